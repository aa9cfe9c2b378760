//! The decode chain (NEAGARI_CUDA_CHAIN=1, opt-in until measured): inside a one-token
//! decode step, the GEMVs, GLU GEMVs, residual norms and adds between two other kernels are
//! not launched one by one but recorded as instructions and run as ONE persistent launch
//! (kernels/chain.cu) when anything else needs the GPU — a mixer's kernel, a copy, the
//! step's read. One block an SM streams the weights of all of them through a ring of
//! shared memory, so the memory does not idle at each GEMV's boundary (session 31's
//! prototype, bench/cuda/persistent_chain_proto.cu, measures the idea alone).
//!
//! What it takes: one activation row; Q1_0 (repacked, rows of whole 1024-weight groups),
//! Q4_K and TQ2_0 (repacked) weights, K ≤ 17,408, rows a multiple of 16 (8 for the GLU); anything else runs
//! as before and ends the chain. Only inside a step (the arena's buffers live to its end,
//! so a recorded instruction's buffers cannot be freed under it); graphs capture the launch
//! like any other; off while `--profile` times kernels one by one. An instruction waits for
//! the earlier ones whose outputs it reads or whose inputs it overwrites (device address
//! ranges), transitively reduced.

use super::*;

pub(super) const CHAIN: &str = include_str!("kernels/chain.cu");

/// The chain module's defines (its compile key): Q1_0 on int8 MMA (the default), or with
/// NEAGARI_CUDA_CHAIN_Q1=p128 on binary MMA over an activation with a scale a 128-value
/// block (CN_Q1_P128; a speed experiment only: rounding per 128 values triples the KL
/// divergence of per-32 on the test model, BENCHMARKS session 35).
pub(super) fn defines() -> String {
    match std::env::var("NEAGARI_CUDA_CHAIN_Q1").as_deref() {
        Ok("p128") => "#define CN_Q1_P128 1\n",
        _ => "",
    }
    .to_string()
}

/// A block's make-up (chain.cu CN_W, CN_CH): 8 consumer warps, chunks of at most 6 groups a
/// row, 14 ring slots. A consumer's parity wait on its next slot needs the slot's fill
/// before it done, so warps ≤ slots (16 warps on 14 slots hung in session 33; 16 on 16
/// slots ran at 75.9 tok/s against 8 warps' 129.5, session 35).
const WARPS: usize = 8;
const CHUNK_GROUPS: usize = 6;
const SLOTS: usize = 14;
/// chain.cu's CN_SLOT: 16 rows of a chunk (+ 16 bytes a row).
const SLOT: usize = 16 * (CHUNK_GROUPS * 144 + 16);
const SMEM: usize = SLOTS * SLOT + ACT;
const THREADS: u32 = 32 * (WARPS as u32 + 1);

const _: () = {
    // TQ2_0's chunk is one 528-byte group.
    assert!(WARPS <= SLOTS && SLOTS <= MAXNS && SMEM <= 227 * 1024);
    assert!(16 * (528 + 16) <= SLOT);
};

/// chain.cu's CN_MAXI, CN_MAXNS, CN_MAXK, CN_ACT.
const MAXI: usize = 25;
const MAXNS: usize = 16;
const MAXK: usize = 17408;
const ACT: usize = MAXK + MAXK / 32 * 8;
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
const DELTA: u32 = 5;
const Q1_0R: u32 = 0;
const Q4_K: u32 = 1;
const TQ2_0R: u32 = 2;

/// Weights of a format's group (chain.cu `cn_group_weights`).
fn group_weights(fmt: u32) -> usize {
    match fmt {
        Q1_0R => 1024,
        Q4_K => 256,
        _ => 2048,
    }
}

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
    nx: u64,
    ny: u64,
    aux: u64,
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
    norm: u32,
    mat: u32,
    /// GEMV with `w1`: `w0`'s rows (its tiles first, then `w1`'s; outputs o0, o1).
    rows0: u32,
    map0: u64,
    map1: u64,
}

/// The kernel's parameter (chain.cu `ChainArgs`), passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    ins: [Ins; MAXI],
    cnt: u64,
    n: u32,
    ns: u32,
    prof: u64,
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

