//! MLX affine quantization (`mx.quantize(mode="affine")`, ml-explore/mlx
//! `mlx/backend/cpu/quantized.cpp`): the scalar reference every kernel is tested against.
//!
//! A row of `k` weights is split into groups of `group` consecutive values (32, 64 or
//! 128); each group has a scale `s` and a bias `β` (f16, bf16 or f32 — the checkpoint's
//! dtype) and `b`-bit codes `q`: `w = s·q + β`. Codes fill a little-endian bit stream
//! LSB first: code `i` of a row occupies bits `[i·b, (i+1)·b)` of the row's bytes (the
//! uint32 words MLX stores, read as bytes on a little-endian host). Bits 1–6 and 8.
//!
//! Unlike the GGUF blocks, codes, scales and biases live in three separate tensors, so a
//! row is described by three byte slices rather than one block array.

use half::{bf16, f16};

use crate::QuantError;

/// Element type of the scales and biases tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F16,
    BF16,
    F32,
}

impl ScaleType {
    pub fn size(self) -> usize {
        match self {
            ScaleType::F16 | ScaleType::BF16 => 2,
            ScaleType::F32 => 4,
        }
    }

    /// Element `i` of `bytes`; the caller has checked the length.
    #[inline(always)]
    pub fn get(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            ScaleType::F16 => f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
            ScaleType::BF16 => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
            ScaleType::F32 => f32::from_le_bytes([
                bytes[4 * i],
                bytes[4 * i + 1],
                bytes[4 * i + 2],
                bytes[4 * i + 3],
            ]),
        }
    }
}

/// Bits and group size of one affine-quantized matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AffineLayout {
    pub bits: u32,
    pub group: usize,
}

impl AffineLayout {
    /// Bits 1–6 or 8; a group that is a positive multiple of 32 (so every group starts on a
    /// byte, in fact on a uint32 word, for every bit width).
    pub fn new(bits: u32, group: usize) -> Result<Self, QuantError> {
        if !matches!(bits, 1..=6 | 8) || group == 0 || !group.is_multiple_of(32) {
            return Err(QuantError::Unsupported(format!(
                "MLX affine with {bits} bits and group size {group}"
            )));
        }
        Ok(AffineLayout { bits, group })
    }

    /// Bytes of packed codes in one group.
    pub fn group_bytes(self) -> usize {
        self.group * self.bits as usize / 8
    }

    /// Bytes of packed codes in a row of `k` values.
    pub fn row_code_bytes(self, k: usize) -> usize {
        k * self.bits as usize / 8
    }

    /// Checks the three slices of one row of `k` values.
    pub fn check_row(
        self,
        k: usize,
        codes: &[u8],
        scales: &[u8],
        biases: &[u8],
        st: ScaleType,
    ) -> Result<(), QuantError> {
        if !k.is_multiple_of(self.group) {
            return Err(QuantError::Ragged {
                ty: "MLX affine",
                len: k,
                block: self.group,
            });
        }
        let want_codes = self.row_code_bytes(k);
        if codes.len() != want_codes {
            return Err(QuantError::Size {
                got: codes.len(),
                want: want_codes,
            });
        }
        let want_s = k / self.group * st.size();
        for s in [scales, biases] {
            if s.len() != want_s {
                return Err(QuantError::Size {
                    got: s.len(),
                    want: want_s,
                });
            }
        }
        Ok(())
    }

    /// Code `i` of a row's packed bytes.
    #[inline(always)]
    pub fn code(self, codes: &[u8], i: usize) -> u32 {
        let bit = i * self.bits as usize;
        let byte = bit / 8;
        let lo = codes[byte] as u32;
        // A code of ≤ 8 bits spans at most two bytes.
        let hi = codes.get(byte + 1).copied().unwrap_or(0) as u32;
        ((lo | hi << 8) >> (bit % 8)) & ((1 << self.bits) - 1)
    }
}

/// `out[i] = s·q_i + β` for one row.
pub fn dequantize_row(
    l: AffineLayout,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    st: ScaleType,
    out: &mut [f32],
) -> Result<(), QuantError> {
    l.check_row(out.len(), codes, scales, biases, st)?;
    for (g, chunk) in out.chunks_exact_mut(l.group).enumerate() {
        let (s, b) = (st.get(scales, g), st.get(biases, g));
        for (j, o) in chunk.iter_mut().enumerate() {
            *o = s * l.code(codes, g * l.group + j) as f32 + b;
        }
    }
    Ok(())
}

/// `Σ_i w_i·x_i` for one row, computed per group as `s·Σ q_i x_i + β·Σ x_i` (the form the
/// kernels use: codes are multiplied as integers-in-floats, the bias meets the group sum).
pub fn dot_row(
    l: AffineLayout,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    st: ScaleType,
    x: &[f32],
) -> Result<f32, QuantError> {
    l.check_row(x.len(), codes, scales, biases, st)?;
    let mut acc = 0f64;
    for (g, xs) in x.chunks_exact(l.group).enumerate() {
        let (mut qx, mut sx) = (0f64, 0f64);
        for (j, &xv) in xs.iter().enumerate() {
            qx += l.code(codes, g * l.group + j) as f64 * xv as f64;
            sx += xv as f64;
        }
        acc += st.get(scales, g) as f64 * qx + st.get(biases, g) as f64 * sx;
    }
    Ok(acc as f32)
}

