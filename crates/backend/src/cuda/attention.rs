//! RoPE, the KV-cache store (f16 or q8_0) and attention (split over the KV for decode) on
//! the CUDA backend; kernels in attention.cu.

use super::*;

/// Bytes of one layer's K (or V) cache: f16 `[n_kv_heads, n_ctx, head_dim]`, or q8_0's
/// codes `[n_kv_heads, n_ctx, head_dim]` i8 then scales `[n_kv_heads, n_ctx, head_dim/32]`
/// f16 (attention.cu `kv_q8_put`), rounded up to 256 so every layer's planes stay aligned for
/// 16-byte loads. None when it overflows.
pub(super) fn kv_layer_bytes(s: &KvShape) -> Option<usize> {
    let n = s.n_kv_heads.checked_mul(s.n_ctx)?.checked_mul(s.head_dim)?;
    let bytes = match s.ty {
        KvType::Q8_0 => n.checked_add(n / 16)?,
        _ => n.checked_mul(2)?,
    };
    bytes.checked_next_multiple_of(256)
}

/// Query heads a kv head and head sizes with a grouped attention kernel (attention.cu
/// `ATTENTION_GROUP_KERNELS`).
pub(super) const GROUPS: [usize; 4] = [2, 4, 6, 8];
pub(super) const GROUP_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Positions a split of the grouped kernel takes at least (a tile of 32 for each of its
/// four warps). Below what fills every SM with such splits the kernel a query head is
/// faster (H200, 27B Q1_0 shape, 6 query heads a kv head, tg64: grouped 251.5 vs 254.9
/// tok/s at depth 2048, 253.9 vs 241.2 at 4096, 239.8 vs 214.0 at 8192, 213.8 vs 172.7
/// at 16384; tg128 at depth 0 267.7 vs 284.4).
const GROUP_MIN_SPLIT: usize = 128;

/// The most splits of a row's positions (`att_combine` keeps their weights in shared
/// memory).
const ATT_SPLIT_MAX: usize = 128;

impl CudaBackend {
    pub(super) fn kv_layer_ptrs(&self, kv: &CudaKv, layer: usize) -> (u64, u64) {
        // Checked when the cache was allocated.
        let off = (layer * kv_layer_bytes(&kv.shape).unwrap_or(0)) as u64;
        (self.dptr(&kv.k) + off, self.dptr(&kv.v) + off)
    }

    pub(super) fn rope_op(
        &self,
        x: &mut CudaBuf,
        head_dim: usize,
        pos0: usize,
        rope: &Rope,
        freq_factors: Option<&CudaVector>,
    ) -> Result<()> {
        if head_dim == 0
            || !x.cols.is_multiple_of(head_dim)
            || rope.dims > head_dim
            || !rope.dims.is_multiple_of(2)
        {
            return Err(shape_err(
                "rope",
                format!("{} cols, head_dim {head_dim}, dims {}", x.cols, rope.dims),
            ));
        }
        if let Some(ff) = freq_factors {
            if ff.len < rope.dims / 2 {
                return Err(shape_err(
                    "rope",
                    format!("{} freq factors for {} dims", ff.len, rope.dims),
                ));
            }
        }
        if x.rows == 0 || rope.dims == 0 {
            return Ok(());
        }
        let n_dims = rope.dims;
        let RopeConsts {
            theta_scale,
            c0,
            c1,
            mscale_yarn,
        } = RopeConsts::of(rope);
        let xp = self.dptr(&x.data);
        let ffp = freq_factors.map_or(0u64, |v| self.dptr(&v.data));
        let posp = self.step_posp();
        let n_pairs = x.cols / head_dim * (n_dims / 2);
        // One thread per pair: a block per row looped 8 times over Llama 3 8B's q (6.9 µs).
        let block = n_pairs.clamp(32, 256).div_ceil(32) * 32;
        let cfg = LaunchConfig {
            grid_dim: (x.rows as u32, n_pairs.div_ceil(block) as u32, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (cols_i, hd_i, dims_i, pos_i, neox_i) = (
            x.cols as i32,
            head_dim as i32,
            n_dims as i32,
            pos0 as i32,
            rope.neox as i32,
        );
        launch!(
            self,
            &self.ops.rope,
            cfg,
            &xp,
            &cols_i,
            &hd_i,
            &dims_i,
            &pos_i,
            &neox_i,
            &theta_scale,
            &rope.freq_scale,
            &rope.ext_factor,
            &rope.attn_factor,
            &c0,
            &c1,
            &mscale_yarn,
            &ffp,
            &posp
        )
    }

    /// `attention`, storing k and v first where `store` (else a kernel before did), with
    /// the output gated where `gate` is set: the device address of the first gate of a
    /// gated layer's `[rows, n_heads·(query hd | gate hd)]` projection.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_launch(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        pos0: usize,
        q: &CudaBuf,
        k: &CudaBuf,
        v: &CudaBuf,
        attn: &Attn,
        out: &mut CudaBuf,
        store: bool,
        gate: u64,
    ) -> Result<()> {
        let (nh, nkv, hd) = (attn.n_heads, attn.n_kv_heads, attn.head_dim);
        let rows = q.rows;
        attn.check(
            &kv.shape,
            layer,
            pos0,
            (q.rows, q.cols),
            (k.rows, k.cols),
            (v.rows, v.cols),
        )?;
        self.reshape(out, rows, nh * hd)?;
        if rows == 0 {
            return Ok(());
        }
        let n_ctx = kv.shape.n_ctx;
        let (kc, vc) = self.kv_layer_ptrs(kv, layer);
        let posp = self.step_posp();
        let (kp, vp) = (self.dptr(&k.data), self.dptr(&v.data));
        let (rows_i, nkv_i, hd_i, nctx_i, pos_i) = (
            rows as i32,
            nkv as i32,
            hd as i32,
            n_ctx as i32,
            pos0 as i32,
        );
        let q8 = kv.shape.ty == KvType::Q8_0;
        if store {
            launch!(
                self,
                if q8 {
                    &self.ops.kv_store_q8
                } else {
                    &self.ops.kv_store
                },
                cfg1(rows * nkv * hd, 256),
                &kp,
                &vp,
                &kc,
                &vc,
                &rows_i,
                &nkv_i,
                &hd_i,
                &nctx_i,
                &pos_i,
                &posp
            )?;
        }
        let g_hs = 2 * hd as i32;
        // In a decode step: the lowest of the position's class (graph.rs).
        let last = self.split_last(pos0 + rows);
        let visible = match attn.window {
            Some(w) => last.min(w),
            None => last,
        };
        // Split the positions across blocks when there are too few (row, head) blocks to
        // fill the GPU (decode over a long cache); up to 256 positions one block per
        // (row, head) finishes sooner than a second launch (the merge) costs.
        let split = |blocks: usize, target: usize, min_per: usize| {
            if blocks >= target || visible <= 256 {
                1
            } else {
                (target / blocks)
                    .min(visible / min_per)
                    .clamp(1, ATT_SPLIT_MAX)
            }
        };
        // The grouped kernel (a block per kv head, row and split) where there is one and
        // it fills every SM with blocks of at least GROUP_MIN_SPLIT positions; else a
        // block per query head, row and split, att_blocks of them an SM.
        let group = self
            .ops
            .att_group
            .iter()
            .find(|(k, _)| nh % nkv == 0 && *k == (nh / nkv, hd, q8))
            .map(|(_, f)| f)
            .filter(|_| match self.att_group {
                Some(on) => on,
                None => visible >= GROUP_MIN_SPLIT * self.n_sm.div_ceil(rows * nkv),
            });
        let (grid_x, nsplit) = match group {
            Some(_) => (nkv, split(rows * nkv, self.n_sm, GROUP_MIN_SPLIT)),
            None => (nh, split(rows * nh, self.att_blocks * self.n_sm, 64)),
        };
        let qp = self.dptr(&q.data);
        let op = self.dptr(&out.data);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        // The output projection's q8_1 input, written by the kernel that writes the output
        // (a `quant_q8_1` launch fewer a layer).
        let with_q = Self::fuse_q8_1(rows, nh * hd) && hd.is_multiple_of(32);
        let (xqp, xdsp) = if with_q {
            self.xq_reserve(&mut sc, rows, nh * hd / 32)?
        } else {
            (0, 0)
        };
        let partp = if nsplit > 1 {
            let need = rows * nh * nsplit * (hd + 2);
            if sc.part.as_ref().is_none_or(|s| s.len() < need) {
                sc.part = Some(self.alloc_f32(need)?);
                self.scratch_moved();
            }
            sc.part.as_ref().map_or(0, |s| self.dptr(s))
        } else {
            0
        };
        let cfg = LaunchConfig {
            grid_dim: (grid_x as u32, rows as u32, nsplit as u32),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let nh_i = nh as i32;
        let window_i = attn.window.map_or(0, |w| w as i32);
        let softcap = attn.softcap.unwrap_or(0.0);
        let nsplit_i = nsplit as i32;
        launch!(
            self,
            match group {
                Some(f) => f,
                None if q8 => &self.ops.attention_q8,
                None => &self.ops.attention,
            },
            cfg,
            &qp,
            &kc,
            &vc,
            &op,
            &partp,
            &nh_i,
            &nkv_i,
            &hd_i,
            &nctx_i,
            &pos_i,
            &attn.scale,
            &window_i,
            &softcap,
            &nsplit_i,
            &posp,
            &gate,
            &g_hs,
            &xqp,
            &xdsp
        )?;
        if nsplit > 1 {
            let cfg = LaunchConfig {
                grid_dim: (nh as u32, rows as u32, 1),
                block_dim: (hd.next_multiple_of(32).min(256) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self,
                &self.ops.att_combine,
                cfg,
                &partp,
                &op,
                &nh_i,
                &hd_i,
                &nsplit_i,
                &gate,
                &g_hs,
                &xqp,
                &xdsp
            )?;
        }
        if with_q {
            sc.xq_key = Some((op, rows, nh * hd, self.gen.load(Ordering::Relaxed)));
        }
        Ok(())
    }

    /// `Backend::attention_block`: two launches where `qk_norm_rope` fuses — `qk_norm_rope`
    /// reading the queries out of a gated projection and storing k, v in the cache, then
    /// `attention` gating its output — instead of the separate ops' four to six (two column
    /// copies, the q/k op, the KV store, attention, the gate). NEAGARI_CUDA_FUSE_ATTN=0
    /// keeps the separate ops (H200 tg128: Q1_0 27B shape 229.8 → 232.5, Gemma 3 270M
    /// shape 1,117 → 1,151 with it).
    #[allow(clippy::too_many_arguments)] // the trait method's arguments, forwarded
    pub(super) fn attention_block_op(
        &self,
        kv: &mut CudaKv,
        layer: usize,
        pos0: usize,
        q: &mut CudaBuf,
        gated: bool,
        k: &mut CudaBuf,
        v: &CudaBuf,
        prep: &QkPrep<CudaVector>,
        attn: &Attn,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let (nh, hd) = (attn.n_heads, attn.head_dim);
        let q_cols = if gated { 2 * nh * hd } else { nh * hd };
        let fusable =
            self.fuse_attn && q.cols == q_cols && self.qk_fusable(q.rows, nh * hd, k, prep, hd);
        if !fusable {
            return crate::attention_block_ops(
                self, kv, layer, pos0, q, gated, k, v, prep, attn, out,
            );
        }
        let rows = q.rows;
        // The checks `attention` makes, before anything is stored.
        attn.check(
            &kv.shape,
            layer,
            pos0,
            (rows, nh * hd),
            (k.rows, k.cols),
            (v.rows, v.cols),
        )?;
        if rows == 0 {
            self.reshape(out, 0, nh * hd)?;
            return Ok(());
        }
        let qo = if gated {
            Some(self.buf(rows, nh * hd)?)
        } else {
            None
        }; // [rows, n_heads·hd]
        let (kc, vc) = self.kv_layer_ptrs(kv, layer);
        let store = super::fused::CacheStore {
            v: self.dptr(&v.data),
            k_cache: kc,
            v_cache: vc,
            n_ctx: kv.shape.n_ctx,
            q8: kv.shape.ty == KvType::Q8_0,
        };
        let q_hs = if gated { 2 * hd } else { hd };
        let qo_p = qo.as_ref().map_or(0, |b| self.dptr(&b.data));
        self.qk_norm_rope_launch(q, q_hs, qo_p, k, prep, hd, pos0, Some(store))?;
        let gate = if gated {
            self.dptr(&q.data) + (hd * 4) as u64
        } else {
            0
        };
        let qa = qo.as_ref().unwrap_or(q);
        self.attention_launch(kv, layer, pos0, qa, k, v, attn, out, false, gate)
    }
}

/// The host-side RoPE constants of the `rope` and `qk_norm_rope` kernels, computed as the
/// CPU's rope_cache computes them, so the angles round identically.
pub(super) struct RopeConsts {
    pub(super) theta_scale: f32,
    /// YaRN's ramp ends (0 without extrapolation mixing).
    pub(super) c0: f32,
    pub(super) c1: f32,
    pub(super) mscale_yarn: f32,
}

impl RopeConsts {
    pub(super) fn of(rope: &Rope) -> Self {
        let n_dims = rope.dims;
        let corr = |n_rot: f32| {
            n_dims as f32 * (rope.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * rope.base.ln())
        };
        let (c0, c1) = if rope.ext_factor != 0.0 {
            (
                corr(rope.beta_fast).floor().max(0.0),
                corr(rope.beta_slow).ceil().min(n_dims as f32 - 1.0),
            )
        } else {
            (0.0, 0.0)
        };
        RopeConsts {
            theta_scale: rope.base.powf(-2.0 / n_dims as f32),
            c0,
            c1,
            mscale_yarn: 1.0 + 0.1 * (1.0 / rope.freq_scale).ln(),
        }
    }
}
