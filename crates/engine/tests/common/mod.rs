//! Helpers the engine's reference tests share: fixture paths and reading (JSON, token ids,
//! raw f32 logits), greedy continuations, logit distances and argmax checks, in-memory
//! quantization, and the tiny hybrid-model cases that hybrid_transformers.rs (GGUF) and
//! hybrid_hf.rs (HF checkpoints) run against the same transformers logits. Each test file
//! uses only part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{Backend, KvType};
use neagari_engine::quantize::{self, FileType, QuantizeInput, QuantizeParams, TypeParams};
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::CausalLm;
use serde_json::Value;

/// `tests/fixtures/{sub}` at the repository root.
pub fn repo_fixtures(sub: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(sub)
}

pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The entry named `name` of a reference file's `models` array.
pub fn model_ref(refs: &Value, name: &str) -> Value {
    refs["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} missing from reference.json"))
        .clone()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// Index of the largest logit (the first of equals).
pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// A little-endian f32 file (logits fixtures).
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{path:?}: {e}"))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A model loaded on the CPU backend.
pub type CpuModel = Box<dyn CausalLm<CpuBackend>>;

/// The model of the GGUF file at `path`, loaded on `be`.
pub fn load_gguf(be: &CpuBackend, path: &Path) -> CpuModel {
    let file = Arc::new(Gguf::open(path).expect("open"));
    neagari_model::load(be, &GgufSource::new(file)).expect("load")
}

pub fn cpu(threads: usize, scalar_only: bool) -> CpuBackend {
    CpuBackend::new(&CpuOptions {
        threads,
        scalar_only,
    })
}

/// Largest |v|.
pub fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// Largest |a − b|.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Root mean square of a − b, summed in f64.
pub fn rms_diff(a: &[f32], b: &[f32]) -> f64 {
    (a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) * (x - y)) as f64)
        .sum::<f64>()
        / b.len() as f64)
        .sqrt()
}

/// Positions (rows of `n_vocab` logits) where both sides have the same argmax.
pub fn argmax_agreement(got: &[f32], want: &[f32], n_vocab: usize) -> usize {
    got.chunks_exact(n_vocab)
        .zip(want.chunks_exact(n_vocab))
        .filter(|(a, b)| argmax(a) == argmax(b))
        .count()
}

/// `n` greedy tokens from `logits` (the last position's) on, each decoded in turn.
pub fn greedy<B: Backend>(
    sess: &mut Session<B>,
    model: &dyn CausalLm<B>,
    be: &B,
    mut logits: Vec<f32>,
    n: usize,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = argmax(&logits);
        out.push(t);
        logits = sess.decode(model, be, t).expect("decode");
    }
    out
}

/// As [`greedy`], through the model's own KV cache; every step's logits must be `n_vocab`
/// long.
pub fn greedy_kv<B: Backend>(
    model: &dyn CausalLm<B>,
    be: &B,
    kv: &mut B::Kv,
    mut logits: Vec<f32>,
    n: usize,
    n_vocab: usize,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        assert_eq!(logits.len(), n_vocab);
        let t = argmax(&logits);
        out.push(t);
        logits = model.forward(be, kv, &[t], false).expect("forward");
    }
    out
}

/// Bar of the hybrid tests: the largest |Δlogit| over every position stays under this
/// share of the largest |logit|.
pub const HYBRID_REL_TOL: f32 = 1e-3;

/// crates/model/tests/fixtures/hybrid (scripts/make_hybrid_fixtures.py).
pub fn hybrid_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hybrid")
}

/// A hybrid model and the transformers logits of its reference ids.
pub struct HybridCase {
    pub be: CpuBackend,
    pub model: CpuModel,
    pub ids: Vec<u32>,
    /// `[ids.len(), n_vocab]`.
    pub want: Vec<f32>,
    pub n_vocab: usize,
}

