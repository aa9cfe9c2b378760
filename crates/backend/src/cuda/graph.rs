//! CUDA graph replay of decode steps, and the greedy argmax on the device.
//!
//! The engine brackets a decode step with `Backend::step_begin` / `step_end`: one token, or
//! up to 8 (`MV_MAX_ROWS`: the verify forward of a speculative block, which stays on the
//! GEMV kernels). Inside it the backend runs in one of three modes:
//! - `Warm`: ops run as usual, but the step's activation buffers come from an arena (the
//!   i-th buffer the step asks for is always arena slot i, so it has the same address every
//!   step), the token ids and the position are uploaded at `step_begin` into device memory
//!   that `embed`, `rope`, `kv_store` and `attention` read, and scratch that must grow grows.
//! - `Capture`: the next step with the same key is recorded by stream capture; the graph is
//!   instantiated and launched when the model reads its result (`read`, or `argmax`, which
//!   then runs after the graph).
//! - `Replay`: later steps with that key launch the graph at `step_begin` and skip every
//!   launch and copy (only the host-side shape bookkeeping runs, which checks that the step
//!   makes as many launches as the recording).
//!
//! The key is (the KV cache's id, the attention split class of the step's last position,
//! the scratch epoch, the number of tokens). Attention splits the visible positions into a
//! number of blocks that depends on the position; in a step it is computed from the lowest
//! position of the 64-position class instead, so it is constant across the class (the
//! kernel divides the actual positions, read from device memory, among that many blocks).
//! A new class, a new cache, a new token count or grown scratch (the epoch) makes a new
//! key: one warm step, one capture, then replays. Up to `GRAPHS` recordings are kept (the
//! newest), so a speculative loop that alternates one-token steps and 8-token verifies
//! replays both.
//! Caches with recurrent state (`rec_alloc`) are recorded too: their conv windows and
//! delta-rule states live at fixed device addresses for the cache's life (a restore copies
//! into them, a truncate to 0 clears them in place), so a graph that updates them in place
//! stays valid across `kv_restore` / `kv_truncate`. A step that reads back in the middle
//! (MoE routing) is recorded up to that read; the rest of it runs as usual every time.
//! `NEAGARI_CUDA_GRAPH=0` turns graphs off.

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;

use cudarc::driver::{CudaGraph, CudaSlice, LaunchConfig};

use super::{drv, CudaBackend, CudaBuf, CudaKv, TOPK_N, TOPK_THREADS};
use crate::{Backend, BackendError, Candidates, Penalties, Result, Settles};

/// Positions per attention split class (the split count changes at multiples of 64).
pub(super) const POS_CLASS: usize = 64;

/// `CudaBackend::mode` values.
pub(super) const OFF: u8 = 0;
pub(super) const WARM: u8 = 1;
pub(super) const CAPTURE: u8 = 2;
pub(super) const REPLAY: u8 = 3;

/// Recorded steps kept (the oldest is dropped).
const GRAPHS: usize = 8;

/// Most tokens a recorded step holds (the GEMV's rows; more go through cuBLAS, whose
/// scratch may grow inside the step).
pub(super) const STEP_MAX_TOKENS: usize = super::MV_MAX_ROWS;

/// A new cache's `CudaKv::id`.
pub(super) fn next_kv_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// (KV cache id, position class of the last token, scratch epoch, tokens).
type Key = (u64, usize, u64, usize);

/// A recorded step. cudarc's graph holds raw driver handles and is not `Send`.
pub(super) struct Recorded(CudaGraph);

// SAFETY: the graph is only touched under the backend's step mutex, so calls on it are
// serialized (what CUDA requires of graph objects); the driver handles are valid on any
// thread bound to the context, which cudarc binds before each call.
unsafe impl Send for Recorded {}

