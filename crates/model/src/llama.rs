//! The Llama family as GGUF stores it: `llama` (Llama 2/3; llama.cpp's converter permuted
//! q/k so the GPT-J RoPE pairing applies), `qwen2` (q/k/v biases, NeoX RoPE) and `qwen3`
//! (per-head q/k RMSNorm before NeoX RoPE, explicit head_dim). Pre-norm blocks, GQA,
//! SwiGLU MLP, optional tied output head and Llama 3.1 `rope_freqs`.

use neagari_backend::{Attn, Backend, GluAct, KvShape, KvType, QkPrep, Rope};

use crate::source::{ModelSource, SourceExt};
use crate::{check_room, CausalLm, ModelError, ModelInfo, OutputHead, Result};

/// Hyper-parameters, from `{arch}.*` metadata.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    pub rope: Rope,
}

impl Config {
    pub fn from_source(src: &dyn ModelSource) -> Result<Self> {
        let arch = src.architecture()?;
        let k = |s: &str| format!("{arch}.{s}");
        let n_layers = src.usize(&k("block_count"))?;
        let n_embd = src.usize(&k("embedding_length"))?;
        let n_heads = src.usize(&k("attention.head_count"))?;
        let n_kv_heads = src.usize_or(&k("attention.head_count_kv"), n_heads)?;
        let head_dim = src.usize_or(&k("attention.key_length"), n_embd / n_heads.max(1))?;
        if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 || head_dim == 0 {
            return Err(ModelError::BadKey {
                key: k("attention.head_count"),
                msg: format!("{n_heads} heads, {n_kv_heads} KV heads, head_dim {head_dim}"),
            });
        }
        let n_ctx_train = src.usize_or(&k("context_length"), 4096)?;
        let rope_dims = src.usize_or(&k("rope.dimension_count"), head_dim)?;
        // An HF llama checkpoint keeps q/k unpermuted (NeoX pairing); see hf.rs.
        let neox = arch != "llama" || src.bool_opt("neagari.rope_neox")?.unwrap_or(false);
        let mut rope = Rope::plain(rope_dims, src.f32_or(&k("rope.freq_base"), 10_000.0)?, neox);
        let factor = src.f32_opt(&k("rope.scaling.factor"))?.filter(|&f| f > 0.0);
        rope.attn_factor = src.f32_or(&k("rope.scaling.attn_factor"), 1.0)?;
        match src.str_opt(&k("rope.scaling.type"))?.as_deref() {
            None | Some("none") => {}
            Some("linear") => rope.freq_scale = 1.0 / factor.unwrap_or(1.0),
            Some("yarn") => {
                let f = factor.unwrap_or(1.0);
                rope.freq_scale = 1.0 / f;
                rope.ext_factor = 1.0;
                rope.n_ctx_orig =
                    src.usize_or(&k("rope.scaling.original_context_length"), n_ctx_train)?;
                rope.beta_fast = src.f32_or(&k("rope.scaling.yarn_beta_fast"), 32.0)?;
                rope.beta_slow = src.f32_or(&k("rope.scaling.yarn_beta_slow"), 1.0)?;
                if src
                    .f32_opt(&k("rope.scaling.yarn_log_multiplier"))?
                    .is_some_and(|m| m != 0.0)
                {
                    return Err(ModelError::Unsupported(
                        "YaRN with a log multiplier (DeepSeek-style mscale)".into(),
                    ));
                }
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "{arch} RoPE scaling '{other}'"
                )))
            }
        }
        let emb = src.require("token_embd.weight")?;
        Ok(Config {
            n_layers,
            n_embd,
            n_ff: src.usize(&k("feed_forward_length"))?,
            n_heads,
            n_kv_heads,
            head_dim,
            n_vocab: emb.shape.first().copied().unwrap_or(0),
            n_ctx_train,
            eps: src.f32_or(&k("attention.layer_norm_rms_epsilon"), 1e-5)?,
            rope,
            arch,
        })
    }
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Mat,
    wk: B::Mat,
    wv: B::Mat,
    /// qwen2: biases of the q/k/v projections.
    bq: Option<B::Vector>,
    bk: Option<B::Vector>,
    bv: Option<B::Vector>,
    /// qwen3: per-head RMSNorm of q and k.
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    wo: B::Mat,
    ffn_norm: B::Vector,
    gate: B::Mat,
    up: B::Mat,
    down: B::Mat,
}

