//! The decode chain (NEAGARI_CUDA_CHAIN=1, opt-in until measured): inside a one-token
//! decode step, the GEMVs, GLU GEMVs, residual norms and adds between two other kernels are
//! not launched one by one but recorded as instructions and run as ONE persistent launch
//! (kernels/chain.cu) when anything else needs the GPU — a mixer's kernel, a copy, the
//! step's read. One block an SM streams the weights of all of them through a ring of
//! shared memory, so the memory does not idle at each GEMV's boundary (session 31's
//! prototype, bench/cuda/persistent_chain_proto.cu, measures the idea alone).
//!
//! What it takes: one activation row; Q1_0 (repacked, rows of whole 1024-weight groups)
//! and Q4_K weights, K ≤ 17,408, rows a multiple of 16 (8 for the GLU); anything else runs
//! as before and ends the chain. Only inside a step (the arena's buffers live to its end,
//! so a recorded instruction's buffers cannot be freed under it); graphs capture the launch
//! like any other. An instruction waits for the earlier ones whose outputs it reads or
//! whose inputs it overwrites (device address ranges), transitively reduced.

use super::*;

pub(super) const CHAIN: &str = include_str!("kernels/chain.cu");

/// chain.cu's CN_MAXI, CN_MAXNS, CN_SLOT, CN_MAXK, CN_ACT, CN_T.
const MAXI: usize = 16;
const MAXNS: usize = 16;
const SLOT: usize = 16 * (6 * 144 + 16);
const MAXK: usize = 17408;
const ACT: usize = MAXK + MAXK / 32 * 8;
const THREADS: u32 = 9 * 32;
/// Ring slots (14 KB each): the most that fit beside the activation.
const SLOTS: usize = 14;
const _: () = assert!(SLOTS <= MAXNS && SLOTS * SLOT + ACT <= 227 * 1024);
/// Counters: instructions and the exit count first, then the K-split tiles'.
const TILE_CNT0: usize = MAXI + 1;
const COUNTERS: usize = 1 << 16;
/// f32 sums of the K parts of a chain's split GEMVs.
const PART: usize = 1 << 20;

const GEMV: u32 = 0;
const GLU: u32 = 1;
const ADD_NORM: u32 = 2;
const NORM: u32 = 3;
const ADD: u32 = 4;
const Q1_0R: u32 = 0;
const Q4_K: u32 = 1;

/// One instruction (chain.cu `CIns`, the same layout).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct Ins {
    w0: u64,
    w1: u64,
    x: u64,
    y: u64,
    o0: u64,
    o1: u64,
    gamma: u64,
    part: u64,
    kind: u32,
    fmt: u32,
    rows: u32,
    k: u32,
    row_bytes: u32,
    nkc: u32,
    deps: u32,
    tcnt: u32,
    eps: f32,
    act: u32,
    reuse: u32,
    pad: u32,
}

/// The kernel's parameter (chain.cu `ChainArgs`), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    ins: [Ins; MAXI],
    cnt: u64,
    n: u32,
    ns: u32,
}

// SAFETY: plain data in the layout of chain.cu's `ChainArgs` (u64 and u32 fields, no
// padding the kernel reads); passed by value as a kernel parameter.
unsafe impl DeviceRepr for Args {}

/// A byte range of device memory.
type Span = (u64, u64);

fn overlaps(a: &[Span], b: &[Span]) -> bool {
    a.iter()
        .any(|&(a0, a1)| b.iter().any(|&(b0, b1)| a0 < b1 && b0 < a1))
}

/// The instructions recorded since the last launch.
#[derive(Default)]
struct Pending {
    ins: Vec<Ins>,
    reads: Vec<Vec<Span>>,
    writes: Vec<Vec<Span>>,
    /// Every instruction each one waits for, directly or through another.
    closure: Vec<u32>,
    part_used: usize,
    tiles_used: usize,
}

/// The chain's kernel and its device memory.
pub(super) struct Chain {
    func: CudaFunction,
    cnt: CudaSlice<u32>,
    part: CudaSlice<f32>,
    pending: Mutex<Pending>,
    /// Launches made (or replayed in a graph), for tests.
    launched: AtomicU64,
}

