//! Fused decode ops of the CUDA backend, each one launch where the separate ops took
//! several, with the separate ops' arithmetic (so the same results): the gate/up GEMV with
//! its GLU and the q8_1 of its output (`mvqg*`, gemv_int.cu; `mvsg_R`, gemv_stream.cu, for
//! one row; `mvrtg_4`, gemv_rows.cu, for 3–8 rows), and the attention input's
//! per-head q/k RMSNorm with RoPE (`qk_norm_rope`, attention.cu). The Gated DeltaNet step is in
//! hybrid.rs. NEAGARI_CUDA_FUSE=0 runs the separate ops instead.

use super::gemv_rows::MvrtPlan;
use super::norm::NrmArgs;
use super::*;

/// The largest gate matrix (rows × cols) whose GLU is fused into its GEMV. Fusing pays
/// where launches dominate (Gemma 3 270M, 2048 × 640: tg128 827 → 880 tok/s on the H200);
/// on the 27B's 17,408 × 5,120 the fused kernel (121 registers, gate then up in one
/// thread) streamed 0.98 TB/s against `matmul_multi`'s ~1.0 and the step lost 5%; again
/// with Q4_K's `mvqg1x4` at 60 registers (session 23: tg128 162.3 → 140.7 tok/s, 121.3 at
/// 2 rows a block; NEAGARI_CUDA_GLU_FUSE_MAX raises the bound for measuring).
pub(super) const GLU_FUSE_MAX: usize = 1 << 22;

/// The `act` argument of the GLU kernels (gemv_int.cu `glu_act_mul`): 0 SiLU, 1 GELU.
fn glu_act_code(act: GluAct) -> i32 {
    match act {
        GluAct::Silu => 0,
        GluAct::GeluTanh => 1,
    }
}

impl CudaBackend {
    /// A second q8_1 area (see [`Scratch::xq_alt`]) for up to `MV_MAX_ROWS` rows of
    /// `units`, grown if needed: the addresses of its codes and pairs for `rows` rows.
    fn xq_alt_reserve(&self, sc: &mut Scratch, rows: usize, units: usize) -> Result<(u64, u64)> {
        // Room for MV_MAX_ROWS rows of `units`.
        let need = MV_MAX_ROWS * units * 40;
        let p = self.q8_1_area(&mut sc.xq_alt, &mut sc.xq_alt_key, need, "second ")?;
        Ok((p, p + (rows * units * 32) as u64))
    }

    /// Whether x's q8_1 (at `qp`) is in the second area: a GLU kernel may not write g's
    /// there then, since it would overwrite x's while it is read.
    fn x_in_alt(&self, sc: &Scratch, qp: u64) -> bool {
        sc.xq_alt.as_ref().is_some_and(|b| self.dptr(b) == qp)
    }

    /// After a GLU launch wrote g (`gp`, n × rows) and u (`up`), and g's q8_1 into the
    /// second area where `g_q8`: cached quantizations of those addresses are stale.
    fn glu_written(
        &self,
        sc: &mut Scratch,
        (gp, up): (u64, u64),
        n: usize,
        rows: usize,
        g_q8: bool,
    ) {
        if sc.xq_key.is_some_and(|(p, ..)| p == gp || p == up) {
            sc.xq_key = None;
        }
        if g_q8 {
            sc.xq_alt_key = Some((gp, n, rows, self.gen.load(Ordering::Relaxed)));
        } else if sc.xq_alt_key.is_some_and(|(p, ..)| p == gp || p == up) {
            sc.xq_alt_key = None;
        }
    }

