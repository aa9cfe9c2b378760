//! Hybrid (Gated DeltaNet) and MoE ops of the CUDA backend: the recurrent state of a
//! sequence in VRAM (`CudaRec`), snapshots of it, and the kernels of `kernels/hybrid.cu`.
//! The `Backend` methods in `mod.rs` forward here.
//!
//! The gated delta rule keeps a head's state `[d_v, d_k]` (a column's rows contiguous; the
//! layout is private to the two kernels that use it): a warp owns four state columns in
//! registers and walks the tokens in order (`gated_delta`; a chunked tensor-core form for
//! long prefills is a later step), or does 1–8 tokens (a decode step, a verify) with the
//! conv before it and the gated norm after it (`delta_rows`, blocks per head).
//! `matmul_rows` copies the expert's rows to a scratch matrix and runs the ordinary matmul
//! on it (one extra device copy per call, so the GEMV path stays untouched).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, LaunchConfig};

use super::{cfg1, compile, drv, shape_err, CudaBackend, CudaBuf, CudaKv, CudaMat, CudaVector};
use crate::{Backend, BackendError, DeltaNet, HeadMap, RecShape, Result};

pub(super) const HYBRID: &str = include_str!("kernels/hybrid.cu");

/// Largest conv kernel (CONV_MAXK in hybrid.cu).
const CONV_MAXK: usize = 16;
/// State columns a warp owns (GD_CPW in hybrid.cu) and the largest d_k and d_v (a lane keeps
/// GD_ROWS = 4 rows of each column).
const GD_CPW: usize = 4;
const GD_MAX_DIM: usize = 128;
/// Warps a block of `gated_delta` (prefill).
const GD_WARPS: usize = 8;
/// State columns a warp owns in `delta_rows` (DR_CPW in hybrid.cu).
const DR_CPW: usize = 4;
/// Most rows of `delta_rows` and its largest conv kernel (DR_MAXN, DR_MAXK in hybrid.cu).
const DR_MAXN: usize = 8;
const DR_MAXK: usize = 4;
/// Warps a block of `delta_rows` at most (its `__launch_bounds__(512)`).
const DR_MAX_WARPS: usize = 16;

pub(super) struct HybridKernels {
    ssm_conv: CudaFunction,
    gated_delta: CudaFunction,
    rms_norm_gated: CudaFunction,
    rms_norm_gated_q: CudaFunction,
    mul_sigmoid: CudaFunction,
    copy_cols: CudaFunction,
    gather_rows: CudaFunction,
    scatter_add_rows: CudaFunction,
    delta_rows: CudaFunction,
}

impl HybridKernels {
    pub(super) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Self> {
        let ptx = compile("hybrid", arch, "", HYBRID)?;
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(drv)?;
        let f = |n: &str| m.load_function(n).map_err(drv);
        Ok(HybridKernels {
            ssm_conv: f("ssm_conv")?,
            gated_delta: f("gated_delta")?,
            rms_norm_gated: f("rms_norm_gated")?,
            rms_norm_gated_q: f("rms_norm_gated_q")?,
            mul_sigmoid: f("mul_sigmoid")?,
            copy_cols: f("copy_cols")?,
            gather_rows: f("gather_rows")?,
            scatter_add_rows: f("scatter_add_rows")?,
            delta_rows: f("delta_rows")?,
        })
    }
}

/// Recurrent state of one sequence, all recurrent layers, in device memory.
pub struct CudaRec {
    shape: RecShape,
    /// `[n_layers, kernel − 1, channels]`: the last conv inputs, oldest first.
    conv: CudaSlice<f32>,
    /// `[n_layers, n_v_heads, d_k, d_v]`.
    state: CudaSlice<f32>,
}

impl CudaRec {
    fn conv_len(s: &RecShape) -> usize {
        (s.conv_kernel - 1) * s.conv_channels
    }

    fn state_len(s: &RecShape) -> usize {
        s.n_v_heads * s.d_k * s.d_v
    }

    /// Bytes of state per sequence.
    pub fn bytes(&self) -> usize {
        4 * self.shape.n_layers * (Self::conv_len(&self.shape) + Self::state_len(&self.shape))
    }
}

