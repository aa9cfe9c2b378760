//! The CPU backend: packed-weight matmul kernels per format and instruction set, selected
//! once at start-up from the CPU's features.

pub mod kernels;

// K-quants (256-weight super-blocks) and their Q8_K activations.
mod q2_k;
mod q3_k;
mod q4_k;
mod q5_k;
mod q6_k;
mod q8_k;
