//! Attention over the KV cache on the CPU: stores a step's keys and values in the cache, then
//! `softmax(scale · q·kᵀ) · v` for every query row and head, causal, with an optional
//! sliding window and soft-cap.
//!
//! Layout: the cache holds, per layer and kv head, `n_ctx` head vectors of `vec_bytes`
//! (f16, f32 or q8_0); q and out are `[rows, n_heads · head_dim]` f32.
//!
//! Tiling (what makes a 28K-token prefill feasible): a task is one kv head × one block of up
//! to `QB` query rows and serves every query head of that head's GQA group, so one key is
//! read for `QB · group` query vectors. Keys and values are visited in tiles of `KT`
//! positions, converted to f32 once per task (64 KiB at head_dim 256, so a tile stays in L2
//! while every query vector of the block uses it); only the tiles inside the block's causal /
//! sliding window are touched. Tasks run across the thread pool.
//!
//! Two passes keep the arithmetic of the one-row reference exactly (`attend` in the tests:
//! the path before tiling): pass 1 writes each query vector's raw scores q·k
//! (`simd::dots`: `simd::dot`'s float order, four queries × two keys per step), then a row
//! softmax (scale, soft-cap, max, `exp`, a sum in key order, weights rounded to f16 unless
//! the cache is f32), then pass 2 adds weight × value tile by tile in key order
//! (`simd::axpys`: `simd::axpy`'s fused multiply-add per key, a row's heads held in
//! registers). Each output element therefore sums over the same keys in the same order as
//! the reference, and the results are bit-identical (tested below on random caches, ragged
//! sizes, GQA, windows, soft-cap, every cache type and `pos0 > 0`). The cost: the scores of
//! a block are held whole (`SCORES_MAX`) instead of an online softmax, which would change the
//! rounding.
//!
//! Split (decode and short batches, `Job::split`): with fewer (kv head, block) tasks than
//! twice the threads — one kv head, as in Gemma 3, leaves one thread with all of a global
//! layer's decode — the positions are split into fixed 512-position chunks instead, in
//! three passes across the pool: (kv head, chunk) tasks write raw scores and each chunk's
//! largest visible score; (kv head, query vector) tasks run the softmax over all chunks (the
//! same weights as the one-row form, bit for bit: the sum is still in key order); (kv head,
//! chunk) tasks add weight × value over their chunk into partial outputs, which are then
//! added in chunk order. Only that last step re-associates (per chunk, then across chunks:
//! ~1e-7 from the one-row form, tested); no flash-decoding rescale is needed since the
//! weights are already normalised. The chunks do not depend on the thread count, so
//! neither does the result. Cost: two more pool barriers per call, and the scores of all
//! positions held at once (`SPLIT_SCORES_MAX`). `NEAGARI_CPU_ATTN_SPLIT=0` turns it off.
//! An earlier variant split pass 3 by output columns (exactly the one-row sums) but its
//! strided value reads were 2–4x slower than one thread.

use std::cell::RefCell;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::pool::{SyncPtr, ThreadPool};
use super::{attend_ggml, ops, shape_err, simd, CpuBuf, CpuKv};
use crate::{Attn, KvType, Result};

/// Query rows per task at most (each serves `QB × group` query vectors per key loaded;
/// 32 measured a little faster than 16 at 4K–28K positions, tests/bench_attention.rs).
const QB: usize = 32;
/// Scores (f32) one task may hold: 16 MiB, e.g. 32 rows × 4 heads × 32K positions.
const SCORES_MAX: usize = 4 << 20;
/// Key positions per tile: `KT × head_dim` f32 of K (pass 1) or V (pass 2) stay in L2.
const KT: usize = 64;

/// Per-thread scratch of a task, kept between calls so a long prefill does not allocate
/// (and page-fault) megabytes of scores per block.
#[derive(Default)]
struct Scratch {
    /// `[qb · group, head_dim]`: the block's query vectors (rounded to f16 unless exact).
    q: Vec<f32>,
    /// `[qb · group, n_pos]`: scores, then softmax weights, of positions `first..=last`.
    s: Vec<f32>,
    /// `[KT, head_dim]`: one tile of keys or values as f32.
    tile: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static SPAN_SCRATCH: RefCell<SpanScratch> = RefCell::new(SpanScratch::default());
    /// The calling thread's buffers of a split call, shared by its tasks (which use
    /// `SCRATCH` for their own tiles, so the two are never borrowed twice).
    static SPLIT: RefCell<SplitScratch> = RefCell::new(SplitScratch::default());
}

/// Per-thread buffers of `ggml_order`'s tasks.
#[derive(Default)]
struct SpanScratch {
    /// `[n_pos, head_dim]` each: a task's span of keys and values as f32.
    k: Vec<f32>,
    v: Vec<f32>,
    group: attend_ggml::GroupScratch,
}

/// Fewest positions worth splitting a block's span across threads: a 512-token sliding
/// window's decode is ~50 µs of work on one thread, too little to pay for two more pool
/// barriers (measured slower split).
const SPLIT_MIN_POS: usize = 1024;
/// Positions of one chunk (a multiple of `KT`): fixed, so that the chunks, and with them
/// the result, do not depend on the thread count.
const SPLIT_CHUNK: usize = 8 * KT;
/// Scores (f32) a split call may hold for all its kv heads: 32 MiB, e.g. 64K positions ×
/// 32 query vectors (decode with a GQA group of 32, or 8 rows of a group of 4).
const SPLIT_SCORES_MAX: usize = 8 << 20;
/// The split form is on unless `NEAGARI_CPU_ATTN_SPLIT=0` (read once; for A/B timing, as
/// `NEAGARI_CUDA_GRAPH`).
fn split_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("NEAGARI_CPU_ATTN_SPLIT").as_deref() != Ok("0"))
}

/// Buffers of one split call (`Job::split`), written by its tasks in disjoint pieces.
#[derive(Default)]
struct SplitScratch {
    /// `[n_kv, nq, head_dim]`: every kv head's query vectors (rounded like `Scratch::q`).
    q: Vec<f32>,
    /// `[n_kv, n_chunks, nq, chunk]`: scores, then softmax weights; chunk-major so that a
    /// pass-1 task owns one contiguous piece.
    s: Vec<f32>,
    /// `[n_kv, n_chunks, nq]`: each chunk's largest visible score per query vector.
    max: Vec<f32>,
    /// `[n_kv, n_chunks, nq, head_dim]`: each chunk's partial weight × value sums.
    part: Vec<f32>,
}

