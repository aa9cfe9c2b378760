//! The CPU backend: packed-weight matmul kernels per format and instruction set, selected
//! once at start-up from the CPU's features.

pub mod kernels;
