//! RMSNorm on the CUDA backend: the per-group norm, the fused residual add + norm (one block
//! or, for a decode row, several blocks meeting at a barrier) and Gemma's post-norm + add +
//! norm; each may also write the q8_1 input of the next matmul.

use super::*;

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
        let cl = g.div_ceil(NORM_ROW_THREADS).clamp(2, NORM_CL_MAX);
        let cl_threads = g.div_ceil(cl).next_multiple_of(32);
        if self.norm_row
            && self.norm_cl
            && Self::fuse_q8_1(x.rows, g)
            && g > NORM_ROW_THREADS
            && cl_threads <= 1024
        {
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
            let (pp, cp) = match (&sc.norm_part, &sc.norm_cnt) {
                (Some(p), Some(c)) => (self.dptr(p), self.dptr(c)),
                _ => return Err(BackendError::Other("cuda: norm scratch missing".into())),
            };
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