/// Decode-step state of the backend (see the module docs).
#[derive(Default)]
pub(super) struct Step {
    key: Option<Key>,
    /// Keys of the last warm steps that reached their read: the next step with one captures.
    warm: Vec<Key>,
    /// The recorded steps, oldest first: key, graph and how many launches it holds.
    graphs: Vec<(Key, Recorded, usize)>,
    /// Arena slots lent in step order; `next` is the next slot to lend.
    arena: Vec<CudaSlice<f32>>,
    next: usize,
    /// Slots replaced by larger ones: kept (not freed) while the backend lives, since a
    /// buffer lent from them may still be alive.
    retired: Vec<CudaSlice<f32>>,
    /// `[pos, token 0, token 1, ..]`: the step's position, read by rope / kv_store /
    /// attention, and its token ids, read by embed (`STEP_MAX_TOKENS + 1` values).
    pos: Option<CudaSlice<i32>>,
    /// Tokens of the step under way.
    n_tokens: usize,
    /// The read of this step happened (a warm step may then be captured next time).
    finished: bool,
    /// Graphs captured and replayed (for tests and measurements).
    pub(super) captures: u64,
    pub(super) replays: u64,
    /// With NEAGARI_CUDA_STEP_STATS=1: when the replayed step under way began, and the
    /// sums over replayed steps of the host's walk (begin to read) and of the whole step
    /// (begin to the argmax ids on the host), printed every 64 steps.
    stats: Option<StepStats>,
}

#[derive(Default)]
struct StepStats {
    began: Option<std::time::Instant>,
    walk: std::time::Duration,
    whole: std::time::Duration,
    steps: u32,
}

impl Step {
    pub(super) fn new() -> Step {
        let on = super::knob_forced("NEAGARI_CUDA_STEP_STATS") == Some(true);
        Step {
            stats: on.then(StepStats::default),
            ..Step::default()
        }
    }
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        // SAFETY: `data` is not used after this point (we are in drop).
        let s = unsafe { ManuallyDrop::take(&mut self.data) };
        if self.lent {
            // An arena slot's alias: the arena owns (and frees) the memory.
            s.leak();
        }
    }
}

impl CudaBackend {
    pub(super) fn step_mode(&self) -> u8 {
        self.mode.load(Ordering::Relaxed)
    }

    /// Whether launches and copies are skipped (a replayed step).
    pub(super) fn replaying(&self) -> bool {
        self.step_mode() == REPLAY
    }

    /// Allocation is not allowed while a step is captured or replayed: it would change
    /// addresses the graph holds (or be recorded into it).
    pub(super) fn check_alloc(&self, what: &str) -> Result<()> {
        match self.step_mode() {
            CAPTURE | REPLAY => Err(BackendError::Other(format!(
                "cuda graph: {what} would allocate inside a recorded decode step"
            ))),
            _ => Ok(()),
        }
    }

    /// Scratch at a new address: recorded graphs that use the old one are stale.
    pub(super) fn scratch_moved(&self) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// Device address of the step's position when a step is on, else 0 (kernels then take
    /// the position argument). The step's token ids follow it (4 bytes on).
    pub(super) fn step_posp(&self) -> u64 {
        if self.step_mode() == OFF {
            return 0;
        }
        let st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        st.pos.as_ref().map_or(0, |p| self.dptr(p))
    }

    /// Tokens of the step under way (0 when no step is on).
    pub(super) fn step_tokens(&self) -> usize {
        if self.step_mode() == OFF {
            return 0;
        }
        let st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        st.n_tokens
    }

    /// The last position attention's split count is computed from: the lowest of the
    /// position's class during a step, so the graph's launch shapes hold across the class.
    pub(super) fn split_last(&self, last: usize) -> usize {
        if self.step_mode() == OFF {
            last
        } else {
            (last / POS_CLASS * POS_CLASS).max(1)
        }
    }

    /// An activation buffer of `n` values: from the arena during a step, else allocated.
    pub(super) fn lend(&self, n: usize) -> Result<(CudaSlice<f32>, bool)> {
        if self.step_mode() == OFF {
            return Ok((self.alloc_f32(n)?, false));
        }
        let mut st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        let i = st.next;
        st.next += 1;
        if st.arena.get(i).is_none_or(|s| s.len() < n) {
            self.check_alloc("an activation buffer")?;
            let s = self.alloc_f32(n)?;
            if i < st.arena.len() {
                let old = std::mem::replace(&mut st.arena[i], s);
                st.retired.push(old);
            } else {
                st.arena.push(s);
            }
            self.scratch_moved();
        }
        let slot = &st.arena[i];
        let (ptr, len) = (self.dptr(slot), slot.len());
        // SAFETY: `ptr` is a live allocation of `len` f32 owned by the arena, which never
        // frees it while the backend lives (replaced slots are retired, not freed); the
        // alias is leaked, not freed, when its `CudaBuf` drops.
        let alias = unsafe { self.stream.upgrade_device_ptr::<f32>(ptr, len) };
        Ok((alias, true))
    }

