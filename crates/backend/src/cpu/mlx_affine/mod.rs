//! MLX affine matrices on CPU: codes, scales and biases stay in the file's three tensors
//! and are multiplied where they lie. Activations stay f32 (as in MLX's own CPU matmul), so
//! a pack's logits track mlx-lm's to f32 rounding; each activation row's per-group sums are
//! computed once per matmul and meet the biases (`Σ w·x = Σ_g s_g·Σ q·x + β_g·Σ x`).
//!
//! 1-bit matrices (where a SIMD kernel exists) take another path, `sign1.rs`: at load each
//! group's scale and bias become the sign form `d·(±1) + m`, and the kernels multiply the
//! codes with Q8_0 activations at the integer cost of a GGUF Q1_0 row.
//!
//! Kernels: `avx2.rs` (one source for every bit width, codes unpacked 8 at a time; the
//! 1-bit sign kernel), `avx512.rs` (the 1-bit sign kernel on VNNI) and the scalar
//! references `neagari_quant::mlx_affine::dot_row` / `dot_row_q8`, which they are tested
//! against on fresh random data.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod sign1;

use neagari_quant::mlx_affine::{self, AffineLayout, ScaleType};

use super::kernels::CpuFeatures;
use super::pool::{SyncPtr, ThreadPool};
use crate::{AffineTensor, BackendError, Result, SharedBytes};

/// Rows `[0, nw)` of one weight chunk against `na` activation rows:
/// `out[i * out_stride + j] = Σ_g s_jg · Σ q·x_i + β_jg · xsum[i, g]`.
/// `codes` `[nw, k·bits/8]`, `scales`/`biases` `[nw, k/group]` in `st`, `x` `[na, k]`,
/// `xsum` `[na, k/group]`.
#[allow(clippy::too_many_arguments)]
pub(crate) type AffineGemmFn = fn(
    l: AffineLayout,
    st: ScaleType,
    k: usize,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    nw: usize,
    x: &[f32],
    xsum: &[f32],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
);

/// A loaded affine matrix `[rows, cols]`.
pub struct CpuAffine {
    pub layout: AffineLayout,
    pub st: ScaleType,
    codes: SharedBytes,
    scales: SharedBytes,
    biases: SharedBytes,
    gemm: AffineGemmFn,
    /// The 1-bit sign form and its integer kernel, where one exists (1-bit on AVX2).
    one: Option<OneBit>,
    pub isa: &'static str,
}

/// A 1-bit matrix's group pairs in sign form (`sign1.rs`), and its kernel.
struct OneBit {
    /// `[rows, ng]` in `dt`: `s/2`.
    d: Vec<u8>,
    dt: ScaleType,
    /// `[rows, ng]`: `β + s/2`; `None` when all are zero (the Bonsai packs).
    m: Option<Vec<f32>>,
    gemm: sign1::Sign1GemmFn,
    quantize: super::kernels::QuantizeActFn,
}

impl CpuAffine {
    /// Checks the three tensors against `[rows, cols]` and picks the kernel.
    pub(crate) fn new(
        t: &AffineTensor,
        name: &str,
        rows: usize,
        cols: usize,
        feats: &CpuFeatures,
        scalar_only: bool,
    ) -> Result<Self> {
        let l = t.layout;
        let bad = |what: &str, got: usize, want: usize| BackendError::Shape {
            op: "load_weight",
            detail: format!("{name}: {what} of {got} bytes, {want} expected for {rows}x{cols}"),
        };
        if !cols.is_multiple_of(l.group) {
            return Err(BackendError::Shape {
                op: "load_weight",
                detail: format!("{name}: {cols} columns in groups of {}", l.group),
            });
        }
        let want = rows * l.row_code_bytes(cols);
        if t.codes.len() != want {
            return Err(bad("codes", t.codes.len(), want));
        }
        let want = rows * (cols / l.group) * t.scale_type.size();
        for (what, b) in [("scales", &t.scales), ("biases", &t.biases)] {
            if b.len() != want {
                return Err(bad(what, b.len(), want));
            }
        }
        let (gemm, mut isa) = pick(feats, scalar_only, l.bits);
        let mut one = None;
        #[cfg(target_arch = "x86_64")]
        if l.bits == 1 && !scalar_only && feats.has_avx2() {
            let (d, dt, m) =
                sign1::sign_form(t.scale_type, t.scales.as_slice(), t.biases.as_slice());
            let (gemm, name) = sign1::pick(feats);
            isa = name;
            one = Some(OneBit {
                d,
                dt,
                m,
                gemm,
                quantize: super::q8_0::quantize_act_avx2,
            });
        }
        Ok(CpuAffine {
            layout: l,
            st: t.scale_type,
            codes: t.codes.clone(),
            scales: t.scales.clone(),
            biases: t.biases.clone(),
            gemm,
            one,
            isa,
        })
    }

