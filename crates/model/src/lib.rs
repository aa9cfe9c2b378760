//! Architectures: config → weights → forward pass, one file per family. A model is written
//! once against `neagari_backend::Backend` and never knows which device runs it.
//!
//! `source` is the narrow view of a weights file the models read (metadata and tensors), so
//! the same model code loads from GGUF now and from safetensors packs later.

mod dump;
pub mod gemma3;
pub mod gguf;
pub mod hadamard;
pub mod hf;
pub mod llama;
pub mod qwen35;
pub mod source;
pub mod synth;

use neagari_backend::{Backend, BackendError, Candidates, KvType, Penalties, Settles};

pub use source::ModelSource;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("architecture '{0}' is not supported (supported: llama, qwen2, qwen3, gemma3, qwen35, qwen35moe, qwen3next, qwen3moe)")]
    UnsupportedArch(String),
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    #[error("metadata key '{key}': {msg}")]
    BadKey { key: String, msg: String },
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {got:?}, expected {want:?}")]
    TensorShape {
        name: String,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("prompt of {tokens} tokens at position {pos} does not fit the context of {n_ctx}")]
    ContextFull {
        tokens: usize,
        pos: usize,
        n_ctx: usize,
    },
    #[error(transparent)]
    Backend(#[from] BackendError),
}

pub type Result<T> = std::result::Result<T, ModelError>;

/// What the engine needs to know about a loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub arch: String,
    pub name: String,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Bytes of weight data read per decoded token (every matrix but the embedding table,
    /// plus the output head).
    pub decode_bytes: usize,
    /// All weight bytes held by the backend.
    pub weight_bytes: usize,
    /// Layers that keep K and V in the cache (a hybrid's attention layers).
    pub n_kv_layers: usize,
    /// Recurrent state bytes of one sequence (a hybrid's conv windows and DeltaNet
    /// states, f32), whatever the context.
    pub rec_bytes: usize,
}

impl ModelInfo {
    /// Bytes of one sequence's cache of `n_ctx` positions of element type `ty` (q8_0: 34
    /// bytes a 32-value block) plus its recurrent state: what `new_kv` allocates, to within
    /// a backend's alignment.
    pub fn kv_bytes(&self, n_ctx: usize, ty: KvType) -> u64 {
        let values = 2 * self.n_kv_layers as u64 * self.n_kv_heads as u64 * self.head_dim as u64;
        let per_pos = match ty {
            KvType::F16 => values * 2,
            KvType::Q8_0 => values / 32 * 34,
            KvType::F32 => values * 4,
        };
        per_pos * n_ctx as u64 + self.rec_bytes as u64
    }
}

/// A causal language model on backend `B`.
pub trait CausalLm<B: Backend>: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// A KV cache for one sequence of up to `n_ctx` positions.
    fn new_kv(&self, be: &B, n_ctx: usize, ty: KvType) -> Result<B::Kv>;

    /// Runs `tokens` at the positions following what `kv` holds and returns logits
    /// `[n_out, n_vocab]` row-major: for the last token only, or for every token when
    /// `all_logits` (perplexity, speculative verify).
    fn forward(&self, be: &B, kv: &mut B::Kv, tokens: &[u32], all_logits: bool)
        -> Result<Vec<f32>>;

    /// Runs `tokens` and returns the residual stream before the output head with the head
    /// itself: every row of it where `every_row`, else at least the last. Families whose
    /// logits come from an [`OutputHead`] (all here) return it, and the `forward_*` picks
    /// below then select on the backend (a device brings back ids or k pairs instead of
    /// the logits); `None` (the default) runs nothing, and they go through `forward`.
    fn hidden_head(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        every_row: bool,
    ) -> Result<Option<(B::Buf, OutputHead<'_, B>)>> {
        let _ = (be, kv, tokens, every_row);
        Ok(None)
    }

    /// Runs `tokens` like `forward` and returns the greedy pick of the last token's logits:
    /// the highest, the lowest id among equals, NaN ignored (the sampler's greedy rule).
    fn forward_greedy(&self, be: &B, kv: &mut B::Kv, tokens: &[u32]) -> Result<u32> {
        if let Some((x, head)) = self.hidden_head(be, kv, tokens, false)? {
            return head.argmax(be, &x);
        }
        let logits = self.forward(be, kv, tokens, false)?;
        Ok(neagari_backend::argmax_host(&logits))
    }

    /// Runs `tokens` like `forward` and returns the `k` best of the last token's logits
    /// after `pen` as (id, logit), highest first, the lowest id among equals, NaN left out:
    /// top-k sampling's candidates (`Sampler::sample_top_k` runs the rest of the chain on
    /// them).
    fn forward_top_k(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        k: usize,
        pen: &Penalties,
    ) -> Result<Vec<(u32, f32)>> {
        if let Some((x, head)) = self.hidden_head(be, kv, tokens, false)? {
            return head.top_k(be, &x, k, pen);
        }
        let mut logits = self.forward(be, kv, tokens, false)?;
        pen.apply(&mut logits);
        Ok(neagari_backend::top_k_host(&logits, k))
    }

    /// Runs `tokens` like `forward` and returns the last token's logits after `pen` as
    /// `Backend::candidates` gives them: the `k` best with the row's softmax sums where
    /// `enough` says those settle the draw, else the whole penalized row (a sampling chain
    /// without a top-k: `Sampler::settles`).
    fn forward_candidates(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        k: usize,
        pen: &Penalties,
        enough: &Settles<'_>,
    ) -> Result<Candidates> {
        if let Some((x, head)) = self.hidden_head(be, kv, tokens, false)? {
            return head.candidates(be, &x, k, pen, enough);
        }
        let mut logits = self.forward(be, kv, tokens, false)?;
        pen.apply(&mut logits);
        Ok(Candidates::All(logits))
    }

    /// Runs `tokens` and returns the greedy pick of every token's logits (the check of a
    /// speculative block's drafts).
    fn forward_greedy_all(&self, be: &B, kv: &mut B::Kv, tokens: &[u32]) -> Result<Vec<u32>> {
        if let Some((x, head)) = self.hidden_head(be, kv, tokens, true)? {
            return head.argmax_rows(be, &x);
        }
        let logits = self.forward(be, kv, tokens, true)?;
        let n_vocab = self.info().n_vocab.max(1);
        Ok(logits
            .chunks(n_vocab)
            .map(neagari_backend::argmax_host)
            .collect())
    }
}