    /// Step mode for `tokens` at the cache's end. Steps of more than `STEP_MAX_TOKENS`
    /// tokens run as usual (no arena, no recording).
    pub(super) fn step_begin_impl(&self, kv: &CudaKv, tokens: &[u32]) -> Result<()> {
        self.step_end_impl();
        let n = tokens.len();
        if !self.graphs_on.load(Ordering::Relaxed)
            || self.profiling()
            || n == 0
            || n > STEP_MAX_TOKENS
        {
            return Ok(());
        }
        let pos = kv.len;
        let mut st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        if st.pos.is_none() {
            st.pos = Some(
                self.stream
                    .alloc_zeros::<i32>(STEP_MAX_TOKENS + 1)
                    .map_err(drv)?,
            );
        }
        // One upload a step: [position, token ids].
        if let Some(p) = st.pos.as_mut() {
            let mut up = [0i32; STEP_MAX_TOKENS + 1];
            up[0] = pos as i32;
            for (u, &t) in up[1..].iter_mut().zip(tokens) {
                *u = t as i32;
            }
            self.stream
                .memcpy_htod(&up[..n + 1], &mut p.slice_mut(0..n + 1))
                .map_err(drv)?;
        }
        let key = (
            kv.id,
            (pos + n) / POS_CLASS,
            self.epoch.load(Ordering::Relaxed),
            n,
        );
        st.key = Some(key);
        st.n_tokens = n;
        st.next = 0;
        st.finished = false;
        self.launches.store(0, Ordering::Relaxed);
        let mode = if let Some((_, g, _)) = st.graphs.iter().find(|g| g.0 == key) {
            // Launched now, not at the read: the graph depends on nothing the step's host
            // code does (only on the upload above), so the GPU runs it while the host walks
            // the model's ops to check the step is the recorded one.
            g.0.launch().map_err(drv)?;
            if let Some(s) = st.stats.as_mut() {
                s.began = Some(std::time::Instant::now());
            }
            REPLAY
        } else if st.warm.contains(&key) {
            st.warm.retain(|k| *k != key);
            self.stream
                .begin_capture(
                    cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
                )
                .map_err(drv)?;
            CAPTURE
        } else {
            WARM
        };
        self.mode.store(mode, Ordering::Relaxed);
        Ok(())
    }

    /// The model reads its result: a captured step is instantiated and launched, a replayed
    /// one launched; the rest of the step (if any) runs as usual.
    pub(super) fn step_finish(&self) -> Result<()> {
        let mode = self.step_mode();
        if mode == OFF {
            return Ok(());
        }
        self.mode.store(OFF, Ordering::Relaxed);
        let mut st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        st.finished = true;
        let n = self.launches.load(Ordering::Relaxed);
        match mode {
            CAPTURE => {
                let g = match self
                    .stream
                    .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
                {
                    Ok(Some(g)) => g,
                    failed => {
                        // This step's work is lost; later steps run without graphs.
                        st.warm.clear();
                        self.graphs_on.store(false, Ordering::Relaxed);
                        return Err(BackendError::Other(format!(
                            "cuda graph: capture failed ({:?}); graphs are off from now on",
                            failed.err()
                        )));
                    }
                };
                g.launch().map_err(drv)?;
                st.captures += 1;
                if let Some(key) = st.key {
                    st.graphs.retain(|g| g.0 != key);
                    if st.graphs.len() >= GRAPHS {
                        st.graphs.remove(0);
                    }
                    st.graphs.push((key, Recorded(g), n));
                }
            }
            REPLAY => {
                let key = st.key;
                let recorded = st.graphs.iter().find(|g| Some(g.0) == key).map(|g| g.2);
                if recorded != Some(n) {
                    // A model whose step differs from its recording (a bug): the graph ran
                    // already, so this step's result is wrong; drop it and report.
                    st.graphs.retain(|g| Some(g.0) != key);
                    return Err(BackendError::Other(format!(
                        "cuda graph: the step made {n} launches, the recording {recorded:?}"
                    )));
                }
                st.replays += 1;
                if let Some(t) = st.stats.as_mut().and_then(|s| s.began) {
                    if let Some(s) = st.stats.as_mut() {
                        s.walk += t.elapsed();
                    }
                }
            }
            _ => {}
        }
        // What the q8_1 scratch holds is no longer tied to this step's launches.
        self.scratch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .xq_key = None;
        Ok(())
    }

