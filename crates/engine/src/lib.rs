//! neagari-engine
pub mod sampler;
