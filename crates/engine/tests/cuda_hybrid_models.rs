//! The hybrid fixtures (Qwen3.5 dense and MoE, Qwen3-Next MoE, Qwen3-MoE; tiny random
//! models under crates/model/tests/fixtures/hybrid, scripts/make_hybrid_fixtures.py) on the
//! GPU against transformers' logits, as hybrid_transformers.rs checks the CPU: prefill in
//! batches of 8 (the f32 GEMV, so the hybrid ops run on several tokens at f32 precision),
//! of 32 and of 150 (cuBLAS with activations rounded to f16), token-by-token decode, and a
//! checkpoint/restore round trip of the recurrent state in VRAM.
//!
//! Bars, per position the largest |Δlogit| over the largest |logit|: on the f32 paths every
//! position under REL_TOL (looser than the CPU's 1e-3 because the GPU's KV cache is f16).
//! Where activations meet cuBLAS in f16, an MoE router whose top experts are nearly tied
//! can pick another expert at a position, so there 95% of the positions must be under
//! F16_TOL (all finite); the largest is printed.
//!
//! Skips with a note where no CUDA GPU is usable (CI). NEAGARI_HYBRID_FIXTURES overrides
//! where the fixtures are (the test binary may run from another checkout).
#![cfg(feature = "cuda")]

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use neagari_backend::cuda::{probe, CudaBackend};
use neagari_backend::KvType;
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::CausalLm;
use serde_json::Value;

const REL_TOL: f32 = 2e-3;
const F16_TOL: f32 = 2e-2;

fn note(msg: &str) {
    // Straight to stderr: the harness swallows eprintln! of a passing test.
    let _ = writeln!(std::io::stderr(), "note: {msg}");
}

fn dir() -> PathBuf {
    std::env::var_os("NEAGARI_HYBRID_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/hybrid")
        })
}

struct Case {
    be: CudaBackend,
    model: Box<dyn CausalLm<CudaBackend>>,
    ids: Vec<u32>,
    /// `[ids.len(), n_vocab]`.
    want: Vec<f32>,
    n_vocab: usize,
}

fn case(name: &str) -> Option<Case> {
    if let Some(why) = probe().unavailable {
        note(&format!("skipping a CUDA hybrid model test: {why}"));
        return None;
    }
    let be = CudaBackend::new(0).expect("open GPU 0");
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
    let file = Arc::new(Gguf::open(dir().join(format!("{name}.gguf"))).expect("open"));
    let model = neagari_model::load(&be, &GgufSource::new(file)).expect("load");
    assert_eq!(model.info().n_vocab, n_vocab);
    Some(Case {
        be,
        model,
        ids,
        want,
        n_vocab,
    })
}

/// Largest |a − b| over the largest |b|.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|v| v.is_finite()), "non-finite logits");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    d / scale
}

/// Per position: largest |a − b| over the largest |b| of the whole reference.
fn pos_errs(got: &[f32], want: &[f32], v: usize) -> Vec<f32> {
    assert_eq!(got.len(), want.len());
    assert!(got.iter().all(|x| x.is_finite()), "non-finite logits");
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    got.chunks(v)
        .zip(want.chunks(v))
        .map(|(g, w)| g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale)
        .collect()
}

fn session(c: &Case) -> Session<CudaBackend> {
    Session::new(c.model.as_ref(), &c.be, 256, KvType::F16).expect("session")
}

fn prefill_all(c: &Case, n_batch: usize) -> Vec<f32> {
    let mut s = session(c);
    let mut out = Vec::new();
    for chunk in c.ids.chunks(n_batch) {
        out.extend(s.forward_all(c.model.as_ref(), &c.be, chunk).unwrap());
    }
    out
}

fn decode_all(c: &Case) -> Vec<f32> {
    let mut s = session(c);
    let mut out = Vec::new();
    for &t in &c.ids {
        out.extend(s.decode(c.model.as_ref(), &c.be, t).unwrap());
    }
    out
}