    pub(super) fn step_end_impl(&self) {
        let mode = self.mode.swap(OFF, Ordering::Relaxed);
        let mut st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        if mode == CAPTURE {
            // The step failed before its read: drop the partial recording.
            let _ = self
                .stream
                .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            if let Some(key) = st.key {
                st.warm.retain(|k| *k != key);
            }
        }
        let recorded = st.graphs.iter().any(|g| Some(g.0) == st.key);
        if st.finished && !recorded {
            // A warm step: the next one with the same key (same epoch: nothing grew) captures.
            let epoch = self.epoch.load(Ordering::Relaxed);
            if let Some(key) = st.key.filter(|k| k.2 == epoch) {
                if !st.warm.contains(&key) {
                    if st.warm.len() >= GRAPHS {
                        st.warm.remove(0);
                    }
                    st.warm.push(key);
                }
            }
        }
        if mode == REPLAY && !st.finished {
            let key = st.key;
            st.graphs.retain(|g| Some(g.0) != key);
        }
        st.key = None;
        st.finished = false;
    }

    /// Turns decode-step graphs on or off (on unless NEAGARI_CUDA_GRAPH=0); takes effect
    /// at the next `step_begin`.
    pub fn set_graphs(&self, on: bool) {
        self.graphs_on.store(on, Ordering::Relaxed);
    }

    /// A replayed step's ids are on the host: its time goes into the sums (see
    /// [`Step::stats`]).
    fn step_stats_done(&self) {
        let mut st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        let Some(s) = st.stats.as_mut() else { return };
        let Some(t) = s.began.take() else { return };
        s.whole += t.elapsed();
        s.steps += 1;
        if s.steps == 64 {
            eprintln!(
                "cuda: 64 replayed steps: host walk {:.1} µs, whole step {:.1} µs a step",
                s.walk.as_secs_f64() * 1e6 / 64.0,
                s.whole.as_secs_f64() * 1e6 / 64.0
            );
            *s = StepStats::default();
        }
    }

    /// (graphs captured, steps replayed) so far.
    pub fn graph_stats(&self) -> (u64, u64) {
        let st = self.step.lock().unwrap_or_else(|e| e.into_inner());
        (st.captures, st.replays)
    }

