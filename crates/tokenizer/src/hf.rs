//! Hugging Face `tokenizer.json` (byte-level BPE) → [`VocabSpec`], so HF tokenizers run on
//! the same engine as GGUF vocabularies.
//!
//! The conversion follows what llama.cpp's converter stores in GGUF: ids without a token
//! become `[PAD<id>]` (unused); added tokens are control when `special` (or when they look
//! like `<|…|>`), user-defined otherwise; the pre-tokenizer family is recognised from the
//! split regex (Llama 3, Qwen 2, Qwen 3.5) or plain `ByteLevel` (GPT-2). Other model types
//! and pre-tokenizers are refused rather than approximated. Unlike the converter, a
//! non-normalized added token is not re-encoded through the HF tokenizer first.

use serde_json::Value;

use crate::{Tokenizer, TokenizerError, VocabSpec};

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn err(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::Json(msg.into())
}

/// Reads the `tokenizer.ggml.pre` equivalent from an HF `pre_tokenizer` object.
fn detect_pre(pre: &Value) -> Result<&'static str, TokenizerError> {
    let ty = pre.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "ByteLevel"
            if pre
                .get("use_regex")
                .and_then(Value::as_bool)
                .unwrap_or(true) =>
        {
            Ok("gpt-2")
        }
        "Sequence" => {
            let items = pre
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or_else(|| err("Sequence without items"))?;
            let mut found = None;
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("Split") => {
                        let regex = item
                            .pointer("/pattern/Regex")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        let behavior = item.get("behavior").and_then(Value::as_str).unwrap_or("");
                        let family = match regex {
                            LLAMA3_REGEX => "llama-bpe",
                            QWEN2_REGEX => "qwen2",
                            QWEN35_REGEX => "qwen35",
                            _ => return Err(err(format!("unsupported split regex {regex:?}"))),
                        };
                        if behavior != "Isolated" || found.is_some() {
                            return Err(err("unsupported split behaviour"));
                        }
                        found = Some(family);
                    }
                    Some("ByteLevel")
                        if !item
                            .get("use_regex")
                            .and_then(Value::as_bool)
                            .unwrap_or(true) => {}
                    other => return Err(err(format!("unsupported pre-tokenizer step {other:?}"))),
                }
            }
            found.ok_or_else(|| err("no split regex in pre-tokenizer sequence"))
        }
        other => Err(err(format!("unsupported pre_tokenizer type {other:?}"))),
    }
}

fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
}

/// A special-token entry of `tokenizer_config.json` (a string or `{"content": …}`).
fn config_token(cfg: &Value, key: &str) -> Option<String> {
    match cfg.get(key)? {
        Value::String(s) => Some(s.clone()),
        v => v.get("content").and_then(Value::as_str).map(str::to_string),
    }
}

/// Builds a [`VocabSpec`] from `tokenizer.json` text and, optionally, `tokenizer_config.json`
/// text (for BOS/EOS and `add_bos_token`). Without a config, BOS/EOS are looked up by the
/// usual names (`<|begin_of_text|>`, `<s>`, …).
pub fn spec_from_json(
    tokenizer_json: &str,
    config_json: Option<&str>,
) -> Result<VocabSpec, TokenizerError> {
    let j: Value = serde_json::from_str(tokenizer_json).map_err(|e| err(e.to_string()))?;
    let model = j.get("model").ok_or_else(|| err("no model"))?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(err("only BPE models are supported"));
    }
    if !matches!(j.get("normalizer"), None | Some(Value::Null)) {
        return Err(err("normalizers are not supported"));
    }
    let pre = detect_pre(
        j.get("pre_tokenizer")
            .ok_or_else(|| err("no pre_tokenizer"))?,
    )?;

    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| err("no model.vocab"))?;
    let mut entries: Vec<(u32, String)> = Vec::with_capacity(vocab.len());
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| err("bad vocab id"))?;
        entries.push((id, text.clone()));
    }
    let mut added: Vec<(u32, String, bool)> = Vec::new();
    if let Some(list) = j.get("added_tokens").and_then(Value::as_array) {
        for t in list {
            let id = t
                .get("id")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| err("bad added token id"))?;
            let content = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| err("added token without content"))?;
            let special = t.get("special").and_then(Value::as_bool).unwrap_or(false);
            added.push((id, content.to_string(), special));
        }
    }
    let n = entries
        .iter()
        .map(|e| e.0)
        .chain(added.iter().map(|a| a.0))
        .max()
        .map_or(0, |m| m as usize + 1);
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![5i32; n];
    for (id, text) in entries {
        tokens[id as usize] = Some(text);
        types[id as usize] = 1;
    }
    for (id, text, special) in added {
        let i = id as usize;
        if special || looks_special(&text) {
            types[i] = 3;
            tokens[i] = Some(text);
        } else {
            types[i] = 4;
            tokens[i] = Some(text.replace('\u{2581}', " "));
        }
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();

    let merges = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| err("no model.merges"))?;
    let merges = merges
        .iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(parts) if parts.len() == 2 => {
                let a = parts[0].as_str().ok_or_else(|| err("bad merge"))?;
                let b = parts[1].as_str().ok_or_else(|| err("bad merge"))?;
                Ok(format!("{a} {b}"))
            }
            _ => Err(err("bad merge")),
        })
        .collect::<Result<Vec<_>, _>>()?;

    let find = |name: &str| tokens.iter().position(|t| t == name).map(|i| i as u32);
    let cfg: Option<Value> = config_json
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| err(format!("config: {e}")))?;
    let named =
        |key: &str, fallbacks: &[&str]| match cfg.as_ref().and_then(|c| config_token(c, key)) {
            Some(name) => find(&name),
            None => fallbacks.iter().find_map(|f| find(f)),
        };
    let bos_id = named("bos_token", &["<|begin_of_text|>", "<s>", "<bos>"]);
    let eos_id = named(
        "eos_token",
        &["<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>"],
    );
    let flag = |key: &str| {
        cfg.as_ref()
            .and_then(|c| c.get(key))
            .and_then(Value::as_bool)
    };

    Ok(VocabSpec {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        bos_id,
        eos_id,
        add_bos: flag("add_bos_token"),
        add_eos: flag("add_eos_token"),
        ..Default::default()
    })
}

impl Tokenizer {
    /// Loads an HF `tokenizer.json` (see [`spec_from_json`]).
    pub fn from_hf_json(
        tokenizer_json: &str,
        config_json: Option<&str>,
    ) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(spec_from_json(tokenizer_json, config_json)?)
    }
}
