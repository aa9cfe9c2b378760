//! The residual add and the first half of a decode norm inside the GEMV that makes the
//! add's operand (`Addend::Matmul`): the 3–8-row `mvrt_*` launch of `wo · a` (or one row's
//! `mvs_R`) adds its sums into x itself and writes the q8_1 of x·w and a sum of squares a
//! block (common.cuh `Res`), so no `add_norm_part` runs between it and the GEMV after,
//! which finishes the norm from those parts (common.cuh `Nrm`, norm.rs). With
//! NEAGARI_CUDA_RES_FOLD=1 (and for one row NEAGARI_CUDA_RES_FOLD_ONE=1): off until a GPU
//! has timed them against `add_norm_part`.

use cudarc::driver::DeviceRepr;

use super::gemv_rows::MvrtPlan;
use super::norm::NrmArgs;
use super::prefetch::PfSite;
use super::*;

/// The most parts a fold leaves (activation rows × tile blocks): the norm scratch holds
/// them. 8 rows of the 27B's 5,120-wide residual are 640 in 64-row tile blocks, 1,280 in 32.
pub(super) const RES_PARTS: usize = 2048;

/// gemv_rows.cu's `Res`, by value; all zero: none.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct ResArgs {
    x: u64,
    w: u64,
    xq: u64,
    xds: u64,
    part: u64,
    g: i32,
    np: i32,
}

// SAFETY: plain old data of the kernel parameter's C layout (five 8-byte addresses and two
// 4-byte scalars, 48 bytes, no padding), by value.
unsafe impl DeviceRepr for ResArgs {}
const _: () = assert!(std::mem::size_of::<ResArgs>() == 48);

/// The GEMV that takes the add: `mvrt_*` with its plan, or one row's `mvs_R` with its
/// (steps, K, G) (R·K·G = 32 rows a block).
enum ResGemv<'a> {
    Rows(MvrtPlan<'a>),
    One(&'a CudaFunction, (usize, usize, usize)),
}

impl ResGemv<'_> {
    /// Rows of the product a block: a part of the norm each.
    fn rows(&self) -> usize {
        match self {
            ResGemv::Rows(p) => p.rows,
            ResGemv::One(..) => 32,
        }
    }
}