    /// Greedy pick of each row on the device (`argmax_rows`); only the ids come back.
    /// It runs after the step's graph, not in it: a step recorded with a logits read and
    /// one with an argmax then share one graph (a session may alternate them).
    pub(super) fn argmax_impl(&self, x: &CudaBuf) -> Result<Vec<u32>> {
        if x.rows == 0 {
            return Ok(Vec::new());
        }
        self.step_finish()?;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if sc.amax.as_ref().is_none_or(|s| s.len() < x.rows) {
            sc.amax = Some(
                self.stream
                    .alloc_zeros::<u64>(x.rows.max(64))
                    .map_err(drv)?,
            );
        }
        let Some(keys) = sc.amax.as_mut() else {
            return Err(BackendError::Other("cuda: argmax scratch missing".into()));
        };
        let mut kv = keys.slice_mut(0..x.rows);
        self.stream.memset_zeros(&mut kv).map_err(drv)?;
        let kp = self.dptr(keys);
        // Blocks of 256 threads over 4,096-value chunks (61 for a 248,320-token vocabulary).
        let chunk = 4096usize;
        let cfg = LaunchConfig {
            grid_dim: (x.cols.div_ceil(chunk).max(1) as u32, x.rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let xp = self.dptr(&x.data);
        let (cols_i, chunk_i) = (x.cols as i32, chunk as i32);
        launch!(
            self,
            &self.ops.argmax_rows,
            cfg,
            &xp,
            &cols_i,
            &chunk_i,
            &kp
        )?;
        let mut k = vec![0u64; x.rows];
        self.stream
            .memcpy_dtoh(&keys.slice(0..x.rows), &mut k)
            .map_err(drv)?;
        self.synchronize()?;
        self.step_stats_done();
        // A zero key: no value that is not NaN (id 0); else the complement of the index.
        Ok(k.iter()
            .map(|&k| if k == 0 { 0 } else { !(k as u32) })
            .collect())
    }

    /// The k best of each row on the device (`topk_chunks`, then `topk_merge`: ops.cu);
    /// only k keys a row come back. Both take K, the power of two from k; a row whose
    /// chunks' K best do not fit one merge (a power of two of chunks · K > TOPK_N), or a k
    /// over 64, is read back and selected on the host.
    pub(super) fn top_k_impl(
        &self,
        x: &CudaBuf,
        k: usize,
        pen: &Penalties,
    ) -> Result<Vec<Vec<(u32, f32)>>> {
        if x.rows == 0 || k.min(x.cols) == 0 {
            return Ok(vec![Vec::new(); x.rows]);
        }
        match self.select(x, k, pen, false)? {
            Selected::Host(mut host) => Ok(crate::top_k_rows_host(&mut host, x.cols, k, pen)),
            Selected::Device(rows) => Ok(rows.into_iter().map(|(top, _)| top).collect()),
        }
    }

    /// `Backend::candidates` on the device: `select` with the softmax sums of the last row;
    /// the row (penalized in place) comes back only where `enough` says no.
    pub(super) fn candidates_impl(
        &self,
        x: &CudaBuf,
        k: usize,
        pen: &Penalties,
        enough: &Settles<'_>,
    ) -> Result<Candidates> {
        let (rows, cols) = (x.rows, x.cols);
        let mut row = vec![0f32; cols];
        if rows == 0 || cols == 0 {
            return Ok(Candidates::All(row));
        }
        match self.select(x, k.max(1), pen, true)? {
            Selected::Host(host) => {
                // Read back as it was: penalized here.
                row.copy_from_slice(&host[(rows - 1) * cols..]);
                pen.apply(&mut row);
                Ok(Candidates::All(row))
            }
            Selected::Device(mut sel) => {
                let (top, (max, sum)) = sel.pop().unwrap_or_default();
                if enough(&top, max, sum) {
                    return Ok(Candidates::Top { top, max, sum });
                }
                // The penalties were applied in place.
                Backend::read(self, x, rows - 1, 1, &mut row)?;
                Ok(Candidates::All(row))
            }
        }
    }

    /// The k (≥ 1) best of each row after `pen`, and with `sums` each row's softmax sums
    /// (its largest value and Σ exp(v − max)), selected on the device with the penalties
    /// applied in place; or, where the device's selection does not take this k and width,
    /// the rows read back as they are.
    fn select(&self, x: &CudaBuf, k: usize, pen: &Penalties, sums: bool) -> Result<Selected> {
        let (rows, cols) = (x.rows, x.cols);
        let k = k.min(cols);
        let big_k = k.next_power_of_two();
        let chunks = cols.div_ceil(TOPK_N);
        let runs = chunks.next_power_of_two();
        if big_k > 64 || runs * big_k > TOPK_N {
            let mut host = vec![0f32; rows * cols];
            Backend::read(self, x, 0, rows, &mut host)?;
            return Ok(Selected::Host(host));
        }
        self.step_finish()?;
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let xp = self.dptr(&x.data);
        if !pen.tokens.is_empty() {
            // [ids; subs' bits], uploaded, then applied in place to every row.
            let n = pen.tokens.len();
            let host: Vec<u32> = (pen.tokens.iter().map(|&(t, _)| t))
                .chain(pen.tokens.iter().map(|&(_, s)| s.to_bits()))
                .collect();
            if sc.topk_pen.as_ref().is_none_or(|b| b.len() < 2 * n) {
                let len = 2 * n.max(64);
                sc.topk_pen = Some(self.stream.alloc_zeros::<u32>(len).map_err(drv)?);
            }
            let Some(buf) = sc.topk_pen.as_mut() else {
                return Err(BackendError::Other("cuda: penalty scratch missing".into()));
            };
            self.stream
                .memcpy_htod(&host, &mut buf.slice_mut(0..2 * n))
                .map_err(drv)?;
            let ids = self.dptr(buf);
            let subs = ids + (4 * n) as u64;
            let (cols_i, n_i) = (cols as i32, n as i32);
            let cfg = LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (n.next_multiple_of(32).min(256) as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let rp = pen.repeat;
            launch!(
                self,
                &self.ops.penalize,
                cfg,
                &xp,
                &cols_i,
                &ids,
                &subs,
                &n_i,
                &rp
            )?;
        }
        // [rows, chunks, K] chunk keys, then [rows, K] merged keys; with `sums`, then
        // [rows, chunks] chunk sums and [rows] row sums (a float2 in a word each).
        let keys_len = rows * (chunks + 1) * big_k;
        let need = keys_len + if sums { rows * (chunks + 1) } else { 0 };
        if sc.topk.as_ref().is_none_or(|s| s.len() < need) {
            sc.topk = Some(self.stream.alloc_zeros::<u64>(need).map_err(drv)?);
        }
        let Some(buf) = sc.topk.as_ref() else {
            return Err(BackendError::Other("cuda: top-k scratch missing".into()));
        };
        let part = self.dptr(buf);
        let off = rows * chunks * big_k;
        let keys = part + (off * 8) as u64;
        // Null pointers: no sums.
        let (ms, ms_row) = if sums {
            let ms = part + (keys_len * 8) as u64;
            (ms, ms + (rows * chunks * 8) as u64)
        } else {
            (0u64, 0u64)
        };
        let (cols_i, k_i, chunks_i, runs_i) =
            (cols as i32, big_k as i32, chunks as i32, runs as i32);
        let cfg = LaunchConfig {
            grid_dim: (chunks as u32, rows as u32, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            &self.ops.topk_chunks,
            cfg,
            &xp,
            &cols_i,
            &k_i,
            &part,
            &ms
        )?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            self,
            &self.ops.topk_merge,
            cfg,
            &part,
            &chunks_i,
            &runs_i,
            &k_i,
            &keys,
            &ms,
            &ms_row
        )?;
        let mut host = vec![0u64; rows * big_k];
        self.stream
            .memcpy_dtoh(&buf.slice(off..off + rows * big_k), &mut host)
            .map_err(drv)?;
        let mut row_sums = vec![0u64; if sums { rows } else { 0 }];
        if sums {
            let at = keys_len + rows * chunks;
            self.stream
                .memcpy_dtoh(&buf.slice(at..at + rows), &mut row_sums)
                .map_err(drv)?;
        }
        self.synchronize()?;
        self.step_stats_done();
        // Zero keys (NaN, or past a short row) end a row's list; else the monotone bits of
        // the value (amax_key) and the complement of the index. A row's sums are a float2
        // (max, sum): the low word first.
        let sums_of = |r: usize| {
            row_sums.get(r).map_or((f32::NEG_INFINITY, 0.0), |&w| {
                (f32::from_bits(w as u32), f32::from_bits((w >> 32) as u32))
            })
        };
        Ok(Selected::Device(
            host.chunks(big_k)
                .enumerate()
                .map(|(r, keys)| {
                    let top = keys
                        .iter()
                        .take(k)
                        .take_while(|&&key| key != 0)
                        .map(|&key| {
                            let o = (key >> 32) as u32;
                            let b = if o & 0x8000_0000 != 0 {
                                o & 0x7fff_ffff
                            } else {
                                !o
                            };
                            (!(key as u32), f32::from_bits(b))
                        })
                        .collect();
                    (top, sums_of(r))
                })
                .collect(),
        ))
    }
}

/// A row's k best and its softmax sums (`select`).
type RowSel = (Vec<(u32, f32)>, (f32, f32));

/// What `select` brings back: each row's k best and softmax sums (max, Σ exp(v − max)),
/// or the rows as they are where the device's selection does not take the shape.
enum Selected {
    Device(Vec<RowSel>),
    Host(Vec<f32>),
}
