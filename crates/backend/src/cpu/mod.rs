//! The CPU backend: packed-weight matmul kernels per format and instruction set, selected
//! once at start-up from the CPU's features.

pub mod kernels;

#[cfg(target_arch = "x86_64")]
mod avx2_tiles;
mod tiles;

// Unquantized and legacy 32-weight block formats.
mod float;
mod q4_0;
mod q4_1;
mod q5_0;
mod q5_1;
mod q8_0;
mod q8_1;
