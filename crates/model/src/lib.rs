//! neagari-model
