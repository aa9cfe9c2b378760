//! Test support: a minimal GGUF metadata reader (only what a [`VocabSpec`] needs, so the
//! tokenizer tests do not depend on the formats crate) and the llama.cpp fixture checker.
#![allow(dead_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use neagari_tokenizer::{Tokenizer, VocabSpec};
use serde_json::Value;

/// One GGUF metadata value (arrays of scalars / strings only as far as tokenizers use them).
#[derive(Debug, Clone)]
pub enum Meta {
    U64(u64),
    I64(i64),
    F64(f64),
    Bool(bool),
    Str(String),
    ArrStr(Vec<String>),
    ArrF32(Vec<f32>),
    ArrI32(Vec<i32>),
    ArrOther,
}

struct R<T: Read>(T);

impl<T: Read> R<T> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        self.0.read_exact(&mut b).expect("truncated GGUF");
        b
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        let mut v = vec![0u8; n];
        self.0.read_exact(&mut v).expect("truncated GGUF string");
        String::from_utf8(v).expect("GGUF strings in these files are UTF-8")
    }
    fn scalar(&mut self, ty: u32) -> Meta {
        match ty {
            0 => Meta::U64(self.bytes::<1>()[0] as u64),
            1 => Meta::I64(self.bytes::<1>()[0] as i8 as i64),
            2 => Meta::U64(u16::from_le_bytes(self.bytes()) as u64),
            3 => Meta::I64(i16::from_le_bytes(self.bytes()) as i64),
            4 => Meta::U64(self.u32() as u64),
            5 => Meta::I64(i32::from_le_bytes(self.bytes()) as i64),
            6 => Meta::F64(f32::from_le_bytes(self.bytes()) as f64),
            7 => Meta::Bool(self.bytes::<1>()[0] != 0),
            8 => Meta::Str(self.string()),
            10 => Meta::U64(self.u64()),
            11 => Meta::I64(i64::from_le_bytes(self.bytes())),
            12 => Meta::F64(f64::from_le_bytes(self.bytes())),
            _ => panic!("unknown GGUF type {ty}"),
        }
    }
    fn value(&mut self, ty: u32) -> Meta {
        if ty != 9 {
            return self.scalar(ty);
        }
        let ety = self.u32();
        let n = self.u64() as usize;
        match ety {
            8 => Meta::ArrStr((0..n).map(|_| self.string()).collect()),
            6 => Meta::ArrF32((0..n).map(|_| f32::from_le_bytes(self.bytes())).collect()),
            5 => Meta::ArrI32((0..n).map(|_| i32::from_le_bytes(self.bytes())).collect()),
            _ => {
                for _ in 0..n {
                    self.value(ety);
                }
                Meta::ArrOther
            }
        }
    }
}

/// Reads all metadata key/values of a GGUF file (stops before the tensor infos).
pub fn read_gguf_meta(path: &Path) -> HashMap<String, Meta> {
    let mut r = R(BufReader::new(File::open(path).expect("open GGUF")));
    assert_eq!(&r.bytes::<4>(), b"GGUF", "not a GGUF file");
    let version = r.u32();
    assert!(version >= 2, "GGUF v{version} not supported here");
    let _n_tensors = r.u64();
    let n_kv = r.u64();
    let mut out = HashMap::new();
    for _ in 0..n_kv {
        let key = r.string();
        let ty = r.u32();
        let v = r.value(ty);
        out.insert(key, v);
    }
    out
}

