//! Float ops of the forward pass on CPU. Their numerics follow ggml's CPU backend where a
//! choice exists (f64 sum of squares in RMSNorm, GELU through an fp16 table, iterative RoPE
//! angles, q rounded to f16 before q·k), so greedy tokens track llama.cpp's closely.

use std::sync::OnceLock;

use half::{f16, slice::HalfFloatSliceExt};

use crate::{KvType, Rope};

/// `x = x / sqrt(mean(x²) + eps) * w`, in place. As ggml: each square rounded to f32, the
/// squares summed in f64 in order, and `(x · scale) · w`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// `gate = silu(gate) * up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// GELU, tanh form. `1 + a·x·x` is one FMA, `fma(a·x, x, 1)`: what GCC contracts ggml's
/// `ggml_gelu_f32` to, so the fp16 table below equals ggml's entry for entry.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    let inner = (COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// GELU of every f16 value, rounded to f16 — ggml's CPU table (ggml_table_gelu_f16).
fn gelu_table() -> &'static [f32] {
    static T: OnceLock<Vec<f32>> = OnceLock::new();
    T.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu_tanh(f16::from_bits(b).to_f32())).to_f32())
            .collect()
    })
}

/// `gate = gelu_tanh(gate) * up`, with GELU looked up at fp16 precision as ggml does.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let t = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            t[f16::from_f32(x).to_bits() as usize] * u
        };
    }
}

fn yarn_corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// `cache[2i], cache[2i+1]` = cos, sin of pair i's angle at position `pos`.
pub fn rope_cache(r: &Rope, pos: f32, freq_factors: Option<&[f32]>, cache: &mut [f32]) {
    let n_dims = r.dims;
    let theta_scale = r.base.powf(-2.0 / n_dims as f32);
    let (c0, c1) = if r.ext_factor != 0.0 {
        let start = yarn_corr_dim(n_dims, r.n_ctx_orig, r.beta_fast, r.base).floor();
        let end = yarn_corr_dim(n_dims, r.n_ctx_orig, r.beta_slow, r.base).ceil();
        (start.max(0.0), end.min(n_dims as f32 - 1.0))
    } else {
        (0.0, 0.0)
    };
    let mut theta = pos;
    for i0 in (0..n_dims).step_by(2) {
        let ff = freq_factors.map_or(1.0, |f| f[i0 / 2]);
        let theta_extrap = theta / ff;
        let theta_interp = r.freq_scale * theta_extrap;
        let mut t = theta_interp;
        let mut mscale = r.attn_factor;
        if r.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - c0) / (c1 - c0).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * r.ext_factor;
            t = theta_interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / r.freq_scale).ln();
        }
        cache[i0] = t.cos() * mscale;
        cache[i0 + 1] = t.sin() * mscale;
        theta *= theta_scale;
    }
}

/// Rotate the first `n_dims` values of one head with a prepared cache. Each output is one
/// FMA over the other product, `x0·c − x1·s = fma(x0, c, −(x1·s))` and
/// `x0·s + x1·c = fma(x0, s, x1·c)`: what GCC contracts ggml's `rotate_pairs` to (its
/// default `-ffp-contract=fast`), so rotated q and k are bit-identical to llama.cpp's.
pub fn rope_apply(x: &mut [f32], cache: &[f32], n_dims: usize, neox: bool) {
    let half = n_dims / 2;
    for i0 in (0..n_dims).step_by(2) {
        let (c, s) = (cache[i0], cache[i0 + 1]);
        let (a, b) = if neox {
            (i0 / 2, i0 / 2 + half)
        } else {
            (i0, i0 + 1)
        };
        let (x0, x1) = (x[a], x[b]);
        x[a] = x0.mul_add(c, -(x1 * s));
        x[b] = x0.mul_add(s, x1 * c);
    }
}

/// Store one head vector in the cache's element type.
pub fn kv_store(ty: KvType, src: &[f32], dst: &mut [u8]) {
    match ty {
        KvType::F16 => match bytemuck::try_cast_slice_mut::<u8, f16>(dst) {
            Ok(halves) => halves.convert_from_f32_slice(&src[..halves.len()]),
            Err(_) => {
                for (v, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                    d.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
                }
            }
        },
        KvType::F32 => {
            for (v, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
        KvType::Q8_0 => {
            for (blk, d) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = amax / 127.0;
                let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
                d[..2].copy_from_slice(&f16::from_f32(scale).to_bits().to_le_bytes());
                for (q, v) in d[2..].iter_mut().zip(blk) {
                    *q = (v * inv).round() as i8 as u8;
                }
            }
        }
    }
}

/// Load consecutive head vectors as f32.
pub fn kv_load(ty: KvType, src: &[u8], dst: &mut [f32]) {
    // Both conversions are exact (f16 → f32) or one rounding of the same product (q8_0), so
    // the AVX2 path gives the same bits as the portable one (tested below); it is most of
    // the time of a long decode's attention otherwise.
    #[cfg(target_arch = "x86_64")]
    if has_avx2_f16c() && ty != KvType::F32 {
        // SAFETY: AVX2 and F16C were detected at run time; the functions bound every access
        // by the slices' lengths.
        unsafe {
            match ty {
                KvType::F16 => x86::f16_to_f32(src, dst),
                _ => x86::q8_0_to_f32(src, dst),
            }
        }
        return;
    }
    kv_load_portable(ty, src, dst);
}

fn has_avx2_f16c() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// f16 (little-endian bytes) → f32 for the first `min(src.len() / 2, dst.len())` values.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn f16_to_f32(src: &[u8], dst: &mut [f32]) {
        let n = dst.len().min(src.len() / 2);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: bytes 2i..2i + 16 of src and floats i..i + 8 of dst are in bounds.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for (j, d) in dst.iter_mut().enumerate().take(n).skip(i) {
            *d = f16::from_bits(u16::from_le_bytes([src[2 * j], src[2 * j + 1]])).to_f32();
        }
    }

    /// q8_0 blocks (34 bytes: f16 scale, 32 × i8) → f32, `q · scale` per value.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn q8_0_to_f32(src: &[u8], dst: &mut [f32]) {
        for (blk, d) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
            let scale = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
            let s = _mm256_set1_ps(scale);
            for k in 0..4 {
                // SAFETY: bytes 2 + 8k..10 + 8k of the 34-byte block and floats
                // 8k..8k + 8 of the 32-float chunk are in bounds.
                unsafe {
                    let q = _mm_loadl_epi64(blk.as_ptr().add(2 + 8 * k) as *const __m128i);
                    let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                    _mm256_storeu_ps(d.as_mut_ptr().add(8 * k), _mm256_mul_ps(f, s));
                }
            }
        }
    }
}

