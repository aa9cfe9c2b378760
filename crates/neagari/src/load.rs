//! Opening a model file for the commands: the GGUF, the backend, the model, its tokenizer
//! and its chat template, with one clear error line when any of them cannot be had.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::KvType;
use neagari_engine::loader::{chat_template, tokenizer_from_gguf};
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::CausalLm;
use neagari_tokenizer::chat_template::ChatTemplate;
use neagari_tokenizer::Tokenizer;

use crate::ModelArgs;

pub struct Loaded {
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
            threads: args
                .threads
                .unwrap_or_else(neagari_backend::cpu::default_threads),
            scalar_only: false,
        });
        let src = GgufSource::new(file.clone());
        let model = neagari_model::load(&be, &src)
            .with_context(|| format!("cannot load {}", args.model.display()))?;
        let tokenizer = tokenizer_from_gguf(&file)
            .context("cannot build the tokenizer from the file's metadata")?;
        let (template, template_builtin) = if want_template {
            chat_template(&file, &tokenizer)?
        } else {
            (None, false)
        };
        let n_ctx_train = model.info().n_ctx_train;
        let n_ctx = match args.ctx_size {
            Some(0) | None => n_ctx_train.min(4096),
            Some(n) => n,
        };
        Ok(Loaded {
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
        Ok(Session::new(
            self.model.as_ref(),
            &self.be,
            n_ctx,
            self.kv_type,
        )?)
    }
}

/// Peak resident memory of this process (VmHWM), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}