/// The model `load` gives against the transformers logits stored for `name`.
pub fn hybrid_case(name: &str, load: impl FnOnce(&CpuBackend) -> CpuModel) -> HybridCase {
    let refs = read_json(&hybrid_dir().join("reference.json"));
    let m = &refs["models"][name];
    let ids = ids(&m["ids"]);
    let n_vocab = m["logits_shape"][1].as_u64().unwrap() as usize;
    let want = read_f32(&hybrid_dir().join(format!("{name}.logits.bin")));
    assert_eq!(want.len(), ids.len() * n_vocab);
    let be = cpu(2, false);
    let model = load(&be);
    assert_eq!(model.info().n_vocab, n_vocab);
    HybridCase {
        be,
        model,
        ids,
        want,
        n_vocab,
    }
}

/// Largest |a − b| over the largest |b|.
pub fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    max_abs_diff(got, want) / max_abs(want)
}

/// A 256-token session with an f32 KV cache (no f16 rounding in attention).
pub fn session(c: &HybridCase) -> Session<CpuBackend> {
    Session::new(c.model.as_ref(), &c.be, 256, KvType::F32).expect("session")
}

/// Every position's logits, prefilled `n_batch` tokens at a time.
pub fn prefill_all(c: &HybridCase, n_batch: usize) -> Vec<f32> {
    let mut s = session(c);
    let mut out = Vec::new();
    for chunk in c.ids.chunks(n_batch) {
        out.extend(s.forward_all(c.model.as_ref(), &c.be, chunk).unwrap());
    }
    out
}

/// Every position's logits, one token at a time.
pub fn decode_all(c: &HybridCase) -> Vec<f32> {
    let mut s = session(c);
    let mut out = Vec::new();
    for &t in &c.ids {
        out.extend(s.decode(c.model.as_ref(), &c.be, t).unwrap());
    }
    out
}

/// Prefilled in batches of 32 and of all 150 ids, the logits meet the hybrid bar.
pub fn check_prefill(c: &HybridCase, what: &str) {
    for n_batch in [32, 150] {
        let e = rel_err(&prefill_all(c, n_batch), &c.want);
        println!("{what}: prefill n_batch {n_batch}: rel err {e:.2e}");
        assert!(e < HYBRID_REL_TOL, "{what} prefill n_batch {n_batch}: {e}");
    }
}

/// Decoded token by token, the logits meet the hybrid bar.
pub fn check_decode(c: &HybridCase, what: &str) {
    let e = rel_err(&decode_all(c), &c.want);
    println!("{what}: token-by-token decode: rel err {e:.2e}");
    assert!(e < HYBRID_REL_TOL, "{what} decode: {e}");
}

/// Asserts the argmax of every position (rows of `n_vocab` logits) equals `want`'s wherever
/// `want`'s top two logits are more than `gap` apart.
pub fn assert_clear_argmaxes(got: &[f32], want: &[f32], n_vocab: usize, gap: f32, what: &str) {
    for (p, (g, w)) in got
        .chunks_exact(n_vocab)
        .zip(want.chunks_exact(n_vocab))
        .enumerate()
    {
        let mut s = w.to_vec();
        s.sort_by(|a, b| b.total_cmp(a));
        if s[0] - s[1] > gap {
            assert_eq!(argmax(g), argmax(w), "{what}argmax at position {p}");
        }
    }
}

/// `src` quantized in memory to `ftype` with llama.cpp's default options.
pub fn quantize_default(src: &Gguf, ftype: FileType) -> Gguf {
    let input = QuantizeInput::from_gguf(src);
    let p = QuantizeParams {
        types: TypeParams {
            ftype,
            output_type: None,
            embd_type: None,
            pure: false,
        },
        allow_requantize: false,
    };
    let plan = quantize::plan(&input, &p).expect("plan");
    let mut out = Vec::new();
    quantize::write(&input, plan, &mut out, 2, |_| {}).expect("write");
    Gguf::from_bytes(out).expect("our output parses")
}
