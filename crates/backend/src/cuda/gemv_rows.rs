//! The tensor-core GEMV of 3–8 activation rows (gemv_rows.cu), the verify forward's
//! matmuls: which kernel runs (`mvr` from registers, `mvrt_MT` with the tile in one bulk
//! copy, `mvrc_MT` with it by group, `mvrq_MT` by group through a ring of slots — the
//! default where a tile goes by group), the block's tiles and K parts, and the tensor maps
//! they copy through. Launched from matmul.rs with the other GEMVs.

use super::*;

/// Which matrices the tensor-core GEMV takes by group of its tile (`mvrc_*`) rather than in
/// one copy (`mvrt_*`). By group a warp starts once its first group has landed, but each
/// 144-byte group of a row is a request of its own: 27B Q4_K (4.5 bits a weight), 8 rows,
/// gate+up 60.1 → 51.5 µs, qkv+z 25.7 → 24.0, ffn_down 35.7 → 32.8, head 331 → 293,
/// verify8 greedy 10.74 → 9.76 ms; Q1_0, whose tile lands in half the time, lost (gate+up
/// 25.7 → 26.7, qkv+z 10.5 → 12.1; H200). NEAGARI_CUDA_MVRC=0 (never) or 1 (always) for
/// tests and measuring.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum ByGroup {
    Off,
    /// Formats of 4 bits a weight and more.
    Wide,
    All,
}

impl CudaBackend {
    /// A format module's `mvrt_MT`, `mvrmt_MT`, `mvrc_MT`, `mvrmc_MT`, `mvrq_MT`, `mvrmq_MT`
    /// for the allowed MT, most first, each allowed the most shared memory a tile takes.
    pub(super) fn mvrt_funcs(
        &self,
        f: &dyn Fn(&str) -> Result<CudaFunction>,
    ) -> Result<Vec<(usize, [CudaFunction; 6])>> {
        let smem = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        MVRT_TILES
            .iter()
            .filter(|mt| self.mvrt_tiles.contains(mt))
            .map(|&mt| {
                let fs = [
                    f(&format!("mvrt_{mt}"))?,
                    f(&format!("mvrmt_{mt}"))?,
                    f(&format!("mvrc_{mt}"))?,
                    f(&format!("mvrmc_{mt}"))?,
                    f(&format!("mvrq_{mt}"))?,
                    f(&format!("mvrmq_{mt}"))?,
                ];
                for func in &fs {
                    func.set_attribute(smem, MVR_TMA_MAX as i32).map_err(drv)?;
                }
                Ok((mt, fs))
            })
            .collect()
    }

    /// A format module's 4-tile kernel `name` beside `mvrt_4` (`mvrtg_4`: `matmul_glu` on 4
    /// tiles; `mvrt_4w`: `mvrt_4` with twice the warps), where 4 tiles are allowed.
    pub(super) fn mvrt4_func(
        &self,
        f: &dyn Fn(&str) -> Result<CudaFunction>,
        name: &str,
    ) -> Result<Option<CudaFunction>> {
        if !self.mvrt_tiles.contains(&4) {
            return Ok(None);
        }
        let func = f(name)?;
        let smem = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        func.set_attribute(smem, MVR_TMA_MAX as i32).map_err(drv)?;
        Ok(Some(func))
    }