/// `kv_load` without SIMD: the reference of the AVX2 path.
fn kv_load_portable(ty: KvType, src: &[u8], dst: &mut [f32]) {
    match ty {
        KvType::F16 => {
            // Bulk conversion (F16C eight at a time where the CPU has it); the cache's byte
            // buffers come from the allocator, so the 2-byte view is aligned in practice.
            match bytemuck::try_cast_slice::<u8, f16>(src) {
                Ok(halves) => halves.convert_to_f32_slice(&mut dst[..halves.len()]),
                Err(_) => {
                    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
                    }
                }
            }
        }
        KvType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        KvType::Q8_0 => {
            for (blk, d) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
                let scale = f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
                for (o, q) in d.iter_mut().zip(&blk[2..]) {
                    *o = (*q as i8) as f32 * scale;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_neox_preserves_norm_and_rotates_pairs() {
        let r = Rope::plain(8, 10000.0, true);
        let mut cache = vec![0f32; 8];
        rope_cache(&r, 3.0, None, &mut cache);
        // Pair 0 turns by exactly the position (theta = pos · base^0).
        assert!((cache[0] - 3f32.cos()).abs() < 1e-6 && (cache[1] - 3f32.sin()).abs() < 1e-6);
        let mut x: Vec<f32> = (0..8).map(|i| i as f32 + 1.0).collect();
        let n0: f32 = x.iter().map(|v| v * v).sum();
        rope_apply(&mut x, &cache, 8, true);
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-3);
        // Position 0 is the identity.
        rope_cache(&r, 0.0, None, &mut cache);
        let mut y: Vec<f32> = (0..8).map(|i| i as f32).collect();
        rope_apply(&mut y, &cache, 8, false);
        assert_eq!(y, (0..8).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn kv_load_simd_matches_the_portable_path() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for ty in [KvType::F16, KvType::Q8_0, KvType::F32] {
            // Ragged lengths (f16 tails past the last 8) and odd values: subnormal, zero,
            // negative zero and large f16; several q8_0 blocks with their own scales.
            for n in [32usize, 64, 96, 256, 320] {
                let mut src: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                src[0] = 1e-6;
                src[1] = -0.0;
                src[2] = 60000.0;
                src[n - 1] = 0.0;
                let bytes = match ty {
                    KvType::F16 => 2 * n,
                    KvType::F32 => 4 * n,
                    KvType::Q8_0 => n / 32 * 34,
                };
                let mut b = vec![0u8; bytes];
                kv_store(ty, &src, &mut b);
                let (mut a, mut c) = (vec![f32::NAN; n], vec![f32::NAN; n]);
                kv_load(ty, &b, &mut a);
                kv_load_portable(ty, &b, &mut c);
                let (a, c): (Vec<u32>, Vec<u32>) = (
                    a.iter().map(|x| x.to_bits()).collect(),
                    c.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(a, c, "{ty:?} n {n}");
            }
        }
        // A length that is not a multiple of 8 (the f16 tail).
        let src: Vec<f32> = (0..13).map(|i| i as f32 * 0.3 - 2.0).collect();
        let mut b = vec![0u8; 26];
        kv_store(KvType::F16, &src, &mut b);
        let (mut a, mut c) = (vec![0f32; 13], vec![0f32; 13]);
        kv_load(KvType::F16, &b, &mut a);
        kv_load_portable(KvType::F16, &b, &mut c);
        assert_eq!(a, c);
    }

    #[test]
    fn kv_q8_0_round_trip_is_close() {
        let src: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut b = vec![0u8; 68];
        kv_store(KvType::Q8_0, &src, &mut b);
        let mut back = vec![0f32; 64];
        kv_load(KvType::Q8_0, &b, &mut back);
        for (a, c) in src.iter().zip(&back) {
            assert!((a - c).abs() < 1.0 / 127.0);
        }
    }
}