    /// Whether `matmul_glu` of `n` rows would run `matmul_multi` over gate and up, then the
    /// GLU kernel: one row where neither a streaming GLU kernel (`mvsg_R`) nor `mvqg*` takes
    /// it (`mvqg*` steps aside for the streaming GEMV); 3–8 rows through the ring (`mvrtg_4`
    /// takes only whole-tile plans, and the fused kernels step aside for the tensor cores).
    /// What `add_rms_norm_matmul_glu` folds the norm into.
    pub(super) fn glu_apart(&self, gate: &CudaMat, up: &CudaMat, n: usize) -> bool {
        let Some(k) = &gate.k.int else {
            return false;
        };
        if n > 1 {
            return self.multi_ring(&[gate, up], n, gate.cols);
        }
        let fused = self.fuse && self.mv_int && glu_pair(gate, up, gate.cols);
        let stream = self.mvs.is_some() && !k.stream.is_empty();
        let mvsg = fused && self.glu_stream_plan(k, gate).is_some();
        let mvqg = fused && gate.rows * gate.cols <= self.glu_fuse_max && !stream;
        n == 1 && !mvsg && !mvqg
    }

    pub(super) fn matmul_glu_op(
        &self,
        gate: &CudaMat,
        up: &CudaMat,
        x: &CudaBuf,
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<()> {
        let n = x.rows;
        // Gate and up of one format and shape over x: what the fused kernels take.
        let pair = glu_pair(gate, up, x.cols);
        if self.fuse && self.mv_int && pair {
            if let Some(k) = &gate.k.int {
                if n == 1 && self.matmul_glu_stream(k, gate, up, x, act, g, u, None)? {
                    return Ok(());
                }
                if n > 1 && self.matmul_glu_rows(k, gate, up, x, act, g, u, None)? {
                    return Ok(());
                }
            }
        }
        let fused = self.fuse
            && self.mv_int
            && (1..=MV_MAX_ROWS).contains(&n)
            && pair
            && gate.rows * gate.cols <= self.glu_fuse_max;
        // Where the separate GEMV runs on the tensor cores (3–8 rows of a format that has
        // that kernel), the separate ops: the same bits, and that kernel's speed.
        // Likewise where one row takes the streaming GEMV (gemv_stream.cu).
        let k = match (&gate.k.int, fused) {
            (Some(k), true)
                if self.mvr_kernels(k, n).is_none()
                    && !(n == 1 && self.mvs.is_some() && !k.stream.is_empty()) =>
            {
                k
            }
            _ => {
                self.matmul_multi_op(&[gate, up], x, &mut [&mut *g, &mut *u])?;
                return self.glu(g, u, act);
            }
        };
        let (rows, cols) = (gate.rows, gate.cols);
        self.reshape(g, n, rows)?;
        self.reshape(u, n, rows)?;
        let units = cols.div_ceil(32);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, x, cols)?;
        // The down projection's q8_1 input, when g is whole 32-value units (and x's is
        // not in the second area, which it would overwrite while it is read).
        let (oq, ods, cp) = if rows.is_multiple_of(32) && !self.x_in_alt(&sc, qp) {
            let (oq, ods) = self.xq_alt_reserve(&mut sc, n, rows / 32)?;
            (oq, ods, self.fuse_counters(&mut sc, rows / 32)?)
        } else {
            (0, 0, 0)
        };
        // Each block does its rows of both matrices: rows per block as for one matrix.
        let (func, r) = match n {
            1 => match self.mv_per_block(rows, cols, gate.row_bytes, k.step) {
                1 => (&k.glu[0], 1),
                2 => (&k.glu[1], 2),
                8 => (&k.glu[3], 8),
                _ => (&k.glu[2], 4),
            },
            2 => (&k.glu[4], 2),
            3 | 4 => (&k.glu[5], 1),
            _ => (&k.glu[6], 1),
        };
        // The GEMV's block shape for one matrix, with a power of two of row groups (the
        // repacked formats), so that a block's rows are whole 32-row units or divide one.
        let (bx, by) = self.mv_block(k, units, rows, r);
        let by = 1usize << by.max(1).ilog2();
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(r * by) as u32, 1, 1),
            block_dim: (bx as u32, by as u32, 1),
            shared_mem_bytes: 0,
        };
        let (wg, wu, gp, up_) = (
            self.dptr(&gate.data),
            self.dptr(&up.data),
            self.dptr(&g.data),
            self.dptr(&u.data),
        );
        let (rows_i, units_i, rb, nr_i) =
            (rows as i32, units as i32, gate.row_bytes as i64, n as i32);
        let act_i = glu_act_code(act);
        // `@keep`: x's q8_1 stays valid for other matmuls of x.
        launch!(
            @keep self, func, cfg, &wg, &wu, &qp, &dsp, &gp, &up_, &rows_i, &units_i, &rb,
            &nr_i, &act_i, &oq, &ods, &cp
        )?;
        self.glu_written(&mut sc, (gp, up_), n, rows, oq != 0);
        Ok(())
    }

    /// The `mvrtg_4` launch and its plan where `matmul_glu` of `n` rows over gate and up
    /// takes it (`matmul_glu_rows`): the separate GEMV would take `mvrt_4` with whole rows and
    /// one copy a tile, and the rows are whole 32-row units.
    pub(super) fn glu_rows_plan<'a>(
        &self,
        k: &'a IntKernels,
        gate: &CudaMat,
        up: &CudaMat,
        n: usize,
    ) -> Option<(&'a CudaFunction, MvrtPlan<'a>)> {
        let func = k.rows_tma.as_ref().and_then(|t| t.glu.as_ref())?;
        if !self.glu_rows || self.mvr_kernels(k, n).is_none() || !gate.rows.is_multiple_of(32) {
            return None;
        }
        let (wg, wu) = (self.dptr(&gate.data), self.dptr(&up.data));
        let aligned = wg.is_multiple_of(16) && wu.is_multiple_of(16);
        let p = self.mvr_tma(k, gate.cols.div_ceil(32), gate.row_bytes, aligned)?;
        (p.rows == 4 * MVR_ROWS && p.tile_whole()).then_some((func, p))
    }

    /// 3–8 rows' gate/up GEMV and GLU as one gemv_rows.cu `mvrtg_4` launch (with the q8_1 of
    /// g for the down projection), where `glu_rows_plan` holds; `false`: not taken. With
    /// `nrm` it finishes the norm before it (norm.rs `norm_glu_op`; x's q8_1 is then
    /// that of x·w). 27B gate/up (17,408 × 5,120), 8-row greedy step (H200, same call):
    /// Q1_0 5.569 → 5.480 ms, TQ2_0 6.753 → 6.768 (level).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_glu_rows(
        &self,
        k: &IntKernels,
        gate: &CudaMat,
        up: &CudaMat,
        x: &CudaBuf,
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
        nrm: Option<NrmArgs>,
    ) -> Result<bool> {
        let Some((func, p)) = self.glu_rows_plan(k, gate, up, x.rows) else {
            return Ok(false);
        };
        let (n, rows, cols) = (x.rows, gate.rows, gate.cols);
        let units = cols.div_ceil(32);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, x, cols)?;
        // g's q8_1 goes to the second area.
        if self.x_in_alt(&sc, qp) {
            if nrm.is_some() {
                return Err(BackendError::Other(
                    "cuda: a norm folded into a GLU whose input is in the second area".into(),
                ));
            }
            return Ok(false);
        }
        self.reshape(g, n, rows)?;
        self.reshape(u, n, rows)?;
        let (oq, ods) = self.xq_alt_reserve(&mut sc, n, rows / 32)?;
        // A block a tile block, or (glu_loop) fewer blocks taking several each, two tiles
        // of shared memory where they fit (MVR_TMA_MAX is the kernel's limit).
        let nblk = rows / 32;
        let grid = match self.glu_loop {
            0 => nblk,
            n => nblk.min(n * self.n_sm),
        };
        let bufs: u32 = if grid < nblk && self.glu_bufs == 2 && 2 * p.smem as usize <= MVR_TMA_MAX {
            2
        } else {
            1
        };
        let cfg = LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: ((MVR_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: bufs * p.smem,
        };
        let parts = glu_split(
            self.glu_split,
            nblk,
            grid,
            units,
            k.rows_tma.as_ref().map_or(0, |t| t.group_units),
        );
        let ks = if parts > 1 {
            // The parts' sums: MT·128 (MT = 4) a part of each tile block left over.
            let left = nblk % grid;
            self.ks_scratch(&mut sc, left * parts * 512, left)?
        } else {
            Default::default()
        };
        let parts_i = parts as i32;
        let (wg, wu) = (self.dptr(&gate.data), self.dptr(&up.data));
        let (gp, up_) = (self.dptr(&g.data), self.dptr(&u.data));
        let (rows_i, units_i, rb, nr_i, bufs_i) = (
            rows as i32,
            units as i32,
            gate.row_bytes as i64,
            n as i32,
            bufs as i32,
        );
        let act_i = glu_act_code(act);
        let nrm = nrm.unwrap_or_default();
        // `@keep`: x's q8_1 stays valid for other matmuls of x.
        launch!(
            @keep self, func, cfg, &wg, &wu, &qp, &dsp, &gp, &up_, &rows_i, &units_i, &rb,
            &nr_i, &act_i, &oq, &ods, &bufs_i, &nrm, &parts_i, &ks
        )?;
        self.glu_written(&mut sc, (gp, up_), n, rows, true);
        Ok(true)
    }

    /// The `mvsg_R` launch and its (R, K, G) where `matmul_glu` of one row over gate and up
    /// takes it (`matmul_glu_stream`).
    pub(super) fn glu_stream_plan<'a>(
        &self,
        k: &'a IntKernels,
        gate: &CudaMat,
    ) -> Option<(&'a CudaFunction, MvsShape)> {
        let units = gate.cols.div_ceil(32);
        let steps = units / k.step;
        let (Some(shape), Some(_)) = (self.mvsg, self.mvs) else {
            return None;
        };
        if !(1..=256).contains(&steps) || units != steps * k.step {
            return None;
        }
        let (r, kc, gg) = super::matmul::mvsg_geometry(shape, steps, gate.row_bytes)?;
        let (_, func) = k.stream_glu.iter().find(|(s, _)| *s == r)?;
        Some((func, (r, kc, gg)))
    }

    /// Whether `glu_stream_plan`'s launch can finish a norm (norm.rs `stage_fits`): what
    /// `norm_glu_op` folds a norm into at one row.
    pub(super) fn glu_stream_folds(&self, k: &IntKernels, gate: &CudaMat) -> bool {
        self.glu_stream_plan(k, gate).is_some_and(|(_, shape)| {
            let (blocks, steps, gg) = glu_stream_grid(k, gate, shape);
            super::norm::stage_fits(blocks, steps * gg, gate.cols)
        })
    }

    /// One activation row's gate/up GEMV and GLU as one gemv_stream.cu `mvsg_R` launch
    /// (with the q8_1 of g for the down projection where its rows are whole units), where
    /// `matmul_multi` would run `mvs_R` over both (`glu_stream_plan`): `false` where it does
    /// not fit, and nothing was launched. With `nrm` it finishes the norm before it (norm.rs
    /// `norm_glu_op`; x's q8_1 is then that of x·w).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_glu_stream(
        &self,
        k: &IntKernels,
        gate: &CudaMat,
        up: &CudaMat,
        x: &CudaBuf,
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
        nrm: Option<NrmArgs>,
    ) -> Result<bool> {
        let Some((func, (r, kc, gg))) = self.glu_stream_plan(k, gate) else {
            return Ok(false);
        };
        let (rows, cols) = (gate.rows, gate.cols);
        let units = cols.div_ceil(32);
        let (blocks, steps, gg) = glu_stream_grid(k, gate, (r, kc, gg));
        self.reshape(g, 1, rows)?;
        self.reshape(u, 1, rows)?;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, x, cols)?;
        // The down projection's q8_1 input.
        let (oq, ods) = if rows.is_multiple_of(32) && !self.x_in_alt(&sc, qp) {
            self.xq_alt_reserve(&mut sc, 1, rows / 32)?
        } else {
            (0, 0)
        };
        if nrm.is_some() && !super::norm::stage_fits(blocks, steps * gg, cols) {
            return Err(BackendError::Other(
                "cuda: a norm folded into a GLU that cannot finish it".into(),
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (steps as u32, gg as u32, 1),
            shared_mem_bytes: 0,
        };
        let (wg, wu, gp, up_) = (
            self.dptr(&gate.data),
            self.dptr(&up.data),
            self.dptr(&g.data),
            self.dptr(&u.data),
        );
        let (rows_i, units_i, rb, k_i) =
            (rows as i32, units as i32, gate.row_bytes as i64, kc as i32);
        let act_i = glu_act_code(act);
        let nrm = nrm.unwrap_or_default();
        // `@keep`: x's q8_1 stays valid for other matmuls of x.
        launch!(
            @keep self, func, cfg, &wg, &wu, &qp, &dsp, &gp, &up_, &rows_i, &units_i, &rb,
            &k_i, &act_i, &oq, &ods, &nrm
        )?;
        self.glu_written(&mut sc, (gp, up_), 1, rows, oq != 0);
        Ok(true)
    }

    #[allow(clippy::too_many_arguments)] // the trait method's arguments, forwarded
    pub(super) fn qk_norm_rope_op(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        q_norm: Option<&CudaVector>,
        k_norm: Option<&CudaVector>,
        eps: f32,
        head_dim: usize,
        pos0: usize,
        rope_q: &Rope,
        rope_k: &Rope,
        freq_factors: Option<&CudaVector>,
    ) -> Result<()> {
        let hd = head_dim;
        let prep = QkPrep {
            q_norm,
            k_norm,
            eps,
            rope_q,
            rope_k,
            freq_factors,
        };
        if !(self.fuse && self.qk_fusable(q.rows, q.cols, k, &prep, hd)) {
            if let Some(w) = q_norm {
                self.rms_norm_inplace(q, w, eps)?;
            }
            if let Some(w) = k_norm {
                self.rms_norm_inplace(k, w, eps)?;
            }
            self.rope_op(q, hd, pos0, rope_q, freq_factors)?;
            return self.rope_op(k, hd, pos0, rope_k, freq_factors);
        }
        self.qk_norm_rope_launch(q, hd, 0, k, &prep, hd, pos0, None)
    }

    /// Whether `qk_norm_rope` (attention.cu) takes these shapes: queries `[rows, q_cols]`, k.
    pub(super) fn qk_fusable(
        &self,
        rows: usize,
        q_cols: usize,
        k: &CudaBuf,
        prep: &QkPrep<CudaVector>,
        hd: usize,
    ) -> bool {
        let (rope_q, rope_k) = (prep.rope_q, prep.rope_k);
        let same_rope = Rope {
            attn_factor: 1.0,
            ..*rope_q
        } == Rope {
            attn_factor: 1.0,
            ..*rope_k
        };
        same_rope
            && hd > 0
            && hd <= 1024
            && rows == k.rows
            && q_cols.is_multiple_of(hd)
            && k.cols.is_multiple_of(hd)
            && prep.q_norm.is_none_or(|w| w.len == hd)
            && prep.k_norm.is_none_or(|w| w.len == hd)
            && rope_q.dims <= hd
            && rope_q.dims.is_multiple_of(2)
            && prep.freq_factors.is_none_or(|f| f.len >= rope_q.dims / 2)
    }

    /// The RoPE and norm constants of `prep` at `pos0` for attention.cu's `QkArgs` (q and k share
    /// every RoPE parameter but the attention factor).
    pub(super) fn qk_args(&self, prep: &QkPrep<CudaVector>, pos0: usize) -> QkArgs {
        let rope = prep.rope_q;
        let c = super::attention::RopeConsts::of(rope);
        QkArgs {
            wq: prep.q_norm.map_or(0, |w| self.dptr(&w.data)),
            wk: prep.k_norm.map_or(0, |w| self.dptr(&w.data)),
            ff: prep.freq_factors.map_or(0, |v| self.dptr(&v.data)),
            posp: self.step_posp(),
            eps: prep.eps,
            theta_scale: c.theta_scale,
            freq_scale: rope.freq_scale,
            ext_factor: rope.ext_factor,
            attn_q: prep.rope_q.attn_factor,
            attn_k: prep.rope_k.attn_factor,
            c0: c.c0,
            c1: c.c1,
            mscale_yarn: c.mscale_yarn,
            dims: rope.dims as i32,
            neox: rope.neox as i32,
            pos0: pos0 as i32,
        }
    }

    /// One `qk_norm_rope` launch (shapes checked by `qk_fusable`): the queries are q's
    /// heads `q_hs` values apart, written to `qo` (a device address; 0: in place), k in
    /// place; with `store` (v's address, the layer's k and v cache, n_ctx) k and v also go
    /// to the f16 cache at their positions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn qk_norm_rope_launch(
        &self,
        q: &CudaBuf,
        q_hs: usize,
        qo: u64,
        k: &mut CudaBuf,
        prep: &QkPrep<CudaVector>,
        hd: usize,
        pos0: usize,
        store: Option<CacheStore>,
    ) -> Result<()> {
        let (nh, nkv) = (q.cols / q_hs, k.cols / hd);
        if q.rows == 0 || nh + nkv == 0 {
            return Ok(());
        }
        let args = self.qk_args(prep, pos0);
        let (qp, kp) = (self.dptr(&q.data), self.dptr(&k.data));
        let (vs, kc, vc, n_ctx, q8) = store.as_ref().map_or((0, 0, 0, 0, false), |s| {
            (s.v, s.k_cache, s.v_cache, s.n_ctx, s.q8)
        });
        // v's heads take nkv more blocks when they are stored here.
        let heads = nh + nkv + if store.is_some() { nkv } else { 0 };
        let cfg = LaunchConfig {
            grid_dim: (q.rows as u32, heads as u32, 1),
            block_dim: (hd.div_ceil(32) as u32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (nh_i, nkv_i, hd_i) = (nh as i32, nkv as i32, hd as i32);
        let (q_hs_i, n_ctx_i) = (q_hs as i32, n_ctx as i32);
        launch!(
            self,
            if q8 {
                &self.ops.qk_norm_rope_q8
            } else {
                &self.ops.qk_norm_rope
            },
            cfg,
            &qp,
            &kp,
            &args,
            &nh_i,
            &nkv_i,
            &hd_i,
            &q_hs_i,
            &qo,
            &vs,
            &kc,
            &vc,
            &n_ctx_i
        )
    }
}

/// Where `qk_norm_rope` also stores a step's k and v: v's rows (`[rows, nkv·hd]` f32) and
/// one layer's K and V caches (`kv_layer_ptrs`), f16 or q8_0.
pub(super) struct CacheStore {
    pub(super) v: u64,
    pub(super) k_cache: u64,
    pub(super) v_cache: u64,
    pub(super) n_ctx: usize,
    pub(super) q8: bool,
}

/// attention.cu's `QkArgs`, field for field (device addresses as u64; 0 is null).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct QkArgs {
    wq: u64,
    wk: u64,
    ff: u64,
    posp: u64,
    eps: f32,
    theta_scale: f32,
    freq_scale: f32,
    ext_factor: f32,
    attn_q: f32,
    attn_k: f32,
    c0: f32,
    c1: f32,
    mscale_yarn: f32,
    dims: i32,
    neox: i32,
    pos0: i32,
}

