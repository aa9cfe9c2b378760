//! The residual add and RMSNorm between a block's output projection and its gated MLP
//! (`Backend::matmul_norm_glu`), handed to the two GEMVs around it where both run as
//! gemv_rows.cu tile kernels (3–8 rows: a verify's forward). `mvrtn_4` adds the
//! projection's outputs to the residual and writes the q8_1 of w·x and each 32-value
//! unit's sum of squares; `mvrtg_4` scales its gate/up sums by each row's 1/rms. That is one
//! launch and one grid wait fewer a layer than projection → `add_rms_norm_cl` → gate/up,
//! and xn is never written. The q8_1 is of w·x rather than of the normed value, so a code
//! may round apart from the separate ops' (equal to rounding, not bit for bit).
//! Elsewhere, and with NEAGARI_CUDA_FOLD=0, the separate ops run.

use super::*;
use crate::GluMlp;

/// gemv_rows.cu's `Fold`, by value: the residual, the norm's weight, the q8_1 it writes
/// and the units' sums of squares (device addresses).
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct FoldArgs {
    x: u64,
    w: u64,
    oq: u64,
    ods: u64,
    ss: u64,
}

// SAFETY: plain old data of the kernel parameter's C layout (five 8-byte fields), by value.
unsafe impl DeviceRepr for FoldArgs {}
const _: () = assert!(std::mem::size_of::<FoldArgs>() == 40);

/// gemv_rows.cu's `Unfold`, by value; all zeros (`ss` null) is no fold.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct UnfoldArgs {
    ss: u64,
    eps: f32,
    pad: u32,
}

// SAFETY: plain old data of the kernel parameter's C layout (an 8-byte field, a float and
// its padding to 8 bytes, 16 bytes), by value.
unsafe impl DeviceRepr for UnfoldArgs {}
const _: () = assert!(std::mem::size_of::<UnfoldArgs>() == 16);

/// A fold's output as `mvrtg_4` reads it: x's q8_1 (in the second area) and its `Unfold`.
pub(super) struct Folded {
    pub(super) qp: u64,
    pub(super) dsp: u64,
    pub(super) un: UnfoldArgs,
}

impl CudaBackend {
    /// `Backend::matmul_norm_glu` with its norm folded into the GEMVs around it, where both
    /// take it; `false`: nothing was launched.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_norm_glu_fold(
        &self,
        w: &CudaMat,
        a: &CudaBuf,
        x: &mut CudaBuf,
        norm: &CudaVector,
        eps: f32,
        xn: &mut CudaBuf,
        mlp: &GluMlp<'_, CudaMat>,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<bool> {
        let (n, h) = (a.rows, w.rows);
        let (gate, up) = (mlp.gate, mlp.up);
        let shapes = (x.rows, x.cols, norm.len, w.cols) == (n, h, h, a.cols)
            && h.is_multiple_of(4 * MVR_ROWS)
            && gate.ty == up.ty
            && (gate.rows, gate.cols, gate.row_bytes) == (up.rows, up.cols, up.row_bytes)
            && gate.cols == h;
        if !(self.fold && self.fuse && self.mv_int && shapes) {
            return Ok(false);
        }
        let (Some(kw), Some(kg)) = (&w.k.int, &gate.k.int) else {
            return Ok(false);
        };
        let Some(func) = kw.rows_tma.as_ref().and_then(|t| t.norm.as_ref()) else {
            return Ok(false);
        };
        if self.mvr_kernels(kw, n).is_none() || self.glu_rows_plan(kg, gate, up, n).is_none() {
            return Ok(false);
        }
        let units = w.cols.div_ceil(32);
        let wp = self.dptr(&w.data);
        let Some(p) = self.mvr_tma(kw, units, w.row_bytes, wp.is_multiple_of(16)) else {
            return Ok(false);
        };
        if p.rows != 4 * MVR_ROWS || p.parts != 1 || p.group_bytes.is_some() {
            return Ok(false);
        }
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        // The first area holds a's q8_1 now and g's after it: room for both before either
        // is written (growing drops what it holds).
        self.xq_reserve(&mut sc, n, units.max(gate.rows / 32))?;
        let (qp, dsp) = self.xq_input(&mut sc, kw, a, w.cols)?;
        // x's q8_1 in the second area, which then holds nothing a key names.
        let (oq, ods) = self.xq_alt_reserve(&mut sc, n, h / 32)?;
        sc.xq_alt_key = None;
        let need = MV_MAX_ROWS * h / 32;
        if sc.fold_ss.as_ref().is_none_or(|b| b.len() < need) {
            self.check_alloc("the fold scratch")?;
            self.scratch_moved();
            sc.fold_ss = None;
            sc.fold_ss = Some(self.stream.alloc_zeros::<f64>(need).map_err(drv)?);
        }
        let ss = sc.fold_ss.as_ref().map_or(0, |b| self.dptr(b));
        self.reshape(xn, n, h)?;
        let (xp, np) = (self.dptr(&x.data), self.dptr(&norm.data));
        let fold = FoldArgs {
            x: xp,
            w: np,
            oq,
            ods,
            ss,
        };
        let cfg = LaunchConfig {
            grid_dim: ((h / p.rows) as u32, 1, 1),
            block_dim: (self.mvr_threads(units, Some(&p)) as u32, 1, 1),
            shared_mem_bytes: p.smem,
        };
        let (rows_i, units_i, rb, nr_i) = (h as i32, units as i32, w.row_bytes as i64, n as i32);
        // The hint the norm would have taken (gate/up's first bytes into L2).
        let pf = self.take_pf(super::prefetch::PfSite::Norm, n);
        launch!(self, func, cfg, &wp, &qp, &dsp, &rows_i, &units_i, &rb, &nr_i, &fold, &pf)?;
        drop(sc);
        let folded = Folded {
            qp: oq,
            dsp: ods,
            un: UnfoldArgs { ss, eps, pad: 0 },
        };
        self.prefetch_op(mlp.next);
        if !self.matmul_glu_rows(kg, gate, up, xn, mlp.act, g, u, Some(&folded))? {
            // Its plan was checked above, so not expected: the norm of the updated residual.
            self.rms_norm_into(x, norm, eps, self.dptr(&xn.data))?;
            self.matmul_glu_op(gate, up, xn, mlp.act, g, u)?;
        }
        Ok(true)
    }
}