fn check(name: &str) {
    let Some(c) = case(name) else { return };
    let e = rel_err(&prefill_all(&c, 8), &c.want);
    println!("{name} on GPU: prefill n_batch 8 (f32 GEMV): rel err {e:.2e}");
    let d = rel_err(&decode_all(&c), &c.want);
    println!("{name} on GPU: token-by-token decode: rel err {d:.2e}");
    for n_batch in [32, 150] {
        let pe = pos_errs(&prefill_all(&c, n_batch), &c.want, c.n_vocab);
        let mut sorted = pe.clone();
        sorted.sort_by(f32::total_cmp);
        let p95 = sorted[sorted.len() * 95 / 100];
        let worst = sorted[sorted.len() - 1];
        let over: Vec<usize> = (0..pe.len()).filter(|&i| pe[i] >= F16_TOL).collect();
        println!(
            "{name} on GPU: prefill n_batch {n_batch} (f16 cuBLAS): max {worst:.2e}, \
             95th percentile {p95:.2e}, positions over {F16_TOL:.0e}: {over:?}"
        );
        assert!(p95 < F16_TOL, "{name} prefill n_batch {n_batch}: p95 {p95}");
    }
    assert!(e < REL_TOL, "{name} prefill n_batch 8: {e}");
    assert!(d < REL_TOL, "{name} decode: {d}");
}

#[test]
fn qwen35_dense_on_gpu_matches_transformers() {
    check("qwen35_dense");
}

#[test]
fn qwen35_moe_on_gpu_matches_transformers() {
    check("qwen35_moe");
}

#[test]
fn qwen3next_moe_on_gpu_matches_transformers() {
    check("qwen3next_moe");
}

#[test]
fn qwen3_moe_on_gpu_matches_transformers() {
    check("qwen3_moe");
}

/// A checkpoint restores the recurrent state in VRAM exactly; a backwards truncate is
/// refused.
#[test]
fn qwen35_gpu_state_follows_checkpoint() {
    let Some(c) = case("qwen35_dense") else {
        return;
    };
    let m = c.model.as_ref();
    let mut s = session(&c);
    s.prefill(m, &c.be, &c.ids[..60], 32, |_, _| true).unwrap();
    let cp = s.checkpoint(&c.be).unwrap();
    let first: Vec<Vec<f32>> = c.ids[60..70]
        .iter()
        .map(|&t| s.decode(m, &c.be, t).unwrap())
        .collect();
    for &t in c.ids[100..105].iter() {
        s.decode(m, &c.be, t).unwrap();
    }
    s.restore(&c.be, &cp).unwrap();
    assert_eq!(s.tokens().len(), 60);
    for (k, &t) in c.ids[60..70].iter().enumerate() {
        assert_eq!(s.decode(m, &c.be, t).unwrap(), first[k], "step {k}");
    }
    assert!(s.truncate(&c.be, 30).is_err());
    let v = c.n_vocab;
    // And the restored run still tracks transformers.
    let e = rel_err(&first[9], &c.want[69 * v..70 * v]);
    assert!(e < REL_TOL, "after restore: {e}");
}

