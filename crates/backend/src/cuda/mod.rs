//! The CUDA backend: weights uploaded once in their packed GGUF format (Q1_0 and TQ2_0
//! regrouped for 16-byte loads, [`repack`]) and decoded in registers by per-format kernels;
//! activations, the KV cache (f16) and every op of the dense models live in device memory,
//! and only logits come back.
//!
//! Kernels are CUDA C++ in `kernels/*.cu`, embedded with `include_str!` and compiled by
//! NVRTC for the device's architecture when the backend starts (the float ops) or when the
//! first matrix of a format is loaded (that format's GEMV, embedding and dequantizer), so no
//! compilation happens while a reply is generated. Compiled PTX is cached per (module,
//! architecture, defines) for the process.
//!
//! Launches (`launch!`): on Hopper and later every kernel launches with programmatic
//! stream serialization (PDL; NEAGARI_CUDA_PDL=0 turns it off), so a kernel is launched
//! while the previous one completes (its last blocks exit, its writes are flushed) — a
//! decode step is hundreds of small kernels, and the gap between two is otherwise that
//! completion, a launch and a ramp-up (tg128 on an H200: Gemma 3 270M shape 765 → 836
//! tok/s, 27B Q1_0 193 → 198). Every kernel waits for its predecessor before touching
//! memory (`gdc_wait` in common.cuh; a test checks each kernel calls it), and graph
//! capture keeps the programmatic edges.
//!
//! The CUDA libraries are loaded at run time (cudarc's dynamic loading): the crate builds
//! and the CPU backend runs on machines without CUDA; [`probe`] says why CUDA is missing.
//!
//! Matmul: up to 8 activation rows go through a GEMV. Quantized formats take q8_1
//! activations (int8 + per-32 scale and sum) and dot with `dp4a` (`mvq{1,2,4,8}`,
//! gemv_int.cu); the q8_1 copy is written by the op that produced the input when it is a
//! whole-row RMSNorm, a GLU, the fused gate/up GEMV or the fused DeltaNet step of decode
//! rows, else by one quantizer launch, and serves every matmul on that input (q/k/v,
//! gate/up; see [`Scratch::xq_key`]). Fused ops (fused.rs, `delta_rows` in hybrid.rs) run a
//! decode layer's small steps as one launch each. Float formats decode to
//! f32 (`mv{1,2,4,8}`, matmul.cu). Larger batches
//! (prefill) dequantize the matrix to an f16 scratch tile and call cuBLAS (f16 × f16 → f32,
//! tensor cores) — a first step before a fused dequantize-mma kernel.

mod kernel_cache;
mod modules;
mod probe;
mod profile;
mod ptxas;

pub use kernel_cache::dir as kernel_cache_dir;
pub use modules::{compile_all, module_ptx, nvrtc_present};
pub use probe::{probe, DeviceInfo, Probe};
pub use profile::KernelTime;
pub use ptxas::{kernel_registers, KernelRegs};

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
};
use neagari_quant::GgmlType;

use modules::*;

use crate::{
    Attn, Backend, BackendError, GluAct, HostTensor, KvShape, KvType, QkPrep, Result, Rope,
};

/// Rows a GEMV kernel handles per launch (the largest `mvN`).
const MV_MAX_ROWS: usize = 8;
/// Warps per GEMV block; must match MV_WARPS in matmul.cu.
const MV_WARPS: usize = 4;
/// Weight rows per block of mv1, mv2, mv4, mv8 (the `R` of their MV(NR, R) in matmul.cu).
const MV_ROWS_PER_BLOCK: [usize; 4] = [2, 2, 1, 1];
/// `add_rms_norm_row`: threads per block (a value each) and the most blocks (its scratch).
const NORM_ROW_THREADS: usize = 256;
const NORM_ROW_BLOCKS: usize = 64;
/// `add_rms_norm_cl`: the most blocks of its cluster (the portable cluster size).
const NORM_CL_MAX: usize = 8;
/// Most warps per block of the integer GEMV (MVQ_WARPS in gemv_int.cu).
const MVQ_WARPS: usize = 8;
/// The same for mvq1, mvq2, mvq4, mvq8 (gemv_int.cu).
const MVQ_ROWS_PER_BLOCK: [usize; 4] = [2, 2, 1, 1];
/// (R rows a chunk, K chunks a group, G groups a block; 0 picks by shape) of
/// gemv_stream.cu's GEMV: see [`CudaBackend::mvs`].
type MvsShape = (usize, usize, usize);
/// The instantiations of gemv_stream.cu (`MVS(R)`), and its most rows a group (MVS_ROWS).
const MVS_R: [usize; 3] = [2, 4, 8];
const MVS_ROWS: usize = 32;
const MVS_DEFAULT: MvsShape = (0, 0, 0);
/// Values a block of ops.cu's `topk_chunks` takes, and the most chunk candidates
/// `topk_merge` takes (TOPK_N there); threads a block of both (TOPK_THREADS).
const TOPK_N: usize = 4096;
const TOPK_THREADS: u32 = 512;

/// A measuring knob (an environment variable, read once at load) that turns a default
/// off with "0".
fn knob_on(var: &str) -> bool {
    std::env::var(var).as_deref() != Ok("0")
}

