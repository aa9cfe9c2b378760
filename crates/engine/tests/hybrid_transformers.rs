//! Qwen3.5 hybrid (Gated DeltaNet + gated attention), Qwen3.5-MoE, Qwen3-Next and Qwen3-MoE against
//! transformers on tiny random-weight models committed under
//! crates/model/tests/fixtures/hybrid (scripts/make_hybrid_fixtures.py: transformers runs
//! the model in f32, llama.cpp's convert_hf_to_gguf.py writes the GGUF from the same
//! weights). 150 ids: several prefill batches of 32, and more than one 64-token DeltaNet
//! chunk per batch of 100.
//!
//! Bar: the largest |Δlogit| over every position stays under 1e-3 of the largest |logit|
//! (f32 KV cache, so attention does no f16 rounding; the weights are f16 in the file and
//! were rounded identically before transformers ran).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{
    cpu, hybrid_case, load_gguf, prefill_all, rel_err, session, HybridCase,
    HYBRID_REL_TOL as REL_TOL,
};
use neagari_backend::KvType;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::ModelSource;

fn dir() -> PathBuf {
    common::hybrid_dir()
}

/// `{name}.gguf` against the transformers logits stored for `name`.
fn case(name: &str) -> HybridCase {
    hybrid_case(name, |be| {
        load_gguf(be, &dir().join(format!("{name}.gguf")))
    })
}

fn check_prefill(name: &str) {
    common::check_prefill(&case(name), name);
}

fn check_decode(name: &str) {
    common::check_decode(&case(name), name);
}

/// Prefill 100 ids (batches of 32), then decode the rest one at a time: the logits equal
/// one whole-sequence prefill's (same engine, so the bound is f32 noise: 1e-4 relative).
fn check_decode_after_prefill(name: &str) {
    let c = case(name);
    let whole = prefill_all(&c, c.ids.len());
    let mut s = session(&c);
    let last = s
        .prefill(c.model.as_ref(), &c.be, &c.ids[..100], 32, |_, _| true)
        .unwrap()
        .unwrap();
    let v = c.n_vocab;
    let mut worst = rel_err(&last, &whole[99 * v..100 * v]);
    for (i, &t) in c.ids.iter().enumerate().skip(100) {
        let l = s.decode(c.model.as_ref(), &c.be, t).unwrap();
        let e = rel_err(&l, &whole[i * v..(i + 1) * v]);
        worst = worst.max(e);
    }
    println!("{name}: decode after prefill vs whole prefill: rel err {worst:.2e}");
    // Same engine, different f32 summation orders (chunked form vs single steps).
    assert!(worst < 1e-4, "{name}: {worst}");
}

#[test]
fn qwen35_dense_prefill_matches_transformers() {
    check_prefill("qwen35_dense");
}

#[test]
fn qwen35_dense_decode_matches_transformers() {
    check_decode("qwen35_dense");
}

#[test]
fn qwen35_dense_decode_after_prefill_equals_prefill() {
    check_decode_after_prefill("qwen35_dense");
}

#[test]
fn qwen35_moe_prefill_matches_transformers() {
    check_prefill("qwen35_moe");
}

#[test]
fn qwen35_moe_decode_matches_transformers() {
    check_decode("qwen35_moe");
}

#[test]
fn qwen35_moe_decode_after_prefill_equals_prefill() {
    check_decode_after_prefill("qwen35_moe");
}

#[test]
fn qwen3next_moe_prefill_matches_transformers() {
    check_prefill("qwen3next_moe");
}

#[test]
fn qwen3next_moe_decode_matches_transformers() {
    check_decode("qwen3next_moe");
}

#[test]
fn qwen3next_moe_decode_after_prefill_equals_prefill() {
    check_decode_after_prefill("qwen3next_moe");
}

#[test]
fn qwen3_moe_prefill_matches_transformers() {
    check_prefill("qwen3_moe");
}

