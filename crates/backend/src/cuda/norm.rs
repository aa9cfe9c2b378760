//! RMSNorm on the CUDA backend: the per-group norm, the fused residual add + norm (one block
//! or, for a decode row, several blocks meeting at a barrier) and Gemma's post-norm + add +
//! norm; each may also write the q8_1 input of the next matmul.

use cudarc::driver::DeviceRepr;

use super::*;

/// common.cuh's `Nrm`, by value: the parts of a decode row's norm that the GEMV reading it
/// finishes (`norm_matmul_op`); all zero: no norm.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct NrmArgs {
    part: u64,
    x: u64,
    w: u64,
    out: u64,
    np: i32,
    g: i32,
    eps: f32,
    pad: u32,
}

// SAFETY: plain old data of the kernel parameter's C layout (four 8-byte addresses, three
// 4-byte scalars and the 4 bytes of tail padding C gives the struct, 48 bytes), by value.
unsafe impl DeviceRepr for NrmArgs {}
const _: () = assert!(std::mem::size_of::<NrmArgs>() == 48);

/// Whether a streaming GEMV launch of `blocks` blocks of `threads` threads can finish the
/// norm of a row of `cols` (common.cuh's NrmStage): block b < cols / 32 writes 32 values of
/// the normed row, and warp 0 of every block must be whole.
pub(super) fn stage_fits(blocks: usize, threads: usize, cols: usize) -> bool {
    blocks >= cols / 32 && threads >= 32
}

impl NrmArgs {
    fn new(part: u64, (x, w, out): (u64, u64, u64), np: usize, g: usize, eps: f32) -> Self {
        Self {
            part,
            x,
            w,
            out,
            np: np as i32,
            g: g as i32,
            eps,
            pad: 0,
        }
    }
}

