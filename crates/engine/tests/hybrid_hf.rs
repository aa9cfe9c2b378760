//! Qwen3.5 dense and Qwen3.5-MoE hybrids read from their HF safetensors checkpoints
//! (`HfSource`) against transformers' logits. The checkpoints are the ones transformers ran
//! (scripts/make_hybrid_fixtures.py saves them under
//! crates/model/tests/fixtures/hybrid/hf/): `qwen35_moe` with experts one by one, as
//! transformers saves them, `qwen35_moe_fused` with `experts.gate_up_proj [E, 2F, H]`;
//! `qwen3next_moe` with its fused `in_proj_qkvz` / `in_proj_ba`.
//!
//! Bar as in hybrid_transformers.rs: the largest |Δlogit| over every position stays under
//! 1e-3 of the largest |logit| (f32 KV cache; weights f16 on both sides).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{check_decode, check_prefill, cpu, hybrid_case};
use neagari_backend::HostTensor;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::hf::HfSource;
use neagari_model::ModelSource;

fn dir() -> PathBuf {
    common::hybrid_dir()
}

/// The HF checkpoint `hf/{ckpt}` against the transformers logits stored for `name`:
/// prefilled in batches, then decoded token by token.
fn check(name: &str, ckpt: &str) {
    let c = hybrid_case(name, |be| {
        let src = HfSource::open(&dir().join("hf").join(ckpt)).expect("open");
        neagari_model::load(be, &src).expect("load")
    });
    check_prefill(&c, ckpt);
    check_decode(&c, ckpt);
}

/// `{name}.gguf` (as a file and as a source) and the HF checkpoint `hf/{name}`.
fn sources(name: &str) -> (Gguf, GgufSource, HfSource) {
    let path = dir().join(format!("{name}.gguf"));
    let gguf = GgufSource::new(Arc::new(Gguf::open(&path).unwrap()));
    let hf = HfSource::open(&dir().join("hf").join(name)).unwrap();
    (Gguf::open(&path).unwrap(), gguf, hf)
}

/// Tensor `name` from the HF source, which must have it in the GGUF's shape, and from the
/// GGUF.
fn paired(hf: &HfSource, gguf: &GgufSource, name: &str) -> (HostTensor, HostTensor) {
    let g = gguf.tensor(name).unwrap();
    let h = hf
        .tensor(name)
        .unwrap_or_else(|| panic!("{name} missing from the HF source"));
    assert_eq!(h.shape, g.shape, "{name}");
    (h, g)
}

/// A tensor's values, dequantized to f32.
fn values(x: &HostTensor) -> Vec<f32> {
    let mut v = vec![0f32; x.n_elements()];
    neagari_quant::dequantize_row(x.ty, x.bytes.as_slice(), &mut v).unwrap();
    v
}

#[test]
fn qwen35_dense_hf_matches_transformers() {
    check("qwen35_dense", "qwen35_dense");
}

#[test]
fn qwen35_moe_hf_per_expert_matches_transformers() {
    check("qwen35_moe", "qwen35_moe");
}

#[test]
fn qwen35_moe_hf_fused_experts_match_transformers() {
    check("qwen35_moe", "qwen35_moe_fused");
}

#[test]
fn qwen3next_moe_hf_matches_transformers() {
    check("qwen3next_moe", "qwen3next_moe");
}

/// Qwen3-Next: the split of `in_proj_qkvz` into `attn_qkv` / `attn_gate` equals the
/// converter's (whose V heads stay grouped, so every tensor is comparable).
#[test]
fn qwen3next_hf_tensors_equal_the_converters() {
    let (file, gguf, hf) = sources("qwen3next_moe");
    for t in file.tensors() {
        let (h, g) = paired(&hf, &gguf, &t.name);
        let (a, b) = (values(&h), values(&g));
        if t.name.ends_with("ssm_a") {
            // −exp computed by two libraries: equal to f32 rounding.
            assert!(a
                .iter()
                .zip(&b)
                .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs()));
        } else {
            assert_eq!(a, b, "{}", t.name);
        }
    }
}

/// Tensors the converter writes without reordering value heads: the HF source serves the
/// same values under the same names (norm +1 folds, −exp(A_log), conv squeeze, the MTP
/// block), and every GGUF tensor has an HF counterpart of the same shape.
#[test]
fn qwen35_dense_hf_tensors_equal_the_converters() {
    let (file, gguf, hf) = sources("qwen35_dense");
    let v_reordered = [
        "attn_qkv",
        "attn_gate",
        "ssm_beta",
        "ssm_alpha",
        "ssm_conv1d",
        "ssm_a",
        "ssm_dt",
        "ssm_out",
    ];
    let mut compared = 0;
    for t in file.tensors() {
        let (h, g) = paired(&hf, &gguf, &t.name);
        if v_reordered.iter().any(|s| t.name.contains(s)) {
            continue;
        }
        assert_eq!(values(&h), values(&g), "{}", t.name);
        compared += 1;
    }
    assert!(compared > 40, "{compared}");
    for k in [
        "block_count",
        "nextn_predict_layers",
        "rope.dimension_count",
    ] {
        let k = format!("qwen35.{k}");
        assert_eq!(hf.u64_opt(&k).unwrap(), gguf.u64_opt(&k).unwrap(), "{k}");
    }
    let be = cpu(1, false);
    let m = neagari_model::qwen35::Qwen35::load(&be, &hf).unwrap();
    assert_eq!(m.mtp().len(), 1);
    assert_eq!(
        hf.u64_array_opt("qwen35.attention.recurrent_layers")
            .unwrap(),
        Some(vec![1, 1, 0, 1, 1, 0])
    );
}