/// `tokenizer.ggml.*` (and the two `general.*` keys) → VocabSpec.
pub fn spec_from_gguf(path: &Path) -> VocabSpec {
    let m = read_gguf_meta(path);
    let s = |k: &str| match m.get(k) {
        Some(Meta::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id = |k: &str| match m.get(&format!("tokenizer.ggml.{k}")) {
        Some(Meta::U64(v)) => Some(*v as u32),
        Some(Meta::I64(v)) => Some(*v as u32),
        _ => None,
    };
    let b = |k: &str| match m.get(&format!("tokenizer.ggml.{k}")) {
        Some(Meta::Bool(v)) => Some(*v),
        _ => None,
    };
    VocabSpec {
        model: s("tokenizer.ggml.model").expect("tokenizer.ggml.model"),
        pre: s("tokenizer.ggml.pre"),
        tokens: match m.get("tokenizer.ggml.tokens") {
            Some(Meta::ArrStr(v)) => v.clone(),
            _ => panic!("no tokenizer.ggml.tokens"),
        },
        scores: match m.get("tokenizer.ggml.scores") {
            Some(Meta::ArrF32(v)) => Some(v.clone()),
            Some(Meta::ArrI32(v)) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        },
        token_types: match m.get("tokenizer.ggml.token_type") {
            Some(Meta::ArrI32(v)) => Some(v.clone()),
            _ => None,
        },
        merges: match m.get("tokenizer.ggml.merges") {
            Some(Meta::ArrStr(v)) => Some(v.clone()),
            _ => None,
        },
        bos_id: id("bos_token_id"),
        eos_id: id("eos_token_id"),
        eot_id: id("eot_token_id"),
        eom_id: id("eom_token_id"),
        unk_id: id("unknown_token_id"),
        pad_id: id("padding_token_id"),
        sep_id: id("seperator_token_id"),
        mask_id: id("mask_token_id"),
        fim_pre_id: id("fim_pre_token_id"),
        fim_suf_id: id("fim_suf_token_id"),
        fim_mid_id: id("fim_mid_token_id"),
        fim_pad_id: id("fim_pad_token_id"),
        fim_rep_id: id("fim_rep_token_id"),
        fim_sep_id: id("fim_sep_token_id"),
        add_bos: b("add_bos_token"),
        add_eos: b("add_eos_token"),
        add_space_prefix: b("add_space_prefix"),
        general_name: s("general.name"),
        general_architecture: s("general.architecture"),
    }
}

pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

pub fn load_fixture(name: &str) -> Value {
    let path = fixtures_dir().join(format!("{name}_tokens.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("read fixture"))
        .expect("parse fixture")
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn opt_id(v: &Value) -> Option<u32> {
    v.as_u64().map(|x| x as u32)
}

/// Which parts of a fixture to compare.
pub struct Check {
    pub tokens: bool,
    pub detok: bool,
    pub pieces: bool,
    pub specials: bool,
}

pub const ALL: Check = Check {
    tokens: true,
    detok: true,
    pieces: true,
    specials: true,
};

/// Compares a tokenizer with a llama.cpp fixture; returns the list of mismatches.
pub fn compare_fixture(tok: &Tokenizer, fx: &Value, what: &Check) -> Vec<String> {
    let mut fails = Vec::new();
    let show = |b: &[u8]| format!("{:?}", String::from_utf8_lossy(b));
    if what.specials {
        if tok.n_vocab() as u64 != fx["n_vocab"].as_u64().unwrap() {
            fails.push(format!("n_vocab {} vs {}", tok.n_vocab(), fx["n_vocab"]));
        }
        for (name, ours) in [("bos", tok.bos()), ("eos", tok.eos()), ("eot", tok.eot())] {
            if ours != opt_id(&fx[name]) {
                fails.push(format!("{name}: ours {ours:?} llama.cpp {}", fx[name]));
            }
        }
        let eog = ids(&fx["eog"]);
        if tok.eog_ids() != eog {
            fails.push(format!("eog: ours {:?} llama.cpp {eog:?}", tok.eog_ids()));
        }
    }
    for case in fx["cases"].as_array().unwrap() {
        let text = hex(case["text_hex"].as_str().unwrap());
        let add = case["add_special"].as_bool().unwrap();
        let parse = case["parse_special"].as_bool().unwrap();
        let want = ids(&case["ids"]);
        if what.tokens {
            let got = tok.encode_bytes(&text, add, parse);
            if got != want {
                fails.push(format!(
                    "encode {} (add_special={add}, parse_special={parse}):\n   ours     {got:?}\n   llama.cpp {want:?}",
                    show(&text)
                ));
            }
        }
        if what.detok {
            for (key, rs, us) in [
                ("detok_hex", false, false),
                ("detok_special_hex", true, true),
            ] {
                let want_text = hex(case[key].as_str().unwrap());
                let got = tok.detokenize(&want, rs, us);
                if got != want_text {
                    fails.push(format!(
                        "detokenize {want:?} (remove_special={rs}, unparse_special={us}): ours {} llama.cpp {}",
                        show(&got),
                        show(&want_text)
                    ));
                }
            }
        }
    }
    if what.pieces {
        for p in fx["pieces"].as_array().unwrap() {
            let id = p[0].as_u64().unwrap() as u32;
            for (k, special) in [(1, false), (2, true)] {
                let want = hex(p[k].as_str().unwrap());
                let got = tok.token_to_piece(id, special);
                if got != want {
                    fails.push(format!(
                        "piece {id} special={special}: ours {got:?} llama.cpp {want:?}"
                    ));
                }
            }
        }
    }
    fails
}

pub fn report(name: &str, fails: &[String]) {
    for f in fails.iter().take(25) {
        eprintln!("[{name}] {f}");
    }
    assert!(
        fails.is_empty(),
        "{name}: {} mismatches with llama.cpp (first ones above)",
        fails.len()
    );
}

/// llama.cpp's test-tokenizer-0 vectors: `.inp` split on `\n__ggml_vocab_test__\n`, `.out`
/// one line of ids per input; tokenized with add_special = parse_special = false.
pub fn conformance(tok: &Tokenizer, gguf: &Path) -> (usize, Vec<String>) {
    let inp = std::fs::read(gguf.with_extension("gguf.inp")).expect("read .inp");
    let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).expect("read .out");
    let sep = b"\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match memchr::memmem::find(&inp[pos..], sep) {
            Some(rel) => {
                inputs.push(inp[pos..pos + rel].to_vec());
                pos += rel + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_vec());
                break;
            }
        }
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{}: .inp/.out count mismatch",
        gguf.display()
    );
    let mut fails = Vec::new();
    for (text, want) in inputs.iter().zip(&outputs) {
        let got = tok.encode_bytes(text, false, false);
        if &got != want {
            fails.push(format!(
                "{:?}:\n   ours      {got:?}\n   expected  {want:?}",
                String::from_utf8_lossy(text)
            ));
        }
    }
    (inputs.len(), fails)
}

/// ~20 KB of mixed text for timing.
pub fn perf_text() -> String {
    let unit = "The quick brown fox jumps over the lazy dog; it's 12:34 and costs $5.99!\n\
                def f(x):\n    return x ** 2  # comment\n\
                日本語のテキストと中文，한국어. Ελληνικά русский 😀👍\n    \t  spaces\n";
    let mut s = String::new();
    while s.len() < 20_000 {
        s.push_str(unit);
    }
    s
}