    /// Bytes a matmul reads: codes and scales/biases, or codes and the sign form.
    pub fn bytes(&self) -> usize {
        match &self.one {
            Some(o) => self.codes.len() + o.d.len() + o.m.as_ref().map_or(0, |m| 4 * m.len()),
            None => self.codes.len() + self.scales.len() + self.biases.len(),
        }
    }

    /// Row `r` (`[cols]`) dequantized (embedding lookups).
    pub(crate) fn dequantize_row(&self, r: usize, cols: usize, out: &mut [f32]) -> Result<()> {
        let l = self.layout;
        let (cb, sb) = (l.row_code_bytes(cols), cols / l.group * self.st.size());
        fn slice(b: &SharedBytes, r: usize, n: usize) -> &[u8] {
            b.as_slice().get(r * n..(r + 1) * n).unwrap_or(&[])
        }
        mlx_affine::dequantize_row(
            l,
            slice(&self.codes, r, cb),
            slice(&self.scales, r, sb),
            slice(&self.biases, r, sb),
            self.st,
            out,
        )?;
        Ok(())
    }

    /// `out[i, j] = W[j, :] · x[i, :]`, `x` `[na, cols]`, `out` `[na, rows]`.
    pub(crate) fn matmul(
        &self,
        pool: &ThreadPool,
        rows: usize,
        cols: usize,
        x: &[f32],
        na: usize,
        out: &mut [f32],
    ) {
        let l = self.layout;
        let ng = cols / l.group;
        let chunk = super::chunk_rows(rows, pool.n_threads(), na);
        let n_chunks = rows.div_ceil(chunk);
        let (cb, sb) = (l.row_code_bytes(cols), ng * self.st.size());
        let (codes, scales, biases) = (
            self.codes.as_slice(),
            self.scales.as_slice(),
            self.biases.as_slice(),
        );
        let op = SyncPtr(out.as_mut_ptr());
        let out_len = out.len();
        if let Some(o) = &self.one {
            // Activation rows to Q8_0 once, for every weight row (sums only for `m`).
            let (qs, dl, xsum) = sign1::prepare(o.quantize, x, cols, l.group, o.m.is_some());
            let acts = sign1::Acts {
                qs: &qs,
                dl: &dl,
                xsum: &xsum,
            };
            let ds = ng * o.dt.size();
            pool.run(n_chunks, |c| {
                let j0 = c * chunk;
                let nw = chunk.min(rows - j0);
                let w = sign1::SignRows {
                    group: l.group,
                    codes: &codes[j0 * cb..(j0 + nw) * cb],
                    d: &o.d[j0 * ds..(j0 + nw) * ds],
                    dt: o.dt,
                    m: o.m.as_ref().map(|m| &m[j0 * ng..(j0 + nw) * ng]),
                };
                // SAFETY: as below, chunk c writes only columns j0..j0+nw.
                let dst = unsafe { std::slice::from_raw_parts_mut(op.get().add(j0), out_len - j0) };
                (o.gemm)(&w, cols, nw, &acts, na, dst, rows);
            });
            return;
        }
        // Per-group sums of each activation row, once for all weight rows.
        let xsum: Vec<f32> = x.chunks_exact(l.group).map(|g| g.iter().sum()).collect(); // [na, ng]
        let (gemm, st) = (self.gemm, self.st);
        pool.run(n_chunks, |c| {
            let j0 = c * chunk;
            let nw = chunk.min(rows - j0);
            // SAFETY: chunk c writes only columns j0..j0+nw of every output row; the view
            // starts at column j0 and the kernel indexes i * rows + j with j < nw.
            let dst = unsafe { std::slice::from_raw_parts_mut(op.get().add(j0), out_len - j0) };
            gemm(
                l,
                st,
                cols,
                &codes[j0 * cb..(j0 + nw) * cb],
                &scales[j0 * sb..(j0 + nw) * sb],
                &biases[j0 * sb..(j0 + nw) * sb],
                nw,
                x,
                &xsum,
                na,
                dst,
                rows,
            );
        });
    }
}

