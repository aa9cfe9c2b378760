//! Matmul on the CUDA backend: per-format kernel loading, the integer (q8_1 × packed) and
//! float GEMVs for up to 8 activation rows, `matmul_multi`'s grouped launches, and prefill
//! through an f16 tile and cuBLAS. The kernels are gemv_int.cu, matmul.cu and lowbit.cu;
//! which tensor-core GEMV takes 3–8 rows, and its shape, is gemv_rows.rs.

use cudarc::cublas::sys as blas_sys;

use super::norm::NrmArgs;
use super::*;

impl CudaBackend {
    /// A module (name, defines, source) compiled for this device (or from the PTX caches)
    /// and loaded.
    fn load_module(
        &self,
        (name, defines, src): (String, String, String),
    ) -> Result<Arc<cudarc::driver::CudaModule>> {
        let ptx = compile(&name, &self.arch, &defines, &src)?;
        self.ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(drv)
    }

    pub(super) fn fmt_kernels(&self, ty: GgmlType) -> Result<Arc<FmtKernels>> {
        let mut fm = self.fmts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = fm.get(&ty) {
            return Ok(k.clone());
        }
        let names = fmt_structs(ty, self.repack, self.mvr_k16).ok_or(BackendError::NoKernel {
            op: "matmul",
            device: "cuda",
            ty,
        })?;
        let m = self.load_module(fmt_module(&names))?;
        let f = |n: &str| m.load_function(n).map_err(drv);
        // gemv_stream.cu's `<name>_R` by R, where the module has them.
        let by_r = |name: &str| -> Result<Vec<(usize, CudaFunction)>> {
            if !names.stream {
                return Ok(Vec::new());
            }
            MVS_R
                .iter()
                .map(|&r| Ok((r, f(&format!("{name}_{r}"))?)))
                .collect()
        };
        let k = Arc::new(FmtKernels {
            mv: [f("mv1")?, f("mv2")?, f("mv4")?, f("mv8")?],
            mv1x4: f("mv1x4")?,
            embed: f("embed")?,
            dequant_f16: f("dequant_f16")?,
            int: match names.q {
                Some(_) => Some(IntKernels {
                    step: if self.repack && repack::repacked(ty) {
                        4
                    } else {
                        1
                    },
                    quant: f("quant_q8_1")?,
                    mv: [f("mvq1")?, f("mvq2")?, f("mvq4")?, f("mvq8")?],
                    mv1x4: f("mvq1x4")?,
                    mv1x4u: f("mvq1x4u")?,
                    mv1x8: f("mvq1x8")?,
                    mv1x1: f("mvq1x1")?,
                    multi_u: f("mvqm1x4u")?,
                    multi: [
                        f("mvqm1x1")?,
                        f("mvqm1x2")?,
                        f("mvqm1x4")?,
                        f("mvqm2")?,
                        f("mvqm4")?,
                        f("mvqm8")?,
                        f("mvqm1x8")?,
                    ],
                    glu: [
                        f("mvqg1x1")?,
                        f("mvqg1x2")?,
                        f("mvqg1x4")?,
                        f("mvqg1x8")?,
                        f("mvqg2")?,
                        f("mvqg4")?,
                        f("mvqg8")?,
                    ],
                    rows: match names.rows {
                        Some(_) => Some([f("mvr")?, f("mvrm")?]),
                        None => None,
                    },
                    rows_tma: match (names.rows.as_ref(), names.block) {
                        (Some(_), Some((_, group_units))) if !self.mvrt_tiles.is_empty() => {
                            Some(RowsTma {
                                funcs: self.mvrt_funcs(&f)?,
                                group_units,
                                glu: self.mvrt4_func(&f, "mvrtg_4")?,
                                wide: self.mvrt4_func(&f, "mvrt_4w")?,
                            })
                        }
                        _ => None,
                    },
                    stream: by_r("mvs")?,
                    stream_glu: by_r("mvsg")?,
                }),
                None => None,
            },
        });
        fm.insert(ty, k.clone());
        Ok(k)
    }

    /// Packed rows of a host tensor as the kernels read them (float rows padded to whole
    /// 32-value units; Q1_0, TQ2_0 and Q4_K in repack.rs's layouts when `repack`).
    pub(super) fn pack_rows(
        t: &HostTensor,
        rows: usize,
        cols: usize,
        repack: bool,
    ) -> Result<(Vec<u8>, usize)> {
        let src = t.bytes.as_slice();
        let row_bytes = t.ty.row_bytes(cols).ok_or_else(|| {
            shape_err(
                "load_mat",
                format!("{}: row of {cols} is not whole {} blocks", t.name, t.ty),
            )
        })?;
        if row_bytes * rows != src.len() {
            return Err(shape_err(
                "load_mat",
                format!("{}: {} bytes for {rows}x{cols} {}", t.name, src.len(), t.ty),
            ));
        }
        if repack {
            if let Some(packed) = repack::repack_rows(t.ty, src, rows, row_bytes) {
                return Ok(packed);
            }
        }
        if !is_float(t.ty) || cols.is_multiple_of(32) {
            return Ok((src.to_vec(), row_bytes));
        }
        let padded = cols.div_ceil(32) * 32 * (row_bytes / cols);
        let mut out = vec![0u8; padded * rows];
        for r in 0..rows {
            out[r * padded..r * padded + row_bytes]
                .copy_from_slice(&src[r * row_bytes..(r + 1) * row_bytes]);
        }
        Ok((out, padded))
    }

    /// Device addresses of the q8_1 codes and (d, d·Σq) pairs of `rows` × `units` in the
    /// scratch, grown if needed (which drops what it held).
    pub(super) fn xq_reserve(
        &self,
        sc: &mut Scratch,
        rows: usize,
        units: usize,
    ) -> Result<(u64, u64)> {
        let codes = rows * units * 32;
        // The pairs follow the codes, 8-byte aligned (codes are whole 32s).
        let qp = self.q8_1_area(&mut sc.xq, &mut sc.xq_key, codes + rows * units * 8, "")?;
        Ok((qp, qp + codes as u64))
    }

    /// The device address of a q8_1 scratch area (`xq` or `xq_alt` and its key), grown to
    /// `need` bytes (at least 64 KiB) if smaller; growing clears the key and moves the
    /// scratch epoch (graph.rs). A q8_1 writer (quant_q8_1, rms_norm_q, glu_*_q, mvqg*)
    /// fills every byte a GEMV reads before it runs (same stream).
    pub(super) fn q8_1_area(
        &self,
        area: &mut Option<CudaSlice<u8>>,
        key: &mut Option<(u64, usize, usize, u64)>,
        need: usize,
        which: &str,
    ) -> Result<u64> {
        if area.as_ref().is_none_or(|b| b.len() < need) {
            self.check_alloc(&format!("the {which}q8_1 scratch"))?;
            self.scratch_moved();
            *area = None;
            *key = None;
            // SAFETY: u8 has no invalid bit patterns; see above for who writes the bytes.
            *area = Some(
                unsafe { self.stream.alloc::<u8>(need.max(1 << 16)) }
                    .map_err(|e| BackendError::OutOfMemory(format!("q8_1 scratch: {e:?}")))?,
            );
        }
        Ok(area.as_ref().map_or(0, |b| self.dptr(b)))
    }

