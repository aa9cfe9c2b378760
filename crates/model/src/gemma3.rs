//! Gemma 3 text (GGUF arch `gemma3`), as llama.cpp runs it (src/models/gemma3.cpp):
//! embeddings scaled by √H; four RMSNorms per layer (the GGUF converter folded Gemma's
//! `1 + w` into the weights); q/k norms before NeoX RoPE; sliding-window layers with their
//! own RoPE base, every sixth layer global; GeGLU MLP; tied output head.

use neagari_backend::{Attn, Backend, GluAct, KvShape, KvType, QkPrep, Rope};

use crate::dump::Dump;
use crate::source::{ModelSource, SourceExt};
use crate::{check_room, CausalLm, ModelError, ModelInfo, OutputHead, Result};

/// Hyper-parameters, from `gemma3.*` metadata.
#[derive(Clone, Debug)]
pub struct Config {
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    /// RoPE of global layers (`rope.freq_base`, linear scaling from `rope.scaling.*`).
    pub rope_global: Rope,
    /// RoPE of sliding-window layers (base `rope.freq_base_swa`, default 10,000, unscaled).
    pub rope_local: Rope,
    /// `Some(window)` for sliding-window layers, per layer.
    pub window: Vec<Option<usize>>,
    pub attn_scale: f32,
    pub final_softcap: Option<f32>,
}