/// A measuring knob's value, where it is set and parses.
fn knob<T: std::str::FromStr>(var: &str) -> Option<T> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// A measuring knob that forces a choice: "1" always, "0" never, else the default (None).
fn knob_forced(var: &str) -> Option<bool> {
    match std::env::var(var).as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

/// NEAGARI_CUDA_MVS: unset → the default, "0" → off, "R,K,G" (or "RxKxG", which
/// bench/cuda/run.sh's comma-separated environments can carry) → that shape where it is
/// compiled (else the default).
fn mvs_shape(v: Option<&str>) -> Option<MvsShape> {
    let Some(v) = v else {
        return Some(MVS_DEFAULT);
    };
    if v == "0" {
        return None;
    }
    let n: Vec<usize> = v
        .split([',', 'x'])
        .filter_map(|t| t.trim().parse().ok())
        .collect();
    match n[..] {
        [r, k, g] if (r == 0 || MVS_R.contains(&r)) && r.max(1) * k <= MVS_ROWS => Some((r, k, g)),
        _ => Some(MVS_DEFAULT),
    }
}

/// Weight rows per block of the tensor-core GEMV (one m16n8k32 tile, gemv_rows.cu).
const MVR_ROWS: usize = 16;
/// The largest tile `mvrt_*` copies into shared memory (bigger ones take `mvr`): two fit
/// an SM (27B: Q4_K's 32 rows of 5120 are 92.7 KB with their padding).
const MVR_TMA_MAX: usize = 96 << 10;
/// The 16-row tiles a block of `mvrt_*` takes (gemv_rows.cu's MVRT), most first.
const MVRT_TILES: [usize; 3] = [4, 2, 1];
/// Groups a row's part at most in `mvrc_*` (MVRC_MAXG in gemv_rows.cu).
const MVRC_MAXG: usize = 72;
/// Slots at most in `mvrq_*`'s ring (MVRQ_MAXS in gemv_rows.cu).
const MVRQ_MAXS: usize = 16;
/// Slots of `mvrq_*`'s ring by default: 27B Q4_K, 8 rows, µs at 8 / 16 slots: gate+up
/// 43.2 / 46.5, qkv+z 21.4 / 23.1, head 263.0 / 268.4 (H200; every group at once, `mvrc`:
/// 51.2, 23.9, 293.0).
const MVRQ_SLOTS: usize = 8;
/// Tiles a block of the ring's whole rows where the whole tile would not fit (`mvrq_tiles`).
const MVRQ_TILES: usize = 2;
/// The parts `mvrt_*` may split K in, fewest first; at most MVRT_MAXP.
const MVRT_PARTS: [usize; 3] = [1, 2, 4];
/// gemv_rows.cu's MVRT_MAXP.
const MVRT_MAXP: usize = 4;
/// gemv_rows.cu's MVRTG_MAXP: the most parts of `mvrtg_4`'s leftover tile blocks.
pub(super) const MVRTG_MAXP: usize = 8;
/// The parts of a sub-2-bit matrix's rows (`mvr_tma`). 27B Q1_0 ffn_down, 8 rows (H100):
/// 2 parts in clusters 17.2 µs; 3 parts 22.4 in clusters, 14.4 meeting through global
/// memory (`mvrt_meet`); 4 parts 21.8 (320 blocks: more than two an SM).
const MVRT_SUB2: usize = 3;
/// Most warps per block of it (MVR_WARPS in gemv_rows.cu).
const MVR_WARPS: usize = 8;

fn drv<E: std::fmt::Debug>(e: E) -> BackendError {
    BackendError::Other(format!("cuda: {e:?}"))
}

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// The float-op kernels, loaded once per backend.
struct OpsKernels {
    rms_norm: CudaFunction,
    /// RMSNorm / GLU that also write their output as q8_1 for the next matmul.
    rms_norm_q: CudaFunction,
    /// `x += y` and RMSNorm of the sum in one launch (`Backend::add_rms_norm`).
    add_rms_norm: CudaFunction,
    add_rms_norm_q: CudaFunction,
    add_rms_norm_row: CudaFunction,
    add_rms_norm_cl: CudaFunction,
    add_norm_part: CudaFunction,
    /// `Backend::norm_add_rms_norm` in one launch.
    /// [rows of ≤ blockDim values, of ≤ 8·blockDim]
    norm_add_norm: [CudaFunction; 2],
    norm_add_norm_q: [CudaFunction; 2],
    glu_silu_q: CudaFunction,
    glu_gelu_q: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    softcap: CudaFunction,
    glu_silu: CudaFunction,
    glu_gelu: CudaFunction,
    to_f16: CudaFunction,
    rope: CudaFunction,
    kv_store: CudaFunction,
    kv_store_q8: CudaFunction,
    attention: CudaFunction,
    attention_q8: CudaFunction,
    att_combine: CudaFunction,
    /// attention.cu's grouped-query attention (`attention_group`), by (query heads a kv head,
    /// head size, q8_0 cache).
    att_group: Vec<((usize, usize, bool), CudaFunction)>,
    argmax_rows: CudaFunction,
    topk_chunks: CudaFunction,
    topk_merge: CudaFunction,
    penalize: CudaFunction,
    qk_norm_rope: CudaFunction,
    qk_norm_rope_q8: CudaFunction,
}

/// `mvqp1x{1,2,4,8}` of one pair of formats (matmul.rs `prepare_pair`).
type PairKernels = Arc<[CudaFunction; 4]>;

/// The kernels of one weight format.
struct FmtKernels {
    mv: [CudaFunction; 4],
    mv1x4: CudaFunction,
    embed: CudaFunction,
    dequant_f16: CudaFunction,
    /// Integer GEMV (q8_1 activations), for the formats that have one.
    int: Option<IntKernels>,
}

/// gemv_int.cu of one format: the activation quantizer and `mvq{1,2,4,8}`, `mvq1x{1,4,8}`.
struct IntKernels {
    /// 32-weight units a GEMV thread takes at once (4 for the repacked Q1_0 / TQ2_0: 128
    /// weights, 16 or 32 bytes of a row; 1 otherwise).
    step: usize,
    quant: CudaFunction,
    mv: [CudaFunction; 4],
    mv1x4: CudaFunction,
    /// `mvq1x4` for rows of more than one round of its threads (gemv_int.cu's `mvq_split`).
    mv1x4u: CudaFunction,
    mv1x8: CudaFunction,
    mv1x1: CudaFunction,
    /// `mvqm*`: up to four matrices in one launch (`Backend::matmul_multi`): one activation
    /// row with 1, 2 or 4 weight rows per block, then 2, 4 and 8 activation rows.
    multi: [CudaFunction; 7],
    /// `mvqm1x4` by `mvq_split` (`mvqm1x4u`, where `mvm_half` says).
    multi_u: CudaFunction,
    /// `mvqg*`: gate and up with their GLU (`Backend::matmul_glu`): one activation row
    /// with 1, 2, 4 or 8 weight rows per block, then 2, 4 and 8 activation rows.
    glu: [CudaFunction; 7],
    /// gemv_rows.cu's `mvr` and `mvrm` (3–8 activation rows on the tensor cores), for the
    /// formats that have them.
    rows: Option<[CudaFunction; 2]>,
    /// Their `mvrt_MT` and `mvrmt_MT` (sm_90+, the formats with a `B_` struct: repacked
    /// Q1_0 and TQ2_0, Q4_K).
    rows_tma: Option<RowsTma>,
    /// gemv_stream.cu's `mvs_R` (one activation row, the repacked formats), by R.
    stream: Vec<(usize, CudaFunction)>,
    /// Its `mvsg_R`: gate, up and the GLU in one launch, by R.
    stream_glu: Vec<(usize, CudaFunction)>,
}

/// gemv_rows.cu's `mvrt_MT` / `mvrmt_MT` of a format.
struct RowsTma {
    /// [mvrt, mvrmt, mvrc, mvrmc, mvrq, mvrmq] by MT (16-row tiles a block by bulk copies),
    /// most first.
    funcs: Vec<(usize, [CudaFunction; 6])>,
    /// Units of the format's smallest independently addressed run of a row (FmtNames).
    group_units: usize,
    /// `mvrtg_4`: `matmul_glu` on `mvrt_4`'s tile (fused.rs), where 4 tiles are allowed.
    glu: Option<CudaFunction>,
    /// `mvrt_4w`: `mvrt_4` with twice the warps (gemv_rows.rs `mvrt_wide`), where 4 tiles
    /// are allowed.
    wide: Option<CudaFunction>,
}

/// Device scratch reused across calls (grown, never shrunk).
#[derive(Default)]
struct Scratch {
    w16: Option<CudaSlice<u16>>,
    x16: Option<CudaSlice<u16>>,
    part: Option<CudaSlice<f32>>,
    ids: Option<CudaSlice<u32>>,
    /// q8_1 activations: int8 codes [rows, units·32], then (d, d·Σq) f32 pairs [rows, units].
    xq: Option<CudaSlice<u8>>,
    /// (x's device address, rows, cols, [`CudaBackend::gen`]) of what `xq` holds: q, k and v
    /// (gate and up) read one input, so it is quantized once. Every kernel launch but the
    /// GEMV's own bumps `gen`, so any op that may have written x since makes the key stale;
    /// a GEMV writing into x clears it.
    xq_key: Option<(u64, usize, usize, u64)>,
    /// `add_rms_norm_row`'s per-block sums of squares `[NORM_ROW_BLOCKS]` and its barrier
    /// `[arrivals, generation]`.
    norm_part: Option<CudaSlice<f64>>,
    norm_cnt: Option<CudaSlice<u32>>,
    /// Greedy picks of `argmax` `[rows]`, as keys (graph.rs).
    amax: Option<CudaSlice<u64>>,
    /// `top_k`'s keys: `[rows, chunks, k]` of the chunks, then `[rows, k]` merged.
    topk: Option<CudaSlice<u64>>,
    /// `top_k`'s penalties: token ids, then their subtrahends' bits `[2, n]`.
    topk_pen: Option<CudaSlice<u32>>,
    /// Arrival counters of the fused kernels' last-block steps (`delta_rows`, `mvqg*`),
    /// zero between launches (each last block resets its own).
    fuse_cnt: Option<CudaSlice<u32>>,
    /// The parts' sums of a K-split `mvrt_*` launch where they meet outside a cluster
    /// (gemv_rows.cu `Ks`): `[tile blocks, parts, MT·128]`.
    ksplit: Option<CudaSlice<f32>>,
    /// A second q8_1 area: a fused GEMV writes its output's q8_1 here while its blocks
    /// still read the input's from `xq`; `xq_alt_key` says what it holds, as `xq_key`.
    xq_alt: Option<CudaSlice<u8>>,
    xq_alt_key: Option<(u64, usize, usize, u64)>,
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: String,
    name: String,
    n_sm: usize,
    ops: OpsKernels,
    hybrid: hybrid::HybridKernels,
    fmts: Mutex<HashMap<GgmlType, Arc<FmtKernels>>>,
    /// `mvqp1x{1,2,4,8}` (gemv_int.cu) of the two-format `matmul_multi` groups that
    /// `prepare_multi` met, by (first format, second format).
    pairs: Mutex<HashMap<(GgmlType, GgmlType), PairKernels>>,
    blas: Option<CudaBlas>,
    scratch: Mutex<Scratch>,
    /// Rows per block of the single-row GEMV: `None` picks by shape (four from 4096-wide
    /// rows), NEAGARI_CUDA_MV_ROWS=1, 2, 4 or 8 forces one (for measuring; 1 and 8 are
    /// integer-only, the f32 GEMV takes them as 2 and 4).
    mv_rows: Option<usize>,
    /// Warps per block of the integer GEMV: `None` picks by row width (`mv_warps`),
    /// NEAGARI_CUDA_MV_WARPS=1..8 forces it (for measuring).
    mv_warps: Option<usize>,
    /// A decode row's `add_rms_norm` spreads over blocks (`add_rms_norm_row`), unless
    /// NEAGARI_CUDA_NORM_ROW=0 (one block, for measuring).
    norm_row: bool,
    /// … in one thread-block cluster (`add_rms_norm_cl`, Hopper and later), unless
    /// NEAGARI_CUDA_NORM_CL=0 (`add_rms_norm_row`'s barrier of global atomics).
    norm_cl: bool,
    /// A decode row's residual add and norm finished inside the Q4_K GEMV that reads it
    /// (norm.rs `norm_matmul_op`) unless NEAGARI_CUDA_NORM_FOLD=0: the 27B Q4_K's one-token
    /// step 6.71 → 6.57 ms (H100; all 127 norms a step).
    norm_fold: bool,
    /// … for 3–8 rows too (a verify, through the ring GEMV `mvrmq`) unless
    /// NEAGARI_CUDA_NORM_FOLD_ROWS=0: the 27B Q4_K's 8-row step 8.85 → 8.54 ms, verify8
    /// 1.35 → 1.30 (H100). The compute warps finish it (with the producer warp's idle lanes
    /// doing it, the step went 8.81 → 10.05 ms).
    norm_fold_rows: bool,
    /// … and through the tensor-core GEMV whose whole tile is one bulk copy (`mvrmt`,
    /// `mvrtg_4`: the Q1_0 verify's projections and gate/up), unless
    /// NEAGARI_CUDA_NORM_FOLD_TILE=0: the 27B Q1_0's 8-row greedy step 5.336 / 5.339 →
    /// 5.226 ms (H100, same call).
    norm_fold_tile: bool,
    /// A decode row's norm finished inside the streaming GEMV (`mvs_R`, `mvsg_R`: the Q1_0 and
    /// TQ2_0 decode step), unless NEAGARI_CUDA_NORM_FOLD_STREAM=0: 27B tg64 TQ2_0 228.7 /
    /// 228.7 → 233.1 / 231.9, Q1_0's one-token step 3.424 → 3.417 ms (H100, same call).
    norm_fold_stream: bool,
    /// Quantized formats take the integer GEMV, unless NEAGARI_CUDA_MV=float (measuring).
    mv_int: bool,
    /// Fused ops (`delta_net`, `matmul_glu`, `qk_norm_rope`) run as one launch each, unless
    /// NEAGARI_CUDA_FUSE=0 (the separate ops, for measuring).
    fuse: bool,
    /// `attention_block` in two launches (attention.rs), unless NEAGARI_CUDA_FUSE_ATTN=0
    /// (or NEAGARI_CUDA_FUSE=0): the separate ops, for measuring.
    fuse_attn: bool,
    /// Decode attention splits the positions until it has this many blocks per SM
    /// (NEAGARI_CUDA_ATT_BLOCKS=N for measuring).
    att_blocks: usize,
    /// Query heads sharing a kv head attend in one block (`attention_group`) over long
    /// caches (attention.rs `GROUP_MIN_SPLIT`); NEAGARI_CUDA_ATT_GROUP=1 always, =0 never
    /// (for measuring and tests).
    att_group: Option<bool>,
    /// `prepare_multi` loads a two-format group's one-launch GEMV (`mvqp*`), unless
    /// NEAGARI_CUDA_PAIR=0 (a launch a format, for measuring).
    pair: bool,
    /// Q1_0, TQ2_0 and Q4_K are uploaded in repack.rs's layouts, unless NEAGARI_CUDA_REPACK=0
    /// (ggml's blocks and the kernels that read them, for measuring).
    repack: bool,
    /// Row groups a block of the repacked formats' GEMV (gemv_int.cu `mvq_step`): `None`
    /// picks by shape (`mv_block`), NEAGARI_CUDA_MV_GROUPS=N forces N (1: one group of
    /// whole warps, the mapping of the other formats; for measuring).
    mv_groups: Option<usize>,
    /// One activation row's GEMV of rows of several rounds a thread takes `mvq1x4u`
    /// (gemv_int.cu's `mvq_split`; NEAGARI_CUDA_MVQ_SPLIT=0 turns it off): 27B Q4_K
    /// ffn_down 23.7 → 17.6 µs, tg128 144.0 → 149.4 on the H200.
    mvq_split: bool,
    /// One activation row's Q4_K GEMV of rows of one round a thread (over one warp's units),
    /// with fewer than this many 4-row blocks an SM, takes `mvq1x4u` on half the warps, two
    /// rounds a thread (`half_warps`; NEAGARI_CUDA_MV_HALF=N, 0 turns it off): 27B Q4_K
    /// one-token step 6.02 → 5.94 ms, tg64 166 → 169 (H200).
    mv_half: usize,
    /// The same for `matmul_multi` (`mvqm1x4u`) under NEAGARI_CUDA_MVM_HALF=N blocks an SM
    /// (default 80; 0 turns it off). Its loads go out before the wait, so the norm before
    /// the 27B's Q4_K qkv+z (31 blocks an SM) and gate+up (66) hides under them: one-token
    /// greedy step 6.790 / 6.792 → 6.674 / 6.668 ms, tg64 147.6 / 147.4 → 149.2 / 149.4
    /// (H100, with Q4_K's paired nibbles; in ggml's layout, session 39, it was level).
    /// Shapes past 80 blocks an SM are unmeasured.
    mvm_half: usize,
    /// Blocks a value head of the fused DeltaNet kernel (`delta_rows`, hybrid.cu):
    /// NEAGARI_CUDA_DS_BLOCKS=N, 1..=16, default 2 (on the 27B two blocks of 16 warps a
    /// head). Against 4, same call (H100): 27B Q1_0 one-token / 8-row greedy step 3.413 →
    /// 3.358 / 5.210 → 5.158 ms, TQ2_0 4.317 → 4.286 / 7.231 → 7.298, Q4_K level; 8 and
    /// 16 slower on Q1_0 (3.46, 3.56 ms).
    ds_blocks: usize,
    /// 3–8 rows of `matmul_glu` take `mvrtg_4` (fused.rs `matmul_glu_rows`) where it runs,
    /// unless NEAGARI_CUDA_GLU_ROWS=0 (the GEMV and the GLU kernel, for measuring).
    glu_rows: bool,
    /// `mvrtg_4`'s grid: at most NEAGARI_CUDA_GLU_LOOP=N (default 2) blocks an SM, each
    /// block then taking several tile blocks, the next one's copy in flight with
    /// NEAGARI_CUDA_GLU_BUFS=2 (the default) where two tiles fit; 0: a block a tile block.
    /// 27B Q1_0 8-row greedy step (H200, four calls): 5.55–5.58 → 5.38–5.43 ms.
    glu_loop: usize,
    glu_bufs: usize,
    /// The tile blocks past `mvrtg_4`'s whole rounds in up to NEAGARI_CUDA_GLU_SPLIT=N parts
    /// of K (default 8, capped by fused.rs `glu_split`: 5 on the 27B; 0 or 1: whole, by a
    /// block each). 27B Q1_0 8-row greedy step 5.22 → 5.10 ms at 5 parts (H100,
    /// docs/BENCHMARKS.md sessions 60–61).
    glu_split: usize,
    /// … a head's blocks in one cluster, which normalizes the head's rows in shared memory
    /// (Hopper and later), unless NEAGARI_CUDA_DR_CLUSTER=0 (the last block through L2).
    dr_cluster: bool,
    /// 3–8 activation rows take the tensor-core GEMV (gemv_rows.cu) where the format has
    /// one, on sm_80 and newer, unless NEAGARI_CUDA_MV_TC=0 (then `mvq8`, for measuring).
    mvr_on: bool,
    /// … for Q3_K, Q5_K and Q6_K too with NEAGARI_CUDA_MVR_K16=1 (modules.rs
    /// `rows_struct`: right, but slower than `mvq8` in the replayed step).
    mvr_k16: bool,
    /// One activation row of the repacked formats takes gemv_stream.cu's pipelined GEMV
    /// (rows of at most 256 steps) with this shape, unless NEAGARI_CUDA_MVS=0 (then
    /// `mvq_step`); NEAGARI_CUDA_MVS=R,K,G picks one.
    mvs: Option<MvsShape>,
    /// One activation row's gate/up GEMV with its GLU (`matmul_glu`) runs as one
    /// gemv_stream.cu `mvsg_R` launch where `mvs` would run the GEMV and `mvsg_geometry`
    /// gives a shape (by default TQ2_0, not Q1_0), unless NEAGARI_CUDA_MVSG=0 (then `mvs_R`
    /// and the GLU kernel); NEAGARI_CUDA_MVSG=R,K,G picks a shape (Q1_0 too).
    mvsg: Option<MvsShape>,
    /// The largest gate matrix (rows × cols) whose GLU `mvqg*` fuses into its GEMV
    /// (fused.rs GLU_FUSE_MAX; NEAGARI_CUDA_GLU_FUSE_MAX=N for measuring).
    glu_fuse_max: usize,
    /// The tensor-core GEMV of the B_ formats takes its tile by bulk copies (`mvrt_*`) on
    /// sm_90 and newer, with these tiles a block (16 rows each) and K split in these many
    /// parts to choose from (`mvr_tma`): NEAGARI_CUDA_MVRT=N (1, 2 or 4; 0 = `mvr`
    /// instead) and NEAGARI_CUDA_MVRT_SPLIT=P (1, 2 or 4; 3 for measuring) allow only that one.
    mvrt_tiles: Vec<usize>,
    mvrt_parts: Vec<usize>,
    /// Parts of K where a sub-2-bit matrix's rows are cut for more tiles a block
    /// (`mvr_tma`; NEAGARI_CUDA_MVRT_SUB2=2|3|4 for measuring).
    mvrt_sub2: usize,
    /// Whether one matrix's 4-tile whole-tile plan whose grid leaves SMs without a block
    /// takes `mvrt_4w` (twice the warps; gemv_rows.rs `mvrt_wide`; NEAGARI_CUDA_MVRT_W16=0
    /// turns it off).
    mvrt_w16: bool,
    /// Whether a K split's parts meet in a cluster's rank 0 or through global memory, the
    /// last block to count adding them (gemv_rows.rs `mvrt_meet`): `None`, a cluster for 2
    /// parts only; NEAGARI_CUDA_MVRT_CLUSTER=1 | 0 always | never.
    mvrt_cluster: Option<bool>,
    /// Which matrices `mvrt_*` takes by group (`mvrc_*`: a tensor copy and a barrier per
    /// group of the tile), of those whose rows are whole groups: see [`ByGroup`].
    mvrc: gemv_rows::ByGroup,
    /// Slots of `mvrq_*`'s ring, where the tile goes by group (MVRQ_SLOTS; NEAGARI_CUDA_MVRQ=N,
    /// 0: `mvrc_*`, every group of the tile in flight at once).
    mvrq: usize,
    /// Where set (MVRQ_TILES; NEAGARI_CUDA_MVRQ_TILES=1|2|4, 0 unset), the ring takes rows
    /// whole with that many tiles a block first, where the whole tile would not fit too (no
    /// K split); unset, it takes the tiles and parts of the whole tile's plan. 27B Q4_K, 8
    /// rows, H200: the GEMVs (µs; gate+up, qkv+z, down, ssm_out, head) unset 43.2, 21.4,
    /// 29.5, 13.3, 263; at 2 tiles 43.2, 21.4, 27.8, 11.2, 263; at 4 (read as
    /// NEAGARI_CUDA_MVRC=1, the same plans for Q4_K) 37.8, 18.3, 27.6, 11.6, 215 — yet the
    /// 8-row greedy step at 4 took 8.88 ms against 8.47 unset, unexplained. At 2 the step
    /// took 8.218 ms against 8.378–8.426 unset (session 48, H200).
    mvrq_tiles: Option<usize>,
    /// The tensor maps `mvrc_*` reads, by (weights, rows, row bytes, group bytes, box rows).
    tmaps: Mutex<HashMap<gemv_rows::TMapKey, gemv_rows::TMap>>,
    /// Counts kernel launches and device writes (see [`Scratch::xq_key`]).
    gen: AtomicU64,
    /// Decode-step recording (graph.rs): the mode (OFF, WARM, CAPTURE, REPLAY), launches
    /// made in the step, the scratch epoch, and the step state.
    mode: AtomicU8,
    launches: AtomicUsize,
    epoch: AtomicU64,
    step: Mutex<graph::Step>,
    /// CUDA graphs for decode steps, unless NEAGARI_CUDA_GRAPH=0.
    graphs_on: AtomicBool,
    /// Kernels launch with programmatic stream serialization (`launch_raw`): on Hopper
    /// and later, unless NEAGARI_CUDA_PDL=0.
    pdl: bool,
    /// The next GEMV's weights a small kernel asks L2 for (prefetch.rs).
    pf: prefetch::Prefetch,
    /// Launches are timed (profile.rs) and recorded steps are not replayed.
    profiling: AtomicBool,
    profile: Mutex<Option<profile::Profile>>,
}

/// f32 activations `[rows, cols]` in device memory; `data` may be longer than needed.
pub struct CudaBuf {
    /// Dropped by hand (graph.rs): an arena slot's alias is leaked, not freed.
    data: ManuallyDrop<CudaSlice<f32>>,
    rows: usize,
    cols: usize,
    /// `data` aliases a slot of the decode-step arena.
    lent: bool,
}

/// A packed matrix `[rows = out, cols = in]` in device memory, rows of `row_bytes`.
pub struct CudaMat {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    data: CudaSlice<u8>,
    k: Arc<FmtKernels>,
}

/// A small f32 vector in device memory.
pub struct CudaVector {
    data: CudaSlice<f32>,
    len: usize,
}

/// KV cache of one sequence: K and V each `[n_layers, n_kv_heads, n_ctx, head_dim]` f16.
pub struct CudaKv {
    shape: KvShape,
    len: usize,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    /// Gated DeltaNet state of hybrid models (`rec_alloc`).
    rec: Option<hybrid::CudaRec>,
    /// Unique per cache of the process: part of a recorded decode step's key (an address
    /// can be reused by a later cache of another model).
    id: u64,
}

macro_rules! launch {
    // Without marking device buffers written (the caller keeps `Scratch::xq_key` right), in
    // thread-block clusters of $c blocks along x (see `launch_raw`).
    (@keep_cluster $c:expr, $be:expr, $f:expr, $cfg:expr $(, $a:expr)* $(,)?) => {{
        $be.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if $be.replaying() {
            // A replayed decode step: the graph launches it at the step's read.
            Ok(())
        } else {
            // One expression: temporaries among the arguments live until the launch returns.
            // SAFETY: every pointer argument is a live device allocation of the size the
            // kernel indexes (checked by the caller), and scalars match the kernel's
            // parameter types.
            unsafe { $be.launch_raw($f, $cfg, $c, &mut [$( $crate::cuda::karg($a) ),*]) }
        }
    }};
    (@keep $be:expr, $f:expr, $cfg:expr $(, $a:expr)* $(,)?) => {{
        launch!(@keep_cluster 1, $be, $f, $cfg $(, $a)*)
    }};
    (@cluster $c:expr, $be:expr, $f:expr, $cfg:expr $(, $a:expr)* $(,)?) => {{
        $be.bump();
        launch!(@keep_cluster $c, $be, $f, $cfg $(, $a)*)
    }};
    ($be:expr, $f:expr, $cfg:expr $(, $a:expr)* $(,)?) => {{
        $be.bump();
        launch!(@keep $be, $f, $cfg $(, $a)*)
    }};
}

/// A kernel argument as the driver takes it: the address of the value (a device address is
/// passed as its `u64`).
fn karg<T: DeviceRepr>(a: &T) -> *mut c_void {
    a as *const T as *mut c_void
}

// After `launch!`, which they use (macros are in scope textually).
mod attention;
mod backend;
mod fused;
mod gemv_rows;
mod graph;
mod hybrid;
mod matmul;
mod norm;
mod prefetch;
mod repack;

fn cfg1(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: ((n as u64).div_ceil(block as u64).max(1) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Opens device `ordinal` and compiles the float-op kernels for its architecture.
    pub fn new(ordinal: usize) -> Result<Self> {
        let p = probe();
        if let Some(why) = p.unavailable {
            return Err(BackendError::Other(format!("CUDA is unavailable: {why}")));
        }
        if ordinal >= p.devices.len() {
            return Err(BackendError::Other(format!(
                "no CUDA device {ordinal} ({} found)",
                p.devices.len()
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        // SAFETY: one stream does all the work (cuBLAS too), so cudarc's per-allocation
        // events that order work across streams are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let (maj, min) = ctx.compute_capability().map_err(drv)?;
        let arch = format!("sm_{maj}{min}");
        let n_sm = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(drv)? as usize;
        let name = ctx.name().map_err(drv)?;
        // The two modules every model needs, compiled side by side where not cached.
        modules::compile_parallel(&arch, modules::module_sources(None)?)?;
        let ptx = compile("ops", &arch, modules::ops_defines(), OPS)?;
        let m = ctx
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
            .map_err(drv)?;
        let f = |n: &str| m.load_function(n).map_err(drv);
        let ops = OpsKernels {
            rms_norm: f("rms_norm")?,
            rms_norm_q: f("rms_norm_q")?,
            add_rms_norm: f("add_rms_norm")?,
            add_rms_norm_q: f("add_rms_norm_q")?,
            add_rms_norm_row: f("add_rms_norm_row")?,
            add_rms_norm_cl: f("add_rms_norm_cl")?,
            add_norm_part: f("add_norm_part")?,
            norm_add_norm: [f("norm_add_norm_1")?, f("norm_add_norm_8")?],
            norm_add_norm_q: [f("norm_add_norm_q_1")?, f("norm_add_norm_q_8")?],
            glu_silu_q: f("glu_silu_q")?,
            glu_gelu_q: f("glu_gelu_q")?,
            add: f("add")?,
            add_bias: f("add_bias")?,
            softcap: f("softcap")?,
            glu_silu: f("glu_silu")?,
            glu_gelu: f("glu_gelu")?,
            to_f16: f("to_f16")?,
            rope: f("rope")?,
            kv_store: f("kv_store")?,
            kv_store_q8: f("kv_store_q8")?,
            attention: f("attention")?,
            attention_q8: f("attention_q8")?,
            att_combine: f("att_combine")?,
            att_group: attention::GROUPS
                .iter()
                .flat_map(|&g| attention::GROUP_HEAD_DIMS.map(|hd| (g, hd)))
                .flat_map(|(g, hd)| [(g, hd, false), (g, hd, true)])
                .map(|(g, hd, q8)| {
                    let q = if q8 { "_q8" } else { "" };
                    Ok(((g, hd, q8), f(&format!("att_g{g}_d{hd}{q}"))?))
                })
                .collect::<Result<_>>()?,
            argmax_rows: f("argmax_rows")?,
            topk_chunks: f("topk_chunks")?,
            topk_merge: f("topk_merge")?,
            penalize: f("penalize")?,
            qk_norm_rope: f("qk_norm_rope")?,
            qk_norm_rope_q8: f("qk_norm_rope_q8")?,
        };
        let hybrid = hybrid::HybridKernels::load(&ctx, &arch)?;
        // cuBLAS is optional: without it, batches run through the GEMV 8 rows at a time.
        // SAFETY: only checks whether the shared library can be opened.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            CudaBlas::new(stream.clone()).ok()
        } else {
            None
        };
        Ok(CudaBackend {
            ctx,
            stream,
            arch,
            name,
            n_sm,
            ops,
            hybrid,
            fmts: Mutex::new(HashMap::new()),
            pairs: Mutex::new(HashMap::new()),
            blas,
            scratch: Mutex::new(Scratch::default()),
            mv_rows: knob("NEAGARI_CUDA_MV_ROWS").filter(|&n| [1, 2, 4, 8].contains(&n)),
            mv_warps: knob("NEAGARI_CUDA_MV_WARPS").filter(|n| (1..=MVQ_WARPS).contains(n)),
            norm_row: knob_on("NEAGARI_CUDA_NORM_ROW"),
            norm_cl: maj >= 9 && knob_on("NEAGARI_CUDA_NORM_CL"),
            norm_fold: knob_on("NEAGARI_CUDA_NORM_FOLD"),
            norm_fold_rows: knob_on("NEAGARI_CUDA_NORM_FOLD_ROWS"),
            norm_fold_tile: knob_on("NEAGARI_CUDA_NORM_FOLD_TILE"),
            norm_fold_stream: knob_on("NEAGARI_CUDA_NORM_FOLD_STREAM"),
            mv_int: knob::<String>("NEAGARI_CUDA_MV").as_deref() != Some("float"),
            fuse: knob_on("NEAGARI_CUDA_FUSE"),
            fuse_attn: knob_on("NEAGARI_CUDA_FUSE") && knob_on("NEAGARI_CUDA_FUSE_ATTN"),
            att_blocks: knob("NEAGARI_CUDA_ATT_BLOCKS")
                .filter(|n| (1..=64).contains(n))
                .unwrap_or(2),
            att_group: knob_forced("NEAGARI_CUDA_ATT_GROUP"),
            pair: knob_on("NEAGARI_CUDA_PAIR"),
            repack: knob_on("NEAGARI_CUDA_REPACK"),
            mv_groups: knob("NEAGARI_CUDA_MV_GROUPS").filter(|n| (1..=MVQ_WARPS * 32).contains(n)),
            mvq_split: knob_on("NEAGARI_CUDA_MVQ_SPLIT"),
            mv_half: knob("NEAGARI_CUDA_MV_HALF").unwrap_or(12),
            mvm_half: knob("NEAGARI_CUDA_MVM_HALF").unwrap_or(80),
            ds_blocks: knob("NEAGARI_CUDA_DS_BLOCKS")
                .filter(|n| (1..=16).contains(n))
                .unwrap_or(2),
            glu_rows: knob_on("NEAGARI_CUDA_GLU_ROWS"),
            glu_loop: knob("NEAGARI_CUDA_GLU_LOOP").unwrap_or(2),
            glu_bufs: knob("NEAGARI_CUDA_GLU_BUFS")
                .filter(|&n| n == 1)
                .unwrap_or(2),
            glu_split: knob("NEAGARI_CUDA_GLU_SPLIT").unwrap_or(8),
            dr_cluster: maj >= 9 && knob_on("NEAGARI_CUDA_DR_CLUSTER"),
            mvs: mvs_shape(knob::<String>("NEAGARI_CUDA_MVS").as_deref()),
            mvsg: mvs_shape(knob::<String>("NEAGARI_CUDA_MVSG").as_deref()),
            glu_fuse_max: knob("NEAGARI_CUDA_GLU_FUSE_MAX").unwrap_or(fused::GLU_FUSE_MAX),
            mvrt_tiles: match knob("NEAGARI_CUDA_MVRT") {
                _ if maj < 9 => Vec::new(),
                Some(0) => Vec::new(),
                Some(n) if MVRT_TILES.contains(&n) => vec![n],
                _ => MVRT_TILES.to_vec(),
            },
            // 3 is not among the defaults: for measuring.
            mvrt_parts: match knob("NEAGARI_CUDA_MVRT_SPLIT") {
                Some(n @ 1..=MVRT_MAXP) => vec![n],
                _ => MVRT_PARTS.to_vec(),
            },
            mvrt_sub2: knob("NEAGARI_CUDA_MVRT_SUB2")
                .filter(|n| (2..=MVRT_MAXP).contains(n))
                .unwrap_or(MVRT_SUB2),
            mvrt_w16: knob_forced("NEAGARI_CUDA_MVRT_W16").unwrap_or(true),
            mvrt_cluster: knob_forced("NEAGARI_CUDA_MVRT_CLUSTER"),
            mvrc: match knob_forced("NEAGARI_CUDA_MVRC") {
                Some(false) => gemv_rows::ByGroup::Off,
                Some(true) => gemv_rows::ByGroup::All,
                None => gemv_rows::ByGroup::Wide,
            },
            mvrq: knob("NEAGARI_CUDA_MVRQ").map_or(MVRQ_SLOTS, |n: usize| n.min(MVRQ_MAXS)),
            mvrq_tiles: Some(knob("NEAGARI_CUDA_MVRQ_TILES").unwrap_or(MVRQ_TILES))
                .filter(|n| MVRT_TILES.contains(n)),
            tmaps: Mutex::new(HashMap::new()),
            mvr_on: maj >= 8 && knob_on("NEAGARI_CUDA_MV_TC"),
            mvr_k16: knob_forced("NEAGARI_CUDA_MVR_K16") == Some(true),
            gen: AtomicU64::new(0),
            mode: AtomicU8::new(graph::OFF),
            launches: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            step: Mutex::new(graph::Step::new()),
            graphs_on: AtomicBool::new(knob_on("NEAGARI_CUDA_GRAPH")),
            pdl: maj >= 9 && knob_on("NEAGARI_CUDA_PDL"),
            pf: prefetch::Prefetch::from_env(),
            profiling: AtomicBool::new(false),
            profile: Mutex::new(None),
        })
    }

    /// Marks device buffers as possibly written (see [`Scratch::xq_key`]). `launch!` calls
    /// it; an op that writes a buffer by copying (`write`, `copy_row`) calls it itself.
    fn bump(&self) {
        self.gen.fetch_add(1, Ordering::Relaxed);
    }

    /// Launches `f` on the stream. With PDL on, it launches with programmatic stream
    /// serialization: the kernel may be scheduled before the previous one has completed
    /// (and a recorded graph keeps that as a programmatic edge), which hides the gap
    /// between two small kernels; each kernel waits for its predecessor itself (`gdc_wait`,
    /// common.cuh).
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, each to a live value of the
    /// parameter's type; device addresses among them must be valid for what the kernel
    /// accesses.
    /// A `cluster` above 1 launches thread-block clusters of that many blocks along x
    /// (Hopper; the grid's x a multiple of it).
    unsafe fn launch_raw(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        cluster: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv)?;
        if self.skipped(f) {
            return Ok(());
        }
        // While profiling (profile.rs): an event before and after the launch.
        let start = self.profile_start()?;
        if !self.pdl && cluster <= 1 {
            // SAFETY: the caller's contract; function and stream are live handles of this
            // backend's context.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f.cu_function(),
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    self.stream.cu_stream(),
                    params,
                )
            }
            .map_err(drv)?;
            return self.profile_mark(f, cfg.grid_dim, start);
        }
        let mut pdl = sys::CUlaunchAttributeValue { pad: [0; 64] };
        pdl.programmaticStreamSerializationAllowed = 1;
        let mut dims = sys::CUlaunchAttributeValue { pad: [0; 64] };
        dims.clusterDim.x = cluster;
        dims.clusterDim.y = 1;
        dims.clusterDim.z = 1;
        let mut attrs = [
            sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: pdl,
            },
            sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                pad: [0; 4],
                value: dims,
            },
        ];
        let (first, n) = match (self.pdl, cluster > 1) {
            (true, true) => (0, 2),
            (true, false) => (0, 1),
            _ => (1, 1),
        };
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: attrs[first..].as_mut_ptr(),
            numAttrs: n,
        };
        // SAFETY: the caller's contract for `params`; `lc` and the attribute it points to
        // live across the call, which copies them; function and stream are live handles
        // of this backend's context.
        unsafe {
            sys::cuLaunchKernelEx(
                &lc,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(drv)?;
        self.profile_mark(f, cfg.grid_dim, start)
    }

    /// Whether kernels launch with programmatic dependent launch (Hopper and later, unless
    /// NEAGARI_CUDA_PDL=0).
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Compute architecture the kernels were built for (`sm_90` on Hopper).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Whether prefill batches use cuBLAS.
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    /// Waits for all queued work (timing).
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(drv)
    }

    /// Device-to-device copy bandwidth (bytes read + written per second) over a 1 GiB
    /// buffer, best of five.
    pub fn copy_bandwidth(&self) -> Result<f64> {
        const N: usize = 1 << 28; // f32 values: 1 GiB
        let a = self.stream.alloc_zeros::<f32>(N).map_err(drv)?;
        let mut b = self.stream.alloc_zeros::<f32>(N).map_err(drv)?;
        self.stream.memcpy_dtod(&a, &mut b).map_err(drv)?;
        self.synchronize()?;
        let mut best = 0f64;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            self.stream.memcpy_dtod(&a, &mut b).map_err(drv)?;
            self.synchronize()?;
            best = best.max((2 * N * 4) as f64 / t.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    fn dptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// An activation buffer, left uninitialised: a memset per buffer would be one more
    /// GPU operation per call, and every op writes its output before anything reads it.
    fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.check_alloc("a device buffer")?;
        // SAFETY: f32 has no invalid bit patterns; the contents are overwritten by the op
        // that produces the buffer before any kernel or `read` consumes it.
        unsafe { self.stream.alloc::<f32>(n.max(1)) }
            .map_err(|e| BackendError::OutOfMemory(format!("{n} f32 on the GPU: {e:?}")))
    }

    fn reshape(&self, b: &mut CudaBuf, rows: usize, cols: usize) -> Result<()> {
        if b.data.len() < rows * cols {
            let (data, lent) = self.lend(rows * cols)?;
            // SAFETY: the old slice is replaced right after and never used again.
            let old = unsafe { ManuallyDrop::take(&mut b.data) };
            if b.lent {
                old.leak();
            } else {
                drop(old);
            }
            b.data = ManuallyDrop::new(data);
            b.lent = lent;
        }
        b.rows = rows;
        b.cols = cols;
        Ok(())
    }

    fn elementwise(&self, f: &CudaFunction, x: &mut CudaBuf, y: Option<&CudaBuf>) -> Result<()> {
        let n = (x.rows * x.cols) as i64;
        let xp = self.dptr(&x.data);
        match y {
            Some(y) => {
                let yp = self.dptr(&y.data);
                launch!(self, f, cfg1(n as usize, 256), &xp, &yp, &n)
            }
            None => launch!(self, f, cfg1(n as usize, 256), &xp, &n),
        }
    }
}
