//! neagari-engine
