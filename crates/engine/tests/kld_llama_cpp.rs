//! `neagari_engine::kld` against a KL-divergence computed from llama.cpp's logits
//! (scripts/make_quantize_reference.py: llama-cpp-python 0.3.36 logits of the tiny f16
//! model and of llama.cpp's Q4_0 quantization of it, statistics in NumPy float64) over the
//! windows llama-perplexity uses (chunks of 64 tokens of kld_text.txt, second half scored).
//!
//! The Q4_0 model here is neagari's own quantization of tiny_f16.gguf, whose tensors equal
//! llama.cpp's byte for byte (quantize_llama_cpp.rs checks that).
//!
//! Tolerances come from llama.cpp itself: the script ran the same comparison a second time
//! with llama.cpp's flash-attention path, which changes nothing but where the attention
//! rounds. Two correct engines differ by rounding only, so we allow twice the distance
//! llama.cpp moves from itself: per position (mean and max |ΔKLD|), in the number of
//! positions whose argmaxes agree (near-ties flip), and in log-perplexity.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{cpu, ids, quantize_default, read_json, CpuModel};
use neagari_backend::cpu::CpuBackend;
use neagari_backend::KvType;
use neagari_engine::kld::{kl_divergence, summarize, Side};
use neagari_engine::loader::tokenizer_from_gguf;
use neagari_engine::perplexity::perplexity;
use neagari_engine::quantize::FileType;
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use serde_json::Value;

fn dir() -> PathBuf {
    common::repo_fixtures("quantize")
}

/// The tiny f16 model (file and loaded) and neagari's Q4_0 quantization of it, loaded.
fn f16_and_q4_0(be: &CpuBackend) -> (Arc<Gguf>, CpuModel, CpuModel) {
    let base_file = Arc::new(Gguf::open(dir().join("tiny_f16.gguf")).unwrap());
    let model_file = Arc::new(quantize_default(&base_file, FileType::Q4_0));
    let base = neagari_model::load(be, &GgufSource::new(base_file.clone())).unwrap();
    let model = neagari_model::load(be, &GgufSource::new(model_file)).unwrap();
    (base_file, base, model)
}