    /// `mvrt_4w` for one matrix of `rows` rows on plan `p`, where `p` is 4 whole-row tiles
    /// of K whole whose grid leaves SMs without a block (not NEAGARI_CUDA_MVRT_W16=0). The
    /// 27B Q1_0 ssm_out and o, 8 rows, are 80 blocks on 132 SMs, each warp's chain of steps
    /// the bound: alone 12.67 → 11.85 µs, the 8-row greedy step 5.16 → 5.09 ms (H100).
    /// Its warps' sums meet in another order, so `matmul_multi` (always `mvrmt_*`'s 8 warps)
    /// of such a matrix is not the single product's bits, within float error of them.
    /// The kernel and its threads a block (gemv_rows.cu: twice MVR_WARPS).
    pub(super) fn mvrt_wide<'a>(
        &self,
        k: &'a IntKernels,
        p: &MvrtPlan,
        rows: usize,
    ) -> Option<(&'a CudaFunction, usize)> {
        let wide = k.rows_tma.as_ref()?.wide.as_ref()?;
        (self.mvrt_w16
            && p.tile_whole()
            && p.rows == 4 * MVR_ROWS
            && rows.div_ceil(p.rows) < self.n_sm)
            .then_some((wide, 2 * MVR_WARPS * 32))
    }

    /// The tensor-core GEMV (`mvr`, `mvrm` of gemv_rows.cu) for `nr` activation rows, where
    /// it runs: 3–8 rows (one or two rows are fewer dp4a than a tensor-core tile wastes),
    /// a format that has it, sm_80 or newer, not turned off (NEAGARI_CUDA_MV_TC=0).
    pub(super) fn mvr_kernels<'a>(
        &self,
        k: &'a IntKernels,
        nr: usize,
    ) -> Option<&'a [CudaFunction; 2]> {
        k.rows
            .as_ref()
            .filter(|_| self.mvr_on && (3..=MV_MAX_ROWS).contains(&nr))
    }

    /// The tensor-core GEMV with the tile by bulk copies (`mvrt_MT`), where it runs (sm_90,
    /// a format with a `B_` struct, 16-byte rows, weights 16-byte `aligned`), for rows of
    /// `units` units; `None`: `mvr`.
    ///
    /// A block takes MT 16-row tiles (at most MVR_TMA_MAX) of whole rows, the most that fit;
    /// where not even one tile fits, of a part of K (2 or 4 parts of whole groups of the
    /// format, the blocks of a cluster adding their sums in rank order), the most tiles,
    /// then the fewest parts. 27B Q4_K ffn_down (9,792-byte rows), 8 rows: `mvr` 75.1 µs,
    /// 2 tiles of 4 parts 37.5 µs, 1 tile of 2 parts 46.7 (H200). Splitting rows that fit
    /// costs: split for two blocks an SM, Q1_0 qkv+z (5,120-wide rows) took 11.2 → 21.2 µs
    /// and ssm_out 7.3 → 14.8. The shape depends on the row alone, so a matrix's product is
    /// the same bits alone and beside others in `matmul_multi` (but see `mvrt_wide`).
    pub(super) fn mvr_tma<'a>(
        &self,
        k: &'a IntKernels,
        units: usize,
        row_bytes: usize,
        aligned: bool,
    ) -> Option<MvrtPlan<'a>> {
        let t = k.rows_tma.as_ref()?;
        if !(row_bytes.is_multiple_of(16) && aligned) {
            return None;
        }
        // A row may end in part of a group (TQ2_0's 5,120 values are 2.5 groups): only
        // whole rows then.
        let groups = units / t.group_units;
        let whole_groups = units.is_multiple_of(t.group_units);
        // Bytes of a group where a row is whole groups and `mvrc` takes the tile by group.
        let by_group = match self.mvrc {
            ByGroup::Off => false,
            ByGroup::Wide => row_bytes >= units * 16,
            ByGroup::All => true,
        };
        let gb = (by_group && whole_groups && groups > 0)
            .then(|| row_bytes / groups)
            .filter(|gb| gb % 16 == 0 && gb / 4 <= 256);
        let plan = |mt: usize, parts: usize| {
            // Whole groups a part, every part some.
            let per = groups.div_ceil(parts);
            let (part_units, part_bytes) = if parts == 1 {
                (units, row_bytes)
            } else {
                (per * t.group_units, per * (row_bytes / groups.max(1)))
            };
            if parts > 1
                && (!whole_groups || per * (parts - 1) >= groups || !part_bytes.is_multiple_of(16))
            {
                return None;
            }
            // Rows of an even number of 16-byte words get 16 bytes more in shared memory
            // (gemv_rows.cu `mvrt_stride`).
            let stride = part_bytes + if (part_bytes / 16) % 2 == 1 { 0 } else { 16 };
            let smem = mt * MVR_ROWS * stride;
            // By group through a ring of that many slots, where more groups than slots.
            // A warp takes every `apart`-th group (steps go round the warps, GROUP_STEPS =
            // group_units / 4 a group), so the slots are a multiple of that: a warp's next
            // group then reuses a slot whose last group it read itself, and the barrier's
            // parity names the right phase. The ring's shared memory does not grow with K:
            // with `mvrq_tiles` its rows are whole where the whole tile would not fit
            // (`mvrc` keeps a barrier a group, MVRC_MAXG; the ring one a slot).
            let any = self.mvrq_tiles.is_some();
            let apart = (MVR_WARPS * 4 / t.group_units).max(1);
            let slots = gb
                .filter(|_| any || per <= MVRC_MAXG)
                .map(|gb| (self.mvrq.div_ceil(apart) * apart, mvrq_slot(mt, gb)))
                .filter(|&(n, b)| {
                    self.mvrq > 0 && n < per && n <= MVRQ_MAXS && n * b <= MVR_TMA_MAX
                });
            let group_bytes = gb.filter(|_| slots.is_some() || per <= MVRC_MAXG);
            ((any && slots.is_some()) || smem <= MVR_TMA_MAX).then_some(MvrtPlan {
                f: &t.funcs.iter().find(|(m, _)| *m == mt)?.1,
                // By group: the part's groups unpadded, no more than the rows.
                smem: match (slots, group_bytes) {
                    (Some((n, b)), _) => n * b,
                    (None, Some(gb)) => mt * MVR_ROWS * per * gb,
                    (None, None) => smem,
                } as u32,
                rows: mt * MVR_ROWS,
                parts,
                part_units,
                part_bytes,
                group_bytes,
                slots: slots.map(|(n, _)| n),
            })
        };
        let tiles = || t.funcs.iter().map(|(mt, _)| *mt);
        let whole = self.mvrt_parts.contains(&1);
        // Through the ring of whole rows, `mvrq_tiles` tiles first.
        let ring = tiles()
            .filter(|&mt| whole && Some(mt) == self.mvrq_tiles)
            .find_map(|mt| plan(mt, 1).filter(|p| p.slots.is_some()));
        let whole = ring.or_else(|| tiles().find_map(|mt| whole.then(|| plan(mt, 1)).flatten()));
        // Under 2 bits a weight, rows in parts where that takes twice the tiles a block: each
        // activation fragment a warp loads then serves twice the weights (27B Q1_0 ffn_down,
        // 8 rows: 2 whole-row tiles 21.1 µs, 4 half-row tiles 17.6, H200; 4 tiles of a third
        // of K 14.4 against 17.2 in halves, H100: `mvrt_sub2`). Q4_K's 5120-wide rows lost
        // halved (qkv+z 26.0 → 28.0 µs, ssm_out 14.3 → 18.0; H200).
        if let Some(w) = &whole {
            if self.mvrt_parts.contains(&2) && row_bytes < units * 8 {
                if let Some(p) = plan(2 * w.rows / MVR_ROWS, self.mvrt_sub2) {
                    return Some(p);
                }
            }
        }
        whole.or_else(|| {
            tiles().find_map(|mt| {
                self.mvrt_parts
                    .iter()
                    .filter(|&&p| p > 1)
                    .find_map(|&p| plan(mt, p))
            })
        })
    }

    /// Whether `n` activation rows of `m` take the tensor-core GEMV (`mvr` or `mvrt_*`;
    /// tests, measurements).
    pub fn gemv_rows_on(&self, m: &CudaMat, n: usize) -> bool {
        m.k.int
            .as_ref()
            .filter(|_| self.mv_int)
            .is_some_and(|k| self.mvr_kernels(k, n).is_some())
    }

    /// The tiles a block (16 rows each) and the parts of K that the tensor-core GEMV with
    /// bulk copies takes for `m` alone at `n` activation rows; `None` where another kernel
    /// runs it (tests, measurements).
    pub fn gemv_rows_plan(&self, m: &CudaMat, n: usize) -> Option<(usize, usize)> {
        let k = m.k.int.as_ref().filter(|_| self.mv_int)?;
        self.mvr_kernels(k, n)?;
        let units = m.cols.div_ceil(32);
        // matmul_gemv_int's condition: device allocations are 256-byte aligned.
        let p = self.mvr_tma(k, units, m.row_bytes, true)?;
        Some((p.rows / MVR_ROWS, p.parts))
    }

    /// Warps per block of the tensor-core GEMV: one per 32 units (a warp takes 4 units a
    /// step, so 8 steps), at most MVR_WARPS (8): 5 for 5120-wide rows, 8 for 17,408. With
    /// the tile in shared memory (`tile`), always MVR_WARPS: its loads wait less, so more
    /// warps with fewer steps each finish the tile sooner (27B Q1_0 8-row step 11.36 → 10.86
    /// ms with 8 warps on the 5120-wide rows, H200).
    pub(super) fn mvr_warps(&self, units: usize, tile: bool) -> usize {
        self.mv_warps
            .unwrap_or_else(|| if tile { MVR_WARPS } else { units.div_ceil(32) })
            .clamp(1, MVR_WARPS)
    }

    /// Threads a block of the tensor-core GEMV with plan `tma` (None: `mvr`): `mvr_warps`'
    /// warps, and the ring's producer warp after them.
    pub(super) fn mvr_threads(&self, units: usize, tma: Option<&MvrtPlan>) -> usize {
        match tma {
            Some(p) if p.slots.is_some() => (MVR_WARPS + 1) * 32,
            _ => self.mvr_warps(units, tma.is_some()) * 32,
        }
    }
}