impl CudaBackend {
    /// RMSNorm of `x`'s groups into the buffer at `op` (which may be x's own).
    pub(super) fn rms_norm_into(
        &self,
        x: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        op: u64,
    ) -> Result<()> {
        let g = w.len;
        if g == 0 || !x.cols.is_multiple_of(g) {
            return Err(shape_err(
                "rms_norm",
                format!("{} cols, weight of {g}", x.cols),
            ));
        }
        let groups = x.rows * x.cols / g;
        if groups == 0 {
            return Ok(());
        }
        let (xp, wp) = (self.dptr(&x.data), self.dptr(&w.data));
        let g_i = g as i32;
        // One block per group: a warp-per-group variant (no block barrier) measured 8.9 µs
        // per call against this one's 3.9 µs on the H200 (ncu, synthetic Gemma 3 decode).
        let cfg = LaunchConfig {
            grid_dim: (groups as u32, 1, 1),
            // Up to 1024 threads: a 4096-wide row is then four values a thread.
            block_dim: (1024.min(g.div_ceil(32) * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // A whole-row norm feeding decode matmuls also writes their q8_1 input.
        if g == x.cols && Self::fuse_q8_1(x.rows, x.cols) {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, x.rows, x.cols / 32)?;
            launch!(
                self,
                &self.ops.rms_norm_q,
                cfg,
                &xp,
                &wp,
                &op,
                &g_i,
                &eps,
                &qp,
                &dsp
            )?;
            sc.xq_key = Some((op, x.rows, x.cols, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        launch!(self, &self.ops.rms_norm, cfg, &xp, &wp, &op, &g_i, &eps)
    }

    /// The device addresses of the decode-row norms' scratch (allocated on first use): the
    /// blocks' sums of squares `[NORM_ROW_BLOCKS]` f64 and `add_rms_norm_row`'s barrier
    /// (two u32).
    fn norm_scratch(&self, sc: &mut Scratch) -> Result<(u64, u64)> {
        if sc.norm_part.is_none() || sc.norm_cnt.is_none() {
            self.check_alloc("the norm scratch")?;
            self.scratch_moved();
            sc.norm_part = Some(
                self.stream
                    .alloc_zeros::<f64>(NORM_ROW_BLOCKS)
                    .map_err(drv)?,
            );
            sc.norm_cnt = Some(self.stream.alloc_zeros::<u32>(2).map_err(drv)?);
        }
        match (&sc.norm_part, &sc.norm_cnt) {
            (Some(p), Some(c)) => Ok((self.dptr(p), self.dptr(c))),
            _ => Err(BackendError::Other("cuda: norm scratch missing".into())),
        }
    }

    /// The blocks of a cluster and their threads where `add_rms_norm` of `rows` rows of `g`
    /// runs `add_rms_norm_cl` (decode rows: one cluster a row, a value a thread).
    fn cluster_norm(&self, rows: usize, g: usize) -> Option<(usize, usize)> {
        let cl = g.div_ceil(NORM_ROW_THREADS).clamp(2, NORM_CL_MAX);
        let cl_threads = g.div_ceil(cl).next_multiple_of(32);
        (self.norm_row
            && self.norm_cl
            && Self::fuse_q8_1(rows, g)
            && g > NORM_ROW_THREADS
            && cl_threads <= 1024)
            .then_some((cl, cl_threads))
    }

    /// `add_rms_norm` then `matmul_multi(ws, out, outs)` of a decode row with the norm
    /// finished inside the GEMV (common.cuh's `Nrm`): `add_norm_part` adds, stores x, writes
    /// the q8_1 of x·w and each block's sum of squares, without the blocks meeting; the one
    /// `mvqm1x4u` launch over `ws` scales its sums by 1/rms and writes `out`. Taken where
    /// `add_rms_norm` would run `add_rms_norm_cl` and `matmul_multi` one `mvqm1x4u` launch
    /// (matmul.rs `multi_half`), unless NEAGARI_CUDA_NORM_FOLD=0; `false`: not taken,
    /// nothing launched. `add_norm_part` has the cluster's blocks and threads, so the row's
    /// total, 1/rms and `out` are its bits; the GEMV's sums differ from the separate ops' in
    /// the last places (x·w is quantized, not x·w/rms).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_matmul_op(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        ws: &[&CudaMat],
        outs: &mut [&mut CudaBuf],
    ) -> Result<bool> {
        let (n, g) = (x.rows, x.cols);
        // One row: `mvqm1x4u`, whose first g / 32 blocks write the normed row, and `mvs_R`
        // (NrmStage) unless NEAGARI_CUDA_NORM_FOLD_STREAM=0; 3–8 rows (a verify) unless
        // NEAGARI_CUDA_NORM_FOLD_ROWS=0: the ring GEMV `mvrmq` (its warps hold the n·cl
        // parts, at most NORM_ROW_BLOCKS; every warp writes its share, gemv_rows.cu
        // `mvr_norm_*`), and `mvrmt` unless NEAGARI_CUDA_NORM_FOLD_TILE=0.
        let gemv = |cl: usize| match n {
            1 => {
                (self.multi_half(ws, 1, g)
                    && ws.iter().map(|w| w.rows).sum::<usize>().div_ceil(4) >= g / 32)
                    || (self.norm_fold_stream && self.multi_stream(ws, g))
            }
            _ => {
                self.norm_fold_rows
                    && n * cl <= NORM_ROW_BLOCKS
                    && (self.multi_ring(ws, n, g)
                        || (self.norm_fold_tile && self.multi_tile(ws, n, g)))
            }
        };
        let Some(k) = ws
            .first()
            .and_then(|w0| w0.k.int.as_ref())
            .filter(|_| ws.len() == outs.len())
        else {
            return Ok(false);
        };
        let Some(nrm) = self.norm_part(x, y, w, eps, out, gemv)? else {
            return Ok(false);
        };
        self.matmul_multi_int(k, ws, out, outs, Some(nrm))?;
        self.norm_part_done(out);
        Ok(true)
    }

    /// `add_rms_norm` then `matmul_glu(gate, up, out, act, g, u)` with the norm finished
    /// inside the one launch that takes gate, up and the GLU: 3–8 rows' `mvrtg_4` (fused.rs
    /// `matmul_glu_rows`) unless NEAGARI_CUDA_NORM_FOLD_TILE=0, one row's `mvsg_R`
    /// (`matmul_glu_stream`) unless NEAGARI_CUDA_NORM_FOLD_STREAM=0; `false`: not taken,
    /// nothing launched. As `norm_matmul_op`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_glu_op(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        (gate, up): (&CudaMat, &CudaMat),
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<bool> {
        let (n, cols) = (x.rows, x.cols);
        let Some(k) = gate.k.int.as_ref() else {
            return Ok(false);
        };
        // matmul_glu_op's way to those launches.
        let pair = super::fused::glu_pair(gate, up, cols);
        let fits = |cl: usize| {
            let launch = if n == 1 {
                self.norm_fold_stream && self.glu_stream_folds(k, gate)
            } else {
                self.norm_fold_rows
                    && self.norm_fold_tile
                    && n * cl <= NORM_ROW_BLOCKS
                    && self.glu_rows_plan(k, gate, up, n).is_some()
            };
            self.fuse && self.mv_int && pair && launch
        };
        let Some(nrm) = self.norm_part(x, y, w, eps, out, fits)? else {
            return Ok(false);
        };
        let ran = if n == 1 {
            self.matmul_glu_stream(k, gate, up, out, act, g, u, Some(nrm))?
        } else {
            self.matmul_glu_rows(k, gate, up, out, act, g, u, Some(nrm))?
        };
        if !ran {
            return Err(BackendError::Other(
                "cuda: a norm folded into a GLU that did not run".into(),
            ));
        }
        self.norm_part_done(out);
        Ok(true)
    }

    /// The first half of a folded norm: `add_norm_part` over x's rows (x += y, the parts of
    /// each row's sum of squares, the q8_1 of x·w as `out`'s), where the norm would run
    /// `add_rms_norm_cl`, NEAGARI_CUDA_NORM_FOLD is on and `gemv(blocks a row)` says the
    /// GEMV after it takes the fold; `None`: nothing launched.
    fn norm_part(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
        gemv: impl FnOnce(usize) -> bool,
    ) -> Result<Option<NrmArgs>> {
        let (n, g) = (x.rows, x.cols);
        let Some((cl, cl_threads)) = self.cluster_norm(n, g) else {
            return Ok(None);
        };
        if !(self.norm_fold && (y.rows, y.cols) == (n, g) && w.len == g && gemv(cl)) {
            return Ok(None);
        }
        self.reshape(out, n, g)?;
        let pf = self.take_pf(super::prefetch::PfSite::Norm, n);
        let (xp, yp, wp, op) = (
            self.dptr(&x.data),
            self.dptr(&y.data),
            self.dptr(&w.data),
            self.dptr(&out.data),
        );
        let g_i = g as i32;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (pp, _) = self.norm_scratch(&mut sc)?;
        let (qp, dsp) = self.xq_reserve(&mut sc, n, g / 32)?;
        let cfg = LaunchConfig {
            grid_dim: (cl as u32, n as u32, 1),
            block_dim: (cl_threads as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            &self.ops.add_norm_part,
            cfg,
            &xp,
            &yp,
            &wp,
            &g_i,
            &qp,
            &dsp,
            &pp,
            &pf
        )?;
        sc.xq_key = Some((op, n, g, self.gen.load(Ordering::Relaxed)));
        Ok(Some(NrmArgs::new(pp, (xp, wp, op), cl, g, eps)))
    }

    /// After the GEMV of a folded norm: the q8_1 `norm_part` left is of x·w, not of `out`
    /// (which the GEMV wrote), so no later matmul of out may take it.
    fn norm_part_done(&self, out: &CudaBuf) {
        let op = self.dptr(&out.data);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if sc.xq_key.is_some_and(|(p, ..)| p == op) {
            sc.xq_key = None;
        }
        if sc.xq_alt_key.is_some_and(|(p, ..)| p == op) {
            sc.xq_alt_key = None;
        }
    }

    pub(super) fn add_rms_norm_op(
        &self,
        x: &mut CudaBuf,
        y: &CudaBuf,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        if x.rows * x.cols != y.rows * y.cols {
            return Err(shape_err(
                "add_rms_norm",
                format!("{}x{} + {}x{}", x.rows, x.cols, y.rows, y.cols),
            ));
        }
        if w.len != x.cols || x.rows == 0 {
            // Per-group norms: the two ops.
            self.add(x, y)?;
            return self.rms_norm(x, w, eps, out);
        }
        self.reshape(out, x.rows, x.cols)?;
        // Taken by every call, so a hint never outlives the norm it was meant for.
        let pf = self.take_pf(super::prefetch::PfSite::Norm, x.rows);
        let g = x.cols;
        let (xp, yp, wp, op) = (
            self.dptr(&x.data),
            self.dptr(&y.data),
            self.dptr(&w.data),
            self.dptr(&out.data),
        );
        let g_i = g as i32;
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, 1, 1),
            block_dim: (1024.min(g.div_ceil(32) * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // A decode step's rows (one, or a verify's up to 8), each in one cluster of up to
        // 8 blocks, a value a thread: one block a row took 9.9 µs on the 27B's 8-row
        // verify (5,120 wide), the cluster 5.8 on one row.
        if let Some((cl, cl_threads)) = self.cluster_norm(x.rows, g) {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, x.rows, g / 32)?;
            let cfg = LaunchConfig {
                grid_dim: (cl as u32, x.rows as u32, 1),
                block_dim: (cl_threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                @cluster cl as u32,
                self,
                &self.ops.add_rms_norm_cl,
                cfg,
                &xp,
                &yp,
                &wp,
                &op,
                &g_i,
                &eps,
                &qp,
                &dsp,
                &pf
            )?;
            sc.xq_key = Some((op, x.rows, g, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        // A decode row: spread over blocks of 256 values (at most one per SM).
        let nb = g.div_ceil(NORM_ROW_THREADS);
        if self.norm_row
            && x.rows == 1
            && g.is_multiple_of(32)
            && nb > 1
            && nb <= NORM_ROW_BLOCKS.min(self.n_sm)
        {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (pp, cp) = self.norm_scratch(&mut sc)?;
            let (qp, dsp) = self.xq_reserve(&mut sc, 1, g / 32)?;
            let cfg = LaunchConfig {
                grid_dim: (nb as u32, 1, 1),
                block_dim: (NORM_ROW_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self,
                &self.ops.add_rms_norm_row,
                cfg,
                &xp,
                &yp,
                &wp,
                &op,
                &g_i,
                &eps,
                &qp,
                &dsp,
                &pp,
                &cp
            )?;
            sc.xq_key = Some((op, 1, g, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        if Self::fuse_q8_1(x.rows, x.cols) {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, x.rows, x.cols / 32)?;
            launch!(
                self,
                &self.ops.add_rms_norm_q,
                cfg,
                &xp,
                &yp,
                &wp,
                &op,
                &g_i,
                &eps,
                &qp,
                &dsp
            )?;
            sc.xq_key = Some((op, x.rows, x.cols, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        launch!(
            self,
            &self.ops.add_rms_norm,
            cfg,
            &xp,
            &yp,
            &wp,
            &op,
            &g_i,
            &eps
        )
    }

    pub(super) fn norm_add_rms_norm_op(
        &self,
        x: &mut CudaBuf,
        y: &mut CudaBuf,
        w_y: &CudaVector,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let g = x.cols;
        let block = 1024.min(g.div_ceil(32) * 32);
        if (x.rows, x.cols) != (y.rows, y.cols)
            || w_y.len != g
            || w.len != g
            || x.rows == 0
            || g > 8 * block
        {
            // Other shapes: the two ops (which check them).
            self.rms_norm_inplace(y, w_y, eps)?;
            return self.add_rms_norm(x, y, w, eps, out);
        }
        self.reshape(out, x.rows, g)?;
        let (xp, yp, wyp, wp, op) = (
            self.dptr(&x.data),
            self.dptr(&y.data),
            self.dptr(&w_y.data),
            self.dptr(&w.data),
            self.dptr(&out.data),
        );
        let g_i = g as i32;
        let wide = usize::from(g > block);
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        if Self::fuse_q8_1(x.rows, g) {
            let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            let (qp, dsp) = self.xq_reserve(&mut sc, x.rows, g / 32)?;
            launch!(
                self,
                &self.ops.norm_add_norm_q[wide],
                cfg,
                &xp,
                &yp,
                &wyp,
                &wp,
                &op,
                &g_i,
                &eps,
                &qp,
                &dsp
            )?;
            sc.xq_key = Some((op, x.rows, g, self.gen.load(Ordering::Relaxed)));
            return Ok(());
        }
        launch!(
            self,
            &self.ops.norm_add_norm[wide],
            cfg,
            &xp,
            &yp,
            &wyp,
            &wp,
            &op,
            &g_i,
            &eps
        )
    }
}