pub struct Llama<B: Backend> {
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Mat,
    output: Option<B::Mat>,
    output_norm: B::Vector,
    rope_freqs: Option<B::Vector>,
    layers: Vec<Layer<B>>,
}

impl<B: Backend> Llama<B> {
    pub fn load(be: &B, src: &dyn ModelSource) -> Result<Self> {
        let cfg = Config::from_source(src)?;
        let (h, hd) = (cfg.n_embd, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let tok_embd = src.mat(be, "token_embd.weight", &[cfg.n_vocab, h])?;
        let output = match src.tensor("output.weight") {
            Some(_) => Some(src.mat(be, "output.weight", &[cfg.n_vocab, h])?),
            None => None,
        };
        let rope_freqs = src.vector_opt(be, "rope_freqs.weight", cfg.rope.dims / 2)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let b = |s: &str| format!("blk.{i}.{s}.bias");
            layers.push(Layer {
                attn_norm: src.vector(be, &n("attn_norm"), h)?,
                wq: src.mat(be, &n("attn_q"), &[q_dim, h])?,
                wk: src.mat(be, &n("attn_k"), &[kv_dim, h])?,
                wv: src.mat(be, &n("attn_v"), &[kv_dim, h])?,
                bq: src.vector_opt(be, &b("attn_q"), q_dim)?,
                bk: src.vector_opt(be, &b("attn_k"), kv_dim)?,
                bv: src.vector_opt(be, &b("attn_v"), kv_dim)?,
                q_norm: src.vector_opt(be, &n("attn_q_norm"), hd)?,
                k_norm: src.vector_opt(be, &n("attn_k_norm"), hd)?,
                wo: src.mat(be, &n("attn_output"), &[h, q_dim])?,
                ffn_norm: src.vector(be, &n("ffn_norm"), h)?,
                gate: src.mat(be, &n("ffn_gate"), &[cfg.n_ff, h])?,
                up: src.mat(be, &n("ffn_up"), &[cfg.n_ff, h])?,
                down: src.mat(be, &n("ffn_down"), &[h, cfg.n_ff])?,
            });
        }
        let output_norm = src.vector(be, "output_norm.weight", h)?;
        let mut decode_bytes = be.mat_bytes(output.as_ref().unwrap_or(&tok_embd));
        for l in &layers {
            be.prepare_multi(&[&l.wq, &l.wk, &l.wv])?;
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down] {
                decode_bytes += be.mat_bytes(m);
            }
        }
        let weight_bytes = decode_bytes
            + if output.is_some() {
                be.mat_bytes(&tok_embd)
            } else {
                0
            };
        let info = ModelInfo {
            arch: cfg.arch.clone(),
            name: src
                .str_opt("general.name")?
                .unwrap_or_else(|| cfg.arch.clone()),
            n_vocab: cfg.n_vocab,
            n_ctx_train: cfg.n_ctx_train,
            n_layers: cfg.n_layers,
            n_embd: h,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            decode_bytes,
            weight_bytes,
            n_kv_layers: cfg.n_layers,
            rec_bytes: 0,
        };
        Ok(Llama {
            cfg,
            info,
            tok_embd,
            output,
            output_norm,
            rope_freqs,
            layers,
        })
    }
}

impl<B: Backend> Llama<B> {
    /// The final norm and vocabulary projection (the embedding table when tied).
    fn head(&self) -> OutputHead<'_, B> {
        OutputHead {
            norm: &self.output_norm,
            eps: self.cfg.eps,
            mat: self.output.as_ref().unwrap_or(&self.tok_embd),
            n_vocab: self.cfg.n_vocab,
            softcap: None,
        }
    }
}