/// A launch of `mvrt_MT` / `mvrmt_MT` or, by group, `mvrc_MT` / `mvrmc_MT`, or through a
/// ring, `mvrq_MT` / `mvrmq_MT` (`mvr_tma`).
pub(super) struct MvrtPlan<'a> {
    /// [single, multi, single by group, multi by group, single ring, multi ring].
    pub(super) f: &'a [CudaFunction; 6],
    /// Dynamic shared memory a block.
    pub(super) smem: u32,
    /// Weight rows a block (MT · 16).
    pub(super) rows: usize,
    /// K split over this many blocks (a cluster), `part_units` units and `part_bytes` bytes
    /// a row each (the last part the rest).
    pub(super) parts: usize,
    pub(super) part_units: usize,
    pub(super) part_bytes: usize,
    /// `mvrc`: the tile by group, of these many bytes.
    pub(super) group_bytes: Option<usize>,
    /// `mvrq`: by group through a ring of this many slots (block of MVR_WARPS + 1 warps).
    pub(super) slots: Option<usize>,
}

/// Where the parts of a K split meet without a cluster (gemv_rows.cu `Ks`, by value): the
/// parts' sums and a counter a tile block; zeros: in the cluster's rank 0.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct Ks {
    p: u64,
    c: u64,
}