/// Decode steps replayed from CUDA graphs (recurrent state updated in place by the graph)
/// give the logits of the same steps run one launch at a time, bit for bit (under 256
/// positions both paths split attention alike); a checkpoint restored between replays, and
/// a reset of the cache, leave the recorded steps valid; the device argmax picks the host
/// rule's token. MoE fixtures record up to their router read.
#[test]
fn graph_replayed_hybrid_decode_equals_eager_decode() {
    for name in ["qwen35_dense", "qwen35_moe", "qwen3next_moe", "qwen3_moe"] {
        let Some(g) = case(name) else { return };
        let Some(e) = case(name) else { return };
        e.be.set_graphs(false);
        // 8 prompt tokens: the prefill stays on the f32 GEMV (no f16 rounding).
        let p = 8;
        let run = |c: &Case| -> Vec<Vec<f32>> {
            let mut s = session(c);
            s.prefill(c.model.as_ref(), &c.be, &c.ids[..p], 32, |_, _| true)
                .unwrap();
            c.ids[p..]
                .iter()
                .map(|&t| s.decode(c.model.as_ref(), &c.be, t).unwrap())
                .collect()
        };
        let (c0, r0) = g.be.graph_stats();
        let lg = run(&g);
        let (c1, r1) = g.be.graph_stats();
        let le = run(&e);
        assert_eq!(
            e.be.graph_stats(),
            (0, 0),
            "{name}: graphs off yet recorded"
        );
        assert!(c1 > c0, "{name}: nothing captured");
        // Three 64-position classes: at most three warm steps and a capture each.
        assert!(
            r1 - r0 >= (lg.len() - 9) as u64,
            "{name}: {} replays of {} steps",
            r1 - r0,
            lg.len()
        );
        for (i, (a, b)) in lg.iter().zip(&le).enumerate() {
            let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                a == b,
                "{name}: position {}: graph logits differ by {d}",
                p + i
            );
        }
        let d = rel_err(&lg.concat(), &c_want(&g, p));
        assert!(d < REL_TOL, "{name}: graph decode vs transformers {d}");

        // Checkpoint, replayed steps, restore, the same steps again; then a reset.
        let m = g.model.as_ref();
        let mut s = session(&g);
        s.prefill(m, &g.be, &g.ids[..70], 32, |_, _| true).unwrap();
        let cp = s.checkpoint(&g.be).unwrap();
        let steps = |s: &mut Session<CudaBackend>| -> Vec<Vec<f32>> {
            g.ids[70..90]
                .iter()
                .map(|&t| s.decode(m, &g.be, t).unwrap())
                .collect()
        };
        let first = steps(&mut s);
        s.restore(&g.be, &cp).unwrap();
        let picks: Vec<u32> = g.ids[70..90]
            .iter()
            .map(|&t| s.decode_greedy(m, &g.be, t).unwrap())
            .collect();
        s.restore(&g.be, &cp).unwrap();
        let again = steps(&mut s);
        for (k, l) in again.iter().enumerate() {
            assert_eq!(l, &first[k], "{name}: after restore, step {k}");
            assert_eq!(
                picks[k],
                neagari_backend::argmax_host(l),
                "{name}: device argmax at step {k}"
            );
        }
        s.truncate(&g.be, 0).unwrap();
        s.prefill(m, &g.be, &g.ids[..p], 32, |_, _| true).unwrap();
        for (k, &t) in g.ids[p..p + 20].iter().enumerate() {
            assert_eq!(
                s.decode(m, &g.be, t).unwrap(),
                lg[k],
                "{name}: after a reset, step {k}"
            );
        }
        let (c2, r2) = g.be.graph_stats();
        note(&format!(
            "{name}: graph decode = eager over {} steps; {} captures, {} replays in all",
            lg.len(),
            c2 - c0,
            r2 - r0
        ));
    }
}

/// The reference logits of positions `p..`.
fn c_want(c: &Case, p: usize) -> Vec<f32> {
    c.want[p * c.n_vocab..].to_vec()
}

