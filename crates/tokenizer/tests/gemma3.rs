//! Gemma 3 (SPM) against llama.cpp: the committed fixture (scripts/tokenizer_reference.py)
//! and the examples of TOKENIZERS.md §6. The vocabulary is read from the real GGUF named by
//! NEAGARI_TEST_MODEL; without it the tests print a note and pass vacuously.

mod common;

use std::path::PathBuf;
use std::time::Instant;

use neagari_tokenizer::{StreamDecoder, Tokenizer};

fn model() -> Option<PathBuf> {
    match std::env::var_os("NEAGARI_TEST_MODEL").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        _ => {
            eprintln!("NOTE: NEAGARI_TEST_MODEL unset or missing; skipping Gemma 3 tokenizer test");
            None
        }
    }
}

fn tokenizer() -> Option<Tokenizer> {
    let path = model()?;
    Some(Tokenizer::from_spec(common::spec_from_gguf(&path)).expect("build Gemma 3 tokenizer"))
}

#[test]
fn gemma3_matches_llama_cpp_fixture() {
    let Some(tok) = tokenizer() else { return };
    let fx = common::load_fixture("gemma3");
    common::report("gemma3", &common::compare_fixture(&tok, &fx, &common::ALL));
}

/// The llama-tokenize outputs listed in TOKENIZERS.md §6 (BOS added, parse_special on).
#[test]
fn gemma3_reference_examples() {
    let Some(tok) = tokenizer() else { return };
    let cases: &[(&[u8], &[u32])] = &[
        (b"Hello world", &[2, 9259, 1902]),
        (b" Hello", &[2, 26352]),
        (b"Hello  world", &[2, 9259, 138, 12392]),
        (b"line1\nline2", &[2, 1257, 236770, 107, 1257, 236778]),
        (b"\n\n\n", &[2, 109]),
        (b"\tindent", &[2, 255968, 32699]),
        ("emoji 😀".as_bytes(), &[2, 67906, 163543]),
        ("你好，世界".as_bytes(), &[2, 144626, 236900, 12811]),
        (
            b"The year 2025 costs $3.50!",
            &[
                2, 818, 1051, 236743, 236778, 236771, 236778, 236810, 5384, 609, 236800, 236761,
                236810, 236771, 236888,
            ],
        ),
        (
            b"<start_of_turn>user\nHi<end_of_turn>\n",
            &[2, 105, 2364, 107, 10979, 106, 107],
        ),
        (&[b' '; 32], &[2, 167, 236743]),
        ("𝕏".as_bytes(), &[2, 478, 395, 387, 381]),
        (b"Hello\r\n", &[2, 9259, 251, 107]),
        (b"<b>bold</b>", &[2, 200, 15640, 209]),
        (b"", &[2]),
        (&[0xE3, 0x61, 0x62], &[2, 465, 335, 336]),
    ];
    for (text, want) in cases {
        assert_eq!(
            &tok.encode_bytes(text, true, true),
            want,
            "{:?}",
            String::from_utf8_lossy(text)
        );
    }
    assert_eq!(
        tok.encode("<start_of_turn>user\nHi<end_of_turn>\n", true, false),
        [
            2, 236820, 3041, 236779, 1340, 236779, 887, 236813, 2364, 107, 10979, 236820, 643,
            236779, 1340, 236779, 887, 236813, 107
        ]
    );
    assert_eq!(
        tok.encode("<s>x</s>", true, false),
        [2, 203, 236781, 954, 236751, 236813]
    );
    assert_eq!(tok.encode("<b>bold</b>", true, false), [2, 200, 15640, 209]);
    assert!(tok.is_eog(1) && tok.is_eog(106) && tok.is_eog(212) && !tok.is_eog(2));
    assert_eq!(
        (tok.bos(), tok.eos(), tok.eot()),
        (Some(2), Some(1), Some(106))
    );
    assert_eq!(tok.find_token("<end_of_turn>"), Some(106));
    assert_eq!(tok.token_text(236743), Some("▁".as_bytes()));
}

#[test]
fn gemma3_stream_decoder_holds_back_byte_tokens() {
    let Some(tok) = tokenizer() else { return };
    let ids = tok.encode("a𝕏b <end_of_turn>", false, true);
    let mut d = StreamDecoder::new(false);
    let mut parts = Vec::new();
    for &id in &ids {
        parts.push(d.push(&tok, id));
    }
    parts.push(d.finish());
    // no part may contain a broken character, and together they are the detokenized text
    assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')), "{parts:?}");
    assert_eq!(parts.concat(), tok.decode(&ids));
    assert_eq!(parts.concat(), "a𝕏b ");
}

#[test]
fn gemma3_encode_20kb_is_fast() {
    let Some(path) = model() else { return };
    let spec = common::spec_from_gguf(&path);
    let t = Instant::now();
    let tok = Tokenizer::from_spec(spec).expect("build Gemma 3 tokenizer");
    eprintln!(
        "gemma3: from_spec {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    let text = common::perf_text();
    let _ = tok.encode(&text, true, true);
    let t = Instant::now();
    let ids = tok.encode(&text, true, true);
    let dt = t.elapsed();
    eprintln!(
        "gemma3: {} bytes → {} tokens in {:.2} ms",
        text.len(),
        ids.len(),
        dt.as_secs_f64() * 1e3
    );
    assert_eq!(tok.decode(&ids), text);
    assert!(dt.as_millis() < 200, "encoding 20 KB took {dt:?}");
}
