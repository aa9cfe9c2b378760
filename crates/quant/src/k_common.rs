//! Pieces shared by the K-quant formats (256-weight super-blocks): f16 fields, ggml's
//! rounding, the 6-bit scale packing of Q4_K/Q5_K, and the scale/quant searches that the
//! reference quantizers use (`make_qx_quants`, `make_q3_quants`, `make_qkx2_quants` in
//! ggml-quants.c).
//!
//! The searches are written so every float operation happens in the same order as ggml's
//! C (which libggml-base compiles without FMA contraction); the quantizer tests compare
//! our output with ggml's byte for byte.

// Index loops here follow the layout formulas (weight 128h + 32k + l, ...) literally.
#![allow(clippy::needless_range_loop)]

use crate::legacy::first_absmax;
use crate::q8_k::BlockQ8_K;
use crate::{GgmlType, QuantError};

/// Weights per K-quant super-block.
pub const QK_K: usize = 256;

/// Groups whose largest magnitude is below this are treated as all zero (ggml's
/// `GROUP_MAX_EPS`).
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

#[inline]
pub(crate) fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(b).to_f32()
}

#[inline]
pub(crate) fn f32_to_f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5·2²³ and reading the
/// mantissa. Valid for |v| ≤ 2²² (all callers stay far inside that).
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Sixteen-bit little-endian integers of a byte array (Q8_K bsums).
#[inline]
pub(crate) fn le_i16(b: &[u8], i: usize) -> i16 {
    i16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

/// `o[256]` ← one Q4_K/Q5_K block's values from its unpacked quants `q`:
/// `(d·sc)·q − (dmin·m)` per 32-weight sub-block, in f32 as ggml computes them.
pub fn dequantize_scale_min_k4(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; 12],
    q: &[u8; QK_K],
    o: &mut [f32],
) {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        for l in 32 * j..32 * j + 32 {
            o[l] = d1 * q[l] as f32 - m1;
        }
    }
}

/// Integer parts of one Q4_K/Q5_K block's dot with a Q8_K block, from its unpacked quants
/// `q`: `(Σ_j sc_j·Σ q·a, Σ_j m_j·Σ a)` over the eight 32-weight sub-blocks.
#[inline]
pub(crate) fn isums_scale_min_k4(scales: &[u8; 12], q: &[u8; QK_K], a: &BlockQ8_K) -> (i32, i32) {
    let mut sumi = 0i32;
    let mut summ = 0i32;
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, scales);
        let mut s = 0i32;
        for l in 32 * j..32 * j + 32 {
            s += q[l] as i32 * a.qs[l] as i32;
        }
        sumi += sc as i32 * s;
        summ += m as i32 * (a.bsum(2 * j) + a.bsum(2 * j + 1));
    }
    (sumi, summ)
}

