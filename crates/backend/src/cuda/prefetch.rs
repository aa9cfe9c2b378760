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
//!
//! The same launch also says whether the kernel lets the GEMV after it launch before its own
//! wait (`Pf::first`), so that GEMV's blocks take SMs and send their weight loads while the
//! GEMV before still finishes: where that GEMV is not the one-row streaming kernel of a
//! sub-4-bit format, whose register loads before the wait then slow the GEMV they overlap.
//! 27B, same call, one-token / 8-row greedy step (ms, H200, docs/BENCHMARKS.md session 28):
//! Q4_K 6.131 → 6.020 / 9.644 → 9.381, Q1_0 3.417 → 3.410 / 5.667 → 5.581; before every
//! GEMV (an earlier build), Q1_0's one-token step went 3.450 → 3.560 and TQ2_0's 3.919 →
//! 4.016. NEAGARI_CUDA_PDL_FIRST=0 turns it off.
//!
//! A second hint, `Backend::prefetch_rec`, names the recurrent layer whose state the next
//! DeltaNet step reads (3 MiB a layer on the 27B, f32): the GEMV before it (the layer's
//! in-projections: one row's `mvs_R`, 2–8 rows' `mvrmt_R`) asks L2 for it once its own
//! weight loads are out, so the state lands while that GEMV finishes. `delta_rows` cannot
//! start beside that GEMV (512 threads × 107 registers), and ncu found a third of its
//! one-token samples waiting on the state's loads from DRAM (docs/BENCHMARKS.md, session
//! 59). 27B, H100, same call (session 60): Q1_0's one-token and 8-row greedy steps −0.012
//! ms each, TQ2_0's 8-row −0.025.
//! NEAGARI_CUDA_REC_PF=0 turns it off.

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use cudarc::driver::DeviceRepr;

use super::{CudaBackend, CudaMat};

/// What the next prefetching launch passes (common.cuh's `Pf`, by value): two
/// (address, bytes) ranges, and 1 in `first` where the kernel lets the next launch at once.
#[derive(Clone, Copy, Default)]
#[repr(C)]
pub(super) struct PfArgs {
    p0: u64,
    n0: u64,
    p1: u64,
    n1: u64,
    first: u64,
}

// SAFETY: plain old data of the kernel parameter's C layout (five 8-byte fields, 40 bytes,
// no padding), passed by value.
unsafe impl DeviceRepr for PfArgs {}
const _: () = assert!(std::mem::size_of::<PfArgs>() == 40);

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
    /// Whether a hint's kernel may let the next GEMV launch before its wait (module doc).
    first: bool,
    /// The hint, whether its matrices have 4 bits a weight or more, and
    /// [`CudaBackend::gen`] when it was given: only a launch with no other launch or write
    /// between (GEMVs do not count) takes it, so a hint nobody took never reaches a later
    /// kernel, whose matrices may be gone.
    pending: Mutex<(PfArgs, bool, u64)>,
    /// The recurrent state (and conv window) the next `delta_rows` reads, asked into L2 by
    /// the GEMV before it (`take_rec`); NEAGARI_CUDA_REC_PF=0 turns it off.
    rec_on: bool,
    rec: Mutex<PfArgs>,
}

impl Prefetch {
    pub(super) fn from_env() -> Self {
        let v = super::knob::<String>("NEAGARI_CUDA_BULKPF").unwrap_or_default();
        let mib: Vec<usize> = v.split(':').filter_map(|m| m.trim().parse().ok()).collect();
        let mib = match mib[..] {
            [n] => [n; 3],
            [n, g, d] => [n, g, d],
            _ => DEFAULT_MIB,
        };
        Prefetch {
            caps: mib.map(|m| m << 20),
            first: super::knob_on("NEAGARI_CUDA_PDL_FIRST"),
            pending: Mutex::new((PfArgs::default(), false, 0)),
            rec_on: super::knob_on("NEAGARI_CUDA_REC_PF"),
            rec: Mutex::new(PfArgs::default()),
        }
    }
}

impl PfArgs {
    /// The two ranges, with no early launch.
    fn ranges(p0: u64, n0: u64, p1: u64, n1: u64) -> PfArgs {
        PfArgs {
            p0,
            n0,
            p1,
            n1,
            first: 0,
        }
    }