/// Stores the step's keys and values (`k`, `v`: `[rows, n_kv_heads · head_dim]`) at
/// positions `pos0..pos0 + rows` of `layer`, then writes the attention of `q`
/// (`[rows, n_heads · head_dim]`) over positions `..=pos0 + r` into `out` (same shape as `q`).
#[allow(clippy::too_many_arguments)]
pub(super) fn attention(
    pool: &ThreadPool,
    kv: &mut CpuKv,
    layer: usize,
    pos0: usize,
    q: &CpuBuf,
    k: &CpuBuf,
    v: &CpuBuf,
    attn: &Attn,
    out: &mut CpuBuf,
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
    if layer >= kv.k.len() {
        return Err(shape_err(
            "attention",
            format!("layer {layer} has no cache"),
        ));
    }
    // Store the new keys and values.
    let vb = kv.vec_bytes;
    for r in 0..rows {
        for h in 0..nkv {
            let off = kv.offset(h, pos0 + r);
            let ks = &k.data[r * k.cols + h * hd..r * k.cols + (h + 1) * hd];
            let vs = &v.data[r * v.cols + h * hd..r * v.cols + (h + 1) * hd];
            ops::kv_store(kv.shape.ty, ks, &mut kv.k[layer][off..off + vb]);
            ops::kv_store(kv.shape.ty, vs, &mut kv.v[layer][off..off + vb]);
        }
    }
    out.reshape(rows, nh * hd);
    if kv.shape.ty == KvType::F16 && attn.softcap.is_none() && pos0 + rows <= GGML_ORDER_MAX_POS {
        ggml_order(pool, kv, layer, pos0, q, attn, out);
    } else {
        tiled(pool, kv, layer, pos0, q, attn, out, true);
    }
    Ok(())
}

/// The tiled two-pass form (module doc) of positions `..=pos0 + r`, the step's keys and
/// values already stored.
/// `may_split: false` keeps the (kv head, block) tasks (for the tests' comparison).
#[allow(clippy::too_many_arguments)]
fn tiled(
    pool: &ThreadPool,
    kv: &CpuKv,
    layer: usize,
    pos0: usize,
    q: &CpuBuf,
    attn: &Attn,
    out: &mut CpuBuf,
    may_split: bool,
) {
    let (nh, nkv) = (attn.n_heads, attn.n_kv_heads);
    let rows = q.rows;
    // Smaller blocks where one block's scores would pass SCORES_MAX, and where there would
    // be too few tasks to keep every thread busy.
    let group = nh / nkv;
    let n_pos_max = attn
        .window
        .map_or(pos0 + rows, |w| (w + QB).min(pos0 + rows));
    let mut qb = (SCORES_MAX / (group * n_pos_max).max(1)).clamp(1, QB);
    while qb > 4 && nkv * rows.div_ceil(qb) < 4 * pool.n_threads() {
        qb /= 2;
    }
    let n_blocks = rows.div_ceil(qb);
    let job = Job {
        kv,
        layer,
        pos0,
        rows,
        q: &q.data,
        q_cols: q.cols,
        attn,
        out_cols: out.cols,
    };
    // Decode and short batches: too few (kv head, block) tasks for the threads. Split the
    // positions instead (same arithmetic, module doc).
    if may_split
        && split_enabled()
        && pool.n_threads() > 1
        && rows <= QB
        && nkv * n_blocks < 2 * pool.n_threads()
        && n_pos_max >= SPLIT_MIN_POS
        && nkv * rows * group * (n_pos_max + SPLIT_CHUNK) <= SPLIT_SCORES_MAX
        && nkv * rows * group * attn.head_dim * (n_pos_max / SPLIT_CHUNK + 1) <= SPLIT_SCORES_MAX
    {
        SPLIT.with(|s| job.split(pool, &mut s.borrow_mut(), out));
        return;
    }
    let op = SyncPtr(out.data.as_mut_ptr());
    pool.run(nkv * n_blocks, |t| {
        let (h, b) = (t / n_blocks, t % n_blocks);
        let r0 = b * qb;
        let r1 = (r0 + qb).min(rows);
        SCRATCH.with(|s| job.block(&mut s.borrow_mut(), h, r0, r1, op));
    });
}

/// Up to this many positions an f16 cache without soft-cap is attended in ggml's float order
/// (`attend_ggml.rs`: bit-identical to llama.cpp's CPU backend), one query row at a time over
/// f32 copies of the block's whole span. Past it the tiled two-pass form below takes over:
/// the same function with other roundings, and the only one that keeps a long span's keys in
/// L2 (a 28K-token prompt is 6x faster tiled).
const GGML_ORDER_MAX_POS: usize = 2048;

/// ggml's order: tasks of (kv head, block of query rows); each loads its head's span
/// `first..=last` once as f32 and serves every query head of the group (or one of them,
/// where there would be fewer tasks than threads).
fn ggml_order(
    pool: &ThreadPool,
    kv: &CpuKv,
    layer: usize,
    pos0: usize,
    q: &CpuBuf,
    attn: &Attn,
    out: &mut CpuBuf,
) {
    let (nh, nkv, hd) = (attn.n_heads, attn.n_kv_heads, attn.head_dim);
    let rows = q.rows;
    let group = nh / nkv;
    let row_block = if rows >= 64 { 16 } else { rows.max(1) };
    let n_blocks = rows.div_ceil(row_block);
    // Fewer (kv head, block) tasks than threads (decode with one kv head) over a long span:
    // one task per query head instead, each loading the span itself. Every (row, head) is
    // computed alone either way, so the results do not change.
    let lo_of = |p: usize| match attn.window {
        Some(w) => (p + 1).saturating_sub(w),
        None => 0,
    };
    let per = if nkv * n_blocks < pool.n_threads() && pos0 + 1 - lo_of(pos0) >= SPLIT_MIN_POS {
        1
    } else {
        group
    };
    let n_sub = group / per;
    let op = SyncPtr(out.data.as_mut_ptr());
    let out_cols = out.cols;
    pool.run(nkv * n_blocks * n_sub, |t| {
        let (t, sub) = (t / n_sub, t % n_sub);
        let (h, b) = (t / n_blocks, t % n_blocks);
        let heads = h * group + sub * per..h * group + (sub + 1) * per;
        let r0 = b * row_block;
        let r1 = (r0 + row_block).min(rows);
        let last = pos0 + r1 - 1;
        let first = lo_of(pos0 + r0);
        let n_pos = last + 1 - first;
        SPAN_SCRATCH.with_borrow_mut(|sp| {
            let SpanScratch {
                k: kf,
                v: vf,
                group: gs,
            } = sp;
            // [n_pos, hd] each: the span's keys and values as f32 (kv_load writes them all;
            // the buffers stay allocated between tasks: a 512 KB span was an mmap each time).
            kf.resize(n_pos * hd, 0.0);
            vf.resize(n_pos * hd, 0.0);
            let span = kv.offset(h, first)..kv.offset(h, last + 1);
            ops::kv_load(
                kv.shape.ty,
                &kv.k[layer][span.clone()],
                &mut kf[..n_pos * hd],
            );
            ops::kv_load(kv.shape.ty, &kv.v[layer][span], &mut vf[..n_pos * hd]);
            let (kf, vf) = (&kf[..n_pos * hd], &vf[..n_pos * hd]);
            if rows > 1 && attend_ggml::group_available(hd) {
                for r in r0..r1 {
                    let p = pos0 + r;
                    let at = r * q.cols + heads.start * hd;
                    // SAFETY: the task's heads of row r are written by exactly this task.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            op.get().add(r * out_cols + heads.start * hd),
                            per * hd,
                        )
                    };
                    attend_ggml::attend_group(
                        &q.data[at..at + per * hd],
                        per,
                        kf,
                        vf,
                        hd,
                        (lo_of(p) - first, p - first, first),
                        attn.scale,
                        gs,
                        dst,
                    );
                }
                return;
            }
            let mut scores = vec![0f32; n_pos];
            let mut qh = vec![0f32; hd];
            let mut scratch = attend_ggml::Scratch::default();
            for r in r0..r1 {
                let p = pos0 + r;
                for qi in heads.clone() {
                    qh.copy_from_slice(&q.data[r * q.cols + qi * hd..r * q.cols + (qi + 1) * hd]);
                    // SAFETY: (row r, head qi) is written by exactly this task.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(op.get().add(r * out_cols + qi * hd), hd)
                    };
                    attend_ggml::attend(
                        &mut qh,
                        kf,
                        vf,
                        hd,
                        (lo_of(p) - first, p - first, first),
                        attn.scale,
                        rows == 1,
                        &mut scores,
                        &mut scratch,
                        dst,
                    );
                }
            }
        });
    });
}

