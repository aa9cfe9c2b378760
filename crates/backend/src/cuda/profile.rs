//! Per-kernel GPU time: while on, every launch is bracketed by two CUDA events and
//! [`CudaBackend::profile_end`] sums the elapsed times per (kernel, grid). Graph replay is
//! off meanwhile (a replayed step makes no launches to time), so the step runs its
//! kernels one by one; their times are the kernels' own, the gaps between them are not
//! counted. This is how a step's time is split when no profiler is at hand (the device
//! machine has ncu but not nsys, and ncu replays each kernel under locked clocks).
//!
//! What a kernel costs inside the replayed step (its launch, its wait, what it keeps the
//! next kernel waiting) is what the step loses without it: NEAGARI_CUDA_SKIP=NAME[,NAME…]
//! launches nothing for the kernels of those names (`gemv`: every `mv*` GEMV, `nongemv`:
//! every other kernel). The output is then wrong; it is for timing a step with `bench`.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use cudarc::driver::{sys, CudaEvent, CudaFunction};

use super::{drv, CudaBackend};
use crate::Result;

/// A kernel's time over a profiled span.
#[derive(Clone, Debug)]
pub struct KernelTime {
    /// The kernel's name as compiled (`mvrmt_4`, `rms_norm_q8`, …).
    pub name: String,
    /// Its launch grid: one entry per shape, so the same kernel on two matrices is two.
    pub grid: Grid,
    pub launches: usize,
    /// GPU time between the events around its launches, summed.
    pub seconds: f64,
}

/// A launch grid.
type Grid = (u32, u32, u32);

/// Launches recorded since `profile_begin`, with their events.
#[derive(Default)]
pub(super) struct Profile {
    marks: Vec<(String, Grid, CudaEvent, CudaEvent)>,
    /// Names by function handle (the driver call that gives them is not free).
    names: HashMap<usize, String>,
}

impl CudaBackend {
    /// Starts timing every kernel launch (and stops replaying recorded steps) until
    /// [`Self::profile_end`].
    pub fn profile_begin(&self) -> Result<()> {
        self.synchronize()?;
        let mut p = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        p.get_or_insert_with(Profile::default).marks.clear();
        self.profiling.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Waits for the timed launches and returns their times per (kernel, grid), the
    /// largest first.
    pub fn profile_end(&self) -> Result<Vec<KernelTime>> {
        self.profiling.store(false, Ordering::Relaxed);
        self.synchronize()?;
        let mut guard = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = guard.as_mut() else {
            return Ok(Vec::new());
        };
        let mut sums: HashMap<(String, Grid), (usize, f64)> = HashMap::new();
        for (name, grid, a, b) in p.marks.drain(..) {
            let ms = a.elapsed_ms(&b).map_err(drv)?;
            let e = sums.entry((name, grid)).or_default();
            e.0 += 1;
            e.1 += ms as f64 * 1e-3;
        }
        let mut out: Vec<KernelTime> = sums
            .into_iter()
            .map(|((name, grid), (launches, seconds))| KernelTime {
                name,
                grid,
                launches,
                seconds,
            })
            .collect();
        out.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        Ok(out)
    }

    /// Whether launches are being timed (`launch_raw` brackets them).
    pub(super) fn profiling(&self) -> bool {
        self.profiling.load(Ordering::Relaxed)
    }

    /// The event before a launch, recorded while profiling (`launch_raw`).
    pub(super) fn profile_start(&self) -> Result<Option<CudaEvent>> {
        if !self.profiling() {
            return Ok(None);
        }
        let e = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv)?;
        e.record(&self.stream).map_err(drv)?;
        Ok(Some(e))
    }

    /// The event after a launch of `f` with `grid` that `profile_start` timed (none: not
    /// profiling, nothing to do).
    pub(super) fn profile_mark(
        &self,
        f: &CudaFunction,
        grid: Grid,
        start: Option<CudaEvent>,
    ) -> Result<()> {
        let Some(start) = start else {
            return Ok(());
        };
        let end = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv)?;
        end.record(&self.stream).map_err(drv)?;
        let mut guard = self.profile.lock().unwrap_or_else(|e| e.into_inner());
        let p = guard.get_or_insert_with(Profile::default);
        let key = f.cu_function() as usize;
        let name = match p.names.get(&key) {
            Some(n) => n.clone(),
            None => {
                let n = function_name(f);
                p.names.insert(key, n.clone());
                n
            }
        };
        p.marks.push((name, grid, start, end));
        Ok(())
    }

    /// Whether NEAGARI_CUDA_SKIP names `f` (read once; see the module docs).
    pub(super) fn skipped(&self, f: &CudaFunction) -> bool {
        static SKIP: OnceLock<Vec<String>> = OnceLock::new();
        let skip = SKIP.get_or_init(|| {
            super::knob::<String>("NEAGARI_CUDA_SKIP")
                .map(|v| v.split(',').map(str::to_string).collect())
                .unwrap_or_default()
        });
        if skip.is_empty() {
            return false;
        }
        let name = function_name(f);
        let gemv = name.starts_with("mv");
        skip.iter()
            .any(|s| *s == name || (s == "gemv" && gemv) || (s == "nongemv" && !gemv))
    }
}

/// The kernel's name as compiled, `?` where the driver gives none.
fn function_name(f: &CudaFunction) -> String {
    let mut ptr = std::ptr::null();
    // SAFETY: `f` is a live function of this backend's context; the driver returns a
    // NUL-terminated name it owns for the function's lifetime, copied out at once.
    unsafe {
        sys::cuFuncGetName(&mut ptr, f.cu_function())
            .result()
            .ok()
            .filter(|_| !ptr.is_null())
            .map(|_| CStr::from_ptr(ptr).to_string_lossy().into_owned())
    }
    .unwrap_or_else(|| "?".to_string())
}
