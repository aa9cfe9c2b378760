//! Opening a model file for the commands: the GGUF, the backend, the model, its tokenizer
//! and its chat template, with one clear error line when any of them cannot be had.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::KvType;
use neagari_engine::session::Session;
use neagari_formats::{Array, Gguf, Value};
use neagari_model::gguf::GgufSource;
use neagari_model::CausalLm;
use neagari_tokenizer::chat_template::ChatTemplate;
use neagari_tokenizer::{Tokenizer, VocabSpec};

use crate::ModelArgs;

pub struct Loaded {
    pub file: Arc<Gguf>,
    pub file_bytes: u64,
    pub be: CpuBackend,
    pub model: Box<dyn CausalLm<CpuBackend>>,
    pub tokenizer: Tokenizer,
    /// The file's chat template, or its architecture's built-in format.
    pub template: Option<ChatTemplate>,
    /// True when the template is a built-in stand-in for a missing one.
    pub template_builtin: bool,
    pub n_ctx: usize,
    pub n_batch: usize,
    pub kv_type: KvType,
}

pub fn open_gguf(path: &Path) -> Result<Arc<Gguf>> {
    if !path.exists() {
        bail!("model file not found: {}", path.display());
    }
    let g = Gguf::open(path).with_context(|| format!("cannot read {} as GGUF", path.display()))?;
    Ok(Arc::new(g))
}

impl Loaded {
    pub fn open(args: &ModelArgs, want_template: bool) -> Result<Self> {
        let file = open_gguf(&args.model)?;
        let file_bytes = std::fs::metadata(&args.model).map(|m| m.len()).unwrap_or(0);
        let be = CpuBackend::new(&CpuOptions {
            threads: args.threads.unwrap_or_else(neagari_backend::cpu::default_threads),
            scalar_only: false,
        });
        let src = GgufSource::new(file.clone());
        let model = neagari_model::load(&be, &src).with_context(|| format!("cannot load {}", args.model.display()))?;
        let tokenizer = tokenizer_from_gguf(&file).context("cannot build the tokenizer from the file's metadata")?;
        let (template, template_builtin) = if want_template { chat_template(&file, &tokenizer)? } else { (None, false) };
        let n_ctx_train = model.info().n_ctx_train;
        let n_ctx = match args.ctx_size {
            Some(0) | None => n_ctx_train.min(4096),
            Some(n) => n,
        };
        Ok(Loaded {
            file,
            file_bytes,
            be,
            model,
            tokenizer,
            template,
            template_builtin,
            n_ctx,
            n_batch: args.batch_size.max(1),
            kv_type: args.kv_type,
        })
    }

    pub fn session(&self, n_ctx: usize) -> Result<Session<CpuBackend>> {
        Ok(Session::new(self.model.as_ref(), &self.be, n_ctx, self.kv_type)?)
    }
}

fn meta_str(g: &Gguf, key: &str) -> Option<String> {
    g.get(key).and_then(|v| v.as_str()).map(str::to_string)
}

fn meta_u32(g: &Gguf, key: &str) -> Option<u32> {
    g.get(key).and_then(|v| v.as_int()).and_then(|i| u32::try_from(i).ok())
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
    let token_types = match g.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
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
        bos: meta_u32(g, "tokenizer.ggml.bos_token_id"),
        eos: meta_u32(g, "tokenizer.ggml.eos_token_id"),
        eot: meta_u32(g, "tokenizer.ggml.eot_token_id"),
        eom: meta_u32(g, "tokenizer.ggml.eom_token_id"),
        unk: meta_u32(g, "tokenizer.ggml.unknown_token_id"),
        pad: meta_u32(g, "tokenizer.ggml.padding_token_id"),
        add_bos: meta_bool(g, "tokenizer.ggml.add_bos_token"),
        add_eos: meta_bool(g, "tokenizer.ggml.add_eos_token"),
        add_space_prefix: meta_bool(g, "tokenizer.ggml.add_space_prefix"),
        general_name: meta_str(g, "general.name"),
        ..Default::default()
    };
    Ok(Tokenizer::from_spec(spec)?)
}

fn chat_template(g: &Gguf, tok: &Tokenizer) -> Result<(Option<ChatTemplate>, bool)> {
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(&tok.token_to_piece(i, true)).into_owned()).unwrap_or_default()
    };
    let (bos, eos) = (piece(tok.bos()), piece(tok.eos()));
    if let Some(src) = meta_str(g, "tokenizer.chat_template") {
        let t = ChatTemplate::new(&src, &bos, &eos).context("the file's chat template does not compile")?;
        return Ok((Some(t), false));
    }
    let arch = meta_str(g, "general.architecture").unwrap_or_default();
    match neagari_tokenizer::chat_template::detect_builtin(&arch, None) {
        Some(name) => Ok((Some(ChatTemplate::builtin(name, &bos, &eos)?), true)),
        None => Ok((None, false)),
    }
}

/// Peak resident memory of this process (VmHWM), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else { return 0 };
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
