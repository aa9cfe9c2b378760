//! What `neagari doctor` reports about CUDA: whether the driver and NVRTC libraries load,
//! the devices with their compute capability and memory, or why CUDA is unavailable.
//! Nothing here panics when a library is missing (cudarc would, on first use).

use cudarc::driver::CudaContext;

/// One visible GPU.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub total_bytes: usize,
    pub free_bytes: usize,
}

/// The CUDA environment of this machine.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    /// `Some(reason)` when the CUDA backend cannot run here.
    pub unavailable: Option<String>,
    /// Driver API version as `major.minor`.
    pub driver_version: Option<(i32, i32)>,
    pub nvrtc_version: Option<(i32, i32)>,
    pub cublas: bool,
    pub devices: Vec<DeviceInfo>,
}

/// NVRTC's version, if the library loads.
pub(super) fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: only tries to open the shared library.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return None;
    }
    let (mut maj, mut min) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints; the library is present.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut maj, &mut min) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((maj, min))
}

/// Looks for the driver, NVRTC, cuBLAS and the devices.
pub fn probe() -> Probe {
    let mut p = Probe::default();
    // SAFETY: these only try to open the shared libraries.
    let (has_drv, has_rtc, has_blas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    p.cublas = has_blas;
    if !has_drv {
        p.unavailable = Some("the NVIDIA driver library (libcuda.so) was not found".into());
        return p;
    }
    if has_rtc {
        p.nvrtc_version = nvrtc_version();
    }
    // The driver library is present; cuInit is idempotent.
    if let Err(e) = cudarc::driver::result::init() {
        p.unavailable = Some(format!("the CUDA driver failed to initialise: {e:?}"));
        return p;
    }
    let mut v = 0;
    // SAFETY: writes one int.
    if unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) }
        == cudarc::driver::sys::CUresult::CUDA_SUCCESS
    {
        p.driver_version = Some((v / 1000, (v % 1000) / 10));
    }
    let n = match CudaContext::device_count() {
        Ok(n) => n.max(0) as usize,
        Err(e) => {
            p.unavailable = Some(format!("cannot count CUDA devices: {e:?}"));
            return p;
        }
    };
    for i in 0..n {
        let Ok(ctx) = CudaContext::new(i) else {
            continue;
        };
        let (free, total) = ctx.mem_get_info().unwrap_or((0, 0));
        p.devices.push(DeviceInfo {
            ordinal: i,
            name: ctx.name().unwrap_or_default(),
            compute_capability: ctx.compute_capability().unwrap_or((0, 0)),
            total_bytes: total,
            free_bytes: free,
        });
    }
    if p.devices.is_empty() {
        p.unavailable = Some("the driver loads but reports no usable CUDA device".into());
    } else if !has_rtc {
        p.unavailable =
            Some("NVRTC (libnvrtc.so) was not found; it compiles the kernels at start".into());
    }
    p
}