#[test]
fn qwen3_moe_decode_matches_transformers() {
    check_decode("qwen3_moe");
}

/// The recurrent state follows the session: a checkpoint restores it exactly, and a prompt
/// that diverges inside the cache re-prefills from the start instead of reusing a state
/// that already saw the old tokens.
#[test]
fn qwen35_state_follows_checkpoint_and_prefix_reuse() {
    let c = case("qwen35_dense");
    let m = c.model.as_ref();
    let v = c.n_vocab;
    let mut s = session(&c);
    s.prefill(m, &c.be, &c.ids[..60], 32, |_, _| true).unwrap();
    let cp = s.checkpoint(&c.be).unwrap();
    let first: Vec<Vec<f32>> = c.ids[60..70]
        .iter()
        .map(|&t| s.decode(m, &c.be, t).unwrap())
        .collect();
    // A different continuation, then back to the checkpoint.
    for &t in c.ids[100..105].iter() {
        s.decode(m, &c.be, t).unwrap();
    }
    s.restore(&c.be, &cp).unwrap();
    assert_eq!(s.tokens().len(), 60);
    for (k, &t) in c.ids[60..70].iter().enumerate() {
        assert_eq!(s.decode(m, &c.be, t).unwrap(), first[k]);
    }
    // Truncating a hybrid cache backwards is refused; prefix reuse falls back to zero.
    assert!(s.truncate(&c.be, 30).is_err());
    let mut prompt = c.ids[..50].to_vec();
    prompt.push((c.ids[50] + 1) % v as u32);
    let keep = s.reuse_prefix(&c.be, &prompt).unwrap();
    assert_eq!(keep, 0);
    let got = s
        .prefill(m, &c.be, &prompt[keep..], 32, |_, _| true)
        .unwrap()
        .unwrap();
    let mut fresh = session(&c);
    let want = fresh
        .prefill(m, &c.be, &prompt, 32, |_, _| true)
        .unwrap()
        .unwrap();
    // The refused rewind makes later prefills stop before their last token (to leave a
    // checkpoint), so the batches differ from the fresh run's: equal up to f32 noise.
    assert!(rel_err(&got, &want) < 1e-4);
    // A prompt that extends the cache keeps all of it.
    let mut longer = prompt.clone();
    longer.extend_from_slice(&c.ids[..5]);
    assert_eq!(s.reuse_prefix(&c.be, &longer).unwrap(), prompt.len());
}

/// MTP blocks are loaded when the file has them (the dense fixture carries one).
#[test]
fn qwen35_mtp_block_is_loaded() {
    let be = cpu(1, false);
    let file = Arc::new(Gguf::open(dir().join("qwen35_dense.gguf")).unwrap());
    let m = neagari_model::qwen35::Qwen35::load(&be, &GgufSource::new(file)).unwrap();
    assert_eq!(m.config().n_layers, 6);
    assert_eq!(m.config().n_mtp, 1);
    assert_eq!(m.mtp().len(), 1);
    assert_eq!(
        m.config().recurrent,
        vec![true, true, false, true, true, false]
    );
}

/// The GGUF source `inner` with a test edit: `extra_key` serves one more string key (what
/// a safetensors source would set); `fuse_experts` serves llama.cpp's fused
/// `ffn_gate_up_exps` (per expert: F gate rows, then F up rows) built from the file's
/// separate gate and up expert tensors, and hides those.
struct Edited<'a> {
    inner: &'a GgufSource,
    extra_key: Option<(&'a str, &'a str)>,
    fuse_experts: bool,
}

