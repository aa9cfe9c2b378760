//! 1-bit affine matrices in sign form, multiplied with Q8_0 activations.
//!
//! A 1-bit code `q ∈ {0, 1}` with scale `s` and bias `β` is `w = s·q + β = d·σ + m` with
//! `σ = 2q − 1 ∈ {−1, +1}`, `d = s/2`, `m = β + s/2`. At load each group's pair becomes
//! `(d, m)`; the codes stay where they lie. A row then costs what a GGUF Q1_0 row costs:
//! per 32 codes one masked negation of the int8 activations and one integer dot, plus a
//! per-group `m·Σx` that disappears for the Bonsai packs (scale `2s`, bias `−s`: `m = 0`
//! exactly, so no bias vector is kept and no activation sums are taken). It also avoids the
//! cancellation of the select form `s·Σ_{set}x + β·Σx` (`β ≈ −s/2`).
//!
//! Activations: each row is quantized to Q8_0 (as llama.cpp runs Q1_0), then split into
//! its int8 quants `[na, k]` and the block scales spread over the eight i32 lanes of each
//! block's sums (`[na, k/4]` f32: element `8·blk + lane` holds block `blk`'s scale), so a
//! kernel loads the scale vector of any 32 or 64 quants with one load.
//!
//! Kernels: `gemm_scalar` (portable), `super::avx2::sign1` and `super::avx512::sign1`
//! (VNNI), all tested against `neagari_quant::mlx_affine::dot_row_q8` on the original
//! scales and biases (tests below).

use neagari_quant::mlx_affine::ScaleType;

use super::super::kernels::{CpuFeatures, QuantizeActFn};

/// A row's activations for the sign-form kernels.
pub(crate) struct Acts<'a> {
    /// `[na, k]` Q8_0 quants.
    pub qs: &'a [i8],
    /// `[na, k/4]` f32: the scale of block `b` repeated in elements `8b .. 8b + 8`.
    pub dl: &'a [f32],
    /// `[na, k/group]` sums of the dequantized activations per group (empty without `m`).
    pub xsum: &'a [f32],
}

/// The group scales and offsets of a sign-form matrix, rows `[0, nw)` of a chunk.
pub(crate) struct SignRows<'a> {
    pub group: usize,
    /// `[nw, k/8]` codes, LSB first.
    pub codes: &'a [u8],
    /// `[nw, k/group]` in `dt`.
    pub d: &'a [u8],
    pub dt: ScaleType,
    /// `[nw, k/group]`; `None` where every `m` is zero.
    pub m: Option<&'a [f32]>,
}

/// `out[i·out_stride + j] = Σ_g d_jg · Σ_b dl_ib · Σ σ·q + m_jg · xsum_ig` for rows
/// `j < nw` and activation rows `i < na`.
pub(crate) type Sign1GemmFn =
    fn(w: &SignRows, k: usize, nw: usize, a: &Acts, na: usize, out: &mut [f32], out_stride: usize);

/// The sign form of one matrix's scales and biases (`[rows·ng]` each, in `st`): `d = s/2`
/// stored in `st` when every halved value round-trips (always, short of subnormals), else in
/// f32; `m = β + s/2` in f32, or `None` when all are zero.
pub(crate) fn sign_form(
    st: ScaleType,
    scales: &[u8],
    biases: &[u8],
) -> (Vec<u8>, ScaleType, Option<Vec<f32>>) {
    let n = scales.len() / st.size();
    let s: Vec<f32> = (0..n).map(|i| st.get(scales, i)).collect();
    let m: Vec<f32> = (0..n).map(|i| st.get(biases, i) + s[i] / 2.0).collect();
    let m = m.iter().any(|&v| v != 0.0).then_some(m);
    let enc = |v: f32, t: ScaleType| -> Vec<u8> {
        match t {
            ScaleType::F16 => half::f16::from_f32(v).to_le_bytes().to_vec(),
            ScaleType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
            ScaleType::F32 => v.to_le_bytes().to_vec(),
        }
    };
    let d: Vec<u8> = s.iter().flat_map(|&v| enc(v / 2.0, st)).collect();
    let exact = (0..n).all(|i| st.get(&d, i) == s[i] / 2.0);
    if exact {
        (d, st, m)
    } else {
        let d = s
            .iter()
            .flat_map(|&v| enc(v / 2.0, ScaleType::F32))
            .collect();
        (d, ScaleType::F32, m)
    }
}