// SAFETY: plain old data of the kernel parameter's C layout (two 8-byte fields), by value.
unsafe impl DeviceRepr for Ks {}
const _: () = assert!(std::mem::size_of::<Ks>() == 16);

impl MvrtPlan<'_> {
    /// Whether this is `mvrt` / `mvrmt` with K whole: the whole tile one bulk copy, not by
    /// group, no ring, one part (what the norm fold and `mvrtg_4` take).
    pub(super) fn tile_whole(&self) -> bool {
        self.slots.is_none() && self.group_bytes.is_none() && self.parts == 1
    }

    /// The kernel: `multi` for several matrices (`mvrm*`).
    pub(super) fn func(&self, multi: bool) -> &CudaFunction {
        let by = match (self.slots, self.group_bytes) {
            (Some(_), _) => 4,
            (None, Some(_)) => 2,
            (None, None) => 0,
        };
        &self.f[by + multi as usize]
    }
}

impl CudaBackend {
    /// A launch of `blocks` blocks (tile blocks × parts) of plan `p`: its cluster size and
    /// its [`Ks`] — a cluster of 2 parts, or no cluster and the scratch where more parts
    /// meet (grown outside a recorded step). A cluster of 3 or 4 is slow to place: 8 rows
    /// (H100, µs), 27B Q1_0 ffn_down in 3 parts 22.4 in clusters against 14.4, Q4_K's in 4
    /// parts 32.5 against 30.9 (8-row greedy step 9.17 → 9.05 ms); in 2 parts level alone
    /// (17.2 / 17.0) and in the step the cluster 0.03 ms ahead (Q1_0 5.66 against 5.69).
    pub(super) fn mvrt_meet(
        &self,
        sc: &mut Scratch,
        p: &MvrtPlan,
        blocks: usize,
    ) -> Result<(u32, Ks)> {
        if p.parts == 1 || self.mvrt_cluster.unwrap_or(p.parts == 2) {
            return Ok((p.parts as u32, Ks::default()));
        }
        // MT·128 sums a block (its MT tiles' 16 rows × 8 activation rows).
        Ok((
            1,
            self.ks_scratch(sc, blocks * p.rows * 8, blocks / p.parts)?,
        ))
    }