impl ModelSource for Edited<'_> {
    fn architecture(&self) -> neagari_model::Result<String> {
        self.inner.architecture()
    }
    fn u64_opt(&self, key: &str) -> neagari_model::Result<Option<u64>> {
        self.inner.u64_opt(key)
    }
    fn f32_opt(&self, key: &str) -> neagari_model::Result<Option<f32>> {
        self.inner.f32_opt(key)
    }
    fn str_opt(&self, key: &str) -> neagari_model::Result<Option<String>> {
        match self.extra_key {
            Some((k, v)) if k == key => Ok(Some(v.to_string())),
            _ => self.inner.str_opt(key),
        }
    }
    fn bool_opt(&self, key: &str) -> neagari_model::Result<Option<bool>> {
        self.inner.bool_opt(key)
    }
    fn u64_array_opt(&self, key: &str) -> neagari_model::Result<Option<Vec<u64>>> {
        self.inner.u64_array_opt(key)
    }
    fn tensor(&self, name: &str) -> Option<neagari_backend::HostTensor> {
        if !self.fuse_experts {
            return self.inner.tensor(name);
        }
        if name.ends_with("ffn_gate_exps.weight") || name.ends_with("ffn_up_exps.weight") {
            return None;
        }
        let Some(base) = name.strip_suffix("ffn_gate_up_exps.weight") else {
            return self.inner.tensor(name);
        };
        let g = self.inner.tensor(&format!("{base}ffn_gate_exps.weight"))?;
        let u = self.inner.tensor(&format!("{base}ffn_up_exps.weight"))?;
        let (e, f, h) = (g.shape[0], g.shape[1], g.shape[2]);
        let per = g.bytes.len() / e;
        let mut bytes = Vec::with_capacity(2 * g.bytes.len());
        for x in 0..e {
            bytes.extend_from_slice(&g.bytes.as_slice()[x * per..(x + 1) * per]);
            bytes.extend_from_slice(&u.bytes.as_slice()[x * per..(x + 1) * per]);
        }
        Some(neagari_backend::HostTensor {
            name: name.to_string(),
            ty: g.ty,
            shape: vec![e, 2 * f, h],
            bytes: neagari_backend::SharedBytes::from_vec(bytes),
        })
    }
}

/// The value-head order matters: reading the tiled qwen35moe file (3 value heads per key
/// head) as grouped moves the logits far off transformers'.
#[test]
fn qwen35_moe_wrong_head_order_is_detected() {
    let c = case("qwen35_moe");
    let file = Arc::new(Gguf::open(dir().join("qwen35_moe.gguf")).unwrap());
    let src = GgufSource::new(file);
    let wrong = Edited {
        inner: &src,
        extra_key: Some(("qwen35moe.ssm.v_head_order", "grouped")),
        fuse_experts: false,
    };
    let model = neagari_model::load(&c.be, &wrong).unwrap();
    let mut kv = model.new_kv(&c.be, 256, KvType::F32).unwrap();
    let got = model.forward(&c.be, &mut kv, &c.ids[..40], true).unwrap();
    let e = rel_err(&got, &c.want[..40 * c.n_vocab]);
    println!("qwen35_moe read as grouped: rel err {e:.2e}");
    assert!(e > 1e-2, "{e}");
}

/// Fused gate+up expert tensors give the same logits as separate ones (both against
/// transformers).
#[test]
fn qwen35_moe_fused_gate_up_experts_match_transformers() {
    let c = case("qwen35_moe");
    let file = Arc::new(Gguf::open(dir().join("qwen35_moe.gguf")).unwrap());
    let src = GgufSource::new(file);
    let fused = Edited {
        inner: &src,
        extra_key: None,
        fuse_experts: true,
    };
    let model = neagari_model::load(&c.be, &fused).unwrap();
    let mut kv = model.new_kv(&c.be, 256, KvType::F32).unwrap();
    let mut got = Vec::new();
    for chunk in c.ids.chunks(32) {
        got.extend(model.forward(&c.be, &mut kv, chunk, true).unwrap());
    }
    let e = rel_err(&got, &c.want);
    println!("qwen35_moe with fused gate_up experts: rel err {e:.2e}");
    assert!(e < REL_TOL, "{e}");
}