    /// Whether an op writing `rows` × `cols` at `op` should also write it as q8_1: decode
    /// rows (they go to the GEMV) of whole 32-value units.
    pub(super) fn fuse_q8_1(rows: usize, cols: usize) -> bool {
        rows <= MV_MAX_ROWS && cols.is_multiple_of(32) && cols > 0
    }

    /// The q8_1 copy of `x` (`cols` wide) in the scratch: reused when it is still what the
    /// scratch holds (see [`Scratch::xq_key`]), else one `quant_q8_1` launch.
    pub(super) fn xq_input(
        &self,
        sc: &mut Scratch,
        k: &IntKernels,
        x: &CudaBuf,
        cols: usize,
    ) -> Result<(u64, u64)> {
        let (n, units) = (x.rows, cols.div_ceil(32));
        let xp = self.dptr(&x.data);
        let key = (xp, n, cols, self.gen.load(Ordering::Relaxed));
        // Written by the gate/up GEMV that made x (fused.rs), in the second area.
        if let (true, Some(b)) = (sc.xq_alt_key == Some(key), &sc.xq_alt) {
            let p = self.dptr(b);
            return Ok((p, p + (n * units * 32) as u64));
        }
        let fresh = sc.xq_key == Some(key);
        let (qp, dsp) = self.xq_reserve(sc, n, units)?;
        if !fresh {
            let (cols_i, units_i) = (cols as i32, units as i32);
            let cfg = LaunchConfig {
                grid_dim: (units.div_ceil(4) as u32, n as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(@keep self, &k.quant, cfg, &xp, &qp, &dsp, &cols_i, &units_i)?;
            sc.xq_key = Some(key);
        }
        Ok((qp, dsp))
    }

    /// Warps per block of the integer GEMV for rows of `units` thread steps (32-value
    /// units, or [`IntKernels::step`] of them): the fewest that take the row in the fewest
    /// rounds of one step a thread. With four warps a 5120-wide row (160 units) took two
    /// rounds, the second with a quarter of the threads.
    pub(super) fn mv_warps(&self, units: usize) -> usize {
        if let Some(w) = self.mv_warps {
            return w;
        }
        let rounds = units.div_ceil(32 * MVQ_WARPS).max(1);
        units.div_ceil(32 * rounds).clamp(1, MVQ_WARPS)
    }

    /// Whether one activation row's 4-row-block GEMV of `rows` rows in all takes `mvq1x4u`
    /// (`mvqm1x4u` in `matmul_multi`) on half the warps `mv_warps` picks, two rounds a
    /// thread: rows of one round of more than one warp, in fewer than `limit` blocks an SM
    /// (`mv_half`; `mvm_half` for several matrices). The 27B's 5120 × 6144 ssm_out and o,
    /// 1,280 blocks: 9.16 → 7.29 µs (H200). Q4_K only: its `mvq_split` loads a round's rows
    /// apart from their arithmetic (`load_u`, vecdot.cuh); the other formats would run
    /// `mvq_impl` there.
    pub(super) fn half_warps(&self, ty: GgmlType, units: usize, rows: usize, limit: usize) -> bool {
        self.mvq_split
            && ty == GgmlType::Q4_K
            && self.mv_warps.is_none()
            && units > 32
            && units <= self.mv_warps(units) * 32
            && rows.div_ceil(4) < limit * self.n_sm
    }

    /// Block shape `(x, y)` of the integer GEMV for `rows` weight rows of `units` units, `r`
    /// rows a thread group: `y` groups of `x` threads (gemv_int.cu). Formats of one unit a
    /// step: one group of `mv_warps` warps, or, for rows of at most 32 units, groups of one
    /// warp as many as leave two blocks an SM. The repacked ones (`step` 4): a group is the
    /// row's step count where that is at most 256 (no idle lanes: a 5120-wide Q1_0 row is 40
    /// steps), as many groups as fit 256 threads while that leaves two blocks an SM; wider
    /// rows or NEAGARI_CUDA_MV_WARPS take one group of `mv_warps` warps.
    pub(super) fn mv_block(
        &self,
        k: &IntKernels,
        units: usize,
        rows: usize,
        r: usize,
    ) -> (usize, usize) {
        let steps = units / k.step;
        let most = MVQ_WARPS * 32;
        if self.mv_warps.is_some() || self.mv_groups == Some(1) {
            return (self.mv_warps(steps) * 32, 1);
        }
        if k.step == 1 {
            // Rows of one warp's units: groups of one warp, as many as leave two blocks an
            // SM (the 262,144-row head of Gemma 3: one-warp blocks left most SMs idle).
            if steps > 32 {
                return (self.mv_warps(steps) * 32, 1);
            }
            let g = self
                .mv_groups
                .unwrap_or_else(|| rows / r.max(1) / (2 * self.n_sm));
            return (32, g.clamp(1, MVQ_WARPS));
        }
        if steps > most {
            return (self.mv_warps(steps) * 32, 1);
        }
        let fit = most / steps.max(1);
        let g = self
            .mv_groups
            .unwrap_or_else(|| rows / r.max(1) / (2 * self.n_sm));
        (steps.max(1), g.clamp(1, fit))
    }

    /// Weight rows per block of the one-row integer GEMV. Four from 4096-wide rows (fewer x
    /// loads per weight row), two below, but fewer while that leaves under four blocks per
    /// SM: Llama 3 8B's k/v (1024 × 4096) in 256 blocks ran at 10% of the DRAM peak (ncu,
    /// H200).
    ///
    /// Eight where wide rows are under 2 KiB (1- and 2-bit formats): the 27B-shaped Q1_0 and
    /// TQ2_0 files decoded 174.4 / 146.5 tok/s with eight against 170.0 / 140.5 with four
    /// (H200); Q4_K's 2,880-byte rows were level. Eight for every wide row of the repacked
    /// formats (`step` > 1: their ffn_down rows are 2.4 KB and 4.5 KB): 203.0 / 187.3 tok/s
    /// against 196.5 / 177.3.
    pub(super) fn mv_per_block(
        &self,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        step: usize,
    ) -> usize {
        self.mv_rows.unwrap_or_else(|| {
            let mut r = match (cols >= 4096, row_bytes < 2048 || step > 1) {
                (true, true) => 8,
                (true, false) => 4,
                _ => 2,
            };
            while r > 1 && rows / r < 4 * self.n_sm {
                r /= 2;
            }
            r
        })
    }

    /// Whether `matmul_multi` of `n` rows of `cols` over `ws` is one `mvqm1x4u` launch: up to
    /// four matrices of one format, row size and width with integer kernels, one row, four
    /// rows a block and `half_warps`, no tensor-core or streaming kernel. What
    /// `norm_matmul_op` folds a norm into.
    pub(super) fn multi_half(&self, ws: &[&CudaMat], n: usize, cols: usize) -> bool {
        let Some((w0, k)) = self.multi_one_launch(ws, cols) else {
            return false;
        };
        let total: usize = ws.iter().map(|w| w.rows).sum();
        let units = cols.div_ceil(32);
        n == 1
            && k.stream.is_empty()
            && self.mvr_kernels(k, n).is_none()
            && self.mv_per_block(total, cols, w0.row_bytes, k.step) == 4
            && self.half_warps(w0.ty, units, total, self.mvm_half)
    }

    /// Whether `matmul_multi` of `n` (3–8) rows of `cols` over `ws` is one `mvrmq` launch (the
    /// tensor-core GEMV through the ring, K whole): up to four matrices of one format, row
    /// size and width. What `norm_matmul_op` folds a verify's norm into, for the formats
    /// whose one-row GEMV takes the one-row fold too (not the streaming Q1_0 and TQ2_0,
    /// whose verify was not timed with it).
    pub(super) fn multi_ring(&self, ws: &[&CudaMat], n: usize, cols: usize) -> bool {
        let Some((w0, k)) = self.multi_one_launch(ws, cols) else {
            return false;
        };
        let aligned = ws.iter().all(|w| self.dptr(&w.data).is_multiple_of(16));
        k.stream.is_empty()
            && self.mvr_kernels(k, n).is_some()
            && self
                .mvr_tma(k, cols.div_ceil(32), w0.row_bytes, aligned)
                .is_some_and(|p| p.slots.is_some() && p.parts == 1)
    }

    /// Whether `matmul_multi` of `n` (3–8) rows of `cols` over `ws` is one `mvrmt` launch (the
    /// tensor-core GEMV, its whole tile one bulk copy, K whole): up to four matrices of one
    /// format, row size and width. What `norm_matmul_op` folds a verify's norm into unless
    /// NEAGARI_CUDA_NORM_FOLD_TILE=0 (the Q1_0 verify's projections).
    pub(super) fn multi_tile(&self, ws: &[&CudaMat], n: usize, cols: usize) -> bool {
        let Some((w0, k)) = self.multi_one_launch(ws, cols) else {
            return false;
        };
        let aligned = ws.iter().all(|w| self.dptr(&w.data).is_multiple_of(16));
        self.mvr_kernels(k, n).is_some()
            && self
                .mvr_tma(k, cols.div_ceil(32), w0.row_bytes, aligned)
                .is_some_and(|p| p.tile_whole())
    }

    /// The first matrix and its integer kernels where `matmul_multi` over `ws` of `cols` is
    /// one integer-GEMV launch: up to four matrices of one format, row size and width.
    fn multi_one_launch<'a>(
        &self,
        ws: &[&'a CudaMat],
        cols: usize,
    ) -> Option<(&'a CudaMat, &'a IntKernels)> {
        let w0 = *ws.first()?;
        let k = w0.k.int.as_ref()?;
        let same = ws.iter().all(|w| {
            w.ty == w0.ty && w.row_bytes == w0.row_bytes && w.cols == cols && w.k.int.is_some()
        });
        (self.mv_int && ws.len() <= 4 && same).then_some((w0, k))
    }

    /// `matmul_multi` on the integer GEMV: every matrix of one format and width, up to 8
    /// activation rows; four matrices a launch. With `nrm` (`multi_half`, `multi_ring` or
    /// `multi_tile` holds) the one `mvqm1x4u`, `mvrmq` or `mvrmt` launch finishes the norm
    /// before it (norm.rs `norm_matmul_op`).
    pub(super) fn matmul_multi_int(
        &self,
        k: &IntKernels,
        ws: &[&CudaMat],
        x: &CudaBuf,
        outs: &mut [&mut CudaBuf],
        nrm: Option<NrmArgs>,
    ) -> Result<()> {
        let (n, cols) = (x.rows, x.cols);
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            self.reshape(o, n, w.rows)?;
        }
        if n == 0 {
            return Ok(());
        }
        let units = cols.div_ceil(32);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, x, cols)?;
        // The activation rows' share of the launch picks the kernel; one weight row per
        // block from 4 activation rows, as `mvq4` / `mvq8`.
        let total: usize = ws.iter().map(|w| w.rows).sum();
        let ops: Vec<u64> = outs.iter().map(|o| self.dptr(&o.data)).collect();
        let mats: Vec<MvsMat> = ws
            .iter()
            .zip(&ops)
            .map(|(w, &y)| MvsMat {
                w: self.dptr(&w.data),
                y,
                rows: w.rows,
            })
            .collect();
        let tc = self.mvr_kernels(k, n);
        let aligned = mats.iter().all(|m| m.w.is_multiple_of(16));
        let tma = tc.and_then(|_| self.mvr_tma(k, units, ws[0].row_bytes, aligned));
        let per_block = self.mv_per_block(total, cols, ws[0].row_bytes, k.step);
        let half = n == 1
            && per_block == 4
            && tc.is_none()
            && self.half_warps(ws[0].ty, units, total, self.mvm_half);
        let ring = tma
            .as_ref()
            .is_some_and(|p| p.slots.is_some() && p.parts == 1);
        // Only a fold asks which launch can finish it.
        let foldable = || {
            half || ring
                || tma.as_ref().is_some_and(|p| p.tile_whole())
                || (n == 1 && self.multi_stream(ws, cols))
        };
        if nrm.is_some() && (ws.len() > 4 || !foldable()) {
            return Err(BackendError::Other(
                "cuda: a norm folded into a GEMV that cannot finish it".into(),
            ));
        }
        let (func, r) = if let Some(p) = &tma {
            (p.func(true), p.rows)
        } else if let Some(f) = tc {
            (&f[1], MVR_ROWS)
        } else if half {
            (&k.multi_u, 4)
        } else {
            match n {
                1 => match per_block {
                    1 => (&k.multi[0], 1),
                    2 => (&k.multi[1], 2),
                    8 => (&k.multi[6], 8),
                    _ => (&k.multi[2], 4),
                },
                2 => (&k.multi[3], 2),
                3 | 4 => (&k.multi[4], 1),
                _ => (&k.multi[5], 1),
            }
        };
        let (bx, by) = match tc {
            Some(_) => (self.mvr_threads(units, tma.as_ref()), 1),
            None if half => (self.mv_warps(units).div_ceil(2) * 32, 1),
            None => self.mv_block(k, units, total, r),
        };
        let (units_i, rb, nr_i) = (units as i32, ws[0].row_bytes as i64, n as i32);
        let streamed =
            n == 1 && self.mvs_launch(k, &mats, (qp, dsp), units, ws[0].row_bytes, nrm)?;
        // The recurrent state the DeltaNet step after reads (`mvrmt`), where the model said
        // and `mvs_launch` did not take it. Not by `mvqm1x4u`: the 27B Q4_K one-token step
        // went 6.563 → 6.588 ms with it (H100, session 60).
        let mut pf = self.take_rec();
        let chunks = if streamed { 0 } else { ws.len().div_ceil(4) };
        for c in mats.chunks(4).take(chunks) {
            let a = MultiArgs::new(c, r * by);
            if let Some(p) = &tma {
                let cfg = LaunchConfig {
                    grid_dim: ((a.blocks * p.parts) as u32, 1, 1),
                    block_dim: (bx as u32, 1, 1),
                    shared_mem_bytes: p.smem,
                };
                let (parts, pu, pb) = (p.parts as i32, p.part_units as i32, p.part_bytes as i32);
                let (clu, ks) = self.mvrt_meet(&mut sc, p, a.blocks * p.parts)?;
                if let Some(gb) = p.group_bytes {
                    // Unused matrices' maps are never read (their blocks are past the grid).
                    let mut tm = Vec::with_capacity(4);
                    for m in c {
                        tm.push(self.tmap(m.w, m.rows, ws[0].row_bytes, gb, p.rows)?);
                    }
                    tm.resize(4, tm[0]);
                    // By group, through the ring or not (`mvrmc` ignores the slots and the
                    // norm); the ring takes the norm's parts (none: all zero).
                    let slots = p.slots.unwrap_or(0) as i32;
                    let nrm = nrm.unwrap_or_default();
                    launch!(
                        @keep_cluster clu, self, func, cfg, &tm[0], &tm[1], &tm[2],
                        &tm[3], &a.w[0], &a.w[1], &a.w[2], &a.w[3], &a.y[0], &a.y[1], &a.y[2],
                        &a.y[3], &a.rows[0], &a.rows[1], &a.rows[2], &a.rows[3], &a.starts[1],
                        &a.starts[2], &a.starts[3], &qp, &dsp, &units_i, &nr_i, &parts, &pu, &pb,
                        &slots, &ks, &nrm
                    )?;
                    continue;
                }
                // `mvrmt` takes the norm's parts (none: all zero).
                let nrm = nrm.unwrap_or_default();
                launch!(
                    @keep_cluster clu, self, func, cfg, &a.w[0], &a.w[1], &a.w[2], &a.w[3],
                    &a.y[0], &a.y[1], &a.y[2], &a.y[3], &a.rows[0], &a.rows[1], &a.rows[2],
                    &a.rows[3], &a.starts[1], &a.starts[2], &a.starts[3], &qp, &dsp, &units_i,
                    &rb, &nr_i, &parts, &pu, &pb, &ks, &nrm, &pf
                )?;
                pf = Default::default();
                continue;
            }
            let cfg = LaunchConfig {
                grid_dim: (a.blocks as u32, 1, 1),
                block_dim: (bx as u32, by as u32, 1),
                shared_mem_bytes: 0,
            };
            if half {
                // `mvqm1x4u` takes the norm's parts (none: all zero).
                let nrm = nrm.unwrap_or_default();
                launch!(
                    @keep self, func, cfg, &a.w[0], &a.w[1], &a.w[2], &a.w[3], &a.y[0], &a.y[1],
                    &a.y[2], &a.y[3], &a.rows[0], &a.rows[1], &a.rows[2], &a.rows[3],
                    &a.starts[1], &a.starts[2], &a.starts[3], &qp, &dsp, &units_i, &rb, &nr_i,
                    &nrm
                )?;
                continue;
            }
            launch!(
                @keep self, func, cfg, &a.w[0], &a.w[1], &a.w[2], &a.w[3], &a.y[0], &a.y[1],
                &a.y[2], &a.y[3], &a.rows[0], &a.rows[1], &a.rows[2], &a.rows[3], &a.starts[1],
                &a.starts[2], &a.starts[3], &qp, &dsp, &units_i, &rb, &nr_i
            )?;
        }
        // The outputs are new data at their addresses: a cached quantization is stale.
        if sc.xq_key.is_some_and(|(p, ..)| ops.contains(&p)) {
            sc.xq_key = None;
        }
        if sc.xq_alt_key.is_some_and(|(p, ..)| ops.contains(&p)) {
            sc.xq_alt_key = None;
        }
        Ok(())
    }

