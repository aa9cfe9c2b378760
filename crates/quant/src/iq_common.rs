//! Pieces shared by the grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S: the sign
//! decode of grid entries, and the walk over sub-blocks of signed grid values with a 4-bit
//! scale each that their dequantization and dot product have in common. Each format's file
//! keeps its layout and its index, sign and scale decode (as a [`ScaledGrid`] impl).

use crate::float::f16_to_f32;
use crate::iq_grids::KSIGNS_IQ2XS;
use crate::k_common::QK_K;
use crate::q8_k::BlockQ8_K;

/// A grid i-quant block seen as `256 / N` sub-blocks of `N` weights, each weight a signed
/// grid value and each sub-block one 4-bit scale `s`.
pub(crate) trait ScaledGrid<const N: usize> {
    /// The block scale `d`, f16 little-endian.
    fn d(&self) -> [u8; 2];
    /// Signed grid values of sub-block `k` (weights `N·k .. N·k + N`) and its scale `s`.
    fn sub_block(&self, k: usize) -> ([i32; N], u32);
}

/// Eight grid magnitudes (weight j in byte j) with their signs: bit j of `signs` negates
/// weight j.
#[inline]
pub(crate) fn signed8(grid: [u8; 8], signs: u8) -> [i32; 8] {
    std::array::from_fn(|j| {
        let g = grid[j] as i32;
        if signs & (1 << j) != 0 {
            -g
        } else {
            g
        }
    })
}

/// The 8 sign bits of 7-bit sign index `l` of a packed u32 (`KSIGNS_IQ2XS[(aux >> 7l) & 127]`;
/// the 8th bit makes the count of negatives even).
#[inline]
pub(crate) fn ksigns(aux: u32, l: usize) -> u8 {
    KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize]
}

/// Two 4-magnitude grid entries (IQ3 grids) as the 8 magnitudes of one signed group.
#[inline]
pub(crate) fn grid_pair(lo: u32, hi: u32) -> [u8; 8] {
    (lo as u64 | (hi as u64) << 32).to_le_bytes()
}

/// Two entries' 8 signed values as one 16-weight sub-block.
#[inline]
pub(crate) fn concat8(lo: [i32; 8], hi: [i32; 8]) -> [i32; 16] {
    std::array::from_fn(|j| if j < 8 { lo[j] } else { hi[j - 8] })
}

/// 4-bit scale `k` of scales packed two to a byte, low nibble first.
#[inline]
pub(crate) fn nibble(scales: &[u8], k: usize) -> u32 {
    ((scales[k / 2] >> (4 * (k % 2))) & 15) as u32
}

/// `out[256 · blocks.len()]` ← `db · v` per sub-block, `db = step(d, s)`.
pub(crate) fn dequantize<const N: usize, B: ScaledGrid<N>>(
    blocks: &[B],
    out: &mut [f32],
    step: impl Fn(f32, u32) -> f32,
) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d());
        for (k, ok) in o.chunks_exact_mut(N).enumerate() {
            let (v, s) = b.sub_block(k);
            let db = step(d, s);
            for (y, g) in ok.iter_mut().zip(v) {
                // db · |g| then the sign, as ggml does (the sign flip is exact).
                *y = if g < 0 {
                    -(db * (-g) as f32)
                } else {
                    db * g as f32
                };
            }
        }
    }
}

/// `Σ_b d_w·d_a · Σ_k (2s_k + 1)·Σ v·a` over a row and a Q8_K row of the same block count,
/// integer sums exact, f32 accumulation per block as ggml; the format's constant factor is
/// the caller's.
pub(crate) fn dot<const N: usize, B: ScaledGrid<N>>(w: &[B], a: &[BlockQ8_K]) -> f32 {
    let mut sumf = 0f32;
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d()) * y.d();
        let mut bsum = 0i32;
        for k in 0..QK_K / N {
            let (v, s) = x.sub_block(k);
            let sumi: i32 = v
                .iter()
                .zip(&y.qs[N * k..])
                .map(|(&g, &q)| g * q as i32)
                .sum();
            bsum += sumi * (2 * s as i32 + 1);
        }
        sumf += d * bsum as f32;
    }
    sumf
}