/// See [`CudaBackend::chain_parts`]: 1..=8 parts (at most `groups`), the fewest rounds of
/// `warps` units a block per part; one where a block has over two rounds anyway.
fn chain_parts(n_sm: usize, warps: usize, tiles: usize, groups: usize) -> usize {
    let rounds = |nkc: usize| (tiles * nkc).div_ceil(n_sm.max(1)).div_ceil(warps);
    if rounds(1) > 2 {
        // Enough rounds that the last one's idle warps matter little.
        return 1;
    }
    (1..=groups.clamp(1, 8))
        .min_by(|&a, &b| (rounds(a) * b).cmp(&(rounds(b) * a)).then(a.cmp(&b)))
        .unwrap_or(1)
}

/// The GEMVs of one `matmul_multi` (matrices of `rows`, formats `fmts`; rows the same
/// width): the largest with the smallest of its format, and so on, in the largest's order
/// (a matrix alone where none is left). Two GEMVs of one input in one instruction share its
/// rounds of units, and a few-row one (a DeltaNet's β, α: 48 rows, 15 blocks of one unit)
/// no longer costs a whole instruction's latency of its own.
fn pairs(rows: &[usize], fmts: &[u32]) -> Vec<(usize, Option<usize>)> {
    let mut left: Vec<usize> = (0..rows.len()).collect();
    left.sort_by(|&a, &b| rows[b].cmp(&rows[a]).then(a.cmp(&b)));
    let mut out = Vec::new();
    while !left.is_empty() {
        let i = left.remove(0);
        let j = left
            .iter()
            .rposition(|&j| fmts[j] == fmts[i])
            .map(|p| left.remove(p));
        out.push((i, j));
    }
    out
}