impl Chain {
    /// Compiles and loads the kernel (sm_90 and newer) and allocates its counters (zero)
    /// and K-part sums.
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        arch: &str,
    ) -> Result<Chain> {
        let ptx = compile("chain", arch, "", CHAIN)?;
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(drv)?;
        let func = m.load_function("chain").map_err(drv)?;
        let smem = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        func.set_attribute(smem, (SLOTS * SLOT + ACT) as i32)
            .map_err(drv)?;
        Ok(Chain {
            func,
            cnt: stream.alloc_zeros::<u32>(COUNTERS).map_err(drv)?,
            part: stream.alloc_zeros::<f32>(PART).map_err(drv)?,
            pending: Mutex::new(Pending::default()),
            launched: AtomicU64::new(0),
        })
    }
}

impl CudaBackend {
    fn chain_of(&self, rows: usize) -> Option<&Chain> {
        let on = rows == 1 && self.step_mode() != graph::OFF && !self.profiling();
        self.chain.as_ref().filter(|_| on)
    }

    /// The chain's format code of `w` as a GEMV of `rows_mult`-row tiles, if it takes it.
    fn chain_fmt(&self, w: &CudaMat, rows_mult: usize) -> Option<u32> {
        let fmt = match w.ty {
            GgmlType::Q1_0 if self.repack && w.cols.is_multiple_of(1024) => Q1_0R,
            GgmlType::Q4_K if w.cols.is_multiple_of(256) => Q4_K,
            _ => return None,
        };
        let group = if fmt == Q1_0R { 1024 } else { 256 };
        (w.cols <= MAXK
            && w.rows > 0
            && w.rows.is_multiple_of(rows_mult)
            && w.row_bytes == w.cols / group * 144)
            .then_some(fmt)
    }

    fn span(&self, b: &CudaBuf) -> Span {
        let p = self.dptr(&b.data);
        (p, p + 4 * (b.rows * b.cols) as u64)
    }

    /// K parts of a GEMV of `tiles` tiles over `groups` groups: enough units for every
    /// consumer warp of the grid (8 an SM), each part at least one group.
    fn chain_parts(&self, tiles: usize, groups: usize) -> usize {
        (self.n_sm * 8).div_ceil(tiles).clamp(1, groups.min(8))
    }

    /// Adds an instruction (its deps from the address ranges), launching what is pending
    /// first where it would not fit.
    fn chain_push(
        &self,
        ch: &Chain,
        mut ins: Ins,
        reads: Vec<Span>,
        writes: Vec<Span>,
    ) -> Result<()> {
        let tiles = if ins.nkc > 1 {
            ins.rows as usize / 16
        } else {
            0
        };
        let part = if ins.nkc > 1 {
            ins.nkc as usize * ins.rows as usize
        } else {
            0
        };
        let full = {
            let p = ch.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.ins.len() == MAXI
                || p.part_used + part > PART
                || TILE_CNT0 + p.tiles_used + tiles > COUNTERS
        };
        if full {
            self.chain_flush()?;
        }
        let mut p = ch.pending.lock().unwrap_or_else(|e| e.into_inner());
        if ins.nkc > 1 {
            ins.part = self.dptr(&ch.part) + 4 * p.part_used as u64;
            ins.tcnt = (TILE_CNT0 + p.tiles_used) as u32;
            p.part_used += part;
            p.tiles_used += tiles;
        }
        let mut deps = 0u32;
        let mut closure = 0u32;
        for j in 0..p.ins.len() {
            if overlaps(&p.writes[j], &reads)
                || overlaps(&p.writes[j], &writes)
                || overlaps(&p.reads[j], &writes)
            {
                deps |= 1 << j;
                closure |= (1 << j) | p.closure[j];
            }
        }
        // An instruction done means every instruction it waited for is done.
        let implied = (0..p.ins.len())
            .filter(|j| deps & (1 << j) != 0)
            .fold(0u32, |m, j| m | p.closure[j]);
        ins.deps = deps & !implied;
        // The activation the instruction before made, where it is this one's.
        if let Some(prev) = p.ins.last() {
            let gemv = |i: &Ins| i.kind == GEMV || i.kind == GLU;
            ins.reuse = (gemv(prev)
                && gemv(&ins)
                && prev.x == ins.x
                && prev.fmt == ins.fmt
                && prev.k == ins.k
                && prev.nkc == 1
                && ins.nkc == 1
                && deps & (1 << (p.ins.len() - 1)) == 0) as u32;
        }
        p.ins.push(ins);
        p.reads.push(reads);
        p.writes.push(writes);
        p.closure.push(closure);
        drop(p);
        // What the instruction writes is written as far as `Scratch::xq_key` knows.
        self.bump();
        Ok(())
    }

