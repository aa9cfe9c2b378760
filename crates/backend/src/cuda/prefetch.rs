//! The next GEMV's weights asked into L2 by the small kernel before it (`Backend::prefetch`).
//!
//! Between two GEMVs of a decode step a norm, the GLU or the DeltaNet kernel runs for a few
//! microseconds, and the GEMV after it streams its weights only once its blocks find SMs.
//! A model says which matrices its next GEMV reads; the next `add_rms_norm`, `glu` or
//! `delta_net` launch takes their first bytes as one kernel parameter, and its blocks ask
//! L2 for them with `cp.async.bulk.prefetch.L2` (common.cuh `pf_issue`) before their
//! gdc_wait. A hint: no kernel waits for it and no result depends on it.
//!
//! How much each site asks for was measured on the H200 (docs/BENCHMARKS.md, session 25):
//! 27B Q1_0 one-token step 3.52–3.54 → 3.44–3.46 ms at 4 / 16 / 8 MiB (norm / GLU /
//! DeltaNet), worse past that (8 MiB everywhere 3.47, 16 MiB 3.71, 32 MiB 4.00: the
//! prefetch is issued while the GEMV before still streams, and takes its bandwidth); TQ2_0
//! 3.92 → 3.90; Llama 3 8B Q1_0 tg128 754 → 767; Q4_K 6.19 → 6.23, so matrices of 4 bits a
//! weight and more are not prefetched (their first MiBs are a small share of what the GEMV
//! reads). NEAGARI_CUDA_BULKPF=N or N:G:D (MiB at every site, or per site; 0 turns hints
//! off) for measuring.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use cudarc::driver::DeviceRepr;

use super::{CudaBackend, CudaMat};

/// What the next prefetching launch passes (common.cuh's `Pf`, by value): two
/// (address, bytes) ranges.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct PfArgs {
    p0: u64,
    n0: u64,
    p1: u64,
    n1: u64,
}

// SAFETY: plain old data of the kernel parameter's C layout (four 8-byte fields, 32 bytes,
// no padding), passed by value.
unsafe impl DeviceRepr for PfArgs {}
const _: () = assert!(std::mem::size_of::<PfArgs>() == 32);

/// The kernels that take a hint, each with its own cap (`Prefetch::caps` order).
#[derive(Clone, Copy)]
pub(super) enum PfSite {
    Norm,
    Glu,
    Delta,
}

/// MiB each site asks for by default (norm, GLU, DeltaNet).
const DEFAULT_MIB: [usize; 3] = [4, 16, 8];

/// Matrices of at least this many bits a weight are not prefetched (see the module doc).
const MAX_BITS: usize = 4;

pub(super) struct Prefetch {
    /// The most bytes each site's kernel asks for; all 0 turns hints off.
    caps: [usize; 3],
    /// The hint and [`CudaBackend::gen`] when it was given: only a launch with no other
    /// launch or write between (GEMVs do not count) takes it, so a hint nobody took never
    /// reaches a later kernel, whose matrices may be gone.
    pending: Mutex<(PfArgs, u64)>,
}

impl Prefetch {
    pub(super) fn from_env() -> Self {
        let v = std::env::var("NEAGARI_CUDA_BULKPF").unwrap_or_default();
        let mib: Vec<usize> = v.split(':').filter_map(|m| m.trim().parse().ok()).collect();
        let mib = match mib[..] {
            [n] => [n; 3],
            [n, g, d] => [n, g, d],
            _ => DEFAULT_MIB,
        };
        Prefetch {
            caps: mib.map(|m| m << 20),
            pending: Mutex::new((PfArgs::default(), 0)),
        }
    }
}

impl CudaBackend {
    /// Records the first bytes of `ws` (the first two matrices, at most the largest cap)
    /// for the next prefetching launch, replacing what an earlier hint left.
    pub(super) fn prefetch_op(&self, ws: &[&CudaMat]) {
        let mut args = PfArgs::default();
        let mut left = self.pf.caps.iter().copied().max().unwrap_or(0);
        let dense = |w: &CudaMat| w.data.len() * 8 >= MAX_BITS * w.rows * w.cols;
        if !ws.iter().any(|w| dense(w)) {
            for (i, w) in ws.iter().take(2).enumerate() {
                // Whole 16-byte pieces (the bulk prefetch's unit); allocations are aligned.
                let n = w.data.len().min(left) & !15;
                let r = (self.dptr(&w.data), n as u64);
                if i == 0 {
                    (args.p0, args.n0) = r;
                } else {
                    (args.p1, args.n1) = r;
                }
                left -= n;
            }
        }
        *self.pf.pending.lock().unwrap_or_else(|e| e.into_inner()) =
            (args, self.gen.load(Ordering::Relaxed));
    }

    /// The pending hint for a launch of `site`'s kernel, cut to its cap, cleared (none:
    /// zero bytes).
    pub(super) fn take_pf(&self, site: PfSite) -> PfArgs {
        let (mut a, gen) =
            std::mem::take(&mut *self.pf.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if gen != self.gen.load(Ordering::Relaxed) {
            return PfArgs::default();
        }
        let cap = self.pf.caps[site as usize] as u64;
        a.n0 = a.n0.min(cap);
        a.n1 = a.n1.min(cap - a.n0);
        if a.n0 == 0 {
            (a.p0, a.n0, a.p1, a.n1) = (a.p1, a.n1, 0, 0);
        }
        a
    }
}