/// The activation rows `x` `[na, k]` as `Acts` buffers: quants `[na, k]`, spread block scales
/// `[na, k/4]`, and (with `sums`) per-group sums `[na, k/group]` of the dequantized values.
pub(crate) fn prepare(
    quantize: QuantizeActFn,
    x: &[f32],
    k: usize,
    group: usize,
    sums: bool,
) -> (Vec<i8>, Vec<f32>, Vec<f32>) {
    let na = x.len() / k;
    let nb = k / 32;
    let mut blocks = vec![0u8; nb * 34]; // one row's Q8_0 blocks
    let mut qs = vec![0i8; na * k];
    let mut dl = vec![0f32; na * k / 4];
    let mut xsum = if sums {
        vec![0f32; na * (k / group)]
    } else {
        Vec::new()
    };
    for i in 0..na {
        quantize(&x[i * k..(i + 1) * k], &mut blocks);
        for (b, blk) in blocks.chunks_exact(34).enumerate() {
            let d = neagari_quant::float::f16_to_f32([blk[0], blk[1]]);
            let q = &mut qs[i * k + 32 * b..i * k + 32 * b + 32];
            let mut isum = 0i32;
            for (o, &v) in q.iter_mut().zip(&blk[2..]) {
                *o = v as i8;
                isum += v as i8 as i32;
            }
            dl[i * k / 4 + 8 * b..i * k / 4 + 8 * b + 8].fill(d);
            if sums {
                // The sums of the *quantized* values, so `m·Σx` sees the x the codes see.
                xsum[i * (k / group) + 32 * b / group] += d * isum as f32;
            }
        }
    }
    (qs, dl, xsum)
}

/// The kernel for this CPU: AVX-512 VNNI, else AVX2, else the portable one.
pub(crate) fn pick(feats: &CpuFeatures) -> (Sign1GemmFn, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if feats.has_avx512vnni() {
            return (super::avx512::sign1, "avx512vnni-int8");
        }
        if feats.has_avx2() {
            return (super::avx2::sign1, "avx2-int8");
        }
    }
    let _ = feats;
    (gemm_scalar, "scalar-int8")
}

/// The portable kernel (and the fallback of the SIMD ones when a length is off).
pub(crate) fn gemm_scalar(
    w: &SignRows,
    k: usize,
    nw: usize,
    a: &Acts,
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let ng = k / w.group;
    for j in 0..nw {
        let codes = w.codes.get(j * k / 8..(j + 1) * k / 8).unwrap_or(&[]);
        for i in 0..na {
            let mut acc = 0f32;
            for g in 0..ng {
                let mut t = 0f32;
                for b in g * w.group / 32..(g + 1) * w.group / 32 {
                    let mut isum = 0i32;
                    for c in 32 * b..32 * b + 32 {
                        let q = a.qs.get(i * k + c).copied().unwrap_or(0) as i32;
                        let bit = codes.get(c / 8).map_or(0, |v| v >> (c % 8) & 1);
                        isum += if bit == 1 { q } else { -q };
                    }
                    t += a.dl.get(i * k / 4 + 8 * b).copied().unwrap_or(0.0) * isum as f32;
                }
                acc += w.dt.get(w.d, j * ng + g) * t;
                if let Some(m) = w.m {
                    acc += m[j * ng + g] * a.xsum.get(i * ng + g).copied().unwrap_or(0.0);
                }
            }
            if let Some(o) = out.get_mut(i * out_stride + j) {
                *o = acc;
            }
        }
    }
}