fn pick(feats: &CpuFeatures, scalar_only: bool, bits: u32) -> (AffineGemmFn, &'static str) {
    #[cfg(target_arch = "x86_64")]
    if !scalar_only && feats.has_avx2() {
        if let Some(f) = avx2::gemm_for(bits) {
            return (f, "avx2");
        }
    }
    let _ = (feats, scalar_only, bits);
    (gemm_scalar, "scalar")
}

/// The portable kernel: the quant crate's reference dot per (weight row, activation row).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_scalar(
    l: AffineLayout,
    st: ScaleType,
    k: usize,
    codes: &[u8],
    scales: &[u8],
    biases: &[u8],
    nw: usize,
    x: &[f32],
    _xsum: &[f32],
    na: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let (cb, sb) = (l.row_code_bytes(k), k / l.group * st.size());
    for j in 0..nw {
        for i in 0..na {
            // The driver checked every size at load, so the reference cannot fail here.
            out[i * out_stride + j] = mlx_affine::dot_row(
                l,
                &codes[j * cb..(j + 1) * cb],
                &scales[j * sb..(j + 1) * sb],
                &biases[j * sb..(j + 1) * sb],
                st,
                &x[i * k..(i + 1) * k],
            )
            .unwrap_or(f32::NAN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};
    use rand::{Rng, SeedableRng};

    fn scale_bytes(v: &[f32], st: ScaleType) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| match st {
                ScaleType::F16 => f16::from_f32(x).to_le_bytes().to_vec(),
                ScaleType::BF16 => bf16::from_f32(x).to_le_bytes().to_vec(),
                ScaleType::F32 => x.to_le_bytes().to_vec(),
            })
            .collect()
    }

    /// Every kernel this CPU has against the scalar reference, on fresh random codes,
    /// scales, biases and activations, for every bit width × group × scale type and
    /// several activation-row counts (1 = decode, ragged tiles of the 4-row micro-kernel).
    #[test]
    fn kernels_match_reference() {
        let feats = CpuFeatures::detect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
        for bits in [1u32, 2, 3, 4, 5, 6, 8] {
            let (gemm, isa) = pick(&feats, false, bits);
            if isa == "scalar" {
                eprintln!("no SIMD kernel for {bits}-bit on this CPU");
                continue;
            }
            for group in [32usize, 64, 128] {
                for st in [ScaleType::F16, ScaleType::BF16, ScaleType::F32] {
                    let l = AffineLayout::new(bits, group).unwrap();
                    let (nw, k) = (7usize, group * 3);
                    let ng = k / group;
                    let codes: Vec<u8> = (0..nw * l.row_code_bytes(k)).map(|_| rng.gen()).collect();
                    let s: Vec<f32> = (0..nw * ng).map(|_| rng.gen_range(0.01..0.2)).collect();
                    let b: Vec<f32> = (0..nw * ng).map(|_| rng.gen_range(-1.0..1.0)).collect();
                    let (s, b) = (scale_bytes(&s, st), scale_bytes(&b, st));
                    for na in [1usize, 3, 4, 6] {
                        let x: Vec<f32> = (0..na * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
                        let xsum: Vec<f32> =
                            x.chunks_exact(group).map(|g| g.iter().sum()).collect();
                        let mut want = vec![0f32; na * nw];
                        let mut got = vec![0f32; na * nw];
                        gemm_scalar(l, st, k, &codes, &s, &b, nw, &x, &xsum, na, &mut want, nw);
                        gemm(l, st, k, &codes, &s, &b, nw, &x, &xsum, na, &mut got, nw);
                        let norm = want.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-3);
                        let err = want
                            .iter()
                            .zip(&got)
                            .map(|(a, b)| (a - b) * (a - b))
                            .sum::<f32>()
                            .sqrt();
                        // f32 accumulation in another order than the f64 reference.
                        assert!(
                            err / norm < 1e-5,
                            "{isa} {bits}-bit g{group} {st:?} na={na}: rel err {}",
                            err / norm
                        );
                    }
                }
            }
        }
    }
}