#[test]
fn kl_divergence_matches_llama_cpp() {
    let refs = read_json(&dir().join("reference.json"));
    let k = &refs["kld"];
    let fa = &k["flash_attn_variant"];
    let n_ctx = k["n_ctx"].as_u64().unwrap() as usize;

    let be = cpu(2, false);
    let (base_file, base, model) = f16_and_q4_0(&be);

    // Same text, same tokens as llama.cpp's tokenizer made.
    let tok = tokenizer_from_gguf(&base_file).unwrap();
    let mut text = std::fs::read_to_string(dir().join("kld_text.txt")).unwrap();
    if text.ends_with('\n') {
        text.pop();
    }
    let tokens = tok.encode(&text, true, false);
    assert_eq!(tokens, ids(&k["tokens"]));
    let bos = if tok.add_bos() { tok.bos() } else { None };

    let mut sb = Session::new(base.as_ref(), &be, n_ctx, KvType::F16).unwrap();
    let mut sm = Session::new(model.as_ref(), &be, n_ctx, KvType::F16).unwrap();
    let n_chunk = k["n_chunk"].as_u64().unwrap() as usize;
    let mut reported = 0;
    let pos = kl_divergence(
        &be,
        Side {
            model: base.as_ref(),
            sess: &mut sb,
        },
        Side {
            model: model.as_ref(),
            sess: &mut sm,
        },
        &tokens,
        n_chunk,
        bos,
        512,
        |c, _| {
            assert_eq!(c, reported);
            reported += 1;
        },
    )
    .unwrap();
    assert_eq!(reported, n_chunk);
    let want = k["positions"].as_array().unwrap();
    assert_eq!(pos.len(), want.len());

    // Per position.
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap();
    let d: Vec<f64> = pos
        .iter()
        .zip(want)
        .map(|(p, w)| (p.kld - f(w, "kld")).abs())
        .collect();
    let mean_d = d.iter().sum::<f64>() / d.len() as f64;
    let max_d = d.iter().copied().fold(0.0, f64::max);
    let self_mean = f(fa, "mean_position_kld_delta");
    let self_max = f(fa, "max_position_kld_delta");
    let flips = pos
        .iter()
        .zip(want)
        .filter(|(p, w)| p.same_top != w["same_top"].as_bool().unwrap())
        .count();
    let n = pos.len() as f64;
    let self_flips = ((f(fa, "same_top") - f(k, "same_top")).abs() * n).round() as usize;

    let s = summarize(&pos, n_chunk);
    eprintln!(
        "neagari: mean KLD {:.6} (llama.cpp {:.6}, its flash-attn run {:.6}), median {:.6} ({:.6}), \
         same top {:.4} ({:.4}), ppl {:.4} -> {:.4} ({:.4} -> {:.4}); per-position |ΔKLD| mean \
         {mean_d:.2e} max {max_d:.2e} (llama.cpp vs itself {self_mean:.2e} / {self_max:.2e}); \
         argmax agreement differs at {flips} positions (llama.cpp vs itself {self_flips})",
        s.mean_kld,
        f(k, "mean_kld"),
        f(fa, "mean_kld"),
        s.median_kld,
        f(k, "median_kld"),
        s.same_top,
        f(k, "same_top"),
        s.ppl_base,
        s.ppl,
        f(k, "ppl_base"),
        f(k, "ppl_model"),
    );
    assert!(
        mean_d <= 2.0 * self_mean,
        "per-position mean |ΔKLD| {mean_d}"
    );
    assert!(max_d <= 2.0 * self_max, "per-position max |ΔKLD| {max_d}");
    // |mean(a) − mean(b)| ≤ mean |a − b|.
    assert!((s.mean_kld - f(k, "mean_kld")).abs() <= 2.0 * self_mean);
    assert!(flips <= 2 * self_flips.max(1), "{flips} argmax flips");
    // Log-perplexities: twice llama.cpp's own movement, plus a floor for f64 vs f32 sums.
    let dl = |a: f64, b: f64| (a / b).ln().abs();
    let self_ppl =
        dl(f(fa, "ppl_base"), f(k, "ppl_base")).max(dl(f(fa, "ppl_model"), f(k, "ppl_model")));
    assert!(dl(s.ppl_base, f(k, "ppl_base")) <= 2.0 * self_ppl + 1e-4);
    assert!(dl(s.ppl, f(k, "ppl_model")) <= 2.0 * self_ppl + 1e-4);
    // The median is an order statistic of values each within max_d.
    assert!((s.median_kld - f(k, "median_kld")).abs() <= 2.0 * self_max);
}