/// The slices a SIMD kernel reads through raw pointers are long enough.
pub(crate) fn lengths_ok(
    w: &SignRows,
    k: usize,
    nw: usize,
    a: &Acts,
    na: usize,
    out: &[f32],
    out_stride: usize,
) -> bool {
    let ng = k / w.group;
    k.is_multiple_of(w.group)
        && w.group.is_multiple_of(32)
        && w.codes.len() >= nw * k / 8
        && w.d.len() >= nw * ng * w.dt.size()
        && w.m
            .is_none_or(|m| m.len() >= nw * ng && a.xsum.len() >= na * ng)
        && a.qs.len() >= na * k
        && a.dl.len() >= na * k / 4
        && (na == 0 || nw == 0 || out.len() >= (na - 1) * out_stride + nw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use neagari_quant::mlx_affine::{self, AffineLayout};
    use rand::{Rng, SeedableRng};

    fn bytes_of(v: &[f32], st: ScaleType) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match st {
                ScaleType::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
                ScaleType::BF16 => bf16::from_f32(x).to_le_bytes().to_vec(),
                ScaleType::F32 => x.to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// Every sign-form kernel this CPU has (and the portable one), through `sign_form` and
    /// `prepare`, against the quant crate's `dot_row_q8` on the file's scales and biases:
    /// fresh random codes, scales, biases and activations, groups 32/64/128, every scale
    /// type, ragged row counts (not multiples of any tile) and 1–6 activation rows; both
    /// the general pair and Bonsai's symmetric one (`β = −s/2`, no bias vector).
    #[test]
    fn sign1_kernels_match_reference() {
        let feats = CpuFeatures::detect();
        let mut kernels: Vec<(Sign1GemmFn, &str)> = vec![(gemm_scalar, "scalar")];
        #[cfg(target_arch = "x86_64")]
        {
            if feats.has_avx2() {
                kernels.push((super::super::avx2::sign1, "avx2"));
            }
            if feats.has_avx512vnni() {
                kernels.push((super::super::avx512::sign1, "avx512vnni"));
            } else {
                eprintln!("no AVX-512 VNNI on this CPU: its kernel is not tested");
            }
        }
        let quantize: QuantizeActFn = |x, out| {
            let b: &mut [neagari_quant::BlockQ8_0] = bytemuck::cast_slice_mut(out);
            neagari_quant::q8_0::quantize_row(x, b);
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        for group in [32usize, 64, 128] {
            for st in [ScaleType::F16, ScaleType::BF16, ScaleType::F32] {
                for sym in [false, true] {
                    let l = AffineLayout::new(1, group).unwrap();
                    let nw = 11usize;
                    let k = group * rng.gen_range(1..5) + if group == 32 { 32 * 3 } else { 0 };
                    let ng = k / group;
                    let codes: Vec<u8> = (0..nw * k / 8).map(|_| rng.gen()).collect();
                    let s: Vec<f32> = (0..nw * ng).map(|_| rng.gen_range(0.01..0.2)).collect();
                    let b: Vec<f32> = if sym {
                        s.iter().map(|v| -v / 2.0).collect()
                    } else {
                        (0..nw * ng).map(|_| rng.gen_range(-0.2..0.1)).collect()
                    };
                    let (sb, bb) = (bytes_of(&s, st), bytes_of(&b, st));
                    let (d, dt, m) = sign_form(st, &sb, &bb);
                    // bf16/f16 of −s/2 is exact: the symmetric pack keeps no bias vector.
                    assert_eq!(m.is_none(), sym, "g{group} {st:?}");
                    assert_eq!(dt, st);
                    let w = SignRows {
                        group,
                        codes: &codes,
                        d: &d,
                        dt,
                        m: m.as_deref(),
                    };
                    for na in [1usize, 2, 3, 4, 5, 6] {
                        let x: Vec<f32> = (0..na * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        let (qs, dl, xsum) = prepare(quantize, &x, k, group, true);
                        let acts = Acts {
                            qs: &qs,
                            dl: &dl,
                            xsum: &xsum,
                        };
                        // The reference reads the Q8_0 blocks themselves.
                        let mut blocks = vec![0u8; na * k / 32 * 34];
                        for (xr, br) in x.chunks_exact(k).zip(blocks.chunks_exact_mut(k / 32 * 34))
                        {
                            quantize(xr, br);
                        }
                        let mut want = vec![0f32; na * nw];
                        let mut bound = vec![0f32; na * nw];
                        for j in 0..nw {
                            for i in 0..na {
                                let xq: &[neagari_quant::BlockQ8_0] = bytemuck::cast_slice(
                                    &blocks[i * k / 32 * 34..(i + 1) * k / 32 * 34],
                                );
                                want[i * nw + j] = mlx_affine::dot_row_q8(
                                    l,
                                    &codes[j * k / 8..(j + 1) * k / 8],
                                    &sb[j * ng * st.size()..(j + 1) * ng * st.size()],
                                    &bb[j * ng * st.size()..(j + 1) * ng * st.size()],
                                    st,
                                    xq,
                                    &xsum[i * ng..(i + 1) * ng],
                                )
                                .unwrap();
                                // Σ|w·x|: the size of the terms that cancel.
                                bound[i * nw + j] = (0..k)
                                    .map(|c| {
                                        let g = j * ng + c / group;
                                        (s[g] + b[g].abs()) * x[i * k + c].abs()
                                    })
                                    .sum();
                            }
                        }
                        for &(gemm, isa) in &kernels {
                            let mut got = vec![f32::NAN; na * nw];
                            gemm(&w, k, nw, &acts, na, &mut got, nw);
                            for ((w, g), b) in want.iter().zip(&got).zip(&bound) {
                                // Integer sums are exact; f32 rounding of the block and
                                // group terms (in another order) stays near 1e-6 of Σ|w·x|.
                                assert!(
                                    (w - g).abs() <= 2e-6 * b + 1e-6,
                                    "{isa} g{group} k={k} {st:?} sym={sym} na={na}: {w} vs {g} (Σ|wx| {b})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// `d` falls back to f32 when halving loses bits (an f16 subnormal scale).
    #[test]
    fn sign_form_keeps_halves_exact() {
        let s = [f16::from_bits(1), f16::from_f32(0.5)];
        let b = [f16::from_f32(-0.25), f16::from_f32(-0.25)];
        let sb: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let (d, dt, m) = sign_form(ScaleType::F16, &sb, &bb);
        assert_eq!(dt, ScaleType::F32);
        assert_eq!(dt.get(&d, 0), s[0].to_f32() / 2.0);
        assert_eq!(dt.get(&d, 1), 0.25);
        let m = m.unwrap();
        assert_eq!(m[1], 0.0);
        assert_eq!(m[0], -0.25 + s[0].to_f32() / 2.0);
    }
}
