//! Qwen3.5 dense and Qwen3.5-MoE hybrids read from their HF safetensors checkpoints
//! (`HfSource`) against transformers' logits. The checkpoints are the ones transformers ran
//! (scripts/make_hybrid_fixtures.py saves them under
//! crates/model/tests/fixtures/hybrid/hf/): `qwen35_moe` with experts one by one, as
//! transformers saves them, `qwen35_moe_fused` with `experts.gate_up_proj [E, 2F, H]`;
//! `qwen3next_moe` with its fused `in_proj_qkvz` / `in_proj_ba`.
//!
//! Bar as in hybrid_transformers.rs: the largest |Δlogit| over every position stays under
//! 1e-3 of the largest |logit| (f32 KV cache; weights f16 on both sides).

use std::path::PathBuf;
use std::sync::Arc;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::KvType;
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::hf::HfSource;
use neagari_model::{CausalLm, ModelSource};
use serde_json::Value;

const REL_TOL: f32 = 1e-3;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hybrid")
}

struct Case {
    be: CpuBackend,
    model: Box<dyn CausalLm<CpuBackend>>,
    ids: Vec<u32>,
    /// `[ids.len(), n_vocab]`.
    want: Vec<f32>,
}

/// The HF checkpoint `hf/{ckpt}` against the transformers logits stored for `name`.
fn case(name: &str, ckpt: &str) -> Case {
    let refs: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("reference.json")).unwrap())
            .unwrap();
    let m = &refs["models"][name];
    let ids: Vec<u32> = m["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let n_vocab = m["logits_shape"][1].as_u64().unwrap() as usize;
    let want: Vec<f32> = std::fs::read(dir().join(format!("{name}.logits.bin")))
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), ids.len() * n_vocab);
    let be = CpuBackend::new(&CpuOptions {
        threads: 2,
        scalar_only: false,
    });
    let src = HfSource::open(&dir().join("hf").join(ckpt)).expect("open");
    let model = neagari_model::load(&be, &src).expect("load");
    assert_eq!(model.info().n_vocab, n_vocab);
    Case {
        be,
        model,
        ids,
        want,
    }
}

/// Largest |a − b| over the largest |b|.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    d / scale
}

fn session(c: &Case) -> Session<CpuBackend> {
    Session::new(c.model.as_ref(), &c.be, 256, KvType::F32).expect("session")
}

fn check(name: &str, ckpt: &str) {
    let c = case(name, ckpt);
    for n_batch in [32, 150] {
        let mut s = session(&c);
        let mut got = Vec::new();
        for chunk in c.ids.chunks(n_batch) {
            got.extend(s.forward_all(c.model.as_ref(), &c.be, chunk).unwrap());
        }
        let e = rel_err(&got, &c.want);
        println!("{ckpt}: prefill n_batch {n_batch}: rel err {e:.2e}");
        assert!(e < REL_TOL, "{ckpt} prefill n_batch {n_batch}: {e}");
    }
    let mut s = session(&c);
    let mut got = Vec::new();
    for &t in &c.ids {
        got.extend(s.decode(c.model.as_ref(), &c.be, t).unwrap());
    }
    let e = rel_err(&got, &c.want);
    println!("{ckpt}: token-by-token decode: rel err {e:.2e}");
    assert!(e < REL_TOL, "{ckpt} decode: {e}");
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
    let gguf = GgufSource::new(Arc::new(
        Gguf::open(dir().join("qwen3next_moe.gguf")).unwrap(),
    ));
    let hf = HfSource::open(&dir().join("hf/qwen3next_moe")).unwrap();
    let file = Gguf::open(dir().join("qwen3next_moe.gguf")).unwrap();
    for t in file.tensors() {
        let g = gguf.tensor(&t.name).unwrap();
        let h = hf
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from the HF source", t.name));
        assert_eq!(h.shape, g.shape, "{}", t.name);
        let vals = |x: &neagari_backend::HostTensor| {
            let mut v = vec![0f32; x.n_elements()];
            neagari_quant::dequantize_row(x.ty, x.bytes.as_slice(), &mut v).unwrap();
            v
        };
        let (a, b) = (vals(&h), vals(&g));
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
    let gguf = GgufSource::new(Arc::new(
        Gguf::open(dir().join("qwen35_dense.gguf")).unwrap(),
    ));
    let hf = HfSource::open(&dir().join("hf/qwen35_dense")).unwrap();
    let file = Gguf::open(dir().join("qwen35_dense.gguf")).unwrap();
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
        let g = gguf.tensor(&t.name).unwrap();
        let h = hf
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing from the HF source", t.name));
        assert_eq!(h.shape, g.shape, "{}", t.name);
        if v_reordered.iter().any(|s| t.name.contains(s)) {
            continue;
        }
        let vals = |x: &neagari_backend::HostTensor| {
            let mut v = vec![0f32; x.n_elements()];
            neagari_quant::dequantize_row(x.ty, x.bytes.as_slice(), &mut v).unwrap();
            v
        };
        assert_eq!(vals(&h), vals(&g), "{}", t.name);
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
    let be = CpuBackend::new(&CpuOptions {
        threads: 1,
        scalar_only: false,
    });
    let m = neagari_model::qwen35::Qwen35::load(&be, &hf).unwrap();
    assert_eq!(m.mtp().len(), 1);
    assert_eq!(
        hf.u64_array_opt("qwen35.attention.recurrent_layers")
            .unwrap(),
        Some(vec![1, 1, 0, 1, 1, 0])
    );
}
