//! The kernel modules: which `kernels/*` sources and defines make each one (the float ops,
//! a format's GEMV family, a two-format pair), and their compilation by NVRTC for a device
//! architecture, cached per (module, architecture, defines) for the process and on disk
//! ([`super::kernel_cache`]).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use neagari_quant::GgmlType;

use super::kernel_cache;
use crate::{BackendError, Result};

pub(super) const COMMON: &str = include_str!("kernels/common.cuh");
pub(super) const DEQUANT: &str = include_str!("kernels/dequant.cuh");
pub(super) const MATMUL: &str = include_str!("kernels/matmul.cu");
/// The float ops and the attention family: one module from two files.
pub(super) const OPS: &str = concat!(
    include_str!("kernels/ops.cu"),
    "\n",
    include_str!("kernels/attention.cu")
);
pub(super) const LOWBIT: &str = include_str!("kernels/lowbit.cu");
pub(super) const VECDOT: &str = include_str!("kernels/vecdot.cuh");
pub(super) const GEMV_INT: &str = include_str!("kernels/gemv_int.cu");
pub(super) const GEMV_ROWS: &str = include_str!("kernels/gemv_rows.cu");
pub(super) const GEMV_STREAM: &str = include_str!("kernels/gemv_stream.cu");

/// The kernel struct name in dequant.cuh of a format the GEMV supports.
pub(super) fn fmt_struct(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => "F_F32",
        F16 => "F_F16",
        BF16 => "F_BF16",
        Q4_0 => "F_Q4_0",
        Q4_1 => "F_Q4_1",
        Q5_0 => "F_Q5_0",
        Q5_1 => "F_Q5_1",
        Q8_0 => "F_Q8_0",
        Q2_K => "F_Q2_K",
        Q3_K => "F_Q3_K",
        Q4_K => "F_Q4_K",
        Q5_K => "F_Q5_K",
        Q6_K => "F_Q6_K",
        Q1_0 => "F_Q1_0",
        Q2_0 => "F_Q2_0",
        TQ2_0 => "F_TQ2_0",
        _ => return None,
    })
}

/// The integer-dot struct in vecdot.cuh of a format (q8_1 activations), if it has one.
pub(super) fn int_struct(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => "Q_Q4_0",
        Q4_1 => "Q_Q4_1",
        Q5_0 => "Q_Q5_0",
        Q5_1 => "Q_Q5_1",
        Q8_0 => "Q_Q8_0",
        Q2_K => "Q_Q2_K",
        Q3_K => "Q_Q3_K",
        Q4_K => "Q_Q4_K",
        Q5_K => "Q_Q5_K",
        Q6_K => "Q_Q6_K",
        Q1_0 => "Q_Q1_0",
        TQ2_0 => "Q_TQ2_0",
        _ => return None,
    })
}

/// The tensor-core GEMV struct in gemv_rows.cu of a format (3–8 activation rows), if it
/// has one: formats with a scale per 32- or 16-value run (ggml's layout; an `R` suffix for
/// repack.rs's).
/// `k16`: also Q3_K, Q5_K and Q6_K (NEAGARI_CUDA_MVR_K16=1), whose structs are right
/// (cuda_gemv_rows) but lost to `mvq8` in the replayed step: an all-Q6_K Llama 3 8B's
/// 8-row forward 8.61 → 9.68 ms (H100, session 42), though each kernel alone was faster
/// (9.79 → 8.72 ms summed) and without PDL it won (9.00 → 8.11); with NEAGARI_CUDA_PDL=exit
/// it gave 7.68 (session 43). Q2_K's won in the step: 7.38 → 5.82 ms.
pub(super) fn rows_struct(ty: GgmlType, k16: bool) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        Q4_0 => "R_Q4_0",
        Q5_0 => "R_Q5_0",
        Q8_0 => "R_Q8_0",
        Q2_K => "R_Q2_K",
        Q3_K if k16 => "R_Q3_K",
        Q4_K => "R_Q4_K",
        Q5_K if k16 => "R_Q5_K",
        Q6_K if k16 => "R_Q6_K",
        Q1_0 => "R_Q1_0",
        TQ2_0 => "R_TQ2_0",
        _ => return None,
    })
}