impl CudaBackend {
    /// The first half: `wo · a` by `mvrt_*` or `mvs_R` with `Res` (x += it, the q8_1 of x·w
    /// in the q8_1 area a's is not in, keyed as `out`'s, a part a block in the norm
    /// scratch), where the fold is on, `a` is 3–8 rows that take `mvrt_*` with the tile one
    /// copy (K whole or split) or one row that takes `mvs_R`, a block's rows are whole
    /// 32-row units, whole blocks cover x's width, and `then(parts a row)` says the GEMV
    /// after takes the norm (norm.rs `norm_first`); `None`: nothing launched.
    pub(super) fn res_part(
        &self,
        (wo, a): (&CudaMat, &CudaBuf),
        x: &mut CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        then: impl FnOnce(usize) -> bool,
    ) -> Result<Option<NrmArgs>> {
        let (n, g) = (x.rows, x.cols);
        let shapes = (n == 1 || (3..=MV_MAX_ROWS).contains(&n))
            && (a.rows, a.cols) == (n, wo.cols)
            && wo.rows == g
            && w.len == g
            && g.is_multiple_of(32);
        let on = if n == 1 {
            self.res_fold_one
        } else {
            self.res_fold
        };
        if !(on && self.norm_fold && self.mv_int && shapes) {
            return Ok(None);
        }
        let Some(k) = wo.k.int.as_ref() else {
            return Ok(None);
        };
        let wp = self.dptr(&wo.data);
        let units = wo.cols.div_ceil(32);
        let gemv = if n == 1 {
            self.res_stream(k, units, wo.row_bytes)
                .map(|(f, s)| ResGemv::One(f, s))
        } else {
            self.mvr_kernels(k, n)
                .and_then(|_| self.mvr_tma(k, units, wo.row_bytes, wp.is_multiple_of(16)))
                .filter(|p| p.group_bytes.is_none() && p.slots.is_none())
                .map(ResGemv::Rows)
        };
        let Some(gemv) = gemv else {
            return Ok(None);
        };
        let rows = gemv.rows();
        if !(rows >= 2 * MVR_ROWS && g.is_multiple_of(rows)) {
            return Ok(None);
        }
        let np = g / rows;
        if n * np > RES_PARTS || !then(np) {
            return Ok(None);
        }
        self.reshape(out, n, g)?;
        // The hint was meant for the norm's own kernel, which does not run.
        let _ = self.take_pf(PfSite::Norm, n);
        let (xp, wnp, op) = (self.dptr(&x.data), self.dptr(&w.data), self.dptr(&out.data));
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, a, wo.cols)?;
        let ((oq, ods), alt) = self.xq_other(&mut sc, qp, n, g / 32)?;
        let (pp, _) = self.norm_scratch(&mut sc)?;
        let res = ResArgs {
            x: xp,
            w: wnp,
            xq: oq,
            xds: ods,
            part: pp,
            g: g as i32,
            np: np as i32,
        };
        let (rows_i, units_i, rb) = (g as i32, units as i32, wo.row_bytes as i64);
        // No y: every sum goes into x (a write through it would fault, not pass unseen).
        let y = 0u64;
        // x is written: every cached quantization is stale (`launch!` moves the epoch).
        match gemv {
            ResGemv::Rows(p) => {
                let (clu, ks) = self.mvrt_meet(&mut sc, &p, np * p.parts)?;
                let cfg = LaunchConfig {
                    grid_dim: ((np * p.parts) as u32, 1, 1),
                    block_dim: (self.mvr_threads(units, Some(&p)) as u32, 1, 1),
                    shared_mem_bytes: p.smem,
                };
                let nr_i = n as i32;
                let (parts, pu, pb) = (p.parts as i32, p.part_units as i32, p.part_bytes as i32);
                launch!(
                    @cluster clu, self, p.func(false), cfg, &wp, &qp, &dsp, &y, &rows_i,
                    &units_i, &rb, &nr_i, &parts, &pu, &pb, &ks, &res
                )?;
            }
            ResGemv::One(func, (steps, kc, gg)) => {
                let cfg = LaunchConfig {
                    grid_dim: (np as u32, 1, 1),
                    block_dim: (steps as u32, gg as u32, 1),
                    shared_mem_bytes: 0,
                };
                // MAT4_PARAMS of one matrix: the other three empty, their first blocks past
                // the grid.
                let (z, none, k_i) = (0u64, i32::MAX, kc as i32);
                let (zr, nrm) = (0i32, NrmArgs::default());
                launch!(
                    self, func, cfg, &wp, &z, &z, &z, &y, &z, &z, &z, &rows_i, &zr, &zr, &zr,
                    &none, &none, &none, &qp, &dsp, &units_i, &rb, &k_i, &nrm, &res
                )?;
            }
        }
        self.xq_written(&mut sc, op, n, g, alt);
        Ok(Some(NrmArgs::new(pp, (xp, wnp, op), np, g, eps)))
    }

    /// One row's `mvs_R` for the fold (`k.stream`, NEAGARI_CUDA_MVS not 0) and its (steps,
    /// K, G): 32 rows a block, R as the shape's (8 rows a chunk for steps of at most 24
    /// bytes, else 4), the most groups a block that fit (a power of two), K the rest.
    fn res_stream<'a>(
        &self,
        k: &'a IntKernels,
        units: usize,
        row_bytes: usize,
    ) -> Option<(&'a CudaFunction, (usize, usize, usize))> {
        let steps = units / k.step;
        let (Some((r0, _, _)), true) = (self.mvs, (1..=256).contains(&steps)) else {
            return None;
        };
        if units != steps * k.step {
            return None;
        }
        let r = super::matmul::mvs_chunk_rows(r0, steps, row_bytes);
        let fit = 256 / steps;
        let mut gg = (32 / r).max(1);
        while gg > fit {
            gg /= 2;
        }
        let kc = 32 / (r * gg);
        let (_, func) = k.stream.iter().find(|(s, _)| *s == r)?;
        (r * gg * kc == 32 && steps * gg >= 32).then_some((func, (steps, kc, gg)))
    }
}