/// A profiled chain (`Chain::prof`) summed up, an instruction a line: when its blocks
/// began waiting, started and ended (µs from the launch's first wait; medians over the
/// blocks that took part, then the last end), what the median and the slowest block spent
/// on it, the weight bytes a ns over its span (GB/s), when the producers began and ended
/// its loads, and the median stalls of the producer (slots not yet free) and of consumer
/// warp 0 (data not yet in).
fn prof_report(ins: &[Ins], t: &[u64], nb: usize) -> String {
    let at = |o: usize, b: usize, f: usize| t[(o * nb + b) * PROF + f];
    let t0 = (0..ins.len() * nb)
        .map(|ob| at(ob / nb, ob % nb, P_WAIT))
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(0);
    let us = |v: u64| v.saturating_sub(t0) as f64 / 1e3;
    let med = |mut v: Vec<u64>| -> u64 {
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let words = trace(ins);
    let mut out = String::new();
    let mut last = 0u64;
    for (o, (i, w)) in ins.iter().zip(words.split(" | ")).enumerate() {
        let on: Vec<usize> = (0..nb).filter(|&b| at(o, b, P_END) > 0).collect();
        let col = |f: usize| on.iter().map(|&b| at(o, b, f)).collect::<Vec<u64>>();
        let (start, end) = (col(P_START), col(P_END));
        let (Some(&first), Some(&end_max)) = (start.iter().min(), end.iter().max()) else {
            continue;
        };
        last = last.max(end_max);
        let busy: Vec<u64> = on
            .iter()
            .map(|&b| at(o, b, P_END).saturating_sub(at(o, b, P_START)))
            .collect();
        let busy_max = busy.iter().copied().max().unwrap_or(0);
        let bytes = match i.kind {
            GEMV => i.rows as u64 * i.row_bytes as u64,
            GLU => 2 * i.rows as u64 * i.row_bytes as u64,
            _ => 0,
        };
        let rate = match end_max.saturating_sub(first) {
            0 => 0.0,
            span => bytes as f64 / span as f64,
        };
        out += &format!(
            "  {w:<40} wait {:7.1} start {:7.1} end {:7.1} last {:7.1} busy {:6.1}/{:6.1} {rate:5.0} GB/s loads {:7.1}-{:7.1} stall p {:5.1} c {:5.1}\n",
            us(med(col(P_WAIT))),
            us(med(start)),
            us(med(end)),
            us(end_max),
            med(busy) as f64 / 1e3,
            busy_max as f64 / 1e3,
            us(med(col(P_P0))),
            us(med(col(P_P1))),
            med(col(P_PSTALL)) as f64 / 1e3,
            med(col(P_CSTALL)) as f64 / 1e3,
        );
    }
    format!(
        "neagari chain prof: {} instructions, {:.1} µs\n{out}",
        ins.len(),
        us(last)
    )
}

/// A chain in a line: `kind[rows×K fmt /parts, norm, reuse] <deps`, e.g.
/// `0:GEMV 5120x6144 Q1_0/3 | 1:GLU 17408x5120 Q1_0 norm+ <0`.
fn trace(ins: &[Ins]) -> String {
    let fmt = |f: u32| {
        ["Q1_0", "Q4_K", "TQ2_0"]
            .get(f as usize)
            .copied()
            .unwrap_or("?")
    };
    ins.iter()
        .enumerate()
        .map(|(o, i)| {
            let mut w = match i.kind {
                GEMV | GLU => format!(
                    "{o}:{} {}x{} {}{}{}{}",
                    if i.kind == GEMV { "GEMV" } else { "GLU" },
                    if i.kind == GEMV && i.w1 != 0 {
                        format!("{}+{}", i.rows0, i.rows - i.rows0)
                    } else {
                        i.rows.to_string()
                    },
                    i.k,
                    fmt(i.fmt),
                    if i.nkc > 1 {
                        format!("/{}", i.nkc)
                    } else {
                        String::new()
                    },
                    ["", " norm", " addnorm"][i.norm.min(2) as usize],
                    ["", " reuse", " scale", " reuse"][i.reuse.min(3) as usize],
                ),
                ADD_NORM => format!("{o}:ADD_NORM {}", i.k),
                NORM => format!("{o}:NORM {}", i.k),
                ADD => format!("{o}:ADD {}", i.k),
                DELTA => format!("{o}:DELTA {}x128", i.rows),
                _ => format!("{o}:?"),
            };
            let deps: Vec<String> = (0..32)
                .filter(|j| i.deps & (1 << j) != 0)
                .map(|j| j.to_string())
                .collect();
            if !deps.is_empty() {
                w += &format!(" <{}", deps.join(","));
            }
            w
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The recording: pure host logic (unit-tested on the CPU below). Ops go in as
/// instructions with the device byte ranges they read and write; complete chains come out
/// (`Vec<Ins>` each, in launch order) when they fill up or when `flush` is called.
#[derive(Default)]
struct Recorder {
    ins: Vec<Ins>,
    reads: Vec<Vec<Span>>,
    writes: Vec<Vec<Span>>,
    /// Every instruction each one waits for, directly or through another.
    closure: Vec<u32>,
    /// f32 values of the K-part sums and tile counters taken by the recorded instructions.
    part_used: usize,
    tiles_used: usize,
    /// A norm not yet recorded: the GEMVs that read its output right after it take it in.
    held: Option<Held>,
    /// Norms are held and folded (else recorded as they come).
    fold: bool,
    /// Every instruction waits for the one before (NEAGARI_CUDA_CHAIN_SERIAL=1: a race
    /// that the waits let through goes away).
    serial: bool,
}

struct Held {
    /// The ADD_NORM or NORM instruction.
    ins: Ins,
    /// Its x, y and output rows.
    x: Span,
    y: Option<Span>,
    out: Span,
    /// A GEMV took it in (and wrote its output).
    taken: bool,
}

impl Recorder {
    fn new(fold: bool) -> Recorder {
        Recorder {
            fold,
            ..Recorder::default()
        }
    }

    /// Records an op's instruction. A GEMV or GLU that reads the held norm's output takes
    /// the norm in (each block normalizes the row itself, so none waits for the norm; the
    /// first writes the output too); anything else records the norm first.
    fn push(
        &mut self,
        mut ins: Ins,
        mut reads: Vec<Span>,
        mut writes: Vec<Span>,
        done: &mut Vec<Vec<Ins>>,
    ) {
        let fold = match self.held.as_mut() {
            Some(h)
                if (ins.kind == GEMV || ins.kind == GLU)
                    && ins.x == h.out.0
                    && ins.k == h.ins.k
                    && !overlaps(&writes, &[h.x])
                    && h.y.is_none_or(|y| !overlaps(&writes, &[y])) =>
            {
                ins.norm = if h.ins.kind == ADD_NORM { 2 } else { 1 };
                ins.nx = h.ins.x;
                ins.ny = h.ins.y;
                ins.gamma = h.ins.gamma;
                ins.eps = h.ins.eps;
                ins.mat = (!h.taken) as u32;
                reads = std::iter::once(h.x).chain(h.y).collect();
                if !h.taken {
                    writes.push(h.out);
                }
                h.taken = true;
                true
            }
            _ => false,
        };
        if !fold {
            self.release(done);
        }
        self.record(ins, reads, writes, done);
    }

    /// A norm (ADD_NORM: x += y first) of x into `out`: held where folding is on and `out`
    /// is apart from its inputs, else recorded.
    fn norm(&mut self, ins: Ins, x: Span, y: Option<Span>, out: Span, done: &mut Vec<Vec<Ins>>) {
        self.release(done);
        let apart = !overlaps(&[out], &[x]) && y.is_none_or(|y| !overlaps(&[out], &[y]));
        if self.fold && apart {
            self.held = Some(Held {
                ins,
                x,
                y,
                out,
                taken: false,
            });
        } else {
            let reads = std::iter::once(x).chain(y).collect();
            let mut writes = vec![out];
            writes.extend(y.map(|_| x));
            self.record(ins, reads, writes, done);
        }
    }

    /// Records the held norm: as it is where no GEMV took it in, else (ADD_NORM) its
    /// residual add.
    fn release(&mut self, done: &mut Vec<Vec<Ins>>) {
        let Some(h) = self.held.take() else { return };
        let reads: Vec<Span> = std::iter::once(h.x).chain(h.y).collect();
        match (h.taken, h.ins.kind) {
            (false, _) => {
                let mut writes = vec![h.out];
                writes.extend(h.y.map(|_| h.x));
                self.record(h.ins, reads, writes, done);
            }
            (true, ADD_NORM) => {
                let add = Ins {
                    kind: ADD,
                    x: h.ins.x,
                    y: h.ins.y,
                    k: h.ins.k,
                    ..Ins::default()
                };
                self.record(add, reads, vec![h.x], done);
            }
            _ => {}
        }
    }

    /// Appends an instruction with the earlier ones it must wait for (it reads what they
    /// write, or writes what they read or write), ending the chain first where it is full.
    /// `part` and `tcnt` are offsets (values, counters) the launch adds its bases to.
    fn record(
        &mut self,
        mut ins: Ins,
        reads: Vec<Span>,
        writes: Vec<Span>,
        done: &mut Vec<Vec<Ins>>,
    ) {
        // K-split sums: 16 a tile (16 GEMV rows, or 8 rows of each GLU matrix); DELTA: a
        // counter a key head.
        let split = ins.nkc > 1 && (ins.kind == GEMV || ins.kind == GLU);
        let tile_rows = if ins.kind == GLU { 8 } else { 16 };
        let tiles = match (split, ins.kind) {
            (true, _) => ins.rows as usize / tile_rows,
            (false, DELTA) => ins.k as usize,
            _ => 0,
        };
        let part = if split {
            tiles * 16 * ins.nkc as usize
        } else {
            0
        };
        if self.ins.len() == MAXI
            || self.part_used + part > PART
            || TILE_CNT0 + self.tiles_used + tiles > COUNTERS
        {
            self.end(done);
        }
        if split {
            ins.part = self.part_used as u64;
            self.part_used += part;
        }
        if tiles > 0 {
            ins.tcnt = (TILE_CNT0 + self.tiles_used) as u32;
            self.tiles_used += tiles;
        }
        let (mut deps, mut closure) = (0u32, 0u32);
        for j in 0..self.ins.len() {
            if overlaps(&self.writes[j], &reads)
                || overlaps(&self.writes[j], &writes)
                || overlaps(&self.reads[j], &writes)
            {
                deps |= 1 << j;
                closure |= (1 << j) | self.closure[j];
            }
        }
        // An instruction done means every instruction it waited for is done.
        let implied = (0..self.ins.len())
            .filter(|j| deps & (1 << j) != 0)
            .fold(0u32, |m, j| m | self.closure[j]);
        ins.deps = deps & !implied;
        if self.serial && !self.ins.is_empty() {
            ins.deps = 1 << (self.ins.len() - 1);
            closure = (1 << (self.ins.len() - 1)) | self.closure[self.ins.len() - 1];
        }
        // The activation (bit 0) or the norm scale (bit 1) the instruction before made,
        // where it is this one's: the two read the same input, nothing ran between them.
        if let Some(prev) = self.ins.last() {
            let gemv = |i: &Ins| i.kind == GEMV || i.kind == GLU;
            let same_norm = gemv(prev)
                && gemv(&ins)
                && ins.norm > 0
                && prev.norm == ins.norm
                && prev.nx == ins.nx
                && prev.ny == ins.ny
                && prev.gamma == ins.gamma
                && prev.eps == ins.eps
                && prev.k == ins.k;
            let same_act = gemv(prev)
                && gemv(&ins)
                && prev.x == ins.x
                && prev.fmt == ins.fmt
                && prev.k == ins.k
                && prev.nkc == 1
                && ins.nkc == 1
                && prev.norm == ins.norm
                && prev.nx == ins.nx
                && prev.ny == ins.ny
                && deps & (1 << (self.ins.len() - 1)) == 0;
            ins.reuse = same_act as u32 | (same_norm as u32) << 1;
        }
        self.ins.push(ins);
        self.reads.push(reads);
        self.writes.push(writes);
        self.closure.push(closure);
    }

    /// Ends the chain (the held norm stays held: the GEMV about to take it in goes into the
    /// next chain).
    fn end(&mut self, done: &mut Vec<Vec<Ins>>) {
        if !self.ins.is_empty() {
            done.push(std::mem::take(&mut self.ins));
        }
        self.reads.clear();
        self.writes.clear();
        self.closure.clear();
        self.part_used = 0;
        self.tiles_used = 0;
    }

    fn is_empty(&self) -> bool {
        self.ins.is_empty() && self.held.is_none()
    }

    /// Everything recorded and held, as chains.
    fn flush(&mut self, done: &mut Vec<Vec<Ins>>) {
        self.release(done);
        self.end(done);
    }
}

/// The chain's kernel and its device memory.
pub(super) struct Chain {
    func: CudaFunction,
    cnt: CudaSlice<u32>,
    part: CudaSlice<f32>,
    rec: Mutex<Recorder>,
    /// Launches made (or replayed in a graph), for tests.
    launched: AtomicU64,
    /// DeltaNet layers go into the chain, unless NEAGARI_CUDA_CHAIN_DELTA=0.
    delta: bool,
    /// NEAGARI_CUDA_CHAIN_TRACE=1: each chain of a warm step (the one before its capture)
    /// on stderr, an instruction a word.
    trace: bool,
    /// GEMVs split K in parts (NEAGARI_CUDA_CHAIN_SPLIT=0: never).
    split: bool,
    /// `matmul_multi`'s matrices two to a GEMV (NEAGARI_CUDA_CHAIN_PAIR=0: one each).
    pair: bool,
    /// NEAGARI_CUDA_CHAIN_PROF=1: each chain of a warm step is timed per instruction and
    /// block (chain.cu's CN_PROF fields) and summed up on stderr; [MAXI][n_sm][PROF].
    prof: Option<CudaSlice<u64>>,
}

/// chain.cu's CN_PROF and its fields.
const PROF: usize = 8;
const P_WAIT: usize = 0;
const P_START: usize = 1;
const P_END: usize = 2;
const P_P0: usize = 3;
const P_P1: usize = 4;
const P_PSTALL: usize = 5;
const P_CSTALL: usize = 6;

impl Chain {
    /// Compiles and loads the kernel (sm_90 and newer) and allocates its counters (zero)
    /// and K-part sums. Norms fold into the GEMVs after them unless
    /// NEAGARI_CUDA_CHAIN_FOLD=0 (then block 0 of the launch runs each norm while the
    /// others wait).
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        arch: &str,
        n_sm: usize,
    ) -> Result<Chain> {
        let ptx = compile("chain", arch, &defines(), CHAIN)?;
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(drv)?;
        let func = m.load_function("chain").map_err(drv)?;
        let smem = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        func.set_attribute(smem, SMEM as i32).map_err(drv)?;
        let env = |k: &str| std::env::var(k).ok();
        let fold = env("NEAGARI_CUDA_CHAIN_FOLD").as_deref() != Some("0");
        let prof = match env("NEAGARI_CUDA_CHAIN_PROF").as_deref() {
            Some("1") => Some(stream.alloc_zeros::<u64>(MAXI * n_sm * PROF).map_err(drv)?),
            _ => None,
        };
        Ok(Chain {
            func,
            cnt: stream.alloc_zeros::<u32>(COUNTERS).map_err(drv)?,
            part: stream.alloc_zeros::<f32>(PART).map_err(drv)?,
            rec: Mutex::new(Recorder {
                serial: env("NEAGARI_CUDA_CHAIN_SERIAL").as_deref() == Some("1"),
                ..Recorder::new(fold)
            }),
            split: env("NEAGARI_CUDA_CHAIN_SPLIT").as_deref() != Some("0"),
            pair: env("NEAGARI_CUDA_CHAIN_PAIR").as_deref() != Some("0"),
            prof,
            launched: AtomicU64::new(0),
            delta: std::env::var("NEAGARI_CUDA_CHAIN_DELTA").as_deref() != Ok("0"),
            trace: std::env::var("NEAGARI_CUDA_CHAIN_TRACE").as_deref() == Ok("1"),
        })
    }
}

impl CudaBackend {
    fn chain_of(&self, rows: usize) -> Option<&Chain> {
        let on = rows == 1 && self.step_mode() != graph::OFF && !self.profiling();
        self.chain.as_ref().filter(|_| on)
    }

    /// The chain's format code of `w` as a GEMV of `rows_mult`-row tiles, if it takes it:
    /// Q1_0 (repacked, whole groups), Q4_K, TQ2_0 (repacked; a row's last group may be
    /// short).
    fn chain_fmt(&self, w: &CudaMat, rows_mult: usize) -> Option<u32> {
        let nb = w.cols / 256;
        let (fmt, row_bytes) = match w.ty {
            GgmlType::Q1_0 if self.repack && w.cols.is_multiple_of(1024) => {
                (Q1_0R, w.cols / 1024 * 144)
            }
            GgmlType::Q4_K if w.cols.is_multiple_of(256) => (Q4_K, nb * 144),
            GgmlType::TQ2_0 if self.repack && w.cols.is_multiple_of(256) => {
                (TQ2_0R, 16 * nb.div_ceil(8) + 64 * nb)
            }
            _ => return None,
        };
        (w.cols <= MAXK
            && w.rows > 0
            && w.rows.is_multiple_of(rows_mult)
            && w.row_bytes == row_bytes)
            .then_some(fmt)
    }

    /// The tensor maps the chain's producer copies `w`'s chunks by (chain.cu `map0`):
    /// boxes of one group × 16 rows (GEMV) and × 8 rows (GLU), made as the matrix loads
    /// where the chain is on and takes its format; `None` elsewhere.
    pub(super) fn chain_maps(&self, w: &CudaMat) -> Result<Option<CudaSlice<gemv_rows::TMap>>> {
        if self.chain.is_none() {
            return Ok(None);
        }
        let Some(fmt) = self.chain_fmt(w, 8) else {
            return Ok(None);
        };
        let gb = if fmt == TQ2_0R { 528 } else { 144 };
        let p = self.dptr(&w.data);
        let maps = [
            self.tmap(p, w.rows, w.row_bytes, gb, 16)?,
            self.tmap(p, w.rows, w.row_bytes, gb, 8)?,
        ];
        Ok(Some(self.stream.clone_htod(&maps).map_err(drv)?))
    }

    fn span(&self, b: &CudaBuf) -> Span {
        let p = self.dptr(&b.data);
        (p, p + 4 * (b.rows * b.cols) as u64)
    }

    /// K parts of a GEMV of `tiles` tiles over `groups` groups: a block's W consumer warps
    /// take its units W at a time, so the count that spends the fewest rounds of W per
    /// row's worth of work (a part is 1/nkc of a row), the fewer parts at a tie.
    fn chain_parts(&self, ch: &Chain, tiles: usize, groups: usize) -> usize {
        if ch.split {
            chain_parts(self.n_sm, WARPS, tiles, groups)
        } else {
            1
        }
    }

    /// Runs `f` on the recorder, then launches the chains it completed.
    fn chain_rec(
        &self,
        ch: &Chain,
        f: impl FnOnce(&mut Recorder, &mut Vec<Vec<Ins>>),
    ) -> Result<()> {
        let mut done = Vec::new();
        f(
            &mut ch.rec.lock().unwrap_or_else(|e| e.into_inner()),
            &mut done,
        );
        // What the instructions write is written as far as `Scratch::xq_key` knows.
        self.bump();
        done.into_iter()
            .try_for_each(|ins| self.chain_launch(ch, ins))
    }

    /// Launches what is recorded and held (a no-op when nothing is: every launch and copy
    /// calls it, and the quantized-input cache must survive those).
    pub(super) fn chain_flush(&self) -> Result<()> {
        match self.chain.as_ref() {
            Some(ch) if !ch.rec.lock().unwrap_or_else(|e| e.into_inner()).is_empty() => {
                self.chain_rec(ch, |r, done| r.flush(done))
            }
            _ => Ok(()),
        }
    }

    /// One chain: the instructions' offsets made addresses, one launch of a block an SM.
    fn chain_launch(&self, ch: &Chain, ins: Vec<Ins>) -> Result<()> {
        let warm = self.step_mode() == graph::WARM;
        if ch.trace && warm {
            eprintln!("neagari chain: {}", trace(&ins));
        }
        let prof = ch.prof.as_ref().filter(|_| warm);
        let mut args = Args {
            ins: [Ins::default(); MAXI],
            cnt: self.dptr(&ch.cnt),
            n: ins.len() as u32,
            ns: SLOTS as u32,
            prof: prof.map_or(0, |p| self.dptr(p)),
        };
        let recorded = prof.map(|_| ins.clone());
        let part = self.dptr(&ch.part);
        for (a, i) in args.ins.iter_mut().zip(ins) {
            *a = i;
            // (DELTA's `part` is its β row.)
            if a.nkc > 1 && (a.kind == GEMV || a.kind == GLU) {
                a.part = part + 4 * a.part;
            }
        }
        let cfg = LaunchConfig {
            grid_dim: (self.n_sm as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: SMEM as u32,
        };
        self.launches.fetch_add(1, Ordering::Relaxed);
        ch.launched.fetch_add(1, Ordering::Relaxed);
        if self.replaying() {
            return Ok(());
        }
        // SAFETY: every address in `args` is a live device allocation for the step (arena
        // buffers, weights, the chain's counters and sums, the profile), of the sizes the
        // instructions say; the kernel takes one `ChainArgs` by value.
        unsafe { self.launch_raw(&ch.func, cfg, 1, &mut [karg(&args)]) }?;
        if let (Some(p), Some(ins)) = (prof, recorded) {
            let mut t = vec![0u64; MAXI * self.n_sm * PROF];
            self.stream.memcpy_dtoh(p, &mut t).map_err(drv)?;
            self.synchronize()?;
            eprint!("{}", prof_report(&ins, &t, self.n_sm));
        }
        Ok(())
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
            let mut r = ch.rec.lock().unwrap_or_else(|e| e.into_inner());
            *r = Recorder {
                serial: r.serial,
                ..Recorder::new(r.fold)
            };
        }
    }

    /// `matmul_multi` (and `matmul`) into the chain, if it takes every matrix. Matrices
    /// of one format go two to a GEMV (`pairs`), unless NEAGARI_CUDA_CHAIN_PAIR=0.
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
        if ws
            .iter()
            .any(|w| w.cols != x.cols || w.chain_maps.is_none())
            || fmts.iter().any(Option::is_none)
        {
            return Ok(false);
        }
        for (w, o) in ws.iter().zip(outs.iter_mut()) {
            self.reshape(o, 1, w.rows)?;
        }
        let fmts: Vec<u32> = fmts.into_iter().map(|f| f.unwrap_or(Q4_K)).collect();
        let rows: Vec<usize> = ws.iter().map(|w| w.rows).collect();
        let groups = if ch.pair {
            pairs(&rows, &fmts)
        } else {
            (0..ws.len()).map(|i| (i, None)).collect()
        };
        for (i, j) in groups {
            let (w, fmt) = (ws[i], fmts[i]);
            let tiles = (w.rows + j.map_or(0, |j| ws[j].rows)) / 16;
            let groups = w.cols.div_ceil(group_weights(fmt));
            let map = |w: &CudaMat| w.chain_maps.as_ref().map_or(0, |m| self.dptr(m));
            let ins = Ins {
                kind: GEMV,
                fmt,
                w0: self.dptr(&w.data),
                map0: map(w),
                w1: j.map_or(0, |j| self.dptr(&ws[j].data)),
                map1: j.map_or(0, |j| map(ws[j])),
                x: self.dptr(&x.data),
                o0: self.dptr(&outs[i].data),
                o1: j.map_or(0, |j| self.dptr(&outs[j].data)),
                rows: (tiles * 16) as u32,
                rows0: w.rows as u32,
                k: w.cols as u32,
                row_bytes: w.row_bytes as u32,
                nkc: self.chain_parts(ch, tiles, groups) as u32,
                ..Ins::default()
            };
            let r = self.span(x);
            let o: Vec<Span> = std::iter::once(i)
                .chain(j)
                .map(|k| self.span(outs[k]))
                .collect();
            self.chain_rec(ch, |rec, done| rec.push(ins, vec![r], o, done))?;
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
            || gate.chain_maps.is_none()
            || up.chain_maps.is_none()
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
            map0: gate.chain_maps.as_ref().map_or(0, |m| self.dptr(m)),
            map1: up.chain_maps.as_ref().map_or(0, |m| self.dptr(m)),
            x: self.dptr(&x.data),
            o0: self.dptr(&g.data),
            o1: self.dptr(&u.data),
            rows: gate.rows as u32,
            k: gate.cols as u32,
            row_bytes: gate.row_bytes as u32,
            nkc: self.chain_parts(ch, gate.rows / 8, gate.cols.div_ceil(group_weights(fmt))) as u32,
            act: match act {
                GluAct::Silu => 0,
                GluAct::GeluTanh => 1,
            },
            ..Ins::default()
        };
        let (r, wg, wu) = (self.span(x), self.span(g), self.span(u));
        self.chain_rec(ch, |rec, done| rec.push(ins, vec![r], vec![wg, wu], done))?;
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
        let (sx, sy, so) = (self.span(x), y.map(|y| self.span(y)), self.span(out));
        self.chain_rec(ch, |rec, done| rec.norm(ins, sx, sy, so, done))?;
        Ok(true)
    }

    /// `delta_net` of one token into the chain (NEAGARI_CUDA_CHAIN_DELTA=0: never), where
    /// its shape is the kernel's: d_k = d_v = 128, a conv of 2 to 4 taps.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn chain_delta(
        &self,
        kv: &CudaKv,
        layer: usize,
        qkv: &CudaBuf,
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
    ) -> Result<bool> {
        let Some(ch) = self.chain_of(qkv.rows).filter(|c| c.delta) else {
            return Ok(false);
        };
        let (nk, nv, dk, dv) = (net.n_k_heads, net.n_v_heads, net.d_k, net.d_v);
        let Some((win, wl, st, sl, shape)) = self.rec_layer(kv, layer) else {
            return Ok(false);
        };
        let kc = shape.conv_kernel;
        let fits = dk == 128
            && dv == 128
            && nk > 0
            && nv.is_multiple_of(nk)
            && (2..=4).contains(&kc)
            && shape.n_v_heads == nv
            && shape.d_k == dk
            && shape.d_v == dv
            && shape.conv_channels == qkv.cols
            && qkv.cols == 2 * nk * dk + nv * dv
            && conv.len == qkv.cols * kc
            && alpha.rows * alpha.cols == nv
            && beta.rows * beta.cols == nv
            && a_neg.len == nv
            && dt_bias.len == nv
            && norm.len == dv
            && z.rows * z.cols == nv * dv;
        if !fits {
            return Ok(false);
        }
        self.reshape(out, 1, nv * dv)?;
        let ins = Ins {
            kind: DELTA,
            w0: st,
            w1: win,
            x: self.dptr(&qkv.data),
            y: self.dptr(&z.data),
            o0: self.dptr(&out.data),
            o1: self.dptr(&alpha.data),
            part: self.dptr(&beta.data),
            nx: self.dptr(&conv.data),
            ny: self.dptr(&a_neg.data),
            aux: self.dptr(&dt_bias.data),
            gamma: self.dptr(&norm.data),
            rows: nv as u32,
            k: nk as u32,
            fmt: kc as u32,
            act: (net.map == crate::HeadMap::Tiled) as u32,
            eps,
            ..Ins::default()
        };
        let (sw, ss) = ((win, win + 4 * wl as u64), (st, st + 4 * sl as u64));
        let reads = vec![
            self.span(qkv),
            self.span(z),
            self.span(alpha),
            self.span(beta),
            sw,
            ss,
        ];
        let writes = vec![self.span(out), sw, ss];
        self.chain_rec(ch, |rec, done| rec.push(ins, reads, writes, done))?;
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
        self.chain_rec(ch, |rec, done| rec.push(ins, vec![sx, sy], vec![sx], done))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
