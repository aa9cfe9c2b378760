//! PrismML Hadamard rotation read from GGUF `prism.hadamard.*` keys, applied inside the
//! matmul path (activations rotated by the FWHT; the embedding un-rotated after lookup).
//!
//! tests/fixtures/tiny/qwen3_hadamard.gguf is the tiny qwen3 (scripts/make_tiny_llama_family.py)
//! with every attention/FFN matrix, the output head and the embedding stored as
//! `r' = H(s ⊙ r)` — H built densely with NumPy by scripts/make_hadamard_gguf.py. The
//! rotation is exact, so neagari on the rotated file must compute the unrotated model:
//! - logits equal neagari's on the unrotated file within 1e-3 of the logit scale: both are
//!   f32, but values that differ in their last f32 bits round to different f16 q/K/V
//!   entries now and then (one f16 ulp is 4.9e-4 relative), which shows as ~1.3e-4 of the
//!   scale (2e-3 on logits up to 15.5), while skipping the rotation of any one matrix moves
//!   logits by O(1);
//! - greedy tokens equal llama.cpp's on the unrotated file (tests/fixtures/tiny/reference.json).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{cpu, greedy_kv, ids, load_gguf, max_abs, max_abs_diff, model_ref, read_json};
use neagari_backend::KvType;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;

fn tiny() -> PathBuf {
    common::repo_fixtures("tiny")
}

#[test]
fn rotated_gguf_computes_the_unrotated_model() {
    let m = model_ref(&read_json(&tiny().join("reference.json")), "qwen3");
    let greedy = ids(&m["greedy"]);
    let ids = ids(&m["ids"]);
    for scalar_only in [false, true] {
        let be = cpu(2, scalar_only);
        let plain = load_gguf(&be, &tiny().join("qwen3.gguf"));
        let rot = load_gguf(&be, &tiny().join("qwen3_hadamard.gguf"));
        let mut kv_a = plain.new_kv(&be, 128, KvType::F16).unwrap();
        let mut kv_b = rot.new_kv(&be, 128, KvType::F16).unwrap();
        let a = plain.forward(&be, &mut kv_a, &ids, true).unwrap();
        let b = rot.forward(&be, &mut kv_b, &ids, true).unwrap();
        let max = max_abs_diff(&a, &b);
        let scale = max_abs(&a);
        eprintln!(
            "rotated vs plain (scalar_only={scalar_only}): max |Δlogit| {max:.2e}, scale {scale:.2}"
        );
        assert!(max <= 1e-3 * scale, "rotated model differs by {max}");

        let mut kv = rot.new_kv(&be, 128, KvType::F16).unwrap();
        let last = rot.forward(&be, &mut kv, &ids, false).unwrap();
        let n_vocab = rot.info().n_vocab;
        let ours = greedy_kv(rot.as_ref(), &be, &mut kv, last, greedy.len(), n_vocab);
        assert_eq!(ours, greedy, "greedy tokens differ from llama.cpp's");
    }
}

/// A GGUF whose declared rotation we cannot apply is refused, naming the transform.
#[test]
fn refuses_unknown_transform_in_gguf() {
    let bytes = std::fs::read(tiny().join("qwen3_hadamard.gguf")).unwrap();
    let from = b"normalized-sylvester-walsh-hadamard";
    let to = b"normalized-sylvester-walsh-hadamarX";
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("transform string in the file");
    let mut edited = bytes.clone();
    edited[at..at + to.len()].copy_from_slice(to);
    let g = Arc::new(Gguf::from_bytes(edited).expect("parse"));
    let be = cpu(1, false);
    let err = neagari_model::load(&be, &GgufSource::new(g))
        .err()
        .expect("must refuse")
        .to_string();
    assert!(err.contains("hadamarX"), "{err}");
}