    /// At most `cap` bytes of the two ranges, the first's first (the second gets what the
    /// first leaves of the cap), in 16-byte pieces (the bulk prefetch's unit) that never
    /// pass a range's end; an empty first range gives its place to the second.
    fn cut(self, cap: u64) -> PfArgs {
        let n0 = self.n0.min(cap) & !15;
        let n1 = self.n1.min(cap - n0) & !15;
        if n0 == 0 {
            PfArgs::ranges(self.p1, n1, 0, 0)
        } else {
            PfArgs::ranges(self.p0, n0, self.p1, n1)
        }
    }
}

impl CudaBackend {
    /// Records the first two matrices of `ws` for the next prefetching launch (none where
    /// one of `ws` has 4 bits a weight or more), replacing what an earlier hint left.
    pub(super) fn prefetch_op(&self, ws: &[&CudaMat]) {
        let dense = |w: &CudaMat| w.data.len() * 8 >= MAX_BITS * w.rows * w.cols;
        let range = |i: usize| match ws.get(i) {
            Some(w) => (self.dptr(&w.data), w.data.len() as u64),
            None => (0, 0),
        };
        let is_dense = ws.iter().any(|w| dense(w));
        let args = if is_dense {
            PfArgs::default()
        } else {
            let ((p0, n0), (p1, n1)) = (range(0), range(1));
            PfArgs::ranges(p0, n0, p1, n1)
        };
        *self.pf.pending.lock().unwrap_or_else(|e| e.into_inner()) =
            (args, is_dense, self.gen.load(Ordering::Relaxed));
    }

    /// Records a recurrent layer's state and conv window (device address, bytes) for the next
    /// GEMV that takes it (`take_rec`), replacing what an earlier hint left.
    pub(super) fn prefetch_rec_op(&self, state: (u64, u64), conv: (u64, u64)) {
        let a = if self.pf.rec_on {
            PfArgs::ranges(state.0, state.1 & !15, conv.0, conv.1 & !15)
        } else {
            PfArgs::default()
        };
        *self.pf.rec.lock().unwrap_or_else(|e| e.into_inner()) = a;
    }

    /// The recurrent hint (none: zero bytes), cleared: taken by the GEMV that issues it and
    /// by `delta_net`, so it never outlives the step it was given for.
    pub(super) fn take_rec(&self) -> PfArgs {
        std::mem::take(&mut *self.pf.rec.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The pending hint for a launch of `site`'s kernel over `rows` activation rows (the
    /// next GEMV's), cut to its cap, cleared (none: zero bytes, no early launch).
    pub(super) fn take_pf(&self, site: PfSite, rows: usize) -> PfArgs {
        let (a, is_dense, gen) =
            std::mem::take(&mut *self.pf.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if gen != self.gen.load(Ordering::Relaxed) {
            return PfArgs::default();
        }
        PfArgs {
            first: (self.pf.first && (rows > 1 || is_dense)) as u64,
            ..a.cut(self.pf.caps[site as usize] as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PfArgs;

    fn args(p0: u64, n0: u64, p1: u64, n1: u64) -> PfArgs {
        PfArgs::ranges(p0, n0, p1, n1)
    }

    fn parts(a: PfArgs) -> [u64; 4] {
        [a.p0, a.n0, a.p1, a.n1]
    }

    #[test]
    fn a_hint_is_cut_to_the_cap_in_whole_pieces() {
        // Within the first range; spilling into the second; both whole.
        assert_eq!(
            parts(args(4096, 1000, 8192, 500).cut(100)),
            [4096, 96, 8192, 0]
        );
        assert_eq!(
            parts(args(4096, 1000, 8192, 500).cut(1300)),
            [4096, 992, 8192, 304]
        );
        assert_eq!(
            parts(args(4096, 1008, 8192, 500).cut(1 << 20)),
            [4096, 1008, 8192, 496]
        );
        // Never past a range's end, though a length is not a multiple of 16.
        let a = args(4096, 1000, 8192, 500).cut(1 << 20);
        assert!(a.n0 <= 1000 && a.n1 <= 500 && a.n0.is_multiple_of(16) && a.n1.is_multiple_of(16));
        // An empty first range (a matrix under 16 bytes) gives its place to the second.
        assert_eq!(
            parts(args(4096, 9, 8192, 500).cut(1 << 20)),
            [8192, 496, 0, 0]
        );
        // Cap 0 (the site is off) and no hint ask for nothing.
        assert_eq!(parts(args(4096, 1000, 8192, 500).cut(0))[1], 0);
        assert_eq!(parts(PfArgs::default().cut(1 << 20)), [0; 4]);
    }
}