impl CudaKv {
    /// Bytes of recurrent state (0 without).
    pub fn rec_bytes(&self) -> usize {
        self.rec.as_ref().map_or(0, CudaRec::bytes)
    }
}

fn no_rec(op: &'static str) -> BackendError {
    shape_err(op, "cache has no recurrent state".into())
}

impl CudaBackend {
    pub(super) fn hy_rec_alloc(&self, kv: &mut CudaKv, s: &RecShape) -> Result<()> {
        if s.conv_kernel == 0 || s.conv_kernel > CONV_MAXK {
            return Err(shape_err(
                "rec_alloc",
                format!("conv kernel {} (1..={CONV_MAXK})", s.conv_kernel),
            ));
        }
        if s.d_k == 0 || s.d_k > GD_MAX_DIM || s.d_v == 0 || s.d_v > GD_MAX_DIM {
            return Err(shape_err(
                "rec_alloc",
                format!(
                    "head dims d_k {} d_v {} (each 1..={GD_MAX_DIM} on CUDA)",
                    s.d_k, s.d_v
                ),
            ));
        }
        let conv_n = s.n_layers * CudaRec::conv_len(s);
        let state_n = s.n_layers * CudaRec::state_len(s);
        let alloc = |n: usize| {
            self.stream.alloc_zeros::<f32>(n.max(1)).map_err(|e| {
                BackendError::OutOfMemory(format!("recurrent state of {n} f32: {e:?}"))
            })
        };
        kv.rec = Some(CudaRec {
            shape: s.clone(),
            conv: alloc(conv_n)?,
            state: alloc(state_n)?,
        });
        Ok(())
    }

    /// `kv_truncate` of a cache with recurrent state: only back to 0 (a reset) or no move.
    pub(super) fn hy_truncate(&self, kv: &mut CudaKv, len: usize) -> Result<()> {
        let cur = kv.len;
        if let Some(rec) = kv.rec.as_mut() {
            if len == 0 {
                self.stream.memset_zeros(&mut rec.conv).map_err(drv)?;
                self.stream.memset_zeros(&mut rec.state).map_err(drv)?;
            } else if len < cur {
                return Err(BackendError::CannotRewind { from: cur, to: len });
            }
        }
        Ok(())
    }

    pub(super) fn hy_snapshot(&self, kv: &CudaKv) -> Result<CudaKv> {
        let rec = match &kv.rec {
            Some(r) => Some(CudaRec {
                shape: r.shape.clone(),
                conv: self.stream.clone_dtod(&r.conv).map_err(drv)?,
                state: self.stream.clone_dtod(&r.state).map_err(drv)?,
            }),
            None => None,
        };
        // The attention entries stay in the live cache (append-only); the snapshot holds
        // the position and the recurrent state only.
        Ok(CudaKv {
            shape: kv.shape.clone(),
            len: kv.len,
            k: self.stream.alloc_zeros::<u16>(1).map_err(drv)?,
            v: self.stream.alloc_zeros::<u16>(1).map_err(drv)?,
            rec,
            id: super::graph::next_kv_id(),
        })
    }

    pub(super) fn hy_restore(&self, kv: &mut CudaKv, snap: &CudaKv) -> Result<()> {
        crate::check_kv_restore(
            (kv.len, &kv.shape, kv.rec.as_ref().map(|r| &r.shape)),
            (snap.len, &snap.shape, snap.rec.as_ref().map(|r| &r.shape)),
        )?;
        kv.len = snap.len;
        if let (Some(d), Some(s)) = (kv.rec.as_mut(), snap.rec.as_ref()) {
            self.stream.memcpy_dtod(&s.conv, &mut d.conv).map_err(drv)?;
            self.stream
                .memcpy_dtod(&s.state, &mut d.state)
                .map_err(drv)?;
        }
        Ok(())
    }

