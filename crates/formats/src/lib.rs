//! neagari-formats