/// Chat-style turns on a hybrid model: after the first refused rewind, a prefill leaves a
/// checkpoint before its last token, and the next prompt that diverges after it resumes
/// there instead of re-prefilling; the logits equal a fresh prefill's.
#[test]
fn qwen35_follow_up_turn_resumes_from_the_prompt_checkpoint() {
    let c = case("qwen35_dense");
    let m = c.model.as_ref();
    let v = c.n_vocab as u32;
    let mut s = session(&c);
    let fresh_last = |prompt: &[u32]| {
        let mut f = session(&c);
        f.prefill(m, &c.be, prompt, 32, |_, _| true)
            .unwrap()
            .unwrap()
    };
    // Turn 1, then a reply; turn 2 diverges inside the reply: nothing to resume yet.
    let p1 = c.ids[..40].to_vec();
    s.prefill(m, &c.be, &p1, 32, |_, _| true).unwrap();
    for &t in &c.ids[40..45] {
        s.decode(m, &c.be, t).unwrap();
    }
    let mut p2 = c.ids[..42].to_vec();
    p2.push((c.ids[42] + 1) % v);
    p2.extend_from_slice(&c.ids[60..80]);
    assert_eq!(s.reuse_prefix(&c.be, &p2).unwrap(), 0);
    s.prefill(m, &c.be, &p2, 32, |_, _| true).unwrap();
    for &t in &c.ids[80..85] {
        s.decode(m, &c.be, t).unwrap();
    }
    // Turn 3 keeps all of turn 2's prompt, then diverges from the reply.
    let mut p3 = p2.clone();
    p3.push((c.ids[80] + 7) % v);
    p3.extend_from_slice(&c.ids[90..100]);
    let keep = s.reuse_prefix(&c.be, &p3).unwrap();
    assert_eq!(keep, p2.len() - 1);
    let got = s
        .prefill(m, &c.be, &p3[keep..], 32, |_, _| true)
        .unwrap()
        .unwrap();
    let e = rel_err(&got, &fresh_last(&p3));
    assert!(e < 1e-4, "{e}");
    // Regenerating the same prompt resumes too.
    let keep = s.reuse_prefix(&c.be, &p3).unwrap();
    assert_eq!(keep, p3.len() - 1);
}

/// `Session::verify_greedy` (the check of a speculative block): 8 tokens from a
/// checkpoint give each row's argmax of `forward_all` over the same rows (the same ops, so
/// exactly), the session then holds them, and where transformers' top two logits are
/// apart by more than the bar, its pick.
#[test]
fn verify_greedy_picks_every_row() {
    for name in ["qwen35_dense", "qwen35_moe"] {
        let c = case(name);
        let m = c.model.as_ref();
        let v = c.n_vocab;
        let p = 40;
        let mut s = session(&c);
        s.prefill(m, &c.be, &c.ids[..p], 32, |_, _| true).unwrap();
        let cp = s.checkpoint(&c.be).unwrap();
        let block = &c.ids[p..p + 8];
        let all = s.forward_all(m, &c.be, block).unwrap();
        let want: Vec<u32> = all.chunks(v).map(common::argmax).collect();
        s.restore(&c.be, &cp).unwrap();
        let picks = s.verify_greedy(m, &c.be, block).unwrap();
        assert_eq!(picks, want, "{name}");
        assert_eq!(
            s.tokens(),
            &c.ids[..p + 8],
            "{name}: tokens after the block"
        );
        let scale = c.want.iter().fold(0f32, |a, x| a.max(x.abs()));
        for (i, row) in c.want[p * v..(p + 8) * v].chunks(v).enumerate() {
            let mut top = row.to_vec();
            top.sort_by(|a, b| b.total_cmp(a));
            if top[0] - top[1] > 2.0 * REL_TOL * scale {
                assert_eq!(
                    picks[i],
                    common::argmax(row),
                    "{name}: row {i} vs transformers"
                );
            }
        }
    }
}