/// Multi-token decode steps (the verify forward of a speculative block: 8 and 3 tokens)
/// replayed from CUDA graphs give the logits of the same forwards run one launch at a time,
/// bit for bit, from a restored snapshot of the recurrent state, two 8-token blocks at
/// different positions of one 64-position class sharing a recording; `verify_greedy` picks
/// each row's argmax of those logits, and where the top two logits of a one-token step are
/// apart by more than rounding, the one-token step picks the same token.
#[test]
fn graph_replayed_multi_token_steps_equal_eager() {
    use neagari_backend::Backend;
    for name in ["qwen35_dense", "qwen35_moe", "qwen3next_moe", "qwen3_moe"] {
        let Some(g) = case(name) else { return };
        let Some(e) = case(name) else { return };
        e.be.set_graphs(false);
        let p = 40;
        let blocks = [(p, 8usize), (p + 8, 3), (p + 11, 8)];
        let rounds = 5;
        let run = |c: &Case| -> Vec<Vec<f32>> {
            let m = c.model.as_ref();
            let mut kv = m.new_kv(&c.be, 256, KvType::F16).unwrap();
            // The f32 GEMV (8 rows a batch): no f16 rounding before the steps.
            for chunk in c.ids[..p].chunks(8) {
                m.forward(&c.be, &mut kv, chunk, false).unwrap();
            }
            let snap = c.be.kv_snapshot(&kv).unwrap();
            let mut out = Vec::new();
            for _ in 0..rounds {
                c.be.kv_restore(&mut kv, &snap).unwrap();
                for &(s, n) in &blocks {
                    let toks = &c.ids[s..s + n];
                    c.be.step_begin(&kv, toks).unwrap();
                    let l = m.forward(&c.be, &mut kv, toks, true);
                    c.be.step_end();
                    out.push(l.unwrap());
                }
            }
            out
        };
        let (c0, r0) = g.be.graph_stats();
        let lg = run(&g);
        let (c1, r1) = g.be.graph_stats();
        let le = run(&e);
        assert_eq!(
            e.be.graph_stats(),
            (0, 0),
            "{name}: graphs off yet recorded"
        );
        assert!(c1 > c0, "{name}: nothing captured");
        // Two keys (8 and 3 tokens): a warm round or two and a capture, then replays.
        assert!(
            r1 - r0 >= 2 * blocks.len() as u64,
            "{name}: {} replays of {} steps",
            r1 - r0,
            lg.len()
        );
        for (i, (a, b)) in lg.iter().zip(&le).enumerate() {
            let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(a == b, "{name}: step {i}: graph logits differ by {d}");
        }
        let v = g.n_vocab;
        let d = rel_err(&lg[0], &c_want(&g, p)[..8 * v]);
        assert!(d < REL_TOL, "{name}: 8-token step vs transformers {d}");

        // verify_greedy (recorded after its first runs) against the argmax of those
        // logits, and the one-token greedy steps where their pick is clear.
        let m = g.model.as_ref();
        let mut s = session(&g);
        s.prefill(m, &g.be, &g.ids[..p], 8, |_, _| true).unwrap();
        let cp = s.checkpoint(&g.be).unwrap();
        let block = &g.ids[p..p + 8];
        let want: Vec<u32> = lg[0].chunks(v).map(neagari_backend::argmax_host).collect();
        for k in 0..4 {
            s.restore(&g.be, &cp).unwrap();
            let picks = s.verify_greedy(m, &g.be, block).unwrap();
            assert_eq!(picks, want, "{name}: verify_greedy, run {k}");
        }
        s.restore(&g.be, &cp).unwrap();
        let mut clear = 0;
        for (i, &t) in block.iter().enumerate() {
            let l = s.decode(m, &g.be, t).unwrap();
            let mut top = l.clone();
            top.sort_by(|a, b| b.total_cmp(a));
            let scale = top[0].abs().max(1.0);
            if top[0] - top[1] > 1e-3 * scale {
                clear += 1;
                assert_eq!(
                    neagari_backend::argmax_host(&l),
                    want[i],
                    "{name}: position {}: one-token step and 8-token step pick apart",
                    p + i
                );
            }
        }
        let (c2, r2) = g.be.graph_stats();
        note(&format!(
            "{name}: multi-token steps = eager over {} steps; verify_greedy = one-token \
             steps at {clear}/8 clear positions; {} captures, {} replays in all",
            lg.len(),
            c2 - c0,
            r2 - r0
        ));
    }
}