/// Loads the architecture named by the file.
pub fn load<B: Backend>(be: &B, src: &dyn ModelSource) -> Result<Box<dyn CausalLm<B>>> {
    let arch = src.architecture()?;
    match arch.as_str() {
        "llama" | "qwen2" | "qwen3" => Ok(Box::new(llama::Llama::load(be, src)?)),
        "gemma3" => Ok(Box::new(gemma3::Gemma3::load(be, src)?)),
        "qwen35" | "qwen35moe" | "qwen3next" | "qwen3moe" => {
            Ok(Box::new(qwen35::Qwen35::load(be, src)?))
        }
        other => Err(ModelError::UnsupportedArch(other.to_string())),
    }
}

/// Checks that `tokens` fit after `pos` in a cache of `n_ctx`.
pub(crate) fn check_room(pos: usize, tokens: usize, n_ctx: usize) -> Result<()> {
    if tokens == 0 || pos + tokens > n_ctx {
        return Err(ModelError::ContextFull { tokens, pos, n_ctx });
    }
    Ok(())
}

/// The output head shared by the families: the final RMSNorm and the vocabulary projection
/// (optionally soft-capped) of the residual stream `x` (`[n, H]`).
pub struct OutputHead<'a, B: Backend> {
    pub(crate) norm: &'a B::Vector,
    pub(crate) eps: f32,
    pub(crate) mat: &'a B::Mat,
    pub(crate) n_vocab: usize,
    pub(crate) softcap: Option<f32>,
}

impl<B: Backend> OutputHead<'_, B> {
    /// The logits `[rows, n_vocab]` on the device: of every row of `x`, or of its last.
    fn project(&self, be: &B, x: &B::Buf, every_row: bool) -> Result<B::Buf> {
        let (n, h) = be.buf_shape(x);
        let rows = if every_row { n } else { 1 };
        let mut xn = be.buf(rows, h)?; // [rows, H]
        if every_row {
            be.rms_norm(x, self.norm, self.eps, &mut xn)?;
        } else {
            let mut last = be.buf(1, h)?; // [1, H]
            be.copy_row(x, n - 1, &mut last)?;
            be.rms_norm(&last, self.norm, self.eps, &mut xn)?;
        }
        let mut logits = be.buf(rows, self.n_vocab)?; // [rows, vocab]
        be.matmul(self.mat, &xn, &mut logits)?;
        if let Some(cap) = self.softcap {
            be.softcap(&mut logits, cap)?;
        }
        Ok(logits)
    }

    /// The logits of the last row of `x`, or of every row when `all_logits`, on the host
    /// (`[rows, n_vocab]`).
    pub(crate) fn logits(&self, be: &B, x: &B::Buf, all_logits: bool) -> Result<Vec<f32>> {
        let logits = self.project(be, x, all_logits)?;
        let rows = be.buf_shape(&logits).0;
        let mut host = vec![0f32; rows * self.n_vocab];
        be.read(&logits, 0, rows, &mut host)?;
        Ok(host)
    }

    /// The greedy pick of the last row (`Backend::argmax`: only the id comes back).
    pub(crate) fn argmax(&self, be: &B, x: &B::Buf) -> Result<u32> {
        let ids = be.argmax(&self.project(be, x, false)?)?;
        ids.first().copied().ok_or_else(|| {
            ModelError::Backend(neagari_backend::BackendError::Other(
                "argmax returned no row".into(),
            ))
        })
    }

    /// The `k` best logits of the last row after `pen` (`Backend::top_k`: only k pairs
    /// come back).
    pub(crate) fn top_k(
        &self,
        be: &B,
        x: &B::Buf,
        k: usize,
        pen: &Penalties,
    ) -> Result<Vec<(u32, f32)>> {
        let mut rows = be.top_k(&self.project(be, x, false)?, k, pen)?;
        Ok(rows.pop().unwrap_or_default())
    }

    /// `Backend::candidates` of the last row's logits.
    pub(crate) fn candidates(
        &self,
        be: &B,
        x: &B::Buf,
        k: usize,
        pen: &Penalties,
        enough: &Settles<'_>,
    ) -> Result<Candidates> {
        Ok(be.candidates(&self.project(be, x, false)?, k, pen, enough)?)
    }

    /// The greedy pick of every row of `x`.
    pub(crate) fn argmax_rows(&self, be: &B, x: &B::Buf) -> Result<Vec<u32>> {
        Ok(be.argmax(&self.project(be, x, true)?)?)
    }
}