/// Kernel struct names of a format: decoder, integer dot, tensor-core rows. Those of
/// repack.rs's layout (an `R` suffix) when `repack` and the format has one.
pub(super) struct FmtNames {
    pub(super) st: String,
    pub(super) q: Option<String>,
    pub(super) rows: Option<String>,
    /// The format has gemv_stream.cu's one-row GEMV (the repacked ones).
    pub(super) stream: bool,
    /// gemv_rows.cu's step-of-4-units struct (`B_…`, the verify GEMV `mvrt_*`), if any,
    /// and the units of a row's smallest run that its loads address on their own (where a
    /// K split may cut: a repacked group of 8 blocks, a Q4_K super-block).
    pub(super) block: Option<(&'static str, usize)>,
    /// The module's GEMVs skip their row prefetch before the wait ([`no_row_prefetch`]).
    pub(super) no_prefetch: bool,
}

/// Whether format `ty`'s GEMVs skip `gdc_prefetch_rows` before their wait. Q8_0, Q4_0,
/// Q5_K and Q6_K do by default. Llama 3 8B, all one format, one-token step: Q8_0 4.33 →
/// 3.66 ms and Q4_0 2.53 → 2.36 without it (H100, session 44); Q6_K 3.87–3.88 → 3.76–3.77
/// and Q5_K 2.55 → 2.46 (H200, session 45). Q2_K keeps it (2.01 → 2.25 without, H100),
/// and so do Q3_K (3.23 → 3.33, H200) and Q4_K (27B 7.04 → 7.19 with none anywhere, H100,
/// session 43). NEAGARI_CUDA_NOPF=Q8_0,Q5_K… replaces the list, `none` empties it.
pub(super) fn no_row_prefetch(ty: GgmlType) -> bool {
    nopf_names(ty.name()).unwrap_or(matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_K | GgmlType::Q6_K
    ))
}

/// Whether NEAGARI_CUDA_NOPF, where set, names `name`.
fn nopf_names(name: &str) -> Option<bool> {
    let v = super::knob::<String>("NEAGARI_CUDA_NOPF")?;
    Some(v.split(',').any(|n| n.trim().eq_ignore_ascii_case(name)))
}

/// The ops module's defines: `attn` in NEAGARI_CUDA_NOPF drops attention's KV prefetch
/// before its wait (for measuring; it pays: an all-Q6_K Llama 3 8B stepped 4.16–4.19 ms
/// with it, 4.25–4.28 without; H100, session 44).
pub(super) fn ops_defines() -> &'static str {
    if nopf_names("attn") == Some(true) {
        "#define GDC_NO_PREFETCH"
    } else {
        ""
    }
}

/// `k16` as [`rows_struct`]'s.
pub(super) fn fmt_structs(ty: GgmlType, repack: bool, k16: bool) -> Option<FmtNames> {
    let repacked = repack && super::repack::repacked(ty);
    // Q4_K's and Q5_K's own repacked layout (their units' nibbles paired, repack.rs) keeps
    // their kernels but for the structs' `N` forms.
    let r = match (repacked, repack && super::repack::paired(ty)) {
        (true, _) => "R",
        (false, true) => "N",
        _ => "",
    };
    let st = fmt_struct(ty)?;
    Some(FmtNames {
        st: format!("{st}{r}"),
        q: int_struct(ty).map(|q| format!("{q}{r}")),
        rows: rows_struct(ty, k16).map(|q| format!("{q}{r}")),
        stream: repacked,
        block: match (ty, repacked) {
            (GgmlType::Q1_0, true) => Some(("B_Q1_0R", 32)),
            (GgmlType::TQ2_0, true) => Some(("B_TQ2_0R", 64)),
            (GgmlType::Q4_K, _) if repack => Some(("B_Q4_KN", 8)),
            (GgmlType::Q4_K, _) => Some(("B_Q4_K", 8)),
            _ => None,
        },
        no_prefetch: no_row_prefetch(ty),
    })
}

