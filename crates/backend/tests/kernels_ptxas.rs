//! Register allocation of the CUDA kernels as ptxas makes it for Hopper (NVRTC alone, no GPU
//! needed; skipped where libnvrtc.so is missing): the streaming GEMV stays within the 128
//! registers that let two of its blocks share an SM (gemv_stream.cu's MVS_MINB: unbounded,
//! ptxas took up to 255 and the 27B decode ran 9% slower), and the shapes the 27B's decode
//! runs (Q1_0's `mvs_8`, TQ2_0's `mvs_4`, the gated delta rule's `delta_rows` and
//! `gated_delta`, attention, the cluster norm, Gemma's `norm_add_norm_q_1`) spill nothing
//! and keep no array in local memory (the old one-token DeltaNet kernel at four state
//! columns a warp and 1024 threads spilled 40 bytes under its 64-register bound;
//! `norm_add_norm_q` with 8 values a thread 32). Every kernel that spills is printed: with NVRTC 13.5, `norm_add_norm*_8` (rows over 1,024 values; 4–32 bytes),
//! Q1_0's float `mv2` (24), TQ2_0's `mvs_8` (40, unused) and Q4_K's `mvqg1x8` (4).
//! PTXAS_ALL=1 prints every kernel's registers (with `--nocapture`).
#![cfg(feature = "cuda")]

use std::io::Write;

use neagari_backend::cuda::{kernel_registers, nvrtc_present};
use neagari_quant::GgmlType;

#[test]
fn kernels_fit_their_registers_on_hopper() {
    if !nvrtc_present() {
        let _ = writeln!(
            std::io::stderr(),
            "note: skipping the register check: libnvrtc.so not found"
        );
        return;
    }
    let (mut stream, mut bad) = (0, Vec::new());
    let hot = [
        ("matmul_F_Q1_0R", "mvs_8"),
        ("matmul_F_TQ2_0R", "mvs_4"),
        ("matmul_F_Q1_0R", "mvrmt_4"),
        ("matmul_F_Q1_0R", "mvrt_2"),
        ("matmul_F_Q1_0R", "mvrt_4w"),
        ("matmul_F_Q1_0R", "mvrtg_4"),
        ("matmul_F_TQ2_0R", "mvrtg_4"),
        ("matmul_F_TQ2_0R", "mvrmt_2"),
        ("matmul_F_TQ2_0R", "mvrt_1"),
        ("matmul_F_Q4_K", "mvrmt_2"),
        ("hybrid", "delta_rows"),
        ("hybrid", "gated_delta"),
        ("ops", "attention"),
        ("ops", "qk_norm_rope"),
        ("ops", "add_rms_norm_cl"),
        ("ops", "norm_add_norm_q_1"),
        ("pair_Q_Q5_0_Q_Q8_0", "mvqp1x2"),
        ("matmul_F_Q6_K", "mvr"),
        ("matmul_F_Q5_K", "mvr"),
        ("matmul_F_Q3_K", "mvr"),
        ("matmul_F_Q2_K", "mvr"),
    ];
    // Q4_K has one layout, so its module comes twice.
    let mut hot_seen = std::collections::HashSet::new();
    for ty in [
        None,
        Some(GgmlType::Q1_0),
        Some(GgmlType::TQ2_0),
        Some(GgmlType::Q4_K),
        Some(GgmlType::Q5_0),
        Some(GgmlType::Q8_0),
        Some(GgmlType::F16),
        Some(GgmlType::Q6_K),
        Some(GgmlType::Q5_K),
        Some(GgmlType::Q3_K),
        Some(GgmlType::Q2_K),
    ] {
        let ks = kernel_registers("sm_90", ty).expect("NVRTC");
        assert!(!ks.is_empty(), "{ty:?}: no kernels in the ptxas log");
        for k in &ks {
            let what = format!(
                "{} {}: {} registers, {} bytes stack",
                k.module, k.kernel, k.registers, k.stack_bytes
            );
            if k.spill_bytes > 0 {
                eprintln!("{what}, spills {} bytes", k.spill_bytes);
            }
            if std::env::var("PTXAS_ALL").is_ok() {
                eprintln!("{what}");
            }
            if hot.contains(&(k.module.as_str(), k.kernel.as_str())) {
                hot_seen.insert((k.module.clone(), k.kernel.clone()));
                if k.spill_bytes > 0 {
                    bad.push(format!("{what}, spills {} bytes", k.spill_bytes));
                }
                // A register array indexed at run time lives in local memory without a
                // spill: session 59's first `delta_chunk` kept 64 floats there.
                // qk_norm_rope's 32 bytes are sinf/cosf's reduction of huge angles.
                let allowed = if k.kernel == "qk_norm_rope" { 32 } else { 0 };
                if k.stack_bytes > allowed {
                    bad.push(format!("{what}: local memory"));
                }
            }
            if k.kernel.starts_with("mvs_") {
                stream += 1;
                if k.registers > 128 {
                    bad.push(format!("{what} (over 128)"));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert_eq!(
        hot_seen.len(),
        hot.len(),
        "the decode shapes' kernels were not seen"
    );
    assert!(
        stream >= 6,
        "the streaming GEMV kernels of Q1_0 and TQ2_0 were not seen"
    );
}
