//! `neagari doctor`: what this machine offers the engine — CPU threads and instruction
//! sets, and the CUDA GPUs (driver, compute capability, memory, NVRTC) or why there are none.

use anyhow::Result;

pub fn run() -> Result<()> {
    let f = neagari_backend::cpu::kernels::CpuFeatures::detect();
    println!(
        "cpu: {} threads; avx2 {}, avx512-vnni {}",
        neagari_backend::cpu::default_threads(),
        yes(f.has_avx2()),
        yes(f.has_avx512vnni())
    );
    cuda();
    Ok(())
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda() {
    println!("cuda: unavailable: this build has no CUDA support (feature `cuda`)");
}

#[cfg(feature = "cuda")]
fn cuda() {
    let p = neagari_backend::cuda::probe();
    let v = |v: Option<(i32, i32)>| v.map_or("not found".to_string(), |(a, b)| format!("{a}.{b}"));
    println!(
        "cuda: driver API {}, NVRTC {}, cuBLAS {}",
        v(p.driver_version),
        v(p.nvrtc_version),
        if p.cublas { "found" } else { "not found" }
    );
    for d in &p.devices {
        println!(
            "  cuda:{}  {}  compute {}.{} (sm_{}{})  {:.1} GiB free of {:.1} GiB",
            d.ordinal,
            d.name,
            d.compute_capability.0,
            d.compute_capability.1,
            d.compute_capability.0,
            d.compute_capability.1,
            d.free_bytes as f64 / (1u64 << 30) as f64,
            d.total_bytes as f64 / (1u64 << 30) as f64
        );
    }
    if let Some(why) = &p.unavailable {
        println!("cuda: unavailable: {why}");
        return;
    }
    println!("cuda: ready (--device cuda or cuda:N)");
    match neagari_backend::cuda::kernel_cache_dir() {
        Some(d) => println!(
            "cuda: compiled kernels kept in {} (NEAGARI_KERNEL_CACHE=off to stop)",
            d.display()
        ),
        None => println!("cuda: compiled kernels are not kept between runs"),
    }
}