impl<B: Backend> CausalLm<B> for Llama<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_kv(&self, be: &B, n_ctx: usize, ty: KvType) -> Result<B::Kv> {
        Ok(be.kv_alloc(&KvShape {
            n_layers: self.cfg.n_layers,
            n_ctx,
            n_kv_heads: self.cfg.n_kv_heads,
            head_dim: self.cfg.head_dim,
            ty,
        })?)
    }

    fn forward(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<f32>> {
        let x = self.hidden(be, kv, tokens)?;
        self.head().logits(be, &x, all_logits)
    }

    fn hidden_head(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        _every_row: bool,
    ) -> Result<Option<(B::Buf, OutputHead<'_, B>)>> {
        Ok(Some((self.hidden(be, kv, tokens)?, self.head())))
    }
}

impl<B: Backend> Llama<B> {
    /// The layers: runs `tokens` after what `kv` holds and returns the residual stream
    /// `[n, H]` before the output norm.
    fn hidden(&self, be: &B, kv: &mut B::Kv, tokens: &[u32]) -> Result<B::Buf> {
        let c = &self.cfg;
        let n = tokens.len();
        let pos0 = be.kv_len(kv);
        check_room(pos0, n, be.kv_capacity(kv))?;
        let hd = c.head_dim;
        let attn = Attn {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
        };

        let mut x = be.buf(n, c.n_embd)?; // [n, H] residual stream
        be.embed(&self.tok_embd, tokens, 1.0, &mut x)?;
        let mut xn = be.buf(n, c.n_embd)?; // [n, H]
        let mut q = be.buf(n, c.n_heads * hd)?; // [n, n_heads·hd]
        let mut k = be.buf(n, c.n_kv_heads * hd)?; // [n, n_kv·hd]
        let mut v = be.buf(n, c.n_kv_heads * hd)?; // [n, n_kv·hd]
        let mut att = be.buf(n, c.n_heads * hd)?; // [n, n_heads·hd]
        let mut o = be.buf(n, c.n_embd)?; // [n, H]
        let mut gate = be.buf(n, c.n_ff)?; // [n, F]
        let mut up = be.buf(n, c.n_ff)?; // [n, F]

        if let Some(l) = self.layers.first() {
            be.rms_norm(&x, &l.attn_norm, c.eps, &mut xn)?;
        }
        for (il, l) in self.layers.iter().enumerate() {
            if il == 0 {
                be.matmul_multi(&[&l.wq, &l.wk, &l.wv], &xn, &mut [&mut q, &mut k, &mut v])?;
            } else {
                // The residual add of the layer before's output and this layer's input norm,
                // in one call with the projections that read it (Backend::add_rms_norm_matmul).
                be.prefetch(&[&l.wq, &l.wk])?;
                be.add_rms_norm_matmul(
                    &mut x,
                    &o,
                    &l.attn_norm,
                    c.eps,
                    &mut xn,
                    &[&l.wq, &l.wk, &l.wv],
                    &mut [&mut q, &mut k, &mut v],
                )?;
            }
            for (buf, bias) in [(&mut q, &l.bq), (&mut k, &l.bk), (&mut v, &l.bv)] {
                if let Some(b) = bias {
                    be.add_bias(buf, b)?;
                }
            }
            let prep = QkPrep {
                q_norm: l.q_norm.as_ref(),
                k_norm: l.k_norm.as_ref(),
                eps: c.eps,
                rope_q: &c.rope,
                rope_k: &c.rope,
                freq_factors: self.rope_freqs.as_ref(),
            };
            be.attention_block(
                kv, il, pos0, &mut q, false, &mut k, &v, &prep, &attn, &mut att,
            )?;
            be.matmul(&l.wo, &att, &mut o)?;
            // Each norm (and the GLU) is told which matrices the GEMV after it reads.
            be.prefetch(&[&l.gate, &l.up])?;
            be.add_rms_norm_matmul_glu(
                &mut x,
                &o,
                &l.ffn_norm,
                c.eps,
                &mut xn,
                (&l.gate, &l.up, &[&l.down]),
                GluAct::Silu,
                &mut gate,
                &mut up,
            )?;
            be.matmul(&l.down, &gate, &mut o)?;
        }
        if !self.layers.is_empty() {
            be.add(&mut x, &o)?;
        }
        be.kv_commit(kv, pos0 + n)?;
        Ok(x)
    }
}
