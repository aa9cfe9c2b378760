//! Pre-tokenizer word boundaries against llama.cpp. scripts/tokenizer_reference.py --probe
//! built, for each `pre`, a vocabulary in which every substring of every probe text is a
//! token and every split of it a merge, so llama.cpp returns one token per pre-split word.
//! This test rebuilds the same vocabulary from the probe texts and compares the ids.

mod common;

use std::collections::BTreeSet;

use neagari_tokenizer::{unicode, Tokenizer, VocabSpec};
use serde_json::Value;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Same construction as `probe_vocab` in the script: byte characters first, then all
/// substrings of length ≥ 2 sorted by (length in code points, string).
fn probe_vocab(texts: &[String]) -> (Vec<String>, Vec<String>) {
    let alpha: Vec<String> = (0..=255u8)
        .map(|b| char::from_u32(unicode::byte_to_cpt(b)).unwrap().to_string())
        .collect();
    let mut subs: BTreeSet<(usize, String)> = BTreeSet::new();
    for t in texts {
        let enc: Vec<char> = t
            .bytes()
            .map(|b| char::from_u32(unicode::byte_to_cpt(b)).unwrap())
            .collect();
        for i in 0..enc.len() {
            for j in i + 2..=enc.len() {
                subs.insert((j - i, enc[i..j].iter().collect()));
            }
        }
    }
    let mut tokens = alpha;
    let mut merges = Vec::new();
    for (_, s) in &subs {
        tokens.push(s.clone());
        let chars: Vec<char> = s.chars().collect();
        for k in 1..chars.len() {
            let (a, b): (String, String) =
                (chars[..k].iter().collect(), chars[k..].iter().collect());
            merges.push(format!("{a} {b}"));
        }
    }
    (tokens, merges)
}

fn load_probe() -> (Value, Vec<String>) {
    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(common::fixtures_dir().join("split_probe.json"))
            .expect("read split_probe.json"),
    )
    .unwrap();
    let texts: Vec<String> = fx["texts_hex"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| String::from_utf8(hex(h.as_str().unwrap())).unwrap())
        .collect();
    (fx, texts)
}

#[test]
fn pre_tokenizer_word_boundaries_match_llama_cpp() {
    let (fx, texts) = load_probe();
    let (tokens, merges) = probe_vocab(&texts);
    assert_eq!(
        tokens.len() as u64,
        fx["n_tokens"].as_u64().unwrap(),
        "probe vocabulary differs from the script's"
    );
    assert_eq!(merges.len() as u64, fx["n_merges"].as_u64().unwrap());
    let mut fails = Vec::new();
    for (pre, per_text) in fx["ids"].as_object().unwrap() {
        let tok = Tokenizer::from_spec(VocabSpec {
            model: "gpt2".into(),
            pre: Some(pre.clone()),
            tokens: tokens.clone(),
            token_types: Some(vec![1; tokens.len()]),
            merges: Some(merges.clone()),
            ..Default::default()
        })
        .unwrap();
        let words = |ids: &[u32]| -> Vec<String> {
            ids.iter()
                .map(|&i| String::from_utf8_lossy(&tok.token_to_piece(i, false)).into_owned())
                .collect()
        };
        for (text, want) in texts.iter().zip(per_text.as_array().unwrap()) {
            let want: Vec<u32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(text, false, false);
            if got != want {
                fails.push(format!(
                    "{pre} {text:?}:\n   ours      {:?}\n   llama.cpp {:?}",
                    words(&got),
                    words(&want)
                ));
            }
        }
    }
    common::report("split_probe", &fails);
}

/// The same probe through the HF loader: a `tokenizer.json` carrying the probe vocabulary
/// and each family's split regex must give llama.cpp's ids for the matching `pre`.
#[test]
fn hf_tokenizer_json_pre_tokenizers_match_llama_cpp() {
    let (fx, texts) = load_probe();
    let (tokens, merges) = probe_vocab(&texts);
    let vocab: serde_json::Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), Value::from(i)))
        .collect();
    let contractions = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    let families = [
        (
            "llama-bpe",
            format!(
                r"{contractions}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ),
        (
            "qwen2",
            format!(
                r"{contractions}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ),
        (
            "qwen35",
            format!(
                r"{contractions}|[^\r\n\p{{L}}\p{{N}}]?[\p{{L}}\p{{M}}]+|\p{{N}}| ?[^\s\p{{L}}\p{{M}}\p{{N}}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
            ),
        ),
    ];
    let mut fails = Vec::new();
    let mut check = |pre: &str, pre_tokenizer: Value| {
        let json = serde_json::json!({
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "added_tokens": [],
            "model": {"type": "BPE", "vocab": vocab, "merges": merges},
        });
        let tok = Tokenizer::from_hf_json(&json.to_string(), None)
            .unwrap_or_else(|e| panic!("{pre}: {e}"));
        for (text, want) in texts.iter().zip(fx["ids"][pre].as_array().unwrap()) {
            let want: Vec<u32> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            if tok.encode(text, false, false) != want {
                fails.push(format!("{pre} {text:?}"));
            }
        }
    };
    for (pre, regex) in families {
        let split = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
        check(pre, split);
    }
    check(
        "gpt-2",
        serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}),
    );
    common::report("hf probe", &fails);
}