    pub(super) fn hy_ssm_conv(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        x: &mut CudaBuf,
        w: &CudaVector,
    ) -> Result<()> {
        let rec = kv.rec.as_mut().ok_or_else(|| no_rec("ssm_conv"))?;
        let (ch, k) = (rec.shape.conv_channels, rec.shape.conv_kernel);
        if layer >= rec.shape.n_layers || x.cols != ch || w.len != ch * k {
            return Err(shape_err(
                "ssm_conv",
                format!(
                    "layer {layer}, x {}x{}, w {} for {ch}x{k}",
                    x.rows, x.cols, w.len
                ),
            ));
        }
        if x.rows == 0 {
            return Ok(());
        }
        let win = self.dptr(&rec.conv) + (layer * CudaRec::conv_len(&rec.shape) * 4) as u64;
        let (xp, wp) = (self.dptr(&x.data), self.dptr(&w.data));
        let (rows_i, ch_i, k_i) = (x.rows as i32, ch as i32, k as i32);
        launch!(
            self,
            &self.hybrid.ssm_conv,
            cfg1(ch, 128),
            &xp,
            &win,
            &wp,
            &rows_i,
            &ch_i,
            &k_i
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn hy_gated_delta(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        qkv: &CudaBuf,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        a_neg: &CudaVector,
        dt_bias: &CudaVector,
        net: &DeltaNet,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let rec = kv.rec.as_mut().ok_or_else(|| no_rec("gated_delta"))?;
        let (nk, nv, dk, dv) = (net.n_k_heads, net.n_v_heads, net.d_k, net.d_v);
        let n = qkv.rows;
        if layer >= rec.shape.n_layers
            || nk == 0
            || nv % nk != 0
            || rec.shape.n_v_heads != nv
            || rec.shape.d_k != dk
            || rec.shape.d_v != dv
            || qkv.cols != 2 * nk * dk + nv * dv
            || alpha.rows != n
            || beta.rows != n
            || alpha.cols != nv
            || beta.cols != nv
            || a_neg.len != nv
            || dt_bias.len != nv
        {
            return Err(shape_err(
                "gated_delta",
                format!(
                    "qkv {}x{}, heads {nk}/{nv} of {dk}/{dv}",
                    qkv.rows, qkv.cols
                ),
            ));
        }
        self.reshape(out, n, nv * dv)?;
        if n == 0 {
            return Ok(());
        }
        let sp = self.dptr(&rec.state) + (layer * CudaRec::state_len(&rec.shape) * 4) as u64;
        // A warp per GD_CPW state columns, GD_WARPS warps a block.
        let warps = dv.div_ceil(GD_CPW);
        let cfg = LaunchConfig {
            grid_dim: (nv as u32, warps.div_ceil(GD_WARPS) as u32, 1),
            block_dim: ((warps.min(GD_WARPS) * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (qp, ap, bp) = (
            self.dptr(&qkv.data),
            self.dptr(&alpha.data),
            self.dptr(&beta.data),
        );
        let (anp, dtp, op) = (
            self.dptr(&a_neg.data),
            self.dptr(&dt_bias.data),
            self.dptr(&out.data),
        );
        let (n_i, nk_i, nv_i, dk_i, dv_i) = (n as i32, nk as i32, nv as i32, dk as i32, dv as i32);
        let tiled = (net.map == HeadMap::Tiled) as i32;
        launch!(
            self,
            &self.hybrid.gated_delta,
            cfg,
            &qp,
            &ap,
            &bp,
            &anp,
            &dtp,
            &sp,
            &op,
            &n_i,
            &nk_i,
            &nv_i,
            &dk_i,
            &dv_i,
            &tiled
        )
    }

    pub(super) fn hy_rms_norm_gated(
        &self,
        x: &mut CudaBuf,
        w: &CudaVector,
        z: &CudaBuf,
        eps: f32,
    ) -> Result<()> {
        let g = w.len;
        if g == 0 || !x.cols.is_multiple_of(g) || z.rows * z.cols != x.rows * x.cols {
            return Err(shape_err(
                "rms_norm_gated",
                format!(
                    "x {}x{}, z {}x{}, weight of {g}",
                    x.rows, x.cols, z.rows, z.cols
                ),
            ));
        }
        let groups = x.rows * x.cols / g;
        if groups == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (groups as u32, 1, 1),
            block_dim: (256.min(g.div_ceil(32) * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, wp, zp) = (self.dptr(&x.data), self.dptr(&w.data), self.dptr(&z.data));
        let g_i = g as i32;
        // Feeding a decode matmul (ssm_out): also write its q8_1 input.
        if g.is_multiple_of(32) && Self::fuse_q8_1(x.rows, x.cols) {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, x.rows, x.cols / 32)?;
            launch!(
                self,
                &self.hybrid.rms_norm_gated_q,
                cfg,
                &xp,
                &wp,
                &zp,
                &g_i,
                &eps,
                &qp,
                &dsp
            )?;
            sc.xq_key = Some((xp, x.rows, x.cols, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        launch!(
            self,
            &self.hybrid.rms_norm_gated,
            cfg,
            &xp,
            &wp,
            &zp,
            &g_i,
            &eps
        )
    }

    pub(super) fn hy_mul_sigmoid(&self, x: &mut CudaBuf, gate: &CudaBuf) -> Result<()> {
        if x.rows * x.cols != gate.rows * gate.cols {
            return Err(shape_err(
                "mul_sigmoid",
                format!("{}x{} vs {}x{}", x.rows, x.cols, gate.rows, gate.cols),
            ));
        }
        self.elementwise(&self.hybrid.mul_sigmoid, x, Some(gate))
    }

    pub(super) fn hy_copy_cols(
        &self,
        src: &CudaBuf,
        col0: usize,
        width: usize,
        stride: usize,
        n_blocks: usize,
        dst: &mut CudaBuf,
    ) -> Result<()> {
        if n_blocks == 0 || col0 + (n_blocks - 1) * stride + width > src.cols {
            return Err(shape_err(
                "copy_cols",
                format!(
                    "{n_blocks} blocks of {width} from {col0} step {stride} in {}",
                    src.cols
                ),
            ));
        }
        let cols = n_blocks * width;
        self.reshape(dst, src.rows, cols)?;
        let n = src.rows * cols;
        if n == 0 {
            return Ok(());
        }
        let (sp, dp) = (self.dptr(&src.data), self.dptr(&dst.data));
        let (rows_i, sc_i, c0_i, w_i, st_i, nb_i) = (
            src.rows as i32,
            src.cols as i32,
            col0 as i32,
            width as i32,
            stride as i32,
            n_blocks as i32,
        );
        launch!(
            self,
            &self.hybrid.copy_cols,
            cfg1(n, 256),
            &sp,
            &dp,
            &rows_i,
            &sc_i,
            &c0_i,
            &w_i,
            &st_i,
            &nb_i
        )
    }

    pub(super) fn hy_matmul_rows(
        &self,
        w: &CudaMat,
        row0: usize,
        n_rows: usize,
        x: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<()> {
        if row0 + n_rows > w.rows || n_rows == 0 {
            return Err(shape_err(
                "matmul_rows",
                format!("rows {row0}+{n_rows} of {}", w.rows),
            ));
        }
        let view = w
            .data
            .slice(row0 * w.row_bytes..(row0 + n_rows) * w.row_bytes);
        let data = self.stream.clone_dtod(&view).map_err(|e| {
            BackendError::OutOfMemory(format!("expert rows of {} bytes: {e:?}", view.len()))
        })?;
        let m = CudaMat {
            ty: w.ty,
            rows: n_rows,
            cols: w.cols,
            row_bytes: w.row_bytes,
            data,
            k: w.k.clone(),
        };
        self.matmul(&m, x, out)
    }

    pub(super) fn hy_gather_rows(
        &self,
        src: &CudaBuf,
        rows: &[u32],
        dst: &mut CudaBuf,
    ) -> Result<()> {
        if rows.iter().any(|&r| r as usize >= src.rows) {
            return Err(shape_err("gather_rows", format!("row beyond {}", src.rows)));
        }
        self.reshape(dst, rows.len(), src.cols)?;
        let n = rows.len() * src.cols;
        if n == 0 {
            return Ok(());
        }
        let ids = self.stream.clone_htod(rows).map_err(drv)?;
        let (sp, ip, dp) = (self.dptr(&src.data), self.dptr(&ids), self.dptr(&dst.data));
        let (n_i, c_i) = (rows.len() as i32, src.cols as i32);
        launch!(
            self,
            &self.hybrid.gather_rows,
            cfg1(n, 256),
            &sp,
            &ip,
            &dp,
            &n_i,
            &c_i
        )
    }

    pub(super) fn hy_scatter_add_rows(
        &self,
        dst: &mut CudaBuf,
        rows: &[u32],
        scale: &[f32],
        src: &CudaBuf,
    ) -> Result<()> {
        crate::check_scatter_add_rows(rows, scale, (src.rows, src.cols), (dst.rows, dst.cols))?;
        if rows.is_empty() || src.cols == 0 {
            return Ok(());
        }
        let ids = self.stream.clone_htod(rows).map_err(drv)?;
        let sc = self.stream.clone_htod(scale).map_err(drv)?;
        let (dp, ip, scp, sp) = (
            self.dptr(&dst.data),
            self.dptr(&ids),
            self.dptr(&sc),
            self.dptr(&src.data),
        );
        let (n_i, c_i) = (rows.len() as i32, src.cols as i32);
        launch!(
            self,
            &self.hybrid.scatter_add_rows,
            cfg1(src.cols, 128),
            &dp,
            &ip,
            &scp,
            &sp,
            &n_i,
            &c_i
        )
    }

    /// Device address of `n` zeroed arrival counters in the scratch (allocated once, at
    /// least 4096; never inside a recorded step).
    pub(super) fn fuse_counters(&self, sc: &mut super::Scratch, n: usize) -> Result<u64> {
        if sc.fuse_cnt.as_ref().is_none_or(|c| c.len() < n) {
            self.check_alloc("the fused kernels' counters")?;
            self.scratch_moved();
            sc.fuse_cnt = None;
            sc.fuse_cnt = Some(self.stream.alloc_zeros::<u32>(n.max(4096)).map_err(drv)?);
        }
        Ok(sc.fuse_cnt.as_ref().map_or(0, |c| self.dptr(c)))
    }

    /// `Backend::prefetch_rec`: layer `layer`'s state and conv window for the next GEMV that
    /// takes the hint (`mvs_R`, `mvrmt_R`) to ask into L2 (prefetch.rs `take_rec`); nothing
    /// where `kv` has no such layer.
    pub(super) fn hy_prefetch_rec(&self, kv: &CudaKv, layer: usize) {
        let Some(rec) = kv.rec.as_ref().filter(|r| layer < r.shape.n_layers) else {
            return;
        };
        let (cn, sn) = (
            CudaRec::conv_len(&rec.shape),
            CudaRec::state_len(&rec.shape),
        );
        let state = (
            self.dptr(&rec.state) + (layer * sn * 4) as u64,
            (sn * 4) as u64,
        );
        let conv = (
            self.dptr(&rec.conv) + (layer * cn * 4) as u64,
            (cn * 4) as u64,
        );
        self.prefetch_rec_op(state, conv);
    }

    /// `Backend::delta_net`: 1..=8 rows (a decode step, a verify) in one `delta_rows` launch
    /// (unless NEAGARI_CUDA_FUSE=0), other shapes through the three ops.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hy_delta_net(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        qkv: &mut CudaBuf,
        conv: &CudaVector,
        alpha: &CudaBuf,
        beta: &CudaBuf,
        a_neg: &CudaVector,
        dt_bias: &CudaVector,
        net: &DeltaNet,
        norm: &CudaVector,
        z: &CudaBuf,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        // A recurrent hint no GEMV took ends here.
        self.take_rec();
        let (nk, nv, dk, dv) = (net.n_k_heads, net.n_v_heads, net.d_k, net.d_v);
        let n = qkv.rows;
        let fused = self.fuse
            && (1..=DR_MAXN).contains(&n)
            && dk.is_multiple_of(4)
            && norm.len == dv
            && z.rows * z.cols == n * nv * dv
            && kv.rec.as_ref().is_some_and(|r| {
                r.shape.conv_channels == qkv.cols
                    && conv.len == qkv.cols * r.shape.conv_kernel
                    && r.shape.conv_kernel <= DR_MAXK
            });
        if !fused {
            self.hy_ssm_conv(kv, layer, qkv, conv)?;
            self.hy_gated_delta(kv, layer, qkv, alpha, beta, a_neg, dt_bias, net, out)?;
            return self.hy_rms_norm_gated(out, norm, z, eps);
        }
        let rec = kv.rec.as_mut().ok_or_else(|| no_rec("delta_net"))?;
        if layer >= rec.shape.n_layers
            || nk == 0
            || nv % nk != 0
            || rec.shape.n_v_heads != nv
            || rec.shape.d_k != dk
            || rec.shape.d_v != dv
            || qkv.cols != 2 * nk * dk + nv * dv
            || (alpha.rows, alpha.cols) != (n, nv)
            || (beta.rows, beta.cols) != (n, nv)
            || a_neg.len != nv
            || dt_bias.len != nv
        {
            return Err(shape_err(
                "delta_net",
                format!(
                    "qkv {}x{}, heads {nk}/{nv} of {dk}/{dv}",
                    qkv.rows, qkv.cols
                ),
            ));
        }
        self.reshape(out, n, nv * dv)?;
        let kc = rec.shape.conv_kernel;
        let win = self.dptr(&rec.conv) + (layer * CudaRec::conv_len(&rec.shape) * 4) as u64;
        let sp = self.dptr(&rec.state) + (layer * CudaRec::state_len(&rec.shape) * 4) as u64;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let cp = self.fuse_counters(&mut sc, nk + nv)?;
        // ssm_out's q8_1 input, when the head is whole 32-value units.
        let (qp, dsp) = if dv.is_multiple_of(32) && Self::fuse_q8_1(n, nv * dv) {
            self.xq_reserve(&mut sc, n, nv * dv / 32)?
        } else {
            (0, 0)
        };
        // `ds_blocks` blocks a value head, a warp per DR_CPW state columns, at most the
        // kernel's 512 threads a block (one block a head would want 1,024 on the 27B: more
        // blocks then).
        let f = &self.hybrid.delta_rows;
        let warps = dv
            .div_ceil(self.ds_blocks)
            .div_ceil(DR_CPW)
            .min(DR_MAX_WARPS);
        let nb = dv.div_ceil(warps * DR_CPW);
        // A head's blocks as one cluster (at most the portable 8), where each block's columns
        // are whole q8_1 units when ssm_out's input is written.
        let clu = self.dr_cluster
            && (2..=8).contains(&nb)
            && (qp == 0 || (warps * DR_CPW).is_multiple_of(32));
        let cfg = LaunchConfig {
            grid_dim: (nb as u32, nv as u32, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (xp, cwp, ap, bp) = (
            self.dptr(&qkv.data),
            self.dptr(&conv.data),
            self.dptr(&alpha.data),
            self.dptr(&beta.data),
        );
        let (anp, dtp, op, nwp, zp) = (
            self.dptr(&a_neg.data),
            self.dptr(&dt_bias.data),
            self.dptr(&out.data),
            self.dptr(&norm.data),
            self.dptr(&z.data),
        );
        let (kc_i, n_i, nk_i, nv_i, dk_i, dv_i) = (
            kc as i32, n as i32, nk as i32, nv as i32, dk as i32, dv as i32,
        );
        let tiled = (net.map == HeadMap::Tiled) as i32;
        let pf = self.take_pf(super::prefetch::PfSite::Delta, n);
        let clu_i = clu as i32;
        launch!(
            @cluster if clu { nb as u32 } else { 1 },
            self, f, cfg, &xp, &win, &cwp, &kc_i, &ap, &bp, &anp, &dtp, &sp, &op, &n_i, &nk_i,
            &nv_i, &dk_i, &dv_i, &tiled, &nwp, &zp, &eps, &qp, &dsp, &cp, &clu_i, &pf
        )?;
        sc.xq_key = if qp != 0 {
            Some((op, n, nv * dv, self.gen.load(Ordering::Relaxed)))
        } else {
            None
        };
        Ok(())
    }
}