/// What every task of one `attention` call reads.
struct Job<'a> {
    kv: &'a CpuKv,
    layer: usize,
    pos0: usize,
    rows: usize,
    /// `[rows, q_cols]`.
    q: &'a [f32],
    q_cols: usize,
    attn: &'a Attn,
    out_cols: usize,
}

impl Job<'_> {
    /// First visible position of the query at position `p`.
    fn lo(&self, p: usize) -> usize {
        match self.attn.window {
            Some(w) => (p + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// Query rows `r0..r1` of every query head of kv head `h` into their rows of `out`.
    fn block(&self, sc: &mut Scratch, h: usize, r0: usize, r1: usize, out: SyncPtr<f32>) {
        debug_assert!(r1 <= self.rows);
        let attn = self.attn;
        let (hd, ty) = (attn.head_dim, self.kv.shape.ty);
        let exact = ty == KvType::F32;
        let group = attn.n_heads / attn.n_kv_heads;
        let nq = (r1 - r0) * group;
        let first = self.lo(self.pos0 + r0);
        let last = self.pos0 + r1 - 1;
        let n_pos = last + 1 - first;
        // Query vector i = (r - r0) · group + g is head h · group + g of row r.
        let span = |i: usize| {
            let p = self.pos0 + r0 + i / group;
            (self.lo(p), p)
        };
        grow(&mut sc.q, nq * hd);
        grow(&mut sc.s, nq * n_pos);
        grow(&mut sc.tile, KT * hd);
        for i in 0..nq {
            let (r, qi) = (r0 + i / group, h * group + i % group);
            let dst = &mut sc.q[i * hd..(i + 1) * hd];
            dst.copy_from_slice(
                &self.q[r * self.q_cols + qi * hd..r * self.q_cols + (qi + 1) * hd],
            );
            if !exact {
                round_f16(dst);
            }
        }
        let kc = &self.kv.k[self.layer];
        let vc = &self.kv.v[self.layer];
        let tiles = (first..=last)
            .step_by(KT)
            .map(|t0| (t0, (t0 + KT).min(last + 1)));

        let pos_r0 = self.pos0 + r0;
        // Pass 1: raw scores q·k, one key tile at a time, for the block's rows whose window
        // meets the tile (positions p ≥ t0 with lo(p) < t1: a run of rows, as both grow).
        for (t0, t1) in tiles.clone() {
            let tile = &mut sc.tile[..(t1 - t0) * hd];
            ops::kv_load(ty, &kc[self.kv.offset(h, t0)..self.kv.offset(h, t1)], tile);
            let ra = t0.saturating_sub(pos_r0);
            let rb = (ra..r1 - r0)
                .find(|&j| self.lo(pos_r0 + j) >= t1)
                .unwrap_or(r1 - r0);
            if ra >= rb {
                continue;
            }
            simd::dots(
                &sc.q[ra * group * hd..rb * group * hd],
                tile,
                hd,
                (rb - ra) * group,
                t1 - t0,
                &mut sc.s[ra * group * n_pos + t0 - first..],
                n_pos,
            );
        }
        // Softmax of each query vector's visible scores (scale and soft-cap first), in key
        // order; the weights meet the values as f16 against an f16 / q8_0 cache (ggml
        // converts KQ to f16 before KQ · V).
        for i in 0..nq {
            let (lo, hi) = span(i);
            softmax(
                &mut sc.s[i * n_pos + lo - first..i * n_pos + hi + 1 - first],
                attn,
                exact,
            );
        }
        // Pass 2: weights × values, one value tile at a time, keys in order. A row's query
        // heads of this group are adjacent in `out` and in the scores.
        let row_out = |j: usize| {
            // SAFETY: row r0 + j, heads h·group .. (h+1)·group, is written by this task only
            // (tasks split kv heads and row blocks; a group's heads belong to one kv head).
            unsafe {
                std::slice::from_raw_parts_mut(
                    out.get().add((r0 + j) * self.out_cols + h * group * hd),
                    group * hd,
                )
            }
        };
        for j in 0..r1 - r0 {
            row_out(j).fill(0.0);
        }
        for (t0, t1) in tiles {
            let tile = &mut sc.tile[..(t1 - t0) * hd];
            ops::kv_load(ty, &vc[self.kv.offset(h, t0)..self.kv.offset(h, t1)], tile);
            for j in 0..r1 - r0 {
                let (lo, hi) = span(j * group);
                let (a, b) = (lo.max(t0), (hi + 1).min(t1));
                if a >= b {
                    continue;
                }
                simd::axpys(
                    row_out(j),
                    &sc.s[j * group * n_pos + a - first..],
                    n_pos,
                    &tile[(a - t0) * hd..(b - t0) * hd],
                    hd,
                    group,
                    b - a,
                );
            }
        }
    }
}

impl Job<'_> {
    /// The split form: every query row (at most `QB`) of every kv head in three passes, each
    /// spread across the pool (module doc, "Split"):
    /// 1. (kv head, chunk of positions): raw scores q·k, then scale and soft-cap, and the
    ///    chunk's largest visible score per query vector;
    /// 2. (kv head, query vector): the softmax of its visible scores across the chunks;
    /// 3. (kv head, chunk): weights × values of the chunk into partial outputs;
    ///
    /// then the partials of each query vector added in chunk order.
    fn split(&self, pool: &ThreadPool, sp: &mut SplitScratch, out: &mut CpuBuf) {
        let attn = self.attn;
        let (nkv, hd, ty) = (attn.n_kv_heads, attn.head_dim, self.kv.shape.ty);
        let exact = ty == KvType::F32;
        let group = attn.n_heads / nkv;
        let (rows, pos0) = (self.rows, self.pos0);
        let nq = rows * group;
        let first = self.lo(pos0);
        let last = pos0 + rows - 1;
        let n_pos = last + 1 - first;
        // About four chunks per thread (a thread the OS delays leaves its share to the
        // others), whole tiles, so that tiles never straddle two chunks.
        // Chunks of a fixed size (not a function of the thread count, so the result is not
        // either), whole tiles so that tiles never straddle two chunks.
        let cl = SPLIT_CHUNK;
        let n_chunks = n_pos.div_ceil(cl);
        let piece = nq * cl;
        grow(&mut sp.q, nkv * nq * hd);
        grow(&mut sp.s, nkv * n_chunks * piece);
        grow(&mut sp.max, nkv * n_chunks * nq);
        grow(&mut sp.part, nkv * n_chunks * nq * hd);
        // Query vector i = r · group + g of kv head h is query head h · group + g of row r.
        for h in 0..nkv {
            for i in 0..nq {
                let (r, qi) = (i / group, h * group + i % group);
                let dst = &mut sp.q[(h * nq + i) * hd..(h * nq + i + 1) * hd];
                dst.copy_from_slice(
                    &self.q[r * self.q_cols + qi * hd..r * self.q_cols + (qi + 1) * hd],
                );
                if !exact {
                    round_f16(dst);
                }
            }
        }
        let span = |i: usize| {
            let p = pos0 + i / group;
            (self.lo(p), p)
        };
        let chunk = |c: usize| (first + c * cl, (first + (c + 1) * cl).min(last + 1));
        let (kc, vc) = (&self.kv.k[self.layer], &self.kv.v[self.layer]);
        let qs = &sp.q[..nkv * nq * hd];
        let (sp_s, sp_max) = (SyncPtr(sp.s.as_mut_ptr()), SyncPtr(sp.max.as_mut_ptr()));

        // Pass 1: task t = h · n_chunks + c owns piece t of the scores, `[nq, cl]`.
        pool.run(nkv * n_chunks, |t| {
            let (h, c) = (t / n_chunks, t % n_chunks);
            let (c0, c1) = chunk(c);
            // SAFETY: piece t of the scores and row t of the maxima are this task's alone;
            // `grow` above sized both for every task.
            let (sc, mx) = unsafe {
                (
                    std::slice::from_raw_parts_mut(sp_s.get().add(t * piece), piece),
                    std::slice::from_raw_parts_mut(sp_max.get().add(t * nq), nq),
                )
            };
            let q = &qs[h * nq * hd..(h + 1) * nq * hd];
            SCRATCH.with(|s| {
                let tile_buf = &mut s.borrow_mut().tile;
                grow(tile_buf, KT * hd);
                for t0 in (c0..c1).step_by(KT) {
                    let t1 = (t0 + KT).min(c1);
                    let tile = &mut tile_buf[..(t1 - t0) * hd];
                    ops::kv_load(ty, &kc[self.kv.offset(h, t0)..self.kv.offset(h, t1)], tile);
                    // Rows whose window meets the tile (as in `block`).
                    let ra = t0.saturating_sub(pos0);
                    let rb = (ra..rows)
                        .find(|&j| self.lo(pos0 + j) >= t1)
                        .unwrap_or(rows);
                    if ra >= rb {
                        continue;
                    }
                    simd::dots(
                        &q[ra * group * hd..rb * group * hd],
                        tile,
                        hd,
                        (rb - ra) * group,
                        t1 - t0,
                        &mut sc[ra * group * cl + t0 - c0..],
                        cl,
                    );
                }
            });
            for (i, m) in mx.iter_mut().enumerate() {
                let (lo, hi) = span(i);
                let (a, b) = (lo.max(c0), (hi + 1).min(c1));
                *m = f32::NEG_INFINITY;
                if a < b {
                    let x = &mut sc[i * cl + a - c0..i * cl + b - c0];
                    scale_and_cap(x, attn);
                    *m = max_of(x);
                }
            }
        });

        // Pass 2: task t = h · nq + i owns row i of every piece of kv head h.
        let maxes = SyncPtr(sp_max.get());
        pool.run(nkv * nq, |t| {
            let (h, i) = (t / nq, t % nq);
            let (lo, hi) = span(i);
            let (ca, cb) = ((lo - first) / cl, (hi - first) / cl);
            // The largest visible score: a max, so the order of the chunks does not matter.
            let max = (ca..=cb).fold(f32::NEG_INFINITY, |m, c| {
                // SAFETY: pass 1 has finished; the maxima are only read now.
                m.max(unsafe { *maxes.get().add((h * n_chunks + c) * nq + i) })
            });
            let seg = |c: usize| {
                let (c0, c1) = chunk(c);
                let (a, b) = (lo.max(c0), (hi + 1).min(c1));
                // SAFETY: row i of piece (h, c) is this task's alone (pass 1 has finished).
                unsafe {
                    std::slice::from_raw_parts_mut(
                        sp_s.get().add((h * n_chunks + c) * piece + i * cl + a - c0),
                        b - a,
                    )
                }
            };
            // `softmax`'s steps after the max, the sum in key order across the chunks.
            let mut sum = 0f32;
            for c in ca..=cb {
                for x in seg(c) {
                    *x = (*x - max).exp();
                    sum += *x;
                }
            }
            let inv = 1.0 / sum;
            for c in ca..=cb {
                let x = seg(c);
                x.iter_mut().for_each(|x| *x *= inv);
                if !exact {
                    round_f16(x);
                }
            }
        });

        // Pass 3: task t = h · n_chunks + c adds weight × value over chunk c into its own
        // partial outputs `[nq, hd]` (an `axpy` chain from zero, keys in order).
        let weights = &sp.s[..nkv * n_chunks * piece];
        let sp_part = SyncPtr(sp.part.as_mut_ptr());
        pool.run(nkv * n_chunks, |t| {
            let (h, c) = (t / n_chunks, t % n_chunks);
            let (c0, c1) = chunk(c);
            // SAFETY: partial t is this task's alone; `grow` above sized it.
            let part =
                unsafe { std::slice::from_raw_parts_mut(sp_part.get().add(t * nq * hd), nq * hd) };
            part.fill(0.0);
            let w = &weights[t * piece..(t + 1) * piece];
            SCRATCH.with(|s| {
                let tile_buf = &mut s.borrow_mut().tile;
                grow(tile_buf, KT * hd);
                for t0 in (c0..c1).step_by(KT) {
                    let t1 = (t0 + KT).min(c1);
                    let tile = &mut tile_buf[..(t1 - t0) * hd];
                    ops::kv_load(ty, &vc[self.kv.offset(h, t0)..self.kv.offset(h, t1)], tile);
                    for j in 0..rows {
                        let (lo, hi) = span(j * group);
                        let (a, b) = (lo.max(t0), (hi + 1).min(t1));
                        if a >= b {
                            continue;
                        }
                        simd::axpys(
                            &mut part[j * group * hd..(j + 1) * group * hd],
                            &w[j * group * cl + a - c0..],
                            cl,
                            &tile[(a - t0) * hd..(b - t0) * hd],
                            hd,
                            group,
                            b - a,
                        );
                    }
                }
            });
        });
        // Merge: each query vector's partials of the chunks it sees, added in chunk order.
        let out_cols = self.out_cols;
        for h in 0..nkv {
            for i in 0..nq {
                let (lo, hi) = span(i);
                let (ca, cb) = ((lo - first) / cl, (hi - first) / cl);
                let (r, qi) = (i / group, h * group + i % group);
                let dst = &mut out.data[r * out_cols + qi * hd..r * out_cols + (qi + 1) * hd];
                let part = |c: usize| &sp.part[((h * n_chunks + c) * nq + i) * hd..][..hd];
                dst.copy_from_slice(part(ca));
                for c in ca + 1..=cb {
                    dst.iter_mut().zip(part(c)).for_each(|(d, p)| *d += p);
                }
            }
        }
    }
}

/// Scale and soft-cap, in place (`softmax`'s first steps).
fn scale_and_cap(s: &mut [f32], attn: &Attn) {
    s.iter_mut().for_each(|x| *x *= attn.scale);
    if let Some(cap) = attn.softcap {
        s.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
    }
}

/// Scores → softmax weights, in place: scale, soft-cap, max, `exp` and a sum in key order,
/// weights rounded to f16 unless `exact`.
fn softmax(s: &mut [f32], attn: &Attn, exact: bool) {
    scale_and_cap(s, attn);
    let max = max_of(s);
    let mut sum = 0f32;
    for x in s.iter_mut() {
        *x = (*x - max).exp();
        sum += *x;
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|x| *x *= inv);
    if !exact {
        round_f16(s);
    }
}

/// The largest value, NaN ignored (as a fold with `f32::max`, whose result does not depend
/// on the order: eight running maxima let the loop vectorize).
fn max_of(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for l in 0..8 {
            m[l] = m[l].max(c[l]);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    m.iter().fold(tail, |a, &b| a.max(b))
}

fn grow(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// Rounds to f16 and back (q meets an f16 cache as f16, as in ggml).
fn round_f16(x: &mut [f32]) {
    let mut h = [f16::ZERO; 512];
    for chunk in x.chunks_mut(512) {
        let h = &mut h[..chunk.len()];
        h.convert_from_f32_slice(chunk);
        h.convert_to_f32_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{CpuBackend, CpuOptions};
    use crate::{Backend, KvShape};
    use rand::{Rng, SeedableRng};

    /// One query head over positions `lo..=hi` of `k`/`v` (`[n_pos, hd]` f32):
    /// `out = softmax(scale · q·kᵀ) · v`. `q` and the softmax weights are rounded to f16, as
    /// ggml does against an f16 cache, unless `exact` (an f32 cache).
    ///
    /// The one-row form of the arithmetic (the CPU path before tiling, kept as the
    /// reference): the tiled attention must stay bit-identical to it.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        exact: bool,
        q: &mut [f32],
        k: &[f32],
        v: &[f32],
        hd: usize,
        lo: usize,
        hi: usize,
        attn: &Attn,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let mut qh = [f16::ZERO; 512];
        for chunk in q.chunks_mut(512).filter(|_| !exact) {
            let h = &mut qh[..chunk.len()];
            h.convert_from_f32_slice(chunk);
            h.convert_to_f32_slice(chunk);
        }
        let mut max = f32::NEG_INFINITY;
        for t in lo..=hi {
            let mut s = simd::dot(q, &k[t * hd..(t + 1) * hd]) * attn.scale;
            if let Some(cap) = attn.softcap {
                s = cap * (s / cap).tanh();
            }
            scores[t] = s;
            max = max.max(s);
        }
        let mut sum = 0f32;
        for s in &mut scores[lo..=hi] {
            *s = (*s - max).exp();
            sum += *s;
        }
        let inv = 1.0 / sum;
        out.iter_mut().for_each(|o| *o = 0.0);
        for t in lo..=hi {
            // The weights meet the f16 values as f16, as in ggml's attention (KQ · V with V in
            // f16 converts the f32 softmax to f16 first).
            let p = if exact {
                scores[t] * inv
            } else {
                f16::from_f32(scores[t] * inv).to_f32()
            };
            simd::axpy(out, p, &v[t * hd..(t + 1) * hd]);
        }
    }

    #[test]
    fn attention_of_one_position_returns_its_value() {
        let attn = Attn {
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
            window: None,
            softcap: None,
        };
        let mut q = vec![1.0, 2.0, 3.0, 4.0];
        let k = vec![0.5; 4];
        let v = vec![1.0, -1.0, 2.0, 0.25];
        let mut s = vec![0f32; 1];
        let mut out = vec![9f32; 4];
        attend(false, &mut q, &k, &v, 4, 0, 0, &attn, &mut s, &mut out);
        assert_eq!(out, v);
    }

    fn buf(rng: &mut impl Rng, rows: usize, cols: usize, amp: f32) -> CpuBuf {
        CpuBuf {
            data: (0..rows * cols).map(|_| rng.gen_range(-amp..amp)).collect(),
            rows,
            cols,
        }
    }

    /// The one-row path: every (row, head) on its own through `ops::attend`, over the
    /// cache's positions `lo..=p` loaded as f32.
    fn one_row_path(kv: &CpuKv, layer: usize, pos0: usize, q: &CpuBuf, attn: &Attn) -> Vec<f32> {
        let (nh, hd) = (attn.n_heads, attn.head_dim);
        let group = nh / attn.n_kv_heads;
        let mut out = vec![0f32; q.rows * nh * hd];
        for r in 0..q.rows {
            let p = pos0 + r;
            let lo = attn.window.map_or(0, |w| (p + 1).saturating_sub(w));
            for qi in 0..nh {
                let h = qi / group;
                let n = p + 1 - lo;
                let (mut kf, mut vf) = (vec![0f32; n * hd], vec![0f32; n * hd]);
                let (a, b) = (kv.offset(h, lo), kv.offset(h, p + 1));
                ops::kv_load(kv.shape.ty, &kv.k[layer][a..b], &mut kf);
                ops::kv_load(kv.shape.ty, &kv.v[layer][a..b], &mut vf);
                let mut qh = q.data[r * q.cols + qi * hd..r * q.cols + (qi + 1) * hd].to_vec();
                let mut s = vec![0f32; n];
                let dst = &mut out[(r * nh + qi) * hd..(r * nh + qi + 1) * hd];
                let exact = kv.shape.ty == KvType::F32;
                attend(exact, &mut qh, &kf, &vf, hd, 0, n - 1, attn, &mut s, dst);
            }
        }
        out
    }

    /// Textbook attention in f64 over the cache's (already rounded) keys and values.
    fn naive(kv: &CpuKv, layer: usize, pos0: usize, q: &CpuBuf, attn: &Attn) -> Vec<f64> {
        let (nh, hd) = (attn.n_heads, attn.head_dim);
        let group = nh / attn.n_kv_heads;
        let mut out = vec![0f64; q.rows * nh * hd];
        let load = |c: &[u8], h: usize, t: usize| {
            let mut x = vec![0f32; hd];
            ops::kv_load(
                kv.shape.ty,
                &c[kv.offset(h, t)..kv.offset(h, t + 1)],
                &mut x,
            );
            x
        };
        for r in 0..q.rows {
            let p = pos0 + r;
            let lo = attn.window.map_or(0, |w| (p + 1).saturating_sub(w));
            for qi in 0..nh {
                let h = qi / group;
                let qv = &q.data[r * q.cols + qi * hd..r * q.cols + (qi + 1) * hd];
                let s: Vec<f64> = (lo..=p)
                    .map(|t| {
                        let k = load(&kv.k[layer], h, t);
                        let d: f64 = qv.iter().zip(&k).map(|(a, b)| *a as f64 * *b as f64).sum();
                        let x = d * attn.scale as f64;
                        attn.softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh())
                    })
                    .collect();
                let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for (t, x) in (lo..=p).zip(&s) {
                    let w = (x - m).exp() / z;
                    let v = load(&kv.v[layer], h, t);
                    for d in 0..hd {
                        out[(r * nh + qi) * hd + d] += w * v[d] as f64;
                    }
                }
            }
        }
        out
    }

    /// n_heads, n_kv_heads, head_dim, window, soft-cap, cache type, chunk sizes.
    type Case = (
        usize,
        usize,
        usize,
        Option<usize>,
        Option<f32>,
        KvType,
        &'static [usize],
    );

    #[test]
    fn tiled_attention_is_bit_identical_to_the_one_row_path() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        // (n_heads, n_kv_heads, head_dim, window, soft-cap, cache type, chunk sizes)
        let cases: &[Case] = &[
            (4, 1, 256, None, None, KvType::F16, &[150, 1, 1, 40]),
            (8, 2, 64, Some(20), None, KvType::F16, &[3, 97, 1, 33]),
            (6, 3, 40, Some(70), Some(30.0), KvType::F32, &[71, 64, 2, 1]),
            (4, 2, 64, None, Some(50.0), KvType::Q8_0, &[17, 129, 1]),
            (2, 2, 16, Some(1), None, KvType::F16, &[5, 1]),
            // Long spans after a first chunk, then single rows (decode).
            (4, 1, 256, None, None, KvType::F16, &[300, 1, 1, 2]),
            (8, 2, 64, Some(260), Some(20.0), KvType::Q8_0, &[280, 1, 3]),
            (6, 2, 40, None, None, KvType::F32, &[270, 1]),
            (2, 1, 160, None, None, KvType::Q8_0, &[257, 2]),
        ];
        for threads in [1, 3] {
            let be = CpuBackend::new(&CpuOptions {
                threads,
                scalar_only: false,
            });
            for &(nh, nkv, hd, window, softcap, ty, chunks) in cases {
                let attn = Attn {
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                    window,
                    softcap,
                };
                let n_ctx: usize = chunks.iter().sum::<usize>() + 3;
                let mut kv = be
                    .kv_alloc(&KvShape {
                        n_layers: 2,
                        n_ctx,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        ty,
                    })
                    .unwrap();
                let mut pos0 = 0;
                for &rows in chunks {
                    // Large q so that the softmax is peaked somewhere and flat elsewhere.
                    let q = buf(&mut rng, rows, nh * hd, 2.0);
                    let k = buf(&mut rng, rows, nkv * hd, 1.0);
                    let v = buf(&mut rng, rows, nkv * hd, 1.0);
                    let mut out = CpuBuf {
                        data: Vec::new(),
                        rows: 0,
                        cols: 0,
                    };
                    be.attention(&mut kv, 1, pos0, &q, &k, &v, &attn, &mut out)
                        .unwrap();
                    let what = format!(
                        "{nh}/{nkv}x{hd} window {window:?} softcap {softcap:?} {ty:?} \
                         pos0 {pos0} rows {rows} threads {threads}"
                    );
                    assert_eq!((out.rows, out.cols), (rows, nh * hd), "{what}");
                    // The tiled form itself (short f16 spans take ggml's order in `attention`).
                    let mut tiled_out = CpuBuf {
                        data: vec![0.0; rows * nh * hd],
                        rows,
                        cols: nh * hd,
                    };
                    tiled(&be.pool, &kv, 1, pos0, &q, &attn, &mut tiled_out, false);
                    let want = one_row_path(&kv, 1, pos0, &q, &attn);
                    for (j, (a, b)) in tiled_out.data.iter().zip(&want).enumerate() {
                        assert_eq!(a.to_bits(), b.to_bits(), "{what}: element {j}: {a} vs {b}");
                    }
                    // And the math itself, of both forms: f16 weights and q cost ~1e-3.
                    let exact = naive(&kv, 1, pos0, &q, &attn);
                    let tol = if ty == KvType::F32 { 1e-5 } else { 1e-2 };
                    for o in [&out, &tiled_out] {
                        for (j, (a, b)) in o.data.iter().zip(&exact).enumerate() {
                            assert!(
                                (*a as f64 - b).abs() < tol,
                                "{what}: element {j}: {a} vs {b}"
                            );
                        }
                    }
                    be.kv_commit(&mut kv, pos0 + rows).unwrap();
                    pos0 += rows;
                }
            }
        }
    }

    /// Fills positions `..n` of every kv head of `layer` with random keys and values (as
    /// a prefill would leave them, without paying for its attention).
    fn fill(kv: &mut CpuKv, layer: usize, n: usize, rng: &mut impl Rng) {
        let (nkv, hd, ty) = (kv.shape.n_kv_heads, kv.shape.head_dim, kv.shape.ty);
        let vb = kv.vec_bytes;
        for h in 0..nkv {
            for t in 0..n {
                let off = kv.offset(h, t);
                let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
                ops::kv_store(ty, &x, &mut kv.k[layer][off..off + vb]);
                let x: Vec<f32> = (0..hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
                ops::kv_store(ty, &x, &mut kv.v[layer][off..off + vb]);
            }
        }
    }

    /// The split form (decode and short batches over long spans) against the one-row path
    /// on fresh random caches: within a few ulps (same weights, the output's terms added
    /// per chunk), bit-identical for every thread count, and within float error of f64
    /// attention.
    #[test]
    fn split_attention_matches_the_one_row_path() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(29);
        // (n_heads, n_kv_heads, head_dim, window, soft-cap, cache type, cached positions,
        // query rows of the calls that follow)
        type SplitCase = (
            usize,
            usize,
            usize,
            Option<usize>,
            Option<f32>,
            KvType,
            usize,
            &'static [usize],
        );
        let cases: &[SplitCase] = &[
            // Gemma 3 270M's shape: one kv head, a group of four, head_dim 256.
            (4, 1, 256, None, None, KvType::F16, 2500, &[1, 1, 3]),
            (4, 1, 256, Some(512), None, KvType::F16, 2600, &[1, 2]),
            (4, 1, 256, None, None, KvType::Q8_0, 1000, &[1, 5]),
            (4, 1, 256, Some(512), None, KvType::Q8_0, 700, &[1, 32]),
            // Ragged spans (not whole tiles or chunks), GQA groups, several kv heads.
            (8, 2, 128, None, Some(50.0), KvType::F16, 1283, &[1, 7]),
            (8, 1, 64, Some(333), None, KvType::Q8_0, 517, &[1, 2, 1]),
            (6, 3, 96, None, Some(30.0), KvType::F32, 301, &[1, 4]),
            (2, 2, 80, None, None, KvType::F16, 2049, &[1, 1]),
            (1, 1, 32, Some(257), None, KvType::F32, 263, &[1, 9]),
            (16, 2, 64, None, None, KvType::Q8_0, 3001, &[1]),
        ];
        let mut worst = 0f32;
        for &(nh, nkv, hd, window, softcap, ty, cached, calls) in cases {
            let attn = Attn {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                softcap,
            };
            let n_ctx = cached + calls.iter().sum::<usize>();
            let shape = KvShape {
                n_layers: 1,
                n_ctx,
                n_kv_heads: nkv,
                head_dim: hd,
                ty,
            };
            let mut kv = CpuBackend::new(&CpuOptions {
                threads: 1,
                scalar_only: false,
            })
            .kv_alloc(&shape)
            .unwrap();
            fill(&mut kv, 0, cached, &mut rng);
            let mut pos0 = cached;
            for &rows in calls {
                let q = buf(&mut rng, rows, nh * hd, 2.0);
                let k = buf(&mut rng, rows, nkv * hd, 1.0);
                let v = buf(&mut rng, rows, nkv * hd, 1.0);
                let want = {
                    // Store this call's keys and values once, then compute the reference.
                    let be = CpuBackend::new(&CpuOptions {
                        threads: 1,
                        scalar_only: false,
                    });
                    let mut o = CpuBuf {
                        data: Vec::new(),
                        rows: 0,
                        cols: 0,
                    };
                    be.attention(&mut kv, 0, pos0, &q, &k, &v, &attn, &mut o)
                        .unwrap();
                    one_row_path(&kv, 0, pos0, &q, &attn)
                };
                let exact = naive(&kv, 0, pos0, &q, &attn);
                let mut first_bits = None;
                for threads in [1, 2, 3, 4] {
                    let be = CpuBackend::new(&CpuOptions {
                        threads,
                        scalar_only: false,
                    });
                    let what = format!(
                        "{nh}/{nkv}x{hd} window {window:?} softcap {softcap:?} {ty:?} \
                         pos0 {pos0} rows {rows} threads {threads}"
                    );
                    let job = Job {
                        kv: &kv,
                        layer: 0,
                        pos0,
                        rows,
                        q: &q.data,
                        q_cols: q.cols,
                        attn: &attn,
                        out_cols: nh * hd,
                    };
                    let mut split_out = CpuBuf {
                        data: vec![f32::NAN; rows * nh * hd],
                        rows,
                        cols: nh * hd,
                    };
                    SPLIT.with(|s| job.split(&be.pool, &mut s.borrow_mut(), &mut split_out));
                    // And through `attention` (which picks the split form for these shapes
                    // where threads outnumber kv heads; past 2,048 positions for f16).
                    let mut routed = CpuBuf {
                        data: Vec::new(),
                        rows: 0,
                        cols: 0,
                    };
                    be.attention(&mut kv, 0, pos0, &q, &k, &v, &attn, &mut routed)
                        .unwrap();
                    // The same bits for every thread count (the chunks are fixed).
                    let bits: Vec<u32> = split_out.data.iter().map(|x| x.to_bits()).collect();
                    match &first_bits {
                        None => first_bits = Some(bits),
                        Some(b) => assert_eq!(&bits, b, "{what}: differs from 1 thread"),
                    }
                    // Against the one-row path: the same weights; only the order in which
                    // each output element adds its chunks' terms differs (a few ulps).
                    let via_tiled = ty != KvType::F16 || softcap.is_some() || pos0 + rows > 2048;
                    for (j, (a, b)) in split_out.data.iter().zip(&want).enumerate() {
                        assert!((a - b).abs() <= 1e-6, "{what}: element {j}: {a} vs {b}");
                        worst = worst.max((a - b).abs());
                        if via_tiled {
                            let c = routed.data[j];
                            assert!((c - b).abs() <= 1e-6, "{what}: routed {j}: {c} vs {b}");
                        }
                    }
                    let tol = if ty == KvType::F32 { 1e-5 } else { 1e-2 };
                    for (j, (a, b)) in split_out.data.iter().zip(&exact).enumerate() {
                        assert!(
                            (*a as f64 - b).abs() < tol,
                            "{what}: element {j}: {a} vs {b}"
                        );
                    }
                }
                pos0 += rows;
            }
        }
        // A test that the comparison can see a difference at all: the chunk order does
        // change some bits.
        assert!(
            worst > 0.0,
            "split form identical to the one-row path everywhere"
        );
        println!("split form vs one-row path: largest difference {worst:e}");
    }

    /// A sliding-window layer uses nothing before its window: positions before it hold NaN
    /// (any use would spread to the output), on every path (ggml's order, tiled, split).
    #[test]
    fn sliding_window_uses_nothing_before_the_window() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(37);
        let (nh, nkv, hd) = (4, 1, 256);
        // Gemma 3's 512-token window (never split), and a window long enough to be split.
        let cases = [
            (512, 1500, 1),
            (512, 3000, 1),
            (512, 3000, 5),
            (512, 3000, 40),
            (512, 700, 64),
            (1500, 1800, 1),
            (1500, 3000, 1),
            (1500, 3000, 7),
        ];
        for ty in [KvType::F16, KvType::Q8_0, KvType::F32] {
            for (w, cached, rows) in cases {
                let attn = Attn {
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: 1.0 / 16.0,
                    window: Some(w),
                    softcap: None,
                };
                let shape = KvShape {
                    n_layers: 1,
                    n_ctx: cached + rows,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    ty,
                };
                let mut kv = CpuBackend::new(&CpuOptions {
                    threads: 1,
                    scalar_only: false,
                })
                .kv_alloc(&shape)
                .unwrap();
                fill(&mut kv, 0, cached, &mut rng);
                // NaN in every value of positions before the first row's window.
                let nan: Vec<u8> = match ty {
                    KvType::F16 => f16::NAN.to_bits().to_le_bytes().repeat(hd),
                    KvType::F32 => f32::NAN.to_bits().to_le_bytes().repeat(hd),
                    KvType::Q8_0 => [f16::NAN.to_bits().to_le_bytes().to_vec(), vec![1u8; 32]]
                        .concat()
                        .repeat(hd / 32),
                };
                let lo = (cached + 1).saturating_sub(w);
                for t in 0..lo {
                    let off = kv.offset(0, t);
                    kv.k[0][off..off + kv.vec_bytes].copy_from_slice(&nan);
                    kv.v[0][off..off + kv.vec_bytes].copy_from_slice(&nan);
                }
                let q = buf(&mut rng, rows, nh * hd, 2.0);
                let k = buf(&mut rng, rows, nkv * hd, 1.0);
                let v = buf(&mut rng, rows, nkv * hd, 1.0);
                for threads in [1, 2, 3] {
                    let be = CpuBackend::new(&CpuOptions {
                        threads,
                        scalar_only: false,
                    });
                    let mut o = CpuBuf {
                        data: Vec::new(),
                        rows: 0,
                        cols: 0,
                    };
                    be.attention(&mut kv, 0, cached, &q, &k, &v, &attn, &mut o)
                        .unwrap();
                    let want = one_row_path(&kv, 0, cached, &q, &attn);
                    assert!(
                        o.data.iter().all(|x| x.is_finite()),
                        "{ty:?} window {w} at {cached} rows {rows} threads {threads}"
                    );
                    if ty != KvType::F16 || cached + rows > 2048 {
                        for (a, b) in o.data.iter().zip(&want) {
                            assert!(
                                (a - b).abs() <= 1e-6,
                                "{ty:?} window {w} at {cached} rows {rows}: {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Decode attention of one kv head (Gemma 3 270M's shape), the split form against the
    /// (kv head, block) tasks on the same cache, calls interleaved so that both see the same
    /// load; prints the median and fastest call of each (tuning only):
    ///
    ///     NEAGARI_BENCH_THREADS=2 cargo test --release -p neagari-backend --lib \
    ///         bench_split_decode -- --ignored --nocapture
    #[test]
    #[ignore]
    fn bench_split_decode() {
        let threads: usize = std::env::var("NEAGARI_BENCH_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2);
        let be = CpuBackend::new(&CpuOptions {
            threads,
            scalar_only: false,
        });
        let mut rng = rand::rngs::StdRng::seed_from_u64(41);
        let (nh, nkv, hd) = (4, 1, 256);
        for ty in [KvType::F16, KvType::Q8_0] {
            let n_ctx = 28 * 1024;
            let mut kv = be
                .kv_alloc(&KvShape {
                    n_layers: 1,
                    n_ctx,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    ty,
                })
                .unwrap();
            fill(&mut kv, 0, n_ctx, &mut rng);
            let attn = Attn {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                scale: 1.0 / 16.0,
                window: None,
                softcap: None,
            };
            for pos in [4095, 16383, n_ctx - 1] {
                let q = buf(&mut rng, 1, nh * hd, 2.0);
                let mut out = CpuBuf {
                    data: vec![0.0; nh * hd],
                    rows: 1,
                    cols: nh * hd,
                };
                let n = 60;
                let mut times = [Vec::new(), Vec::new()];
                for i in 0..2 * n {
                    let t = std::time::Instant::now();
                    tiled(&be.pool, &kv, 0, pos, &q, &attn, &mut out, i % 2 == 1);
                    times[i % 2].push(t.elapsed().as_secs_f64() * 1e3);
                }
                for t in &mut times {
                    t.sort_by(f64::total_cmp);
                }
                println!(
                    "{ty:?} decode at {pos:>5}, {threads} threads: one task per kv head {:.3} ms \
                     (fastest {:.3}), split {:.3} ms (fastest {:.3})",
                    times[0][n / 2],
                    times[0][0],
                    times[1][n / 2],
                    times[1][0]
                );
            }
        }
    }

    /// ggml's order split by query head (decode with fewer kv heads than threads) gives the
    /// bits of the one-task-per-kv-head form (one thread).
    #[test]
    fn ggml_order_by_query_head_changes_no_bits() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(31);
        for (nh, nkv, window, cached, rows) in [
            (4, 1, None, 1500, 1),
            (4, 1, Some(512), 2000, 1),
            (8, 2, None, 1100, 1),
            (4, 1, None, 1030, 3),
            (4, 1, None, 300, 1),
        ] {
            let hd = 256;
            let attn = Attn {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                scale: 1.0 / 16.0,
                window,
                softcap: None,
            };
            let shape = KvShape {
                n_layers: 1,
                n_ctx: cached + rows,
                n_kv_heads: nkv,
                head_dim: hd,
                ty: KvType::F16,
            };
            let one = CpuBackend::new(&CpuOptions {
                threads: 1,
                scalar_only: false,
            });
            let mut kv = one.kv_alloc(&shape).unwrap();
            fill(&mut kv, 0, cached, &mut rng);
            let q = buf(&mut rng, rows, nh * hd, 2.0);
            let k = buf(&mut rng, rows, nkv * hd, 1.0);
            let v = buf(&mut rng, rows, nkv * hd, 1.0);
            let mut outs = Vec::new();
            for threads in [1, 2, 4, 8] {
                let be = CpuBackend::new(&CpuOptions {
                    threads,
                    scalar_only: false,
                });
                let mut o = CpuBuf {
                    data: Vec::new(),
                    rows: 0,
                    cols: 0,
                };
                be.attention(&mut kv, 0, cached, &q, &k, &v, &attn, &mut o)
                    .unwrap();
                outs.push(o.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            for o in &outs[1..] {
                assert_eq!(o, &outs[0], "{nh}/{nkv} window {window:?} at {cached}");
            }
            // And it is attention (the exact-order path is tested against llama.cpp in the
            // engine's tests).
            let exact = naive(&kv, 0, cached, &q, &attn);
            for (a, b) in outs[0].iter().zip(&exact) {
                assert!((f32::from_bits(*a) as f64 - b).abs() < 1e-2);
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let be = CpuBackend::new(&CpuOptions {
            threads: 1,
            scalar_only: false,
        });
        let mut kv = be
            .kv_alloc(&KvShape {
                n_layers: 1,
                n_ctx: 8,
                n_kv_heads: 1,
                head_dim: 4,
                ty: KvType::F16,
            })
            .unwrap();
        let attn = Attn {
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
            window: None,
            softcap: None,
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let (q, k, v) = (
            buf(&mut rng, 2, 8, 1.0),
            buf(&mut rng, 2, 4, 1.0),
            buf(&mut rng, 2, 4, 1.0),
        );
        let mut out = CpuBuf {
            data: Vec::new(),
            rows: 0,
            cols: 0,
        };
        // Past the context, and a layer the cache does not have.
        assert!(be
            .attention(&mut kv, 0, 7, &q, &k, &v, &attn, &mut out)
            .is_err());
        assert!(be
            .attention(&mut kv, 1, 0, &q, &k, &v, &attn, &mut out)
            .is_err());
        assert!(be
            .attention(&mut kv, 0, 6, &q, &k, &v, &attn, &mut out)
            .is_ok());
    }
}