/// A model against itself: every divergence is zero and every argmax agrees; and the
/// base perplexity KLD reports is the one `perplexity` computes over the same windows.
#[test]
fn self_divergence_is_zero_and_perplexity_agrees() {
    let file = Arc::new(Gguf::open(dir().join("tiny_f16.gguf")).unwrap());
    let be = cpu(2, false);
    let m = neagari_model::load(&be, &GgufSource::new(file.clone())).unwrap();
    let tok = tokenizer_from_gguf(&file).unwrap();
    let text = std::fs::read_to_string(dir().join("kld_text.txt")).unwrap();
    let tokens = tok.encode(text.trim_end_matches('\n'), true, false);
    let n_ctx = 64;
    let mut s1 = Session::new(m.as_ref(), &be, n_ctx, KvType::F16).unwrap();
    let mut s2 = Session::new(m.as_ref(), &be, n_ctx, KvType::F16).unwrap();
    let pos = kl_divergence(
        &be,
        Side {
            model: m.as_ref(),
            sess: &mut s1,
        },
        Side {
            model: m.as_ref(),
            sess: &mut s2,
        },
        &tokens,
        4,
        None,
        512,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(pos.len(), 4 * (n_ctx - 1 - n_ctx / 2));
    assert!(pos
        .iter()
        .all(|p| p.kld.abs() < 1e-12 && p.same_top && p.p_diff == 0.0));
    let s = summarize(&pos, 4);
    let ppl = perplexity(m.as_ref(), &be, &mut s1, &tokens, 4, None, 512, |_, _| {}).unwrap();
    assert_eq!(ppl.tokens_scored, pos.len());
    assert!(
        ((s.ppl_base / ppl.ppl).ln()).abs() < 1e-6,
        "{} vs {}",
        s.ppl_base,
        ppl.ppl
    );
}

/// Base log-probabilities saved in llama-perplexity's base-file layout and read back give
/// the divergence computed with both models side by side, up to the file's rounding: each
/// log-prob is stored to half a step of (max − min)/65535 ≤ 16/65535, i.e. 1.2e-4, which
/// moves a position's KL by at most that times (1 + Σ p|log p − log q|) — under 5e-4 here.
#[test]
fn saved_base_file_gives_the_same_divergence() {
    use neagari_engine::kld::{kl_divergence_saved, save_base};
    use neagari_engine::kld_file::BaseHeader;

    let be = cpu(2, false);
    let (base_file, base, model) = f16_and_q4_0(&be);
    let tok = tokenizer_from_gguf(&base_file).unwrap();
    let text = std::fs::read_to_string(dir().join("kld_text.txt")).unwrap();
    let tokens = tok.encode(text.trim_end_matches('\n'), true, false);
    let n_ctx = 64;
    let mut sb = Session::new(base.as_ref(), &be, n_ctx, KvType::F16).unwrap();
    let mut sm = Session::new(model.as_ref(), &be, n_ctx, KvType::F16).unwrap();

    let mut file = Vec::new();
    let nll = save_base(
        &be,
        Side {
            model: base.as_ref(),
            sess: &mut sb,
        },
        &tokens,
        5,
        None,
        512,
        &mut file,
        |_| {},
    )
    .unwrap();
    let per_chunk = n_ctx - 1 - n_ctx / 2;
    assert_eq!(nll.len(), 5 * per_chunk);
    // 8 magic + 3·4 header + tokens + positions of nv u16.
    assert_eq!(
        file.len(),
        20 + 5 * n_ctx * 4 + 5 * per_chunk * (2 * 150 + 4) * 2
    );

    let mut r = file.as_slice();
    let header = BaseHeader::read(&mut r).unwrap();
    assert_eq!(header.tokens, tokens[..5 * n_ctx]);
    let saved = kl_divergence_saved(
        &be,
        Side {
            model: model.as_ref(),
            sess: &mut sm,
        },
        &header,
        &mut r,
        None,
        512,
        |_, _| {},
    )
    .unwrap();
    assert!(r.is_empty(), "every saved position was read");
    let live = kl_divergence(
        &be,
        Side {
            model: base.as_ref(),
            sess: &mut sb,
        },
        Side {
            model: model.as_ref(),
            sess: &mut sm,
        },
        &tokens,
        5,
        None,
        512,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(saved.len(), live.len());
    let mut max_d = 0f64;
    for ((s, l), n) in saved.iter().zip(&live).zip(&nll) {
        max_d = max_d.max((s.kld - l.kld).abs());
        assert!((s.nll_base - l.nll_base).abs() < 2e-4 && (n - l.nll_base).abs() < 1e-9);
        assert_eq!(s.nll, l.nll);
        assert_eq!(s.same_top, l.same_top);
    }
    eprintln!("saved vs live base: per-position max |ΔKLD| {max_d:.2e}");
    assert!(max_d < 5e-4, "{max_d}");
}
