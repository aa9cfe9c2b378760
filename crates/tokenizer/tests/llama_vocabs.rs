//! llama.cpp's vocab-only conformance files (models/ggml-vocab-*.gguf with .inp/.out) and
//! the committed fixtures made from them by scripts/tokenizer_reference.py. The vocab files
//! are too big to commit (~40 MB); the tests read them from NEAGARI_LLAMA_VOCABS (the
//! sdist's vendor/llama.cpp/models) and print a note and pass vacuously when it is unset.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use neagari_tokenizer::Tokenizer;

fn vocab(name: &str) -> Option<(Tokenizer, PathBuf)> {
    let Some(dir) = std::env::var_os("NEAGARI_LLAMA_VOCABS").map(PathBuf::from) else {
        eprintln!("NOTE: NEAGARI_LLAMA_VOCABS unset; skipping llama.cpp vocab test for {name}");
        return None;
    };
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    assert!(
        path.exists(),
        "{} missing under NEAGARI_LLAMA_VOCABS",
        path.display()
    );
    let tok = Tokenizer::from_spec(common::spec_from_gguf(&path))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    Some((tok, path))
}

fn check(name: &str, conformance: bool) {
    let Some((tok, path)) = vocab(name) else {
        return;
    };
    let mut fails = common::compare_fixture(&tok, &common::load_fixture(name), &common::ALL);
    if conformance {
        let (n, f) = common::conformance(&tok, &path);
        eprintln!("{name}: {} / {n} conformance vectors match", n - f.len());
        fails.extend(f);
    }
    common::report(name, &fails);
}

#[test]
fn llama_bpe() {
    check("llama-bpe", true);
}

#[test]
fn qwen2() {
    check("qwen2", true);
}

#[test]
fn qwen35() {
    check("qwen35", true);
}

#[test]
fn gpt2() {
    check("gpt-2", true);
}

#[test]
fn llama_spm() {
    check("llama-spm", true);
}

#[test]
fn phi3() {
    check("phi-3", true);
}

#[test]
fn gemma4() {
    check("gemma-4", true);
}

#[test]
fn encode_20kb_is_fast() {
    for name in ["llama-bpe", "qwen35"] {
        let Some((tok, _)) = vocab(name) else { return };
        let text = common::perf_text();
        let _ = tok.encode(&text, false, false);
        let t = Instant::now();
        let ids = tok.encode(&text, false, false);
        let dt = t.elapsed();
        eprintln!(
            "{name}: {} bytes → {} tokens in {:.2} ms",
            text.len(),
            ids.len(),
            dt.as_secs_f64() * 1e3
        );
        assert!(dt.as_millis() < 200, "{name}: encoding 20 KB took {dt:?}");
    }
}