    /// Launches what is pending as one chain (a no-op when nothing is).
    pub(super) fn chain_flush(&self) -> Result<()> {
        let Some(ch) = self.chain.as_ref() else {
            return Ok(());
        };
        let mut p = ch.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.ins.is_empty() {
            return Ok(());
        }
        let mut args = Args {
            ins: [Ins::default(); MAXI],
            cnt: self.dptr(&ch.cnt),
            n: p.ins.len() as u32,
            ns: SLOTS as u32,
        };
        args.ins[..p.ins.len()].copy_from_slice(&p.ins);
        *p = Pending::default();
        drop(p);
        let cfg = LaunchConfig {
            grid_dim: (self.n_sm as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (SLOTS * SLOT + ACT) as u32,
        };
        self.launches.fetch_add(1, Ordering::Relaxed);
        ch.launched.fetch_add(1, Ordering::Relaxed);
        if self.replaying() {
            return Ok(());
        }
        // SAFETY: every address in `args` is a live device allocation for the step (arena
        // buffers, weights, the chain's counters and sums), of the sizes the instructions
        // say; the kernel takes one `ChainArgs` by value.
        unsafe { self.launch_raw(&ch.func, cfg, 1, &mut [karg(&args)]) }
    }

    /// Chain launches so far (replayed ones too), or `None` where the chain is off.
    pub fn chain_launches(&self) -> Option<u64> {
        self.chain
            .as_ref()
            .map(|c| c.launched.load(Ordering::Relaxed))
    }

    /// Drops what is pending (a step that ended without its read: its work is lost).
    pub(super) fn chain_discard(&self) {
        if let Some(ch) = self.chain.as_ref() {
            *ch.pending.lock().unwrap_or_else(|e| e.into_inner()) = Pending::default();
        }
    }

    /// `matmul_multi` (and `matmul`) into the chain, if it takes every matrix.
    pub(super) fn chain_matmul(
        &self,
        ws: &[&CudaMat],
        x: &CudaBuf,
        outs: &mut [&mut CudaBuf],
    ) -> Result<bool> {
        let Some(ch) = self.chain_of(x.rows) else {
            return Ok(false);
        };
        let fmts: Vec<Option<u32>> = ws.iter().map(|w| self.chain_fmt(w, 16)).collect();
        if ws.iter().any(|w| w.cols != x.cols) || fmts.iter().any(Option::is_none) {
            return Ok(false);
        }
        for (i, w) in ws.iter().enumerate() {
            self.reshape(outs[i], 1, w.rows)?;
            let fmt = fmts[i].unwrap_or(Q4_K);
            let groups = w.cols / if fmt == Q1_0R { 1024 } else { 256 };
            let ins = Ins {
                kind: GEMV,
                fmt,
                w0: self.dptr(&w.data),
                x: self.dptr(&x.data),
                o0: self.dptr(&outs[i].data),
                rows: w.rows as u32,
                k: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                nkc: self.chain_parts(w.rows / 16, groups) as u32,
                ..Ins::default()
            };
            let (r, o) = (self.span(x), self.span(outs[i]));
            self.chain_push(ch, ins, vec![r], vec![o])?;
        }
        Ok(true)
    }

    /// `matmul_glu` into the chain, if it takes both matrices.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn chain_glu(
        &self,
        gate: &CudaMat,
        up: &CudaMat,
        x: &CudaBuf,
        act: GluAct,
        g: &mut CudaBuf,
        u: &mut CudaBuf,
    ) -> Result<bool> {
        let Some(ch) = self.chain_of(x.rows) else {
            return Ok(false);
        };
        let (Some(fmt), Some(fu)) = (self.chain_fmt(gate, 8), self.chain_fmt(up, 8)) else {
            return Ok(false);
        };
        if fmt != fu
            || gate.rows != up.rows
            || gate.cols != x.cols
            || up.cols != x.cols
            || gate.row_bytes != up.row_bytes
        {
            return Ok(false);
        }
        self.reshape(g, 1, gate.rows)?;
        self.reshape(u, 1, gate.rows)?;
        let ins = Ins {
            kind: GLU,
            fmt,
            w0: self.dptr(&gate.data),
            w1: self.dptr(&up.data),
            x: self.dptr(&x.data),
            o0: self.dptr(&g.data),
            o1: self.dptr(&u.data),
            rows: gate.rows as u32,
            k: gate.cols as u32,
            row_bytes: gate.row_bytes as u32,
            nkc: 1,
            act: match act {
                GluAct::Silu => 0,
                GluAct::GeluTanh => 1,
            },
            ..Ins::default()
        };
        let (r, wg, wu) = (self.span(x), self.span(g), self.span(u));
        self.chain_push(ch, ins, vec![r], vec![wg, wu])?;
        Ok(true)
    }

