//! Writes the PTX of the CUDA kernel modules NVRTC makes for an architecture (no GPU
//! needed, only libnvrtc.so), one `<TYPE>-<i>-<arch>.ptx` a module, so their SASS can be
//! read where ptxas and cuobjdump are (the PyPI wheels nvidia-cuda-nvcc and
//! nvidia-cuda-cuobjdump carry them):
//!
//!     cargo run --release -p neagari-backend --example cuda_sass -- DIR [ARCH [TYPE ...]]
//!     ptxas -v -arch=sm_90 DIR/Q1_0-1-sm_90.ptx -o q1.cubin
//!     cuobjdump -sass -fun mvrmt_4 q1.cubin
//!
//! TYPE is a GGUF type name (Q1_0, TQ2_0, Q4_K, …) or `ops` for the float-op and hybrid
//! modules; all of Q1_0, TQ2_0, Q4_K and ops without one. A format's modules are numbered
//! in cuda/mod.rs's order: 0 its ggml layout, 1 the repacked one where it has one.
#![cfg_attr(not(feature = "cuda"), allow(unused))]

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use neagari_quant::GgmlType;

    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(
        args.next()
            .ok_or("usage: cuda_sass DIR [ARCH [TYPE ...]]")?,
    );
    let arch = args.next().unwrap_or_else(|| "sm_90".into());
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        names = ["Q1_0", "TQ2_0", "Q4_K", "ops"].map(String::from).to_vec();
    }
    std::fs::create_dir_all(&dir)?;
    for n in &names {
        let ty = match n.as_str() {
            "ops" => None,
            _ => Some(
                (0..64)
                    .filter_map(GgmlType::from_id)
                    .find(|t| t.name() == n)
                    .ok_or(format!("{n}: not a GGUF type name"))?,
            ),
        };
        for (i, ptx) in neagari_backend::cuda::module_ptx(&arch, ty)?
            .iter()
            .enumerate()
        {
            let path = dir.join(format!("{n}-{i}-{arch}.ptx"));
            std::fs::write(&path, ptx)?;
            println!("{}", path.display());
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("built without the cuda feature");
}