// SAFETY: plain old data of the kernel parameter's C layout (8-byte pointers first, then
// 4-byte fields: 80 bytes, no padding), passed by value.
unsafe impl DeviceRepr for QkArgs {}
const _: () = assert!(std::mem::size_of::<QkArgs>() == 80);

/// `mvsg_R`'s grid at `glu_stream_plan`'s (R, K, G): blocks, then a block's threads as
/// (steps, G); a block takes (G / 2)·R·K rows of gate and the same rows of up.
fn glu_stream_grid(k: &IntKernels, gate: &CudaMat, (r, kc, gg): MvsShape) -> (usize, usize, usize) {
    let steps = gate.cols.div_ceil(32) / k.step;
    (gate.rows.div_ceil(gg / 2 * r * kc), steps, gg)
}

/// Gate and up of one format and shape over inputs of `cols`: what the fused GLU kernels take.
pub(super) fn glu_pair(gate: &CudaMat, up: &CudaMat, cols: usize) -> bool {
    gate.ty == up.ty
        && (gate.rows, gate.cols, gate.row_bytes) == (up.rows, up.cols, up.row_bytes)
        && gate.cols == cols
}

/// Parts of K for `mvrtg_4`'s tile blocks past its whole rounds (gemv_rows.cu): the 27B's
/// 17,408 gate/up rows are 544 tile blocks, 2.06 rounds of 264 blocks, and ROWS=8 timed
/// 16,896 rows (2.00 rounds) at 20.1 µs against 25.5 (session 37): the 16 left over cost a
/// whole third round. Split, they are `parts` short items instead. At most `want` parts,
/// MVRTG_MAXP and the row's groups of `group_units` units (every part some groups), only
/// where the items fit in the grid beside nothing else; 1: whole.
fn glu_split(want: usize, nblk: usize, grid: usize, units: usize, group_units: usize) -> usize {
    let left = nblk % grid.max(1);
    if want < 2
        || left == 0
        || grid >= nblk
        || group_units == 0
        || !units.is_multiple_of(group_units)
    {
        return 1;
    }
    let groups = units / group_units;
    let mut parts = want.min(groups).min(grid / left).min(super::MVRTG_MAXP);
    // Every part some groups: per · (parts − 1) < groups.
    while parts > 1 && groups.div_ceil(parts) * (parts - 1) >= groups {
        parts -= 1;
    }
    parts.max(1)
}

