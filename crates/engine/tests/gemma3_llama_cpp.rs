//! Gemma 3 270M Q4_K_M against llama.cpp (fixtures made by scripts/make_llama_fixtures.py
//! with llama-cpp-python 0.3.36): prompt token ids, greedy 64-token continuations,
//! first-step logits, and perplexity on the GPL-3 excerpt.
//!
//! Needs NEAGARI_TEST_MODEL (the .gguf); skips with a note without it.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{argmax, ids, max_abs_diff, read_f32, read_json};
use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::KvType;
use neagari_engine::loader::tokenizer_from_gguf;
use neagari_engine::perplexity::perplexity;
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::CausalLm;
use neagari_tokenizer::Tokenizer;
use serde_json::Value;

fn fixtures() -> PathBuf {
    common::repo_fixtures("")
}

struct Setup {
    be: CpuBackend,
    model: Box<dyn CausalLm<CpuBackend>>,
    tok: Tokenizer,
    refs: Value,
}

fn setup() -> Option<Setup> {
    let Ok(path) = std::env::var("NEAGARI_TEST_MODEL") else {
        eprintln!("NEAGARI_TEST_MODEL is not set: skipping the llama.cpp comparison");
        return None;
    };
    let file = Arc::new(Gguf::open(&path).expect("open the test model"));
    let be = CpuBackend::new(&CpuOptions {
        threads: std::env::var("NEAGARI_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2),
        scalar_only: std::env::var_os("NEAGARI_SCALAR").is_some(),
    });
    let model = neagari_model::load(&be, &GgufSource::new(file.clone())).expect("load the model");
    let tok = tokenizer_from_gguf(&file).expect("tokenizer");
    let refs = read_json(&fixtures().join("gemma3_270m_llama_cpp.json"));
    Some(Setup {
        be,
        model,
        tok,
        refs,
    })
}

/// A fresh session of `n_ctx` tokens with prompt `p`'s ids prefilled, and the logits of
/// its last position.
fn prefilled(s: &Setup, p: &Value, n_ctx: usize) -> (Session<CpuBackend>, Vec<f32>) {
    let mut sess = Session::new(s.model.as_ref(), &s.be, n_ctx, KvType::F16).expect("session");
    let logits = sess
        .prefill(
            s.model.as_ref(),
            &s.be,
            &ids(&p["prompt_ids"]),
            512,
            |_, _| true,
        )
        .expect("prefill")
        .expect("logits");
    (sess, logits)
}

/// A step whose llama.cpp top-1/top-2 margin is below this is a near-tie: the two engines'
/// rounding (activations are quantized to int8 before every matmul, which amplifies a 1e-7
/// difference in f32 order to ~0.3 logit rms) may pick either token there.
const TIE_MARGIN: f64 = 1.0;

/// At a near-tie where we pick another token, llama.cpp's token must be within this of ours.
/// Both engines' logits carry int8-activation noise; on the code_json prompt llama.cpp's own
/// first-step logits are 2.9 from an f64 NumPy forward over the same dequantized weights
/// (whose top 5 equal ours), so the two noises add up; with other builds of the same code
/// code_json's first-step deviation ranged 3.4–4.9.
const FLIP_GAP: f32 = 1.5;

/// Prompt ids equal llama.cpp's. Teacher-forced along llama.cpp's greedy continuation, our
/// argmax equals llama.cpp's token at every step that is not a near-tie, and at near-ties
/// llama.cpp's token is within the tie margin of ours. Free-running greedy continuations:
/// at least 8 of the 12 identical (issue 2's bar) on a CPU with AVX-512 VNNI, the ISA the
/// fixture was made on: there every op of the CPU forward pass sums in the order of
/// llama.cpp's kernels for that ISA (docs/BENCHMARKS.md, scripts/llama_dump_tensors.py), and
/// all 12 are identical. Elsewhere our kernels (and llama.cpp's) sum in other orders, and a
/// free run leaves llama.cpp's path at its first flipped near-tie (llama.cpp itself gets 5 of
/// 12 when only its Q4_K kernel or its attention path changes), so 3 is asked there.
#[test]
fn greedy_continuations_equal_llama_cpp() {
    let Some(s) = setup() else { return };
    let n_ctx = s.refs["settings"]["n_ctx"].as_u64().unwrap_or(1024) as usize;
    let mut report = Vec::new();
    let mut failures = Vec::new();
    let mut identical = 0;
    let prompts = s.refs["prompts"].as_array().expect("prompts");
    for p in prompts {
        let name = p["name"].as_str().unwrap_or("?");
        let want_prompt = ids(&p["prompt_ids"]);
        let text = p["prompt"].as_str().expect("prompt text");
        let got_prompt = s.tok.encode(text, true, true);
        assert_eq!(
            got_prompt, want_prompt,
            "{name}: prompt token ids differ from llama.cpp's"
        );
        let want = ids(&p["continuation_ids"]);
        let runner_up = ids(&p["step_top2_ids"]);
        let margins: Vec<f64> = p["step_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();

        // Teacher-forced: feed llama.cpp's tokens, compare our choice at every step.
        let mut sess = Session::new(s.model.as_ref(), &s.be, n_ctx, KvType::F16).expect("session");
        let mut logits = sess
            .prefill(s.model.as_ref(), &s.be, &want_prompt, 512, |_, _| true)
            .expect("prefill")
            .expect("logits");
        let (mut ties, mut tie_flips) = (0, 0);
        for (k, &t) in want.iter().enumerate() {
            let ours = argmax(&logits);
            if margins[k] < TIE_MARGIN {
                ties += 1;
                if ours != t {
                    tie_flips += 1;
                    // A flip is fine only if llama.cpp's token is a near-tie for us too.
                    let gap = logits[ours as usize] - logits[t as usize];
                    if gap >= FLIP_GAP {
                        failures.push(format!(
                            "{name} step {k}: a near-tie for llama.cpp, but ours {ours} beats its {t} by {gap:.3} (its runner-up {})",
                            runner_up[k]
                        ));
                    }
                }
            } else if ours != t {
                failures.push(format!(
                    "{name} step {k}: ours {ours}, llama.cpp {t} (margin {:.3})",
                    margins[k]
                ));
            }
            logits = sess.decode(s.model.as_ref(), &s.be, t).expect("decode");
        }

        // Free-running greedy.
        sess.truncate(&s.be, 0).expect("truncate");
        let logits = sess
            .prefill(s.model.as_ref(), &s.be, &want_prompt, 512, |_, _| true)
            .expect("prefill")
            .expect("logits");
        let got = common::greedy(&mut sess, s.model.as_ref(), &s.be, logits, want.len());
        let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
        identical += first_diff.is_none() as usize;
        report.push(format!(
            "{name:>18}: free-running {}; teacher-forced: {} near-ties (margin < {TIE_MARGIN}), {tie_flips} flipped",
            match first_diff {
                None => "identical (64/64)".to_string(),
                Some(i) => format!("first differs at step {i} (llama.cpp margin there {:.3})", margins[i]),
            },
            ties
        ));
    }
    eprintln!(
        "{}\n{identical}/{} prompts identical free-running",
        report.join("\n"),
        prompts.len()
    );
    // For scale: llama.cpp against its own fixture when one setting changes only the order
    // of its sums (scripts/llama_self_agreement.py).
    if let Ok(v) = std::fs::read_to_string(fixtures().join("gemma3_llama_cpp_variants.json")) {
        let v: Value = serde_json::from_str(&v).expect("variants JSON");
        for (name, r) in v["variants"].as_object().expect("variants") {
            eprintln!(
                "llama.cpp {name:>14}: {}/{} identical ({})",
                r["identical"],
                prompts.len(),
                r["changes"].as_str().unwrap_or("")
            );
        }
    }
    assert!(
        failures.is_empty(),
        "disagreements with llama.cpp: {failures:#?}"
    );
    let bar = if exact_order_cpu() { 8 } else { 3 };
    assert!(
        identical >= bar,
        "only {identical} prompts identical free-running (want {bar})"
    );
}

/// The CPU has the kernels whose summation order matches the fixture's llama.cpp build
/// (AVX-512 F/BW/VL/VNNI, as the machine that made it) and the test does not force scalar.
fn exact_order_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::env::var_os("NEAGARI_SCALAR").is_none()
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// First-step logits of every prompt: the same top-1, and the top-40 logits close
/// relative to the logit scale. (For scale: an f64 NumPy forward pass over the same
/// dequantized weights differs from llama.cpp's logits by 0.98 at most and 0.28 rms on
/// prompt 0, because both engines quantize activations to int8 before every matmul and a
/// 1e-7 change before a rounding boundary moves the logits by ~0.3 rms.)
#[test]
fn first_step_logits_agree() {
    let Some(s) = setup() else { return };
    let mut report = Vec::new();
    let mut failures = Vec::new();
    for p in s.refs["prompts"].as_array().expect("prompts") {
        let name = p["name"].as_str().unwrap_or("?");
        let (_, logits) = prefilled(&s, p, 1024);
        let top40: Vec<(u32, f32)> = p["first_step_top40"]
            .as_array()
            .expect("top40")
            .iter()
            .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap() as f32))
            .collect();
        let (worst, max_d) = top40
            .iter()
            .map(|&(id, l)| (id, (logits[id as usize] - l).abs()))
            .fold((0, 0f32), |m, x| if x.1 > m.1 { x } else { m });
        let scale = top40[0].1.abs().max(1.0);
        let theirs5: Vec<u32> = top40[..5].iter().map(|e| e.0).collect();
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_unstable_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]));
        report.push(format!(
            "{name:>18}: top-40 max |Δlogit| {max_d:.3} (id {worst}; top logit {scale:.1}), top-5 ours {:?} llama.cpp {theirs5:?}",
            &order[..5]
        ));
        if order[0] != theirs5[0] || max_d / scale > 0.2 {
            failures.push(name.to_string());
        }
    }
    eprintln!("{}", report.join("\n"));
    assert!(
        failures.is_empty(),
        "first-step logits differ: {failures:?}"
    );
}