/// Module name, defines and source of a format's kernels.
pub(super) fn fmt_module(n: &FmtNames) -> (String, String, String) {
    let st = &n.st;
    let stream = if n.stream { GEMV_STREAM } else { "" };
    // NEAGARI_CUDA_MVS_MINB=N: the streaming GEMV's blocks-an-SM bound (gemv_stream.cu).
    let knobs = match super::knob::<u32>("NEAGARI_CUDA_MVS_MINB") {
        Some(b @ 1..=8) if n.stream => format!("\n#define MVS_MINB {b}"),
        _ => String::new(),
    };
    // NEAGARI_CUDA_MVRT_MINB=N: the 4-tile verify GEMV's blocks-an-SM bound (gemv_rows.cu).
    let knobs = match super::knob::<u32>("NEAGARI_CUDA_MVRT_MINB") {
        Some(b @ 1..=4) => format!("{knobs}\n#define MVRT_MINB {b}"),
        _ => knobs,
    };
    let knobs = if n.no_prefetch {
        format!("{knobs}\n#define GDC_NO_PREFETCH")
    } else {
        knobs
    };
    match (n.q.as_deref(), n.rows.as_deref()) {
        (Some(q), Some(r)) => (
            format!("matmul_{st}"),
            // The verify GEMV by steps of 4 units (gemv_rows.cu's B_ structs).
            format!(
                "#define FMT {st}\n#define FMTQ {q}\n#define FMTR {r}{knobs}{}",
                n.block
                    .map_or(String::new(), |(b, _)| format!("\n#define FMTB {b}"))
            ),
            format!("{DEQUANT}\n{LOWBIT}\n{MATMUL}\n{VECDOT}\n{GEMV_INT}\n{GEMV_ROWS}\n{stream}"),
        ),
        (Some(q), None) => (
            format!("matmul_{st}"),
            format!("#define FMT {st}\n#define FMTQ {q}{knobs}"),
            format!("{DEQUANT}\n{LOWBIT}\n{MATMUL}\n{VECDOT}\n{GEMV_INT}"),
        ),
        (None, _) => (
            format!("matmul_{st}"),
            format!("#define FMT {st}{knobs}"),
            format!("{DEQUANT}\n{LOWBIT}\n{MATMUL}"),
        ),
    }
}

/// Float formats are stored padded to whole 32-value units; quantized rows are whole blocks.
pub(super) fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// (module name, arch, defines) → PTX.
pub(super) type PtxCache = Mutex<HashMap<(String, String, String), String>>;

/// PTX per (module name, arch, defines), shared by every backend of the process.
pub(super) fn ptx_cache() -> &'static PtxCache {
    static C: OnceLock<PtxCache> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(super) fn compile(name: &str, arch: &str, defines: &str, src: &str) -> Result<String> {
    let key = (
        name.to_string(),
        arch.to_string(),
        format!("{defines}{}", gdc_define()),
    );
    if let Some(p) = ptx_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
    {
        return Ok(p.clone());
    }
    // Not locked while NVRTC runs, so modules compile side by side (`compile_all`); two
    // threads asking for the same module both compile it, and the later insert is the same.
    let full = full_source(defines, src);
    let options = nvrtc_options(arch);
    // A compile of the same inputs in an earlier run (kernel_cache.rs).
    let disk = kernel_cache::dir().map(|d| {
        let k = kernel_cache::key(&full, &options, super::probe::nvrtc_version());
        (d, k)
    });
    if let Some(s) = disk
        .as_ref()
        .and_then(|(d, k)| kernel_cache::load(d, name, arch, k))
    {
        return Ok(remember(key, s));
    }
    compile_notice(disk.as_ref().map(|(d, _)| d.as_path()));
    let opts = CompileOptions {
        options,
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(&full, opts)
        .map_err(|e| BackendError::Other(format!("NVRTC failed to compile {name}: {e:?}")))?;
    let s = ptx.to_src();
    if let Some((d, k)) = &disk {
        kernel_cache::store(d, name, arch, k, &s);
    }
    Ok(remember(key, s))
}

/// Keeps a module's PTX for the rest of the process.
fn remember(key: (String, String, String), ptx: String) -> String {
    ptx_cache()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.clone());
    ptx
}

/// Says once a process, on stderr, that kernels are being compiled: a first run of a build
/// on a GPU spends seconds to minutes in NVRTC before its first token, silent otherwise.
fn compile_notice(cache: Option<&std::path::Path>) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let kept = cache.map_or("not kept: NEAGARI_KERNEL_CACHE is off".into(), |d| {
            format!("kept in {}", d.display())
        });
        eprintln!("neagari: compiling CUDA kernels (once for this build and GPU; {kept})");
    });
}

/// NVRTC's flags for every module (ptxas.rs adds its report flag to the same).
pub(super) fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
        "--fmad=true".into(),
    ]
}

/// What NVRTC compiles for a module: its defines, the PDL mode, the shared header, its source.
pub(super) fn full_source(defines: &str, src: &str) -> String {
    format!("{defines}\n{}{COMMON}\n{src}", gdc_define())
}

/// How kernels hand over under PDL (`gdc_wait` / `gdc_prefetch` in common.cuh). By default
/// a kernel lets the next one launch as soon as all its blocks have passed their wait, and
/// the GEMVs' blocks ask L2 for their weight rows before they wait, so the weights stream
/// while the kernel before them runs: tg128 (H200, one call) 27B Q4_K 131.6 → 142.7, Q1_0
/// 196.5 → 200.3, TQ2_0 177.3 → 176.5, Gemma 3 270M shape 864 → 850. For measuring:
/// NEAGARI_CUDA_PDL=exit (the next kernel launches when this one's blocks exit), =early
/// (early launch, no prefetch), =0 (no PDL at all, `CudaBackend::pdl`).
pub(super) fn gdc_define() -> &'static str {
    match super::knob::<String>("NEAGARI_CUDA_PDL").as_deref() {
        Some("exit") | Some("0") => "",
        Some("early") => "#define GDC_EARLY\n",
        _ => "#define GDC_EARLY\n#define GDC_PREFETCH\n",
    }
}

