//! The engine: sequences and their caches, the sampler, generation loops.

pub mod kld;
pub mod kld_file;
pub mod loader;
pub mod perplexity;
pub mod quantize;
pub mod sampler;
pub mod session;