    /// The [`Ks`] of a K split through global memory: room for `sums` partial sums (grown
    /// outside a recorded step) and `counters` zeroed counters, one a tile block.
    pub(super) fn ks_scratch(&self, sc: &mut Scratch, sums: usize, counters: usize) -> Result<Ks> {
        if sc.ksplit.as_ref().is_none_or(|b| b.len() < sums) {
            self.check_alloc("the K split's sums")?;
            self.scratch_moved();
            sc.ksplit = None;
            sc.ksplit = Some(
                self.stream
                    .alloc_zeros::<f32>(sums.max(1 << 18))
                    .map_err(drv)?,
            );
        }
        let p = sc.ksplit.as_ref().map_or(0, |b| self.dptr(b));
        let c = self.fuse_counters(sc, counters)?;
        Ok(Ks { p, c })
    }
}

/// Bytes of a slot of `mvrq`'s ring (gemv_rows.cu `mvrq_impl`'s SLOT): a group of MT
/// tiles' rows.
pub(super) fn mvrq_slot(mt: usize, group_bytes: usize) -> usize {
    mt * MVR_ROWS * group_bytes
}

/// (weights, rows, row bytes, group bytes, box rows) of a [`TMap`].
pub(super) type TMapKey = (u64, usize, usize, usize, usize);

/// A driver tensor map (`CUtensorMap`, 128 opaque bytes) as a kernel takes it by value
/// (common.cuh `TMap`).
#[derive(Clone, Copy)]
#[repr(C, align(128))]
pub(super) struct TMap([u64; 16]);

// SAFETY: plain old data of the kernel parameter's layout (128 bytes), passed by value.
unsafe impl DeviceRepr for TMap {}
const _: () = assert!(std::mem::size_of::<TMap>() == 128);

impl CudaBackend {
    /// The 2-D tensor map of `rows` packed rows of `row_bytes` at device address `w` as
    /// 4-byte words, a box `group_bytes` wide and `box_rows` high (`mvrc_*`), made once.
    pub(super) fn tmap(
        &self,
        w: u64,
        rows: usize,
        row_bytes: usize,
        group_bytes: usize,
        box_rows: usize,
    ) -> Result<TMap> {
        let key = (w, rows, row_bytes, group_bytes, box_rows);
        let mut maps = self.tmaps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(&key) {
            return Ok(*m);
        }
        use sys::{
            CUtensorMapDataType as Dt, CUtensorMapFloatOOBfill as Oob, CUtensorMapInterleave as Il,
            CUtensorMapL2promotion as L2, CUtensorMapSwizzle as Sw,
        };
        let mut m = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        let dims = [(row_bytes / 4) as u64, rows as u64];
        let strides = [row_bytes as u64];
        let boxd = [(group_bytes / 4) as u32, box_rows as u32];
        let elem = [1u32, 1];
        // SAFETY: the arrays hold rank (2) entries (strides rank − 1), `m` is written by
        // the call, and `w` is a live device allocation of rows · row_bytes bytes.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                m.as_mut_ptr(),
                Dt::CU_TENSOR_MAP_DATA_TYPE_UINT32,
                2,
                w as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxd.as_ptr(),
                elem.as_ptr(),
                Il::CU_TENSOR_MAP_INTERLEAVE_NONE,
                Sw::CU_TENSOR_MAP_SWIZZLE_NONE,
                L2::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                Oob::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()
            .map_err(drv)?;
        }
        // SAFETY: written by the successful call above.
        let t = TMap(unsafe { m.assume_init() }.opaque);
        maps.insert(key, t);
        Ok(t)
    }
}