/// `Σ_i w_i·x_i` with the activation row as Q8_0 blocks `xq` (ggml's activation format,
/// 32 values per block, so a group of `group` codes spans `group/32` blocks) and per-group
/// activation sums `xsum` (callers pass those of the dequantized `xq`, so the code and bias
/// terms see the same rounding): per group
/// `s·Σ_b d_b·Σ_{i∈b} q_i·xq_i + β·Σx`. The reference of the integer kernels (1-bit).
pub fn dot_row_q8(
    l: AffineLayout,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    st: ScaleType,
    xq: &[crate::BlockQ8_0],
    xsum: &[f32],
) -> Result<f32, QuantError> {
    let k = xq.len() * 32;
    l.check_row(k, codes, scales, biases, st)?;
    if xsum.len() != k / l.group {
        return Err(QuantError::Size {
            got: xsum.len(),
            want: k / l.group,
        });
    }
    let per = l.group / 32;
    let mut acc = 0f32;
    for (g, blocks) in xq.chunks_exact(per).enumerate() {
        let mut qx = 0f32;
        for (bi, b) in blocks.iter().enumerate() {
            let base = (g * per + bi) * 32;
            let isum: i32 = (0..32)
                .map(|j| l.code(codes, base + j) as i32 * b.qs[j] as i32)
                .sum();
            qx += crate::float::f16_to_f32(b.d) * isum as f32;
        }
        acc += st.get(scales, g) * qx + st.get(biases, g) * xsum[g];
    }
    Ok(acc)
}

/// One quantized row: packed codes, f32 scales, f32 biases.
pub type AffineRow = (Vec<u8>, Vec<f32>, Vec<f32>);

/// Reference quantizer of one row with MLX's rule: per group `s = (max − min)/(2^b − 1)`,
/// `β = min`, `q = round((w − β)/s)` clamped (MLX additionally nudges the edge with the
/// larger magnitude to be exact; tests of the kernels do not depend on that detail).
/// Returns (codes, scales, biases) with f32 scales.
pub fn quantize_row(l: AffineLayout, w: &[f32]) -> Result<AffineRow, QuantError> {
    if !w.len().is_multiple_of(l.group) {
        return Err(QuantError::Ragged {
            ty: "MLX affine",
            len: w.len(),
            block: l.group,
        });
    }
    let qmax = ((1u32 << l.bits) - 1) as f32;
    let mut codes = vec![0u8; l.row_code_bytes(w.len())];
    let (mut scales, mut biases) = (Vec::new(), Vec::new());
    for (g, ws) in w.chunks_exact(l.group).enumerate() {
        let lo = ws.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = ws.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let s = if hi > lo { (hi - lo) / qmax } else { 1.0 };
        scales.push(s);
        biases.push(lo);
        for (j, &v) in ws.iter().enumerate() {
            let q = ((v - lo) / s).round().clamp(0.0, qmax) as u32;
            let bit = (g * l.group + j) * l.bits as usize;
            let wide = (q as u16) << (bit % 8);
            codes[bit / 8] |= wide as u8;
            if let Some(c) = codes.get_mut(bit / 8 + 1) {
                *c |= (wide >> 8) as u8;
            }
        }
    }
    Ok((codes, scales, biases))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn codes_follow_the_lsb_first_bit_stream() {
        // 3-bit codes 0..7 repeated: the stream's bits, LSB first, are the codes' bits.
        let l = AffineLayout::new(3, 32).unwrap();
        let vals: Vec<u32> = (0..32).map(|i| i % 8).collect();
        let mut bits = Vec::new();
        for v in &vals {
            for b in 0..3 {
                bits.push((v >> b) & 1);
            }
        }
        let bytes: Vec<u8> = bits
            .chunks(8)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u8, |a, (i, &b)| a | (b as u8) << i)
            })
            .collect();
        for (i, v) in vals.iter().enumerate() {
            assert_eq!(l.code(&bytes, i), *v);
        }
    }

    #[test]
    fn quantize_dequantize_and_dot_agree() {
        for bits in [1, 2, 3, 4, 5, 6, 8] {
            for group in [32, 64, 128] {
                let l = AffineLayout::new(bits, group).unwrap();
                let w: Vec<f32> = (0..256)
                    .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                    .collect();
                let (c, s, b) = quantize_row(l, &w).unwrap();
                let (s, b) = (f32_bytes(&s), f32_bytes(&b));
                let mut d = vec![0f32; 256];
                dequantize_row(l, &c, &s, &b, ScaleType::F32, &mut d).unwrap();
                let step = 4.0 / ((1u32 << bits) - 1) as f32;
                for (x, y) in w.iter().zip(&d) {
                    assert!(
                        (x - y).abs() <= step * 0.5 + 1e-5,
                        "{bits}/{group}: {x} vs {y}"
                    );
                }
                let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.37).sin()).collect();
                let want: f64 = d
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum();
                let got = dot_row(l, &c, &s, &b, ScaleType::F32, &x).unwrap();
                assert!(
                    (got as f64 - want).abs() < 1e-3,
                    "{bits}/{group}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_layouts_and_sizes() {
        assert!(AffineLayout::new(7, 64).is_err());
        assert!(AffineLayout::new(4, 48).is_err());
        let l = AffineLayout::new(4, 32).unwrap();
        let mut out = vec![0f32; 32];
        assert!(dequantize_row(l, &[0; 15], &[0; 2], &[0; 2], ScaleType::F16, &mut out).is_err());
        assert!(dequantize_row(l, &[0; 16], &[0; 2], &[0; 4], ScaleType::F16, &mut out).is_err());
        assert!(dequantize_row(l, &[0; 16], &[0; 2], &[0; 2], ScaleType::F16, &mut out).is_ok());
    }
}