    /// Integer GEMV: x quantized to q8_1 (once per input, see [`Scratch::xq_key`]), then
    /// `mvqN` 8 rows per launch.
    pub(super) fn matmul_gemv_int(
        &self,
        k: &IntKernels,
        w: &CudaMat,
        x: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let n = x.rows;
        let units = w.cols.div_ceil(32);
        let op = self.dptr(&out.data);
        let wp = self.dptr(&w.data);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, k, x, w.cols)?;
        let units_i = units as i32;
        let (rows_i, rb) = (w.rows as i32, w.row_bytes as i64);
        let one = MvsMat {
            w: wp,
            y: op,
            rows: w.rows,
        };
        let streamed = n == 1 && self.mvs_launch(k, &[one], (qp, dsp), units, w.row_bytes, None)?;
        let mut r0 = if streamed { n } else { 0 };
        while r0 < n {
            let nr = (n - r0).min(MV_MAX_ROWS);
            let which = match nr {
                1 => 0,
                2 => 1,
                3 | 4 => 2,
                _ => 3,
            };
            // Four weight rows per block from 4096-wide rows (fewer x loads per weight row),
            // two below, but fewer while that leaves under four blocks per SM: Llama 3 8B's
            // k/v (1024 × 4096) in 256 blocks ran at 10% of the DRAM peak (ncu, H200).
            let per_block = self.mv_per_block(w.rows, w.cols, w.row_bytes, k.step);
            let tc = self.mvr_kernels(k, nr);
            let tma = tc.and_then(|_| self.mvr_tma(k, units, w.row_bytes, wp.is_multiple_of(16)));
            let half = which == 0
                && per_block == 4
                && tc.is_none()
                && self.half_warps(w.ty, units, w.rows, self.mv_half);
            let wide = tma.as_ref().and_then(|p| self.mvrt_wide(k, p, w.rows));
            let (func, rows_per_block) = if let Some(p) = &tma {
                (wide.map_or(p.func(false), |(f, _)| f), p.rows)
            } else if let Some(f) = tc {
                (&f[0], MVR_ROWS)
            } else if which == 0 && per_block == 8 {
                (&k.mv1x8, 8)
            } else if which == 0
                && per_block == 4
                && self.mvq_split
                && (half || units > self.mv_warps(units) * 32)
            {
                // Rows of several rounds a thread: the kernel that loads a round's rows
                // before their arithmetic (gemv_int.cu's `mvq_split`).
                (&k.mv1x4u, 4)
            } else if which == 0 && per_block == 4 {
                (&k.mv1x4, 4)
            } else if which == 0 && per_block == 1 {
                (&k.mv1x1, 1)
            } else {
                (&k.mv[which], MVQ_ROWS_PER_BLOCK[which])
            };
            let (bx, by) = match tc {
                Some(_) => (
                    wide.map_or_else(|| self.mvr_threads(units, tma.as_ref()), |(_, n)| n),
                    1,
                ),
                None if half => (self.mv_warps(units).div_ceil(2) * 32, 1),
                None => self.mv_block(k, units, w.rows, rows_per_block),
            };
            let parts = tma.as_ref().map_or(1, |p| p.parts);
            let cfg = LaunchConfig {
                grid_dim: ((w.rows.div_ceil(rows_per_block * by) * parts) as u32, 1, 1),
                block_dim: (bx as u32, by as u32, 1),
                shared_mem_bytes: tma.as_ref().map_or(0, |p| p.smem),
            };
            let xr = qp + (r0 * units * 32) as u64;
            let dr = dsp + (r0 * units * 8) as u64;
            let orr = op + (r0 * w.rows * 4) as u64;
            let nr_i = nr as i32;
            if let Some(p) = &tma {
                let (parts, pu, pb) = (p.parts as i32, p.part_units as i32, p.part_bytes as i32);
                let (clu, ks) = self.mvrt_meet(&mut sc, p, cfg.grid_dim.0 as usize)?;
                if let Some(gb) = p.group_bytes {
                    let tm = self.tmap(wp, w.rows, w.row_bytes, gb, p.rows)?;
                    // By group, through the ring or not (`mvrc` ignores the slots).
                    let slots = p.slots.unwrap_or(0) as i32;
                    launch!(
                        @keep_cluster clu, self, func, cfg, &tm, &xr, &dr, &orr,
                        &rows_i, &units_i, &nr_i, &parts, &pu, &pb, &slots, &ks
                    )?;
                } else {
                    launch!(
                        @keep_cluster clu, self, func, cfg, &wp, &xr, &dr, &orr,
                        &rows_i, &units_i, &rb, &nr_i, &parts, &pu, &pb, &ks
                    )?;
                }
            } else {
                launch!(@keep self, func, cfg, &wp, &xr, &dr, &orr, &rows_i, &units_i, &rb, &nr_i)?;
            }
            r0 += nr;
        }
        // The output is new data at its address: a cached quantization of it is stale.
        if sc.xq_key.is_some_and(|(p, ..)| p == op) {
            sc.xq_key = None;
        }
        if sc.xq_alt_key.is_some_and(|(p, ..)| p == op) {
            sc.xq_alt_key = None;
        }
        Ok(())
    }

    /// `out[r0.., :] = W · x[r0..r0 + n, :]` through the GEMV kernels, 8 rows per launch.
    pub(super) fn matmul_gemv(&self, w: &CudaMat, x: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        if let (Some(k), true) = (&w.k.int, self.mv_int) {
            return self.matmul_gemv_int(k, w, x, out);
        }
        let n = x.rows;
        let xp = self.dptr(&x.data);
        let op = self.dptr(&out.data);
        let wp = self.dptr(&w.data);
        let (rows_i, cols_i, rb) = (w.rows as i32, w.cols as i32, w.row_bytes as i64);
        let mut r0 = 0;
        while r0 < n {
            let nr = (n - r0).min(MV_MAX_ROWS);
            let which = match nr {
                1 => 0,
                2 => 1,
                3 | 4 => 2,
                _ => 3,
            };
            // Four weight rows per block for wide rows: Llama-3-8B-shaped Q4_K decode 146 vs
            // 122 tok/s on the H200; on 640–3072-wide rows (Gemma 3 270M, Qwen3 0.6B
            // shapes) two rows were 3–4% faster (docs/BENCHMARKS.md).
            let four = self.mv_rows.map_or(w.cols >= 4096, |n| n >= 4);
            let (func, rows_per_block) = if which == 0 && four {
                (&w.k.mv1x4, 4)
            } else {
                (&w.k.mv[which], MV_ROWS_PER_BLOCK[which])
            };
            // One to four warps per block: as many as the row has 32-wide units for.
            let warps = w.cols.div_ceil(32 * 32).clamp(1, MV_WARPS);
            let cfg = LaunchConfig {
                grid_dim: (w.rows.div_ceil(rows_per_block) as u32, 1, 1),
                block_dim: ((warps * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let xr = xp + (r0 * w.cols * 4) as u64;
            let orr = op + (r0 * w.rows * 4) as u64;
            let nr_i = nr as i32;
            launch!(self, func, cfg, &wp, &xr, &orr, &rows_i, &cols_i, &rb, &nr_i)?;
            r0 += nr;
        }
        Ok(())
    }

    /// Batches of F32 weights: one f32 GEMM on the stored rows (no f16 rounding, which
    /// would cost an f32 model its precision).
    pub(super) fn matmul_sgemm(
        &self,
        blas: &CudaBlas,
        w: &CudaMat,
        x: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let (wp, xp, op) = (self.dptr(&w.data), self.dptr(&x.data), self.dptr(&out.data));
        let (alpha, beta) = (1f32, 0f32);
        // Column-major: out^T [rows, n] = W [cols, rows]^T (ld = padded row) · x^T [cols, n].
        // SAFETY: W holds rows × row_bytes/4 f32, x n × cols, out n × rows; the handle's
        // stream is this backend's stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                w.rows as i32,
                x.rows as i32,
                w.cols as i32,
                &alpha as *const f32 as *const _,
                wp as *const _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                (w.row_bytes / 4) as i32,
                xp as *const _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                w.cols as i32,
                &beta as *const f32 as *const _,
                op as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                w.rows as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(drv)
    }

    /// Batches: dequantize W to f16, convert x to f16, one cuBLAS GEMM into f32.
    pub(super) fn matmul_blas(
        &self,
        blas: &CudaBlas,
        w: &CudaMat,
        x: &CudaBuf,
        out: &mut CudaBuf,
    ) -> Result<()> {
        let n = x.rows;
        let units = w.cols.div_ceil(32);
        let kp = units * 32;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let need_w = w.rows * kp;
        if sc.w16.as_ref().is_none_or(|s| s.len() < need_w) {
            sc.w16 = None;
            sc.w16 = Some(self.stream.alloc_zeros::<u16>(need_w).map_err(|e| {
                BackendError::OutOfMemory(format!("f16 tile of {need_w} values: {e:?}"))
            })?);
        }
        let need_x = n * kp;
        if sc.x16.as_ref().is_none_or(|s| s.len() < need_x) {
            sc.x16 = Some(self.stream.alloc_zeros::<u16>(need_x).map_err(drv)?);
        }
        let (w16, x16) = match (&sc.w16, &sc.x16) {
            (Some(a), Some(b)) => (self.dptr(a), self.dptr(b)),
            _ => return Err(BackendError::Other("cuda: scratch missing".into())),
        };
        let wp = self.dptr(&w.data);
        let (rows_i, units_i, rb) = (w.rows as i32, units as i32, w.row_bytes as i64);
        launch!(
            self,
            &w.k.dequant_f16,
            cfg1(w.rows * units * 4, 256),
            &wp,
            &w16,
            &rows_i,
            &units_i,
            &rb
        )?;
        let xp = self.dptr(&x.data);
        let (n_i, cols_i, kp_i) = (n as i32, w.cols as i32, kp as i32);
        launch!(
            self,
            &self.ops.to_f16,
            cfg1(n * kp, 256),
            &xp,
            &x16,
            &n_i,
            &cols_i,
            &kp_i
        )?;
        let op = self.dptr(&out.data);
        let (alpha, beta) = (1f32, 0f32);
        // Column-major view: out^T [rows, n] = W [kp, rows]^T · x^T [kp, n].
        // SAFETY: w16 holds rows·kp f16, x16 n·kp f16, out n·rows f32; the handle's stream
        // is this backend's stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                w.rows as i32,
                n as i32,
                kp as i32,
                &alpha as *const f32 as *const _,
                w16 as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                kp as i32,
                x16 as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                kp as i32,
                &beta as *const f32 as *const _,
                op as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                w.rows as i32,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(drv)
    }

    pub(super) fn embed_op(
        &self,
        table: &CudaMat,
        ids: &[u32],
        scale: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= table.rows) {
            return Err(shape_err(
                "embed",
                format!("token id {bad} ≥ vocab {}", table.rows),
            ));
        }
        self.reshape(out, ids.len(), table.cols)?;
        if ids.is_empty() {
            return Ok(());
        }
        let in_step = self.step_mode() != graph::OFF;
        if in_step && ids.len() != self.step_tokens() {
            return Err(shape_err(
                "embed",
                format!(
                    "{} ids in a decode step of {} tokens",
                    ids.len(),
                    self.step_tokens()
                ),
            ));
        }
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let idp = if in_step {
            // `step_begin` uploaded the tokens after the position.
            self.step_posp() + 4
        } else {
            if sc.ids.as_ref().is_none_or(|s| s.len() < ids.len()) {
                self.check_alloc("the token id scratch")?;
                self.scratch_moved();
                sc.ids = Some(
                    self.stream
                        .alloc_zeros::<u32>(ids.len().max(512))
                        .map_err(drv)?,
                );
            }
            let Some(idb) = sc.ids.as_mut() else {
                return Err(BackendError::Other("cuda: id scratch missing".into()));
            };
            let mut view = idb.slice_mut(0..ids.len());
            self.stream.memcpy_htod(ids, &mut view).map_err(drv)?;
            self.dptr(idb)
        };
        let units = table.cols.div_ceil(32);
        let cfg = LaunchConfig {
            grid_dim: (ids.len() as u32, units.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (wp, op) = (self.dptr(&table.data), self.dptr(&out.data));
        let (cols_i, rb) = (table.cols as i32, table.row_bytes as i64);
        launch!(
            self,
            &table.k.embed,
            cfg,
            &wp,
            &idp,
            &op,
            &cols_i,
            &rb,
            &scale
        )
    }

    pub(super) fn matmul_op(&self, w: &CudaMat, x: &CudaBuf, out: &mut CudaBuf) -> Result<()> {
        if x.cols != w.cols {
            return Err(shape_err(
                "matmul",
                format!("x has {} cols, W is {}x{}", x.cols, w.rows, w.cols),
            ));
        }
        self.reshape(out, x.rows, w.rows)?;
        if x.rows == 0 {
            return Ok(());
        }
        match &self.blas {
            Some(b) if x.rows > MV_MAX_ROWS && w.ty == GgmlType::F32 => {
                self.matmul_sgemm(b, w, x, out)
            }
            Some(b) if x.rows > MV_MAX_ROWS => self.matmul_blas(b, w, x, out),
            _ => self.matmul_gemv(w, x, out),
        }
    }

    pub(super) fn matmul_multi_op(
        &self,
        ws: &[&CudaMat],
        x: &CudaBuf,
        outs: &mut [&mut CudaBuf],
    ) -> Result<()> {
        if ws.len() != outs.len() {
            return Err(shape_err(
                "matmul_multi",
                format!("{} matrices, {} outputs", ws.len(), outs.len()),
            ));
        }
        if self.matmul_pair(ws, x, outs)? {
            return Ok(());
        }
        // One launch per format (and row size) among the matrices that take the integer
        // GEMV; the rest one by one.
        let int_ok = |w: &CudaMat| {
            x.rows <= MV_MAX_ROWS && self.mv_int && w.cols == x.cols && w.k.int.is_some()
        };
        let mut done = vec![false; ws.len()];
        for i in 0..ws.len() {
            if done[i] {
                continue;
            }
            let w0 = ws[i];
            let (Some(k), true) = (&w0.k.int, int_ok(w0)) else {
                done[i] = true;
                self.matmul(w0, x, outs[i])?;
                continue;
            };
            let group: Vec<usize> = (i..ws.len())
                .filter(|&j| {
                    !done[j]
                        && ws[j].ty == w0.ty
                        && ws[j].row_bytes == w0.row_bytes
                        && int_ok(ws[j])
                })
                .collect();
            let gw: Vec<&CudaMat> = group.iter().map(|&j| ws[j]).collect();
            let mut go: Vec<&mut CudaBuf> = outs
                .iter_mut()
                .enumerate()
                .filter(|(j, _)| group.contains(j))
                .map(|(_, o)| &mut **o)
                .collect();
            self.matmul_multi_int(k, &gw, x, &mut go, None)?;
            for j in group {
                done[j] = true;
            }
        }
        Ok(())
    }
}

impl CudaBackend {
    /// The two formats of a `matmul_multi` group that `mvqp*` takes (every matrix on the
    /// integer GEMV of one unit a step, at most four, exactly two formats): the first
    /// matrix's format, then the other.
    fn pair_of(&self, ws: &[&CudaMat]) -> Option<(GgmlType, GgmlType)> {
        let a = ws.first()?.ty;
        let b = ws.iter().find(|w| w.ty != a)?.ty;
        let one_step = |w: &CudaMat| w.k.int.as_ref().is_some_and(|k| k.step == 1);
        let fits = self.mv_int
            && ws.len() <= 4
            && ws
                .iter()
                .all(|w| (w.ty == a || w.ty == b) && w.cols == ws[0].cols && one_step(w));
        fits.then_some((a, b))
    }

    /// `Backend::prepare_multi`: a two-format group's `mvqp*` module, compiled and loaded
    /// now (at load), so the group's one-row `matmul_multi` is one launch.
    pub(super) fn prepare_pair(&self, ws: &[&CudaMat]) -> Result<()> {
        let Some((a, b)) = self.pair_of(ws).filter(|_| self.pair) else {
            return Ok(());
        };
        let mut pairs = self.pairs.lock().unwrap_or_else(|e| e.into_inner());
        if pairs.contains_key(&(a, b)) {
            return Ok(());
        }
        let names = |ty| fmt_structs(ty, self.repack, self.mvr_k16).and_then(|n| n.q);
        let (Some(qa), Some(qb)) = (names(a), names(b)) else {
            return Ok(());
        };
        let m = self.load_module(pair_module(&qa, &qb))?;
        let f = |n: &str| m.load_function(n).map_err(drv);
        let k = [f("mvqp1x1")?, f("mvqp1x2")?, f("mvqp1x4")?, f("mvqp1x8")?];
        pairs.insert((a, b), Arc::new(k));
        Ok(())
    }

    /// `matmul_multi` of one activation row over matrices of two formats in one `mvqp*`
    /// launch, where `prepare_multi` loaded the pair's module: the first format's matrices
    /// go first (the kernel's `na`). `false` where it does not apply (nothing launched).
    fn matmul_pair(&self, ws: &[&CudaMat], x: &CudaBuf, outs: &mut [&mut CudaBuf]) -> Result<bool> {
        if x.rows != 1 {
            return Ok(false);
        }
        let Some((a, b)) = self.pair_of(ws) else {
            return Ok(false);
        };
        let Some(pk) = self
            .pairs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(a, b))
            .cloned()
        else {
            return Ok(false);
        };
        let cols = x.cols;
        if ws[0].cols != cols {
            return Ok(false);
        }
        let order: Vec<usize> = (0..ws.len())
            .filter(|&j| ws[j].ty == a)
            .chain((0..ws.len()).filter(|&j| ws[j].ty == b))
            .collect();
        let (ia, ib) = (order[0], order[order.len() - 1]);
        let (Some(ka), true) = (&ws[ia].k.int, ws[ib].k.int.is_some()) else {
            return Ok(false);
        };
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            self.reshape(o, 1, w.rows)?;
        }
        let units = cols.div_ceil(32);
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (qp, dsp) = self.xq_input(&mut sc, ka, x, cols)?;
        let total: usize = ws.iter().map(|w| w.rows).sum();
        let (func, r) = match self.mv_per_block(total, cols, ws[ia].row_bytes, 1) {
            1 => (&pk[0], 1),
            2 => (&pk[1], 2),
            8 => (&pk[3], 8),
            _ => (&pk[2], 4),
        };
        let (bx, by) = self.mv_block(ka, units, total, r);
        let ops: Vec<u64> = order.iter().map(|&j| self.dptr(&outs[j].data)).collect();
        let mats: Vec<MvsMat> = order
            .iter()
            .zip(&ops)
            .map(|(&j, &y)| MvsMat {
                w: self.dptr(&ws[j].data),
                y,
                rows: ws[j].rows,
            })
            .collect();
        let m = MultiArgs::new(&mats, r * by);
        let cfg = LaunchConfig {
            grid_dim: (m.blocks as u32, 1, 1),
            block_dim: (bx as u32, by as u32, 1),
            shared_mem_bytes: 0,
        };
        let na = order.iter().filter(|&&j| ws[j].ty == a).count() as i32;
        let (units_i, ra, rb) = (
            units as i32,
            ws[ia].row_bytes as i64,
            ws[ib].row_bytes as i64,
        );
        launch!(
            @keep self, func, cfg, &m.w[0], &m.w[1], &m.w[2], &m.w[3], &m.y[0], &m.y[1],
            &m.y[2], &m.y[3], &m.rows[0], &m.rows[1], &m.rows[2], &m.rows[3], &m.starts[1],
            &m.starts[2], &m.starts[3], &qp, &dsp, &units_i, &ra, &rb, &na
        )?;
        // The outputs are new data at their addresses: a cached quantization is stale.
        if sc.xq_key.is_some_and(|(p, ..)| ops.contains(&p)) {
            sc.xq_key = None;
        }
        if sc.xq_alt_key.is_some_and(|(p, ..)| ops.contains(&p)) {
            sc.xq_alt_key = None;
        }
        Ok(true)
    }
}

/// One matrix of a multi-matrix GEMV launch: weights, output, rows.
pub(super) struct MvsMat {
    pub w: u64,
    pub y: u64,
    pub rows: usize,
}

/// Arguments of one launch over up to four matrices (gemv_int.cu's `mvqm*`,
/// gemv_stream.cu's `mvs_*`): weights, outputs, rows, the block starts of matrices 1..3
/// (an unused one past the grid) and the grid, at `per_block` rows a block.
struct MultiArgs {
    w: [u64; 4],
    y: [u64; 4],
    rows: [i32; 4],
    starts: [i32; 4],
    blocks: usize,
}

impl MultiArgs {
    fn new(mats: &[MvsMat], per_block: usize) -> Self {
        let mut a = MultiArgs {
            w: [0; 4],
            y: [0; 4],
            rows: [0; 4],
            starts: [i32::MAX; 4],
            blocks: 0,
        };
        for (j, m) in mats.iter().take(4).enumerate() {
            a.starts[j] = a.blocks as i32;
            (a.w[j], a.y[j], a.rows[j]) = (m.w, m.y, m.rows as i32);
            a.blocks += m.rows.div_ceil(per_block);
        }
        a
    }
}

impl CudaBackend {
    /// gemv_stream.cu's one-row GEMV of up to four matrices per launch (one format and row
    /// size) over matrices of `rows` rows of `units` units, where it runs (the repacked
    /// formats, rows of at most 256 steps, not NEAGARI_CUDA_MVS=0): its kernel and (R, K, G).
    fn mvs_plan<'a>(
        &self,
        k: &'a IntKernels,
        rows: &[usize],
        units: usize,
        row_bytes: usize,
    ) -> Option<(&'a CudaFunction, MvsShape)> {
        let steps = units / k.step;
        let (Some(shape), true) = (self.mvs, (1..=256).contains(&steps)) else {
            return None;
        };
        let (r, kc, g) = mvs_geometry(shape, steps, row_bytes, rows, self.n_sm);
        let (_, func) = k.stream.iter().find(|(s, _)| *s == r)?;
        Some((func, (r, kc, g)))
    }

    /// Whether `matmul_multi` of one row of `cols` over `ws` is one `mvs_R` launch whose
    /// blocks can finish a norm (NrmStage: at least cols / 32 blocks of at least 32
    /// threads). What `norm_matmul_op` folds a norm into (the Q1_0 and TQ2_0 decode step).
    pub(super) fn multi_stream(&self, ws: &[&CudaMat], cols: usize) -> bool {
        let Some((w0, k)) = self.multi_one_launch(ws, cols) else {
            return false;
        };
        let rows: Vec<usize> = ws.iter().map(|w| w.rows).collect();
        let units = cols.div_ceil(32);
        self.mvs_plan(k, &rows, units, w0.row_bytes)
            .is_some_and(|(_, (r, kc, g))| {
                let blocks: usize = rows.iter().map(|n| n.div_ceil(g * r * kc)).sum();
                super::norm::stage_fits(blocks, units / k.step * g, cols)
            })
    }

    /// gemv_stream.cu's one-row GEMV of up to four matrices per launch (`mvs_plan`), with the
    /// norm before it finished where `nrm` is set (`multi_stream` holds): `false` where it
    /// does not run, and nothing was launched.
    pub(super) fn mvs_launch(
        &self,
        k: &IntKernels,
        mats: &[MvsMat],
        (qp, dsp): (u64, u64),
        units: usize,
        row_bytes: usize,
        nrm: Option<NrmArgs>,
    ) -> Result<bool> {
        let rows: Vec<usize> = mats.iter().map(|m| m.rows).collect();
        let Some((func, (r, kc, g))) = self.mvs_plan(k, &rows, units, row_bytes) else {
            return Ok(false);
        };
        let steps = units / k.step;
        let per_block = g * r * kc;
        let (units_i, rb, k_i) = (units as i32, row_bytes as i64, kc as i32);
        let nrm = nrm.unwrap_or_default();
        // The recurrent state the DeltaNet step after this GEMV reads, where the model said.
        let mut pf = self.take_rec();
        for c in mats.chunks(4) {
            let a = MultiArgs::new(c, per_block);
            let cfg = LaunchConfig {
                grid_dim: (a.blocks as u32, 1, 1),
                block_dim: (steps as u32, g as u32, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                @keep self, func, cfg, &a.w[0], &a.w[1], &a.w[2], &a.w[3], &a.y[0], &a.y[1],
                &a.y[2], &a.y[3], &a.rows[0], &a.rows[1], &a.rows[2], &a.rows[3], &a.starts[1],
                &a.starts[2], &a.starts[3], &qp, &dsp, &units_i, &rb, &k_i, &nrm, &pf
            )?;
            pf = Default::default();
        }
        Ok(true)
    }
}

/// Row groups a block of gemv_stream.cu's GEMV at most, where the shape picks: blocks of
/// 120 threads on the 27B's 5,120-wide rows (40 steps), twice the blocks of the 6 groups that
/// fit, four of them an SM. Inside the replayed step (H200, one-token greedy): Q1_0 3.842 →
/// 3.766 ms (tg128 259.5 → 264.6 tok/s), TQ2_0 4.695 → 4.614 (213.7 → 217.5); at most 2 or
/// 1 group, Q1_0 4.277 and 4.272.
const MVS_GROUPS: usize = 3;

/// (R, K, G) of gemv_stream.cu for one launch over matrices of `rows` rows of `steps` steps
/// (`row_bytes` a row), from `shape` (0s pick). R: 128 bytes of a thread's weight bodies in
/// flight (8 Q1_0 rows of 16 + 2 bytes a step, 4 TQ2_0 rows of 32 + 2). K: 3 (Q1_0) or 4
/// (TQ2_0) chunks, then fewer, then fewer row groups a block (G, at most MVS_GROUPS and
/// 256 / steps), while the grid is under one block an SM. On the 27B's gate/up this took the
/// GEMV from 1.43 to 1.86 TB/s (Q1_0) and the step from 199 to 220 tok/s (docs/BENCHMARKS.md).
fn mvs_geometry(
    (r, kc, g): MvsShape,
    steps: usize,
    row_bytes: usize,
    rows: &[usize],
    n_sm: usize,
) -> (usize, usize, usize) {
    let r = match (r, row_bytes / steps.max(1)) {
        (0, b) if b <= 24 => 8,
        (0, _) => 4,
        (r, _) => r,
    };
    let fit = (256 / steps.max(1)).max(1);
    let mut k = match kc {
        0 if r == 8 => 3,
        0 => 4,
        k => k.min(MVS_ROWS / r),
    };
    let mut gr = if g == 0 {
        fit.min(MVS_GROUPS)
    } else {
        g.min(fit)
    };
    let blocks =
        |k: usize, gr: usize| -> usize { rows.iter().map(|n| n.div_ceil(gr * r * k)).sum() };
    while kc == 0 && k > 1 && blocks(k, gr) < n_sm {
        k -= 1;
    }
    while g == 0 && gr > 1 && blocks(k, gr) < n_sm {
        gr -= 1;
    }
    (r, k, gr)
}

/// (R, K, G) of gemv_stream.cu's `mvsg_R` over gate/up matrices of rows of `steps` steps
/// (`row_bytes` a row), or `None` where no shape fits: G even (the first half of a block's
/// groups gate, the rest up), N = (G/2)·R·K output rows a block, a multiple of 32 (the q8_1
/// of the output in whole units) and at most the block's threads. By default none for
/// formats of ≤ 24 bytes a step (Q1_0), else 2 × 16 × 4 (N = 64) where it fits; a forced
/// or fallback shape takes R as `mvs_geometry` (8 or 4) where not given and the first of
/// G = 4, 2, 8, 16 that fits with K for N = 32.
pub(super) fn mvsg_geometry(
    (r, kc, g): MvsShape,
    steps: usize,
    row_bytes: usize,
) -> Option<MvsShape> {
    let wide = row_bytes / steps.max(1) > 24;
    // By default only the wide-step formats (TQ2_0): on the 27B, TQ2_0 tg128 228 → 255
    // tok/s at 2 × 16 × 4, where Q1_0 stayed level at every shape tried (H200, session 22).
    if (r, kc, g) == MVS_DEFAULT {
        if !wide {
            return None;
        }
        if let Some(s) = mvsg_geometry((2, 16, 4), steps, row_bytes) {
            return Some(s);
        }
    }
    let r = match r {
        0 if wide => 4,
        0 => 8,
        r => r,
    };
    let fit = 256 / steps.max(1);
    let valid = |g: usize, k: usize| {
        let n = g / 2 * r * k;
        g.is_multiple_of(2)
            && (2..=fit).contains(&g)
            && k >= 1
            && r * k <= MVS_ROWS
            && n.is_multiple_of(32)
            && n <= g * steps
    };
    // K for N = 32 unless forced.
    let k_for = |g: usize| if kc == 0 { 64 / (g * r).max(1) } else { kc };
    let gs: &[usize] = if g == 0 { &[4, 2, 8, 16] } else { &[g] };
    gs.iter()
        .map(|&g| (g, k_for(g)))
        .find(|&(g, k)| valid(g, k))
        .map(|(g, k)| (r, k, g))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shapes the 27B's decode step gets (132 SMs; Q1_0 rows of 5120 are 40 steps of
    /// 18 bytes, TQ2_0's 40 of 33), and forced ones.
    #[test]
    fn stream_gemv_geometry() {
        let q1 = |cols: usize| (cols / 128, cols / 128 * 18);
        let tq = |cols: usize| (cols / 128, cols / 256 * 66);
        let pick = |(steps, rb): (usize, usize), rows: &[usize]| {
            mvs_geometry(MVS_DEFAULT, steps, rb, rows, 132)
        };
        // gate+up: 484 blocks of 3 groups × 8 rows × 3 chunks.
        assert_eq!(pick(q1(5120), &[17408, 17408]), (8, 3, 3));
        // qkv+z: 229 blocks at K = 3.
        assert_eq!(pick(q1(5120), &[10240, 6144]), (8, 3, 3));
        // ssm_out (48 steps): 72 blocks at K = 3, 107 at 2 → K = 1 (214).
        assert_eq!(pick(q1(6144), &[5120]), (8, 1, 3));
        // ffn_down: 136 steps, one group.
        assert_eq!(pick(q1(17408), &[5120]), (8, 3, 1));
        assert_eq!(pick(tq(5120), &[17408, 17408]), (4, 4, 3));
        // A small matrix: K to 1, then groups to 1 (under one block an SM even so).
        assert_eq!(pick(q1(5120), &[300]), (8, 1, 1));
        // What NEAGARI_CUDA_MVS=0x0x3 ran in the measurement above: the same shapes.
        for rows in [&[17408, 17408][..], &[10240, 6144, 48, 48], &[248320]] {
            let forced = mvs_geometry((0, 0, 3), 40, 720, rows, 132);
            assert_eq!(pick(q1(5120), rows), forced);
        }
        assert_eq!(
            pick(q1(6144), &[5120]),
            mvs_geometry((0, 0, 3), 48, 864, &[5120], 132)
        );
        // Forced: R and K as given (R·K ≤ 32), G no more than fit.
        assert_eq!(mvs_geometry((4, 16, 9), 40, 720, &[64], 132), (4, 8, 6));
        assert_eq!(mvs_shape(Some("0")), None);
        assert_eq!(mvs_shape(Some("8,2,0")), Some((8, 2, 0)));
        assert_eq!(mvs_shape(Some("0x2x3")), Some((0, 2, 3)));
        assert_eq!(mvs_shape(Some("3,2,0")), Some(MVS_DEFAULT));
        assert_eq!(mvs_shape(None), Some(MVS_DEFAULT));
    }

    /// The gate/up GEMV with its GLU: 32 output rows a block by default, G even.
    #[test]
    fn stream_glu_geometry() {
        // 27B gate/up rows (5120 wide: 40 steps): Q1_0 18 bytes a step (none by default),
        // TQ2_0 33.
        assert_eq!(mvsg_geometry(MVS_DEFAULT, 40, 720), None);
        assert_eq!(mvsg_geometry(MVS_DEFAULT, 40, 1320), Some((2, 16, 4)));
        // Short TQ2_0 rows: 2 × 16 × 4's 64 outputs are more than its threads.
        assert_eq!(mvsg_geometry(MVS_DEFAULT, 8, 264), Some((4, 4, 4)));
        // Forced: R from the step size where not given.
        assert_eq!(mvsg_geometry((0, 0, 4), 40, 720), Some((8, 2, 4)));
        assert_eq!(mvsg_geometry((0, 0, 2), 100, 1800), Some((8, 4, 2)));
        // Past 128 steps no two groups fit.
        assert_eq!(mvsg_geometry((0, 0, 2), 136, 2448), None);
        // Odd G, N not whole units, R·K past 32, more rows than threads: none.
        assert_eq!(mvsg_geometry((8, 3, 3), 40, 720), None);
        assert_eq!(mvsg_geometry((8, 3, 4), 40, 720), None);
        assert_eq!(mvsg_geometry((8, 8, 2), 40, 720), None);
        assert_eq!(mvsg_geometry((8, 4, 4), 40, 720), Some((8, 4, 4)));
        assert_eq!(mvsg_geometry((8, 2, 4), 5, 90), None);
        // Short rows: more groups, so that a block's threads cover its 32 outputs.
        assert_eq!(mvsg_geometry((8, 0, 0), 5, 90), Some((8, 1, 8)));
    }
}