/// Whether NVRTC (the run-time compiler of the kernels) can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The PTX NVRTC makes for `arch` without a GPU, for tests that inspect it: the float-op
/// and hybrid modules for `None`, else the modules of weight format `ty` (both layouts).
pub fn module_ptx(arch: &str, ty: Option<GgmlType>) -> Result<Vec<String>> {
    module_sources(ty)?
        .iter()
        .map(|(name, defines, src)| compile(name, arch, defines, src))
        .collect()
}

/// (name, defines, source) of the modules `module_ptx` compiles.
pub(super) fn module_sources(ty: Option<GgmlType>) -> Result<Vec<(String, String, String)>> {
    let Some(ty) = ty else {
        return Ok(vec![
            ("ops".into(), ops_defines().into(), OPS.into()),
            ("hybrid".into(), String::new(), super::hybrid::HYBRID.into()),
        ]);
    };
    // Both layouts of the formats that are repacked at upload.
    let mut out = [false, true]
        .iter()
        .map(|&repack| {
            let names = fmt_structs(ty, repack, true).ok_or(BackendError::NoKernel {
                op: "matmul",
                device: "cuda",
                ty,
            })?;
            Ok(fmt_module(&names))
        })
        .collect::<Result<Vec<_>>>()?;
    // Gemma 3's Q4_K_M q/k/v: the one pair module every model test meets.
    if ty == GgmlType::Q5_0 {
        out.push(pair_module("Q_Q5_0", "Q_Q8_0"));
    }
    Ok(out)
}

/// Module name, defines and source of the two-format one-row GEMV `mvqp*` (gemv_int.cu) of
/// integer-dot structs `qa` (the first matrices) and `qb`.
pub(super) fn pair_module(qa: &str, qb: &str) -> (String, String, String) {
    (
        format!("pair_{qa}_{qb}"),
        format!("#define FMTQ {qa}\n#define FMTQ2 {qb}"),
        format!("{DEQUANT}\n{LOWBIT}\n{VECDOT}\n{GEMV_INT}"),
    )
}

/// Every weight format with CUDA kernels.
const KERNEL_FORMATS: [GgmlType; 16] = {
    use GgmlType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q1_0, Q2_0,
        TQ2_0,
    ]
};

/// Compiles every kernel module for `arch` (e.g. `sm_90`) without a GPU: NVRTC alone
/// suffices, so a machine without a GPU can check that the kernels build.
pub fn compile_all(arch: &str) -> Result<()> {
    let mut jobs = module_sources(None)?;
    for ty in KERNEL_FORMATS {
        jobs.extend(module_sources(Some(ty))?);
    }
    compile_parallel(arch, jobs)
}

/// Compiles modules (name, defines, source) side by side, one thread a core: NVRTC compiles
/// separate programs concurrently, and a cold cache took 300 s on the H200 machine's host
/// one module at a time. Duplicates compile once; the longest sources go first, so the last
/// thread to finish does not start the largest module late.
pub(super) fn compile_parallel(arch: &str, mut jobs: Vec<(String, String, String)>) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    jobs.sort_by(|a, b| (b.2.len(), &b.0, &b.1).cmp(&(a.2.len(), &a.0, &a.1)));
    jobs.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    while let Some((name, defines, src)) =
                        jobs.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        compile(name, arch, defines, src)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(BackendError::Other("an NVRTC thread panicked".into())))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefetch choice reaches every format's module, whichever kernels it holds (the
    /// modules without a verify struct once dropped it, so `NOPF=Q6_K` measured nothing).
    #[test]
    fn every_format_module_takes_its_prefetch_choice() {
        for ty in KERNEL_FORMATS {
            for repack in [false, true] {
                for k16 in [false, true] {
                    let Some(mut n) = fmt_structs(ty, repack, k16) else {
                        continue;
                    };
                    for off in [false, true] {
                        n.no_prefetch = off;
                        let defines = fmt_module(&n).1;
                        assert_eq!(
                            defines.contains("#define GDC_NO_PREFETCH"),
                            off,
                            "{ty:?} repack {repack} k16 {k16}: {defines}"
                        );
                    }
                }
            }
        }
    }
}
