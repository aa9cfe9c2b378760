//! From a GGUF file to what the engine runs: the tokenizer built from `tokenizer.ggml.*`
//! metadata and the chat template (the file's, or its architecture's built-in format).

use anyhow::{bail, Context, Result};
use neagari_formats::{Array, Gguf, Value};
use neagari_tokenizer::chat_template::ChatTemplate;
use neagari_tokenizer::{Tokenizer, VocabSpec};

fn meta_str(g: &Gguf, key: &str) -> Option<String> {
    g.get(key).and_then(|v| v.as_str()).map(str::to_string)
}

fn meta_u32(g: &Gguf, key: &str) -> Option<u32> {
    g.get(key)
        .and_then(|v| v.as_int())
        .and_then(|i| u32::try_from(i).ok())
}

fn meta_bool(g: &Gguf, key: &str) -> Option<bool> {
    match g.get(key) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

/// The `tokenizer.ggml.*` keys as the tokenizer crate wants them.
pub fn tokenizer_from_gguf(g: &Gguf) -> Result<Tokenizer> {
    let model = meta_str(g, "tokenizer.ggml.model").context("missing tokenizer.ggml.model")?;
    let tokens = match g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        Some(Array::String(s)) => s.clone(),
        _ => bail!("missing or malformed tokenizer.ggml.tokens"),
    };
    let scores = match g.get("tokenizer.ggml.scores").and_then(|v| v.as_array()) {
        Some(Array::F32(s)) => Some(s.clone()),
        Some(Array::I32(s)) => Some(s.iter().map(|&x| x as f32).collect()),
        _ => None,
    };
    let token_types = match g
        .get("tokenizer.ggml.token_type")
        .and_then(|v| v.as_array())
    {
        Some(Array::I32(s)) => Some(s.clone()),
        Some(Array::U32(s)) => Some(s.iter().map(|&x| x as i32).collect()),
        _ => None,
    };
    let merges = match g.get("tokenizer.ggml.merges").and_then(|v| v.as_array()) {
        Some(Array::String(s)) => Some(s.clone()),
        _ => None,
    };
    let spec = VocabSpec {
        model,
        pre: meta_str(g, "tokenizer.ggml.pre"),
        tokens,
        scores,
        token_types,
        merges,
        bos_id: meta_u32(g, "tokenizer.ggml.bos_token_id"),
        eos_id: meta_u32(g, "tokenizer.ggml.eos_token_id"),
        eot_id: meta_u32(g, "tokenizer.ggml.eot_token_id"),
        eom_id: meta_u32(g, "tokenizer.ggml.eom_token_id"),
        unk_id: meta_u32(g, "tokenizer.ggml.unknown_token_id"),
        pad_id: meta_u32(g, "tokenizer.ggml.padding_token_id"),
        add_bos: meta_bool(g, "tokenizer.ggml.add_bos_token"),
        add_eos: meta_bool(g, "tokenizer.ggml.add_eos_token"),
        add_space_prefix: meta_bool(g, "tokenizer.ggml.add_space_prefix"),
        general_name: meta_str(g, "general.name"),
        general_architecture: meta_str(g, "general.architecture"),
        ..Default::default()
    };
    Ok(Tokenizer::from_spec(spec)?)
}

/// The file's chat template, or the built-in format of its architecture (then `true`).
pub fn chat_template(g: &Gguf, tok: &Tokenizer) -> Result<(Option<ChatTemplate>, bool)> {
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i, true)).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    if let Some(src) = meta_str(g, "tokenizer.chat_template") {
        let t = ChatTemplate::new(&src, &bos, &eos)
            .context("the file's chat template does not compile")?;
        return Ok((Some(t), false));
    }
    let arch = meta_str(g, "general.architecture").unwrap_or_default();
    match neagari_tokenizer::chat_template::detect_builtin(&arch, None) {
        Some(format) => Ok((Some(ChatTemplate::from_builtin(format)), true)),
        None => Ok((None, false)),
    }
}