impl Config {
    pub fn from_source(src: &dyn ModelSource) -> Result<Self> {
        let k = |s: &str| format!("gemma3.{s}");
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
        let rope_dims = src.usize_or(&k("rope.dimension_count"), head_dim)?;
        let base = src.f32_or(&k("rope.freq_base"), 10_000.0)?;
        let base_swa = src.f32_or(&k("rope.freq_base_swa"), 10_000.0)?;
        let mut rope_global = Rope::plain(rope_dims, base, true);
        match src.str_opt(&k("rope.scaling.type"))?.as_deref() {
            None | Some("none") => {}
            Some("linear") => {
                let f = src.f32_or(&k("rope.scaling.factor"), 1.0)?;
                if f > 0.0 {
                    rope_global.freq_scale = 1.0 / f;
                }
            }
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "gemma3 RoPE scaling '{other}'"
                )));
            }
        }
        let rope_local = Rope::plain(rope_dims, base_swa, true);

        let swa = src.usize_or(&k("attention.sliding_window"), 0)?;
        let window = if swa == 0 {
            vec![None; n_layers]
        } else if let Some(pattern) = src.u64_array_opt(&k("attention.sliding_window_pattern"))? {
            if pattern.len() < n_layers {
                return Err(ModelError::BadKey {
                    key: k("attention.sliding_window_pattern"),
                    msg: format!("{} entries for {n_layers} layers", pattern.len()),
                });
            }
            pattern
                .iter()
                .take(n_layers)
                .map(|&p| (p != 0).then_some(swa))
                .collect()
        } else {
            // llama.cpp's default pattern 6: five local layers, then one global.
            let n = src.usize_or(&k("attention.sliding_window_pattern"), 6)?;
            (0..n_layers)
                .map(|i| (n == 0 || i % n < n - 1).then_some(swa))
                .collect()
        };
        let softcap = src
            .f32_opt(&k("final_logit_softcapping"))?
            .filter(|&c| c != 0.0);
        // gemma_pytorch: the 27B model scales by (H / n_heads)^-0.5, the others by head_dim^-0.5.
        let attn_scale = if n_layers == 62 {
            1.0 / ((n_embd / n_heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let emb = src.require("token_embd.weight")?;
        Ok(Config {
            n_layers,
            n_embd,
            n_ff: src.usize(&k("feed_forward_length"))?,
            n_heads,
            n_kv_heads,
            head_dim,
            n_vocab: emb.shape.first().copied().unwrap_or(0),
            n_ctx_train: src.usize_or(&k("context_length"), 8192)?,
            eps: src.f32_or(&k("attention.layer_norm_rms_epsilon"), 1e-6)?,
            rope_global,
            rope_local,
            window,
            attn_scale,
            final_softcap: softcap,
        })
    }
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Mat,
    wk: B::Mat,
    wv: B::Mat,
    q_norm: B::Vector,
    k_norm: B::Vector,
    wo: B::Mat,
    post_attn_norm: B::Vector,
    ffn_norm: B::Vector,
    gate: B::Mat,
    up: B::Mat,
    down: B::Mat,
    post_ffn_norm: B::Vector,
}

pub struct Gemma3<B: Backend> {
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Mat,
    /// `None`: the output head is the embedding table (tied).
    output: Option<B::Mat>,
    output_norm: B::Vector,
    layers: Vec<Layer<B>>,
}

impl<B: Backend> Gemma3<B> {
    pub fn load(be: &B, src: &dyn ModelSource) -> Result<Self> {
        let cfg = Config::from_source(src)?;
        let (h, hd) = (cfg.n_embd, cfg.head_dim);
        let (q_dim, kv_dim) = (cfg.n_heads * hd, cfg.n_kv_heads * hd);
        let tok_embd = src.mat(be, "token_embd.weight", &[cfg.n_vocab, h])?;
        let output = match src.tensor("output.weight") {
            Some(_) => Some(src.mat(be, "output.weight", &[cfg.n_vocab, h])?),
            None => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: src.vector(be, &n("attn_norm"), h)?,
                wq: src.mat(be, &n("attn_q"), &[q_dim, h])?,
                wk: src.mat(be, &n("attn_k"), &[kv_dim, h])?,
                wv: src.mat(be, &n("attn_v"), &[kv_dim, h])?,
                q_norm: src.vector(be, &n("attn_q_norm"), hd)?,
                k_norm: src.vector(be, &n("attn_k_norm"), hd)?,
                wo: src.mat(be, &n("attn_output"), &[h, q_dim])?,
                post_attn_norm: src.vector(be, &n("post_attention_norm"), h)?,
                ffn_norm: src.vector(be, &n("ffn_norm"), h)?,
                gate: src.mat(be, &n("ffn_gate"), &[cfg.n_ff, h])?,
                up: src.mat(be, &n("ffn_up"), &[cfg.n_ff, h])?,
                down: src.mat(be, &n("ffn_down"), &[h, cfg.n_ff])?,
                post_ffn_norm: src.vector(be, &n("post_ffw_norm"), h)?,
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
            arch: "gemma3".into(),
            name: src
                .str_opt("general.name")?
                .unwrap_or_else(|| "gemma3".into()),
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
        Ok(Gemma3 {
            cfg,
            info,
            tok_embd,
            output,
            output_norm,
            layers,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }
}

impl<B: Backend> Gemma3<B> {
    /// The final norm and vocabulary projection (the embedding table when tied).
    fn head(&self) -> OutputHead<'_, B> {
        OutputHead {
            norm: &self.output_norm,
            eps: self.cfg.eps,
            mat: self.output.as_ref().unwrap_or(&self.tok_embd),
            n_vocab: self.cfg.n_vocab,
            softcap: self.cfg.final_softcap,
        }
    }
}

impl<B: Backend> CausalLm<B> for Gemma3<B> {
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
        let (x, dump) = self.hidden(be, kv, tokens, all_logits)?;
        let logits = self.head().logits(be, &x, all_logits)?;
        if let Some(d) = &dump {
            d.put_host("result_output", None, &logits);
        }
        Ok(logits)
    }

    fn hidden_head(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        every_row: bool,
    ) -> Result<Option<(B::Buf, OutputHead<'_, B>)>> {
        let (x, _) = self.hidden(be, kv, tokens, every_row)?;
        Ok(Some((x, self.head())))
    }
}

impl<B: Backend> Gemma3<B> {
    /// The layers: runs `tokens` after what `kv` holds and returns the residual stream
    /// before the output norm (`[n, H]`, or `[1, H]` for the last token alone unless
    /// `all_logits`), with the tensor dump of this step when `NEAGARI_DUMP` is set.
    fn hidden(
        &self,
        be: &B,
        kv: &mut B::Kv,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<(B::Buf, Option<Dump>)> {
        let c = &self.cfg;
        let n = tokens.len();
        let pos0 = be.kv_len(kv);
        check_room(pos0, n, be.kv_capacity(kv))?;
        let hd = c.head_dim;
        let dump = Dump::start();
        let put = |name: &str, il: Option<usize>, b: &B::Buf| {
            if let Some(d) = &dump {
                d.put(be, name, il, b);
            }
        };

        let mut x = be.buf(n, c.n_embd)?; // [n, H] residual stream
        be.embed(&self.tok_embd, tokens, (c.n_embd as f32).sqrt(), &mut x)?;
        put("inp_scaled", None, &x);
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
            // Attention block (xn: this layer's attn_norm of x, made by the previous one).
            put("attn_norm", Some(il), &xn);
            be.matmul_multi(&[&l.wq, &l.wk, &l.wv], &xn, &mut [&mut q, &mut k, &mut v])?;
            put("Qcur", Some(il), &q);
            put("Kcur", Some(il), &k);
            put("Vcur", Some(il), &v);
            let (rope, window) = match c.window[il] {
                Some(w) => (&c.rope_local, Some(w)),
                None => (&c.rope_global, None),
            };
            // llama.cpp scales q by attn_scale after RoPE (ggml_scale) and attends with scale
            // 1. When attn_scale is a power of two, RoPE's mscale applies it with the same
            // bits (every product just moves its exponent), so q matches llama.cpp's exactly
            // before the f16 rounding that the scale would otherwise follow.
            let q_scaled = is_pow2(c.attn_scale);
            let rope_q = if q_scaled {
                &Rope {
                    attn_factor: rope.attn_factor * c.attn_scale,
                    ..*rope
                }
            } else {
                rope
            };
            let attn = Attn {
                n_heads: c.n_heads,
                n_kv_heads: c.n_kv_heads,
                head_dim: hd,
                scale: if q_scaled { 1.0 } else { c.attn_scale },
                window,
                softcap: None,
            };
            if dump.is_some() {
                // The dump wants the normed q, k before RoPE: the separate ops.
                be.rms_norm_inplace(&mut q, &l.q_norm, c.eps)?;
                be.rms_norm_inplace(&mut k, &l.k_norm, c.eps)?;
                put("Qcur_normed", Some(il), &q);
                put("Kcur_normed", Some(il), &k);
                be.rope(&mut q, hd, pos0, rope_q, None)?;
                be.rope(&mut k, hd, pos0, rope, None)?;
                put("Qcur_rope", Some(il), &q);
                put("Kcur_rope", Some(il), &k);
                be.attention(kv, il, pos0, &q, &k, &v, &attn, &mut att)?;
            } else {
                let prep = QkPrep {
                    q_norm: Some(&l.q_norm),
                    k_norm: Some(&l.k_norm),
                    eps: c.eps,
                    rope_q,
                    rope_k: rope,
                    freq_factors: None,
                };
                be.attention_block(
                    kv, il, pos0, &mut q, false, &mut k, &v, &prep, &attn, &mut att,
                )?;
            }
            put("kqv_out", Some(il), &att);
            be.matmul(&l.wo, &att, &mut o)?;
            put("attn_out", Some(il), &o);
            if il + 1 == c.n_layers && !all_logits && n > 1 {
                // Only the last token's logits are wanted: the rest of the last layer runs
                // on its row alone, as llama.cpp's graph does (inp_out_ids). Besides saving
                // the work, its FFN then sums in the one-row order, as llama.cpp's.
                let mut o1 = be.buf(1, c.n_embd)?; // [1, H]
                be.copy_row(&o, n - 1, &mut o1)?;
                o = o1;
                let mut x1 = be.buf(1, c.n_embd)?; // [1, H]
                be.copy_row(&x, n - 1, &mut x1)?;
                x = x1;
                xn = be.buf(1, c.n_embd)?;
                gate = be.buf(1, c.n_ff)?;
                up = be.buf(1, c.n_ff)?;
            }
            // Post-norm of o, residual add, the MLP's norm.
            be.norm_add_rms_norm(
                &mut x,
                &mut o,
                &l.post_attn_norm,
                &l.ffn_norm,
                c.eps,
                &mut xn,
            )?;
            put("attn_post_norm", Some(il), &o);
            put("sa_out", Some(il), &x);

            // MLP block.
            put("ffn_norm", Some(il), &xn);
            if dump.is_some() {
                // The dump wants gate and up before the GLU: the separate ops.
                be.matmul_multi(&[&l.gate, &l.up], &xn, &mut [&mut gate, &mut up])?;
                put("ffn_gate", Some(il), &gate);
                put("ffn_up", Some(il), &up);
                be.glu(&mut gate, &up, GluAct::GeluTanh)?;
            } else {
                be.matmul_glu(&l.gate, &l.up, &xn, GluAct::GeluTanh, &mut gate, &mut up)?;
            }
            put("ffn_geglu", Some(il), &gate);
            be.matmul(&l.down, &gate, &mut o)?;
            put("ffn_out", Some(il), &o);
            // Post-norm of o, residual add, and the next layer's attn_norm.
            match self.layers.get(il + 1) {
                Some(next) => be.norm_add_rms_norm(
                    &mut x,
                    &mut o,
                    &l.post_ffn_norm,
                    &next.attn_norm,
                    c.eps,
                    &mut xn,
                )?,
                None => {
                    be.rms_norm_inplace(&mut o, &l.post_ffn_norm, c.eps)?;
                    be.add(&mut x, &o)?;
                }
            }
            put("ffn_post_norm", Some(il), &o);
            put("l_out", Some(il), &x);
        }
        be.kv_commit(kv, pos0 + n)?;
        Ok((x, dump))
    }
}

/// `x` is 2^k for an integer k (so multiplying by it is exact in f32 away from underflow).
fn is_pow2(x: f32) -> bool {
    x.is_normal() && x.to_bits() & 0x007f_ffff == 0
}