/// The full first-step logit vectors of three prompts against llama.cpp's.
#[test]
fn full_logits_close_to_llama_cpp() {
    let Some(s) = setup() else { return };
    let prompts = s.refs["prompts"].as_array().expect("prompts");
    for p in prompts
        .iter()
        .filter(|p| p["first_step_logits_file"].is_string())
    {
        let name = p["name"].as_str().unwrap_or("?");
        let file = p["first_step_logits_file"].as_str().unwrap();
        let want = read_f32(&fixtures().join(PathBuf::from(file).file_name().expect("file name")));
        let (_, got) = prefilled(&s, p, 256);
        assert_eq!(got.len(), want.len());
        let max_d = max_abs_diff(&got, &want);
        let rms_d = (got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f32>()
            / want.len() as f32)
            .sqrt();
        let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
        eprintln!(
            "{name}: over {} logits max |Δ| {max_d:.3}, rms Δ {rms_d:.3} (rms logit {rms:.2})",
            got.len()
        );
        assert!(
            rms_d < 0.08 * rms,
            "{name}: rms Δlogit {rms_d} against rms logit {rms}"
        );
        assert_eq!(argmax(&got), argmax(&want), "{name}: argmax");
    }
}

/// Perplexity over the GPL-3 excerpt within 0.5% of llama.cpp's (the nearer of its two
/// attention settings).
#[test]
fn perplexity_within_half_a_percent() {
    let Some(s) = setup() else { return };
    let pr = &s.refs["perplexity"];
    let src = pr["source"].as_str().expect("source");
    let Ok(bytes) = std::fs::read(src) else {
        eprintln!("{src} is missing: skipping perplexity");
        return;
    };
    let n = pr["excerpt_bytes"].as_u64().expect("bytes") as usize;
    let mut text = String::from_utf8_lossy(&bytes[..n.min(bytes.len())]).into_owned();
    if text.ends_with('\n') {
        text.pop();
    }
    let tokens = s.tok.encode(&text, true, false);
    let n_ctx = 512;
    let mut sess = Session::new(s.model.as_ref(), &s.be, n_ctx, KvType::F16).expect("session");
    let r = perplexity(
        s.model.as_ref(),
        &s.be,
        &mut sess,
        &tokens,
        usize::MAX,
        s.tok.bos(),
        512,
        |_, _| {},
    )
    .expect("perplexity");
    // llama.cpp's two attention settings differ by 0.2% on this text (15.0033 with flash
    // attention auto, llama-perplexity's default; 14.9738 without). Ours is measured
    // against the nearer: on AVX-512 VNNI (the kernels in the fixture build's order) it is
    // 14.9821; on an AVX2-only CPU, whose kernels sum in other orders, 14.9213 (0.55% from
    // the first, 0.35% from the second; the scalar reference gives 14.9217 there too).
    let (want, rel) = ["flash_attn_auto", "flash_attn_disabled"]
        .iter()
        .map(|k| {
            let w = pr[*k]["perplexity"].as_f64().expect("reference ppl");
            (w, (r.ppl - w).abs() / w)
        })
        .fold(
            (f64::NAN, f64::INFINITY),
            |b, c| if c.1 < b.1 { c } else { b },
        );
    eprintln!(
        "perplexity {:.4} vs llama.cpp {want:.4} ({:.2}% apart)",
        r.ppl,
        rel * 100.0
    );
    assert_eq!(
        r.tokens_scored as u64,
        pr["flash_attn_auto"]["n_chunks"].as_u64().unwrap() * 255
    );
    assert!(rel < 0.005, "perplexity {} vs {want}", r.ppl);
}

/// Not a check: with NEAGARI_DUMP=DIR set, runs one fixture prompt (NEAGARI_DUMP_PROMPT,
/// default 0) and NEAGARI_DUMP_STEPS (default 2) decode steps along llama.cpp's continuation,
/// while the Gemma forward writes its intermediate buffers for
/// `scripts/llama_dump_tensors.py compare`.
#[test]
fn dump_tensors() {
    if std::env::var_os("NEAGARI_DUMP").is_none() {
        return;
    }
    let Some(s) = setup() else { return };
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let p = &s.refs["prompts"][env("NEAGARI_DUMP_PROMPT", 0)];
    let want = ids(&p["continuation_ids"]);
    let (mut sess, _) = prefilled(&s, p, 1024);
    for &t in &want[..env("NEAGARI_DUMP_STEPS", 2)] {
        sess.decode(s.model.as_ref(), &s.be, t).expect("decode");
    }
}