    /// `add_rms_norm` (with `y`) or `rms_norm` into the chain: one row.
    pub(super) fn chain_norm(
        &self,
        x: &CudaBuf,
        y: Option<&CudaBuf>,
        w: &CudaVector,
        eps: f32,
        out: &mut CudaBuf,
    ) -> Result<bool> {
        let Some(ch) = self.chain_of(x.rows) else {
            return Ok(false);
        };
        if w.len != x.cols || y.is_some_and(|y| y.rows * y.cols != x.cols) {
            return Ok(false);
        }
        self.reshape(out, 1, x.cols)?;
        let ins = Ins {
            kind: if y.is_some() { ADD_NORM } else { NORM },
            x: self.dptr(&x.data),
            y: y.map_or(0, |y| self.dptr(&y.data)),
            o0: self.dptr(&out.data),
            gamma: self.dptr(&w.data),
            k: x.cols as u32,
            eps,
            ..Ins::default()
        };
        let mut reads = vec![self.span(x)];
        reads.extend(y.map(|y| self.span(y)));
        let mut writes = vec![self.span(out)];
        if y.is_some() {
            writes.push(self.span(x));
        }
        self.chain_push(ch, ins, reads, writes)?;
        Ok(true)
    }

    /// `add` (x += y) of one row into the chain.
    pub(super) fn chain_add(&self, x: &CudaBuf, y: &CudaBuf) -> Result<bool> {
        let Some(ch) = self.chain_of(x.rows) else {
            return Ok(false);
        };
        if y.rows * y.cols != x.cols {
            return Ok(false);
        }
        let ins = Ins {
            kind: ADD,
            x: self.dptr(&x.data),
            y: self.dptr(&y.data),
            k: x.cols as u32,
            ..Ins::default()
        };
        let (sx, sy) = (self.span(x), self.span(y));
        self.chain_push(ch, ins, vec![sx, sy], vec![sx])?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_the_kernels() {
        // chain.cu: 8 u64, 12 u32 an instruction; MAXI of them, a u64 and two u32.
        assert_eq!(std::mem::size_of::<Ins>(), 112);
        assert_eq!(std::mem::size_of::<Args>(), 112 * MAXI + 16);
    }

    #[test]
    fn spans_overlap_only_where_they_share_bytes() {
        assert!(overlaps(&[(0, 8)], &[(4, 12)]));
        assert!(!overlaps(&[(0, 8)], &[(8, 12)]));
        assert!(!overlaps(&[], &[(0, 1)]));
    }
}
