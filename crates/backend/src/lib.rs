//! neagari-backend