#[cfg(test)]
mod tests {
    use super::glu_split;

    #[test]
    fn left_over_tile_blocks_split_in_whole_groups() {
        // The 27B's gate/up on an H100 at two blocks an SM: 544 tile blocks, 264 blocks, 16
        // left; Q1_0's 5,120-wide rows are 5 groups of 32 units.
        assert_eq!(glu_split(8, 544, 264, 160, 32), 5);
        // 20 groups: at most MVRTG_MAXP = 8 parts, and 8 of 3 groups leave the last empty: 7.
        assert_eq!(glu_split(16, 544, 264, 640, 32), 7);
        assert_eq!(glu_split(3, 544, 264, 160, 32), 3);
        // 4 parts of 5 groups would leave the last empty (2, 2, 1, 0): 3.
        assert_eq!(glu_split(4, 544, 264, 160, 32), 3);
        // Off, nothing left, one round, ragged groups, not room for the items.
        assert_eq!(glu_split(0, 544, 264, 160, 32), 1);
        assert_eq!(glu_split(5, 528, 264, 160, 32), 1);
        assert_eq!(glu_split(5, 200, 264, 160, 32), 1);
        assert_eq!(glu_split(5, 544, 264, 80, 32), 1);
        assert_eq!(glu_split(5, 272 + 130, 136, 160, 32), 1);
        // On 132 SMs at one block an SM (cuda_ops' 8,704 rows): 272 tile blocks, 8 left.
        assert_eq!(glu_split(5, 272, 132, 160, 32), 5);
    }
}