/// Reference dot of a row of a K-quant with a super-block `d` and `dmin` (Q2_K, Q4_K, Q5_K)
/// with a Q8_K row of the same block count: `Σ_b d_a·d·sumi − d_a·dmin·summ`, the integer
/// parts `(sumi, summ)` from `isums`, accumulated in f32 in ggml's order. `d_dmin` gives a
/// block's two f16 fields.
pub(crate) fn dot_d_dmin<B>(
    w: &[B],
    a: &[BlockQ8_K],
    d_dmin: impl Fn(&B) -> ([u8; 2], [u8; 2]),
    isums: impl Fn(&B, &BlockQ8_K) -> (i32, i32),
) -> f32 {
    let mut sum = 0f32;
    for (x, y) in w.iter().zip(a) {
        let (sumi, summ) = isums(x, y);
        let (d, dmin) = d_dmin(x);
        let da = y.d();
        sum += f16_to_f32(d) * da * sumi as f32 - f16_to_f32(dmin) * da * summ as f32;
    }
    sum
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K: sub-blocks
/// 0..4 keep 6 bits in bytes j (scale) and j+4 (min); 4..8 keep their low 4 bits in byte
/// j+4 (scale low, min high) and their top 2 bits in the top bits of bytes j−4 / j.
#[inline]
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Inverse of [`scale_min_k4`] for all eight sub-blocks (values must be < 64).
pub(crate) fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The start of the symmetric searches. A group whose largest magnitude is below
/// `GROUP_MAX_EPS` gets all-zero quants and `None`. Otherwise the first pass
/// `L[i] = clamp(round(−nmax·x/max), −nmax, nmax−1)` is stored in `l` as `L[i] + offset`,
/// and the result is `max` (the first value of largest magnitude) with the x²-weighted
/// sums `(Σ w·x·L, Σ w·L²)`.
fn symmetric_start(nmax: i32, x: &[f32], offset: i32, l: &mut [i8]) -> Option<(f32, f32, f32)> {
    let max = first_absmax(x);
    if max.abs() < GROUP_MAX_EPS {
        l[..x.len()].fill(0);
        return None;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (&v, lo) in x.iter().zip(l.iter_mut()) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *lo = (q + offset) as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    Some((max, sumlx, suml2))
}

/// Symmetric search (ggml `make_qx_quants`, the `rmse_type = 1`, no-importance case that
/// Q6_K uses): `L[i] = clamp(round(x/scale), −nmax, nmax−1) + nmax`, trying 19 inverse
/// scales around `−nmax/max` and keeping the one with the best weighted (w = x²) fit.
/// Returns the scale.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let Some((max, mut sumlx, mut suml2)) = symmetric_start(nmax, x, nmax, l_out) else {
        return 0.0;
    };
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in x {
            let l = clamp(nearest_int(iscale * v));
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l_out[i] = (nmax + clamp(nearest_int(iscale * x[i]))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric search with coordinate-descent refinement (ggml `make_q3_quants` with
/// `do_rmse`): start from `round(−nmax·x/max)`, then up to five passes that move single
/// quants to improve the x²-weighted fit. `L[i]` in 0..2·nmax. Returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let n = x.len();
    let Some((_, mut sumlx, mut suml2)) = symmetric_start(nmax, x, 0, l_out) else {
        return 0.0;
    };
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    for _ in 0..5 {
        let mut changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                if new_l != l_out[i] as i32 {
                    let nl = new_l as f32;
                    slx += w * x[i] * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for l in &mut l_out[..n] {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the asymmetric search's grid of trial scales.
pub(crate) struct Qkx2 {
    pub nmax: i32,
    pub rmin: f32,
    pub rdelta: f32,
    pub nstep: i32,
    /// Weighted absolute error (Q2_K) instead of weighted squared error.
    pub use_mad: bool,
}

/// Asymmetric search (ggml `make_qkx2_quants`): `x ≈ scale·L − min` with `L` in 0..=nmax
/// and `min ≥ 0`; tries `nstep + 1` inverse scales `(nmax + rmin + rdelta·is)/(max − min)`
/// and solves weighted least squares for scale and min at each. Returns `(scale, min)`.
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if p.use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let dd = sum_w * sum_l2 - sum_l * sum_l;
        if dd > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / dd;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / dd;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The K-quant arms of `dequantize_row`: `Some` when `ty` is one of Q2_K..Q8_K.
pub fn dequantize_row_k(
    ty: GgmlType,
    src: &[u8],
    out: &mut [f32],
) -> Option<Result<(), QuantError>> {
    let r = match ty {
        GgmlType::Q2_K => with_blocks(src, out, crate::q2_k::dequantize),
        GgmlType::Q3_K => with_blocks(src, out, crate::q3_k::dequantize),
        GgmlType::Q4_K => with_blocks(src, out, crate::q4_k::dequantize),
        GgmlType::Q5_K => with_blocks(src, out, crate::q5_k::dequantize),
        GgmlType::Q6_K => with_blocks(src, out, crate::q6_k::dequantize),
        GgmlType::Q8_K => with_blocks(src, out, crate::q8_k::dequantize),
        _ => return None,
    };
    Some(r)
}

/// The K-quant arms of `quantize_row` (ggml's `_ref` quantizers): `Some` when `ty` is one of
/// Q2_K..Q8_K.
pub fn quantize_row_k(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Option<Result<(), QuantError>> {
    let r = match ty {
        GgmlType::Q2_K => with_blocks_mut(x, out, crate::q2_k::quantize_row),
        GgmlType::Q3_K => with_blocks_mut(x, out, crate::q3_k::quantize_row),
        GgmlType::Q4_K => with_blocks_mut(x, out, crate::q4_k::quantize_row),
        GgmlType::Q5_K => with_blocks_mut(x, out, crate::q5_k::quantize_row),
        GgmlType::Q6_K => with_blocks_mut(x, out, crate::q6_k::quantize_row),
        GgmlType::Q8_K => with_blocks_mut(x, out, crate::q8_k::quantize_row),
        _ => return None,
    };
    Some(r)
}

/// Checks that `bytes` holds exactly `n / 256` blocks of `T` for `n` values.
fn check_len<T>(n: usize, bytes: usize) -> Result<usize, QuantError> {
    let size = std::mem::size_of::<T>();
    if !n.is_multiple_of(QK_K) {
        return Err(QuantError::Ragged {
            ty: "K-quant",
            len: n,
            block: QK_K,
        });
    }
    let want = n / QK_K * size;
    if bytes != want {
        return Err(QuantError::Size { got: bytes, want });
    }
    Ok(n / QK_K)
}

fn with_blocks<T: bytemuck::Pod>(
    src: &[u8],
    out: &mut [f32],
    f: fn(&[T], &mut [f32]),
) -> Result<(), QuantError> {
    check_len::<T>(out.len(), src.len())?;
    // Alignment is 1 and the length is whole blocks, so the cast cannot fail.
    let blocks: &[T] = bytemuck::try_cast_slice(src).map_err(|_| QuantError::Size {
        got: src.len(),
        want: 0,
    })?;
    f(blocks, out);
    Ok(())
}

fn with_blocks_mut<T: bytemuck::Pod>(
    x: &[f32],
    out: &mut [u8],
    f: fn(&[f32], &mut [T]),
) -> Result<(), QuantError> {
    let len = out.len();
    check_len::<T>(x.len(), len)?;
    let blocks: &mut [T] =
        bytemuck::try_cast_slice_mut(out).map_err(|_| QuantError::Size { got: len, want: 0 })?;
    f(x, blocks);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
            (-7.6, -8),
            (127.0, 127),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn scale_min_packing_round_trips() {
        let ls = [0, 1, 17, 63, 32, 5, 48, 63];
        let lm = [63, 0, 2, 33, 15, 16, 31, 62];
        let s = pack_scale_min_k4(&ls, &lm);
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &s), (ls[j], lm[j]));
        }
    }
}
