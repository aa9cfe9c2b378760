//! Qwen3.5 / Qwen3.6 hybrids and the Qwen3 MoE family as llama.cpp's converter writes them:
//! `qwen35` (dense hybrid), `qwen35moe` (hybrid with MoE FFN and a sigmoid-gated shared
//! expert), `qwen3next` (the same with fused `ssm_ba` and V heads in grouped order) and
//! `qwen3moe` (plain attention, MoE FFN).
//!
//! A hybrid stack mixes Gated DeltaNet layers (`attention.recurrent_layers[i]` true, or every
//! layer but each `full_attention_interval`-th) with gated full-attention layers (query and
//! output gate interleaved per head in `attn_q`, q/k RMSNorm, partial NeoX RoPE over
//! `rope.dimension_count` dims — text-only MRoPE reduces to that, all position streams being
//! equal). GGUF already folds the zero-centred norms' `1 + w`, stores `ssm_a = −exp(A_log)`
//! and, for qwen35/qwen35moe, orders value heads tiled (v head h reads k head `h mod n_k`;
//! qwen3next keeps HF's grouped order, `h / (n_v / n_k)`).
//!
//! The per-sequence state is the backend's cache: KV entries for the full-attention layers
//! and the recurrent state (`rec_alloc`) for the DeltaNet layers. MTP blocks (the last
//! `nextn_predict_layers` blocks) are loaded and kept for speculative decoding.

use neagari_backend::{
    Attn, Backend, DeltaNet, GluAct, HeadMap, HostTensor, KvShape, KvType, QkPrep, RecShape, Rope,
};

use crate::source::{ModelSource, SourceExt};
use crate::{check_room, CausalLm, ModelError, ModelInfo, OutputHead, Result};

/// Gated DeltaNet geometry.
#[derive(Clone, Debug)]
pub struct SsmConfig {
    /// How value heads find their key head: tiled in llama.cpp's qwen35 GGUFs; a source
    /// serving HF-ordered tensors (no V-head reordering) sets `{arch}.ssm.v_head_order` to
    /// "grouped".
    pub map: HeadMap,
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
}

impl SsmConfig {
    fn key_dim(&self) -> usize {
        self.n_k_heads * self.d_k
    }
    fn value_dim(&self) -> usize {
        self.n_v_heads * self.d_v
    }
    fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// Hyper-parameters, from `{arch}.*` metadata.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: String,
    /// Main-model layers (MTP blocks excluded).
    pub n_layers: usize,
    /// MTP blocks after the main layers.
    pub n_mtp: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub eps: f32,
    pub rope: Rope,
    /// Per main layer: true = Gated DeltaNet, false = full attention.
    pub recurrent: Vec<bool>,
    pub ssm: Option<SsmConfig>,
    /// Dense FFN width (0 when every layer is MoE).
    pub n_ff: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
    pub n_ff_shexp: usize,
}

impl Config {
    pub fn from_source(src: &dyn ModelSource) -> Result<Self> {
        let arch = src.architecture()?;
        let k = |s: &str| format!("{arch}.{s}");
        let block_count = src.usize(&k("block_count"))?;
        let n_mtp = src.usize_or(&k("nextn_predict_layers"), 0)?;
        if n_mtp >= block_count {
            return Err(ModelError::BadKey {
                key: k("nextn_predict_layers"),
                msg: format!("{n_mtp} of {block_count} blocks"),
            });
        }
        let n_layers = block_count - n_mtp;
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
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(ModelError::BadKey {
                key: k("rope.dimension_count"),
                msg: format!("{rope_dims} for head_dim {head_dim}"),
            });
        }
        let rope = Rope::plain(
            rope_dims,
            src.f32_or(&k("rope.freq_base"), 10_000_000.0)?,
            true,
        );
        let hybrid = arch != "qwen3moe";
        let (recurrent, ssm) = if hybrid {
            let recurrent = match src.u64_array_opt(&k("attention.recurrent_layers"))? {
                Some(v) => {
                    if v.len() < n_layers {
                        return Err(ModelError::BadKey {
                            key: k("attention.recurrent_layers"),
                            msg: format!("{} entries for {n_layers} layers", v.len()),
                        });
                    }
                    v[..n_layers].iter().map(|&x| x != 0).collect()
                }
                None => {
                    let every = src.usize_or(&k("full_attention_interval"), 4)?.max(1);
                    (0..n_layers)
                        .map(|i| !(i + 1).is_multiple_of(every))
                        .collect()
                }
            };
            let n_k_heads = src.usize(&k("ssm.group_count"))?;
            let n_v_heads = src.usize(&k("ssm.time_step_rank"))?;
            let inner = src.usize(&k("ssm.inner_size"))?;
            if n_k_heads == 0
                || n_v_heads == 0
                || n_v_heads % n_k_heads != 0
                || inner % n_v_heads != 0
            {
                return Err(ModelError::BadKey {
                    key: k("ssm.time_step_rank"),
                    msg: format!("{n_k_heads} key heads, {n_v_heads} value heads, inner {inner}"),
                });
            }
            // llama.cpp reorders V heads to tiled order for qwen35/qwen35moe only.
            let default_order = if arch == "qwen3next" {
                "grouped"
            } else {
                "tiled"
            };
            let order = src.str_opt(&k("ssm.v_head_order"))?;
            let map = match order.as_deref().unwrap_or(default_order) {
                "tiled" => HeadMap::Tiled,
                "grouped" => HeadMap::Grouped,
                o => {
                    return Err(ModelError::BadKey {
                        key: k("ssm.v_head_order"),
                        msg: format!("'{o}' (expected tiled or grouped)"),
                    })
                }
            };
            let ssm = SsmConfig {
                map,
                conv_kernel: src.usize(&k("ssm.conv_kernel"))?.max(1),
                n_k_heads,
                n_v_heads,
                d_k: src.usize(&k("ssm.state_size"))?,
                d_v: inner / n_v_heads,
            };
            (recurrent, Some(ssm))
        } else {
            (vec![false; n_layers], None)
        };
        let n_expert = src.usize_or(&k("expert_count"), 0)?;
        let n_expert_used = src.usize_or(&k("expert_used_count"), 0)?;
        if n_expert > 0 && (n_expert_used == 0 || n_expert_used > n_expert) {
            return Err(ModelError::BadKey {
                key: k("expert_used_count"),
                msg: format!("{n_expert_used} of {n_expert} experts"),
            });
        }
        let n_ff = src.usize_or(&k("feed_forward_length"), 0)?;
        let emb = src.require("token_embd.weight")?;
        Ok(Config {
            n_layers,
            n_mtp,
            n_embd,
            n_heads,
            n_kv_heads,
            head_dim,
            n_vocab: emb.shape.first().copied().unwrap_or(0),
            n_ctx_train: src.usize_or(&k("context_length"), 4096)?,
            eps: src.f32_or(&k("attention.layer_norm_rms_epsilon"), 1e-6)?,
            rope,
            recurrent,
            ssm,
            n_ff,
            n_expert,
            n_expert_used,
            n_ff_exp: src.usize_or(&k("expert_feed_forward_length"), n_ff)?,
            n_ff_shexp: src.usize_or(&k("expert_shared_feed_forward_length"), 0)?,
            arch,
        })
    }
}

struct AttnW<B: Backend> {
    /// `[n_heads·2·hd, H]` query+gate interleaved per head when `gated`, else `[n_heads·hd, H]`.
    wq: B::Mat,
    gated: bool,
    wk: B::Mat,
    wv: B::Mat,
    wo: B::Mat,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    /// Index among the full-attention layers (the KV cache holds only those).
    kv_layer: usize,
}

/// The β and α projections: separate (qwen35), or fused per key head as
/// `[b r | a r]` rows (qwen3next's `ssm_ba`, r = n_v / n_k).
enum BetaAlpha<B: Backend> {
    /// `[n_v, H]` each.
    Split { beta: B::Mat, alpha: B::Mat },
    /// `[2·n_v, H]`.
    Fused(B::Mat),
}

struct DeltaW<B: Backend> {
    /// `[2·key_dim + value_dim, H]`.
    qkv: B::Mat,
    /// z: `[value_dim, H]`.
    gate: B::Mat,
    beta_alpha: BetaAlpha<B>,
    /// `[channels · kernel]`.
    conv: B::Vector,
    /// −exp(A_log), `[n_v]`.
    a_neg: B::Vector,
    dt_bias: B::Vector,
    /// `[d_v]`.
    norm: B::Vector,
    /// `[H, value_dim]`.
    out: B::Mat,
    /// Index among the recurrent layers.
    rec_layer: usize,
}

enum Mixer<B: Backend> {
    Attn(AttnW<B>),
    Delta(DeltaW<B>),
}

struct SharedExpert<B: Backend> {
    n_ff: usize,
    gate: B::Mat,
    up: B::Mat,
    down: B::Mat,
    /// `[1, H]`: sigmoid(this · x) scales the shared expert (qwen35moe).
    gate_inp: Option<B::Mat>,
}

enum Ffn<B: Backend> {
    Dense {
        gate: B::Mat,
        up: B::Mat,
        down: B::Mat,
    },
    Moe {
        /// `[n_expert, H]`.
        router: B::Mat,
        /// Stacked experts: gate/up `[n_expert·F, H]`, down `[n_expert·H, F]`. With
        /// `up` None, `gate` is llama.cpp's fused `ffn_gate_up_exps` `[n_expert·2F, H]`
        /// (per expert F gate rows, then F up rows).
        gate: B::Mat,
        up: Option<B::Mat>,
        down: B::Mat,
        shared: Option<SharedExpert<B>>,
    },
}

struct Layer<B: Backend> {
    attn_norm: B::Vector,
    mixer: Mixer<B>,
    post_norm: B::Vector,
    ffn: Ffn<B>,
}

/// A multi-token-prediction block (kept for speculative decoding; not run by `forward`).
pub struct Mtp<B: Backend> {
    /// `[H, 2H]`: projects `[enorm(embed(t+1)) ; hnorm(h_t)]`.
    pub eh_proj: B::Mat,
    pub enorm: B::Vector,
    pub hnorm: B::Vector,
    pub shared_head_norm: Option<B::Vector>,
    layer: Layer<B>,
}

pub struct Qwen35<B: Backend> {
    cfg: Config,
    info: ModelInfo,
    tok_embd: B::Mat,
    output: Option<B::Mat>,
    output_norm: B::Vector,
    layers: Vec<Layer<B>>,
    mtp: Vec<Mtp<B>>,
}

/// A 3-D expert tensor `[E, a, b]` viewed as the matrix `[E·a, b]` it already is in memory.
fn expert_mat<B: Backend>(
    be: &B,
    src: &dyn ModelSource,
    name: &str,
    want: [usize; 3],
) -> Result<B::Mat> {
    let t = src.require_shape(name, &want)?;
    let flat = HostTensor {
        shape: vec![want[0] * want[1], want[2]],
        ..t
    };
    Ok(be.load_mat(&flat)?)
}

fn n(i: usize, s: &str) -> String {
    format!("blk.{i}.{s}.weight")
}

impl<B: Backend> Qwen35<B> {
    pub fn load(be: &B, src: &dyn ModelSource) -> Result<Self> {
        let cfg = Config::from_source(src)?;
        let h = cfg.n_embd;
        let tok_embd = src.mat(be, "token_embd.weight", &[cfg.n_vocab, h])?;
        let output = match src.tensor("output.weight") {
            Some(_) => Some(src.mat(be, "output.weight", &[cfg.n_vocab, h])?),
            None => None,
        };
        let output_norm = src.vector(be, "output_norm.weight", h)?;
        let (mut kv_layer, mut rec_layer) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let rec = cfg.recurrent[i];
            layers.push(Self::load_layer(
                be, src, &cfg, i, rec, kv_layer, rec_layer,
            )?);
            if rec {
                rec_layer += 1;
            } else {
                kv_layer += 1;
            }
        }
        let mut mtp = Vec::with_capacity(cfg.n_mtp);
        for j in 0..cfg.n_mtp {
            let i = cfg.n_layers + j;
            // Each MTP block has its own KV layer after the main ones.
            let layer = Self::load_layer(be, src, &cfg, i, false, kv_layer + j, 0)?;
            mtp.push(Mtp {
                eh_proj: src.mat(be, &format!("blk.{i}.nextn.eh_proj.weight"), &[h, 2 * h])?,
                enorm: src.vector(be, &format!("blk.{i}.nextn.enorm.weight"), h)?,
                hnorm: src.vector(be, &format!("blk.{i}.nextn.hnorm.weight"), h)?,
                shared_head_norm: src.vector_opt(
                    be,
                    &format!("blk.{i}.nextn.shared_head_norm.weight"),
                    h,
                )?,
                layer,
            });
        }
        // The groups `matmul_multi` reads together (a device backend builds a two-format
        // group's kernels now, not in a reply).
        for l in &layers {
            match &l.mixer {
                Mixer::Attn(a) => be.prepare_multi(&[&a.wq, &a.wk, &a.wv])?,
                Mixer::Delta(d) => match &d.beta_alpha {
                    BetaAlpha::Split { beta, alpha } => {
                        be.prepare_multi(&[&d.qkv, &d.gate, beta, alpha])?
                    }
                    BetaAlpha::Fused(w) => be.prepare_multi(&[&d.qkv, &d.gate, w])?,
                },
            }
        }
        let head = output.as_ref().unwrap_or(&tok_embd);
        let mut decode_bytes = be.mat_bytes(head);
        for l in &layers {
            decode_bytes += Self::layer_decode_bytes(be, &cfg, l);
        }
        let mut weight_bytes = decode_bytes
            + if output.is_some() {
                be.mat_bytes(&tok_embd)
            } else {
                0
            };
        for l in &layers {
            if let Ffn::Moe { gate, up, down, .. } = &l.ffn {
                let up = up.as_ref().map_or(0, |m| be.mat_bytes(m));
                let all = be.mat_bytes(gate) + up + be.mat_bytes(down);
                weight_bytes += all - all * cfg.n_expert_used / cfg.n_expert.max(1);
            }
        }
        for m in &mtp {
            weight_bytes += be.mat_bytes(&m.eh_proj) + Self::layer_decode_bytes(be, &cfg, &m.layer);
        }
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
            head_dim: cfg.head_dim,
            decode_bytes,
            weight_bytes,
            n_kv_layers: cfg.recurrent.iter().filter(|&&r| !r).count(),
            rec_bytes: cfg.ssm.as_ref().map_or(0, |s| {
                let n_rec = cfg.recurrent.iter().filter(|&&r| r).count();
                // Per recurrent layer: the conv window and the [n_v_heads, d_k, d_v] state.
                let per = (s.conv_kernel.saturating_sub(1)) * s.conv_channels()
                    + s.n_v_heads * s.d_k * s.d_v;
                n_rec * per * 4
            }),
        };
        Ok(Qwen35 {
            cfg,
            info,
            tok_embd,
            output,
            output_norm,
            layers,
            mtp,
        })
    }

    /// Matrix bytes one decoded token reads in a layer (the used share of the experts).
    fn layer_decode_bytes(be: &B, cfg: &Config, l: &Layer<B>) -> usize {
        let mut b = 0;
        match &l.mixer {
            Mixer::Attn(a) => {
                for m in [&a.wq, &a.wk, &a.wv, &a.wo] {
                    b += be.mat_bytes(m);
                }
            }
            Mixer::Delta(d) => {
                for m in [&d.qkv, &d.gate, &d.out] {
                    b += be.mat_bytes(m);
                }
                match &d.beta_alpha {
                    BetaAlpha::Split { beta, alpha } => {
                        b += be.mat_bytes(beta) + be.mat_bytes(alpha)
                    }
                    BetaAlpha::Fused(ba) => b += be.mat_bytes(ba),
                }
            }
        }
        match &l.ffn {
            Ffn::Dense { gate, up, down } => {
                b += be.mat_bytes(gate) + be.mat_bytes(up) + be.mat_bytes(down);
            }
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                shared,
            } => {
                let up = up.as_ref().map_or(0, |m| be.mat_bytes(m));
                let all = be.mat_bytes(gate) + up + be.mat_bytes(down);
                b += be.mat_bytes(router) + all * cfg.n_expert_used / cfg.n_expert.max(1);
                if let Some(s) = shared {
                    b += be.mat_bytes(&s.gate) + be.mat_bytes(&s.up) + be.mat_bytes(&s.down);
                    if let Some(g) = &s.gate_inp {
                        b += be.mat_bytes(g);
                    }
                }
            }
        }
        b
    }

    #[allow(clippy::too_many_arguments)]
    fn load_layer(
        be: &B,
        src: &dyn ModelSource,
        cfg: &Config,
        i: usize,
        recurrent: bool,
        kv_layer: usize,
        rec_layer: usize,
    ) -> Result<Layer<B>> {
        let h = cfg.n_embd;
        let hd = cfg.head_dim;
        let mixer = if recurrent {
            let s = cfg.ssm.as_ref().ok_or_else(|| {
                ModelError::Unsupported("recurrent layer without ssm.* keys".into())
            })?;
            let (ch, vd, nv) = (s.conv_channels(), s.value_dim(), s.n_v_heads);
            let conv = src.require_shape(&n(i, "ssm_conv1d"), &[ch, s.conv_kernel])?;
            Mixer::Delta(DeltaW {
                qkv: src.mat(be, &n(i, "attn_qkv"), &[ch, h])?,
                gate: src.mat(be, &n(i, "attn_gate"), &[vd, h])?,
                beta_alpha: if src.tensor(&n(i, "ssm_ba")).is_some() {
                    BetaAlpha::Fused(src.mat(be, &n(i, "ssm_ba"), &[2 * nv, h])?)
                } else {
                    BetaAlpha::Split {
                        beta: src.mat(be, &n(i, "ssm_beta"), &[nv, h])?,
                        alpha: src.mat(be, &n(i, "ssm_alpha"), &[nv, h])?,
                    }
                },
                conv: be.load_vector(&conv)?,
                a_neg: src.vector(be, &format!("blk.{i}.ssm_a"), nv)?,
                dt_bias: src.vector(be, &format!("blk.{i}.ssm_dt.bias"), nv)?,
                norm: src.vector(be, &n(i, "ssm_norm"), s.d_v)?,
                out: src.mat(be, &n(i, "ssm_out"), &[h, vd])?,
                rec_layer,
            })
        } else {
            let q_dim = cfg.n_heads * hd;
            let kv_dim = cfg.n_kv_heads * hd;
            let wq_t = src.require(&n(i, "attn_q"))?;
            let gated = wq_t.shape.first() == Some(&(2 * q_dim));
            let q_rows = if gated { 2 * q_dim } else { q_dim };
            Mixer::Attn(AttnW {
                wq: src.mat(be, &n(i, "attn_q"), &[q_rows, h])?,
                gated,
                wk: src.mat(be, &n(i, "attn_k"), &[kv_dim, h])?,
                wv: src.mat(be, &n(i, "attn_v"), &[kv_dim, h])?,
                wo: src.mat(be, &n(i, "attn_output"), &[h, q_dim])?,
                q_norm: src.vector_opt(be, &n(i, "attn_q_norm"), hd)?,
                k_norm: src.vector_opt(be, &n(i, "attn_k_norm"), hd)?,
                kv_layer,
            })
        };
        let post_name = if src.tensor(&n(i, "post_attention_norm")).is_some() {
            n(i, "post_attention_norm")
        } else {
            n(i, "ffn_norm")
        };
        let ffn = if src.tensor(&n(i, "ffn_gate_inp")).is_some() {
            let (e, f) = (cfg.n_expert, cfg.n_ff_exp);
            if e == 0 || f == 0 {
                return Err(ModelError::MissingKey(format!("{}.expert_count", cfg.arch)));
            }
            let (gate, up) = if src.tensor(&n(i, "ffn_gate_up_exps")).is_some() {
                let gu = expert_mat(be, src, &n(i, "ffn_gate_up_exps"), [e, 2 * f, h])?;
                (gu, None)
            } else {
                (
                    expert_mat(be, src, &n(i, "ffn_gate_exps"), [e, f, h])?,
                    Some(expert_mat(be, src, &n(i, "ffn_up_exps"), [e, f, h])?),
                )
            };
            let shared = if src.tensor(&n(i, "ffn_gate_shexp")).is_some() {
                let fs = if cfg.n_ff_shexp > 0 {
                    cfg.n_ff_shexp
                } else {
                    f
                };
                Some(SharedExpert {
                    n_ff: fs,
                    gate: src.mat(be, &n(i, "ffn_gate_shexp"), &[fs, h])?,
                    up: src.mat(be, &n(i, "ffn_up_shexp"), &[fs, h])?,
                    down: src.mat(be, &n(i, "ffn_down_shexp"), &[h, fs])?,
                    gate_inp: match src.tensor(&n(i, "ffn_gate_inp_shexp")) {
                        Some(_) => Some(
                            src.mat(be, &n(i, "ffn_gate_inp_shexp"), &[1, h])
                                .or_else(|_| src.mat(be, &n(i, "ffn_gate_inp_shexp"), &[h]))?,
                        ),
                        None => None,
                    },
                })
            } else {
                None
            };
            Ffn::Moe {
                router: src.mat(be, &n(i, "ffn_gate_inp"), &[e, h])?,
                gate,
                up,
                down: expert_mat(be, src, &n(i, "ffn_down_exps"), [e, h, f])?,
                shared,
            }
        } else {
            let f = cfg.n_ff;
            Ffn::Dense {
                gate: src.mat(be, &n(i, "ffn_gate"), &[f, h])?,
                up: src.mat(be, &n(i, "ffn_up"), &[f, h])?,
                down: src.mat(be, &n(i, "ffn_down"), &[h, f])?,
            }
        };
        Ok(Layer {
            attn_norm: src.vector(be, &n(i, "attn_norm"), h)?,
            mixer,
            post_norm: src.vector(be, &post_name, h)?,
            ffn,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The MTP blocks the file carries (empty when none).
    pub fn mtp(&self) -> &[Mtp<B>] {
        &self.mtp
    }

    fn n_kv_layers(&self) -> usize {
        self.cfg.recurrent.iter().filter(|&&r| !r).count()
    }

    fn attn_forward(
        &self,
        be: &B,
        kv: &mut B::Kv,
        a: &AttnW<B>,
        pos0: usize,
        inp: NormIn<'_, B>,
    ) -> Result<B::Buf> {
        let c = &self.cfg;
        let nt = inp.rows(be);
        let hd = c.head_dim;
        let q_dim = c.n_heads * hd;
        // [n, n_heads·hd], or gated [n, n_heads·(query hd | gate hd)]
        let mut q = be.buf(nt, if a.gated { 2 * q_dim } else { q_dim })?;
        let mut k = be.buf(nt, c.n_kv_heads * hd)?; // [n, n_kv·hd]
        let mut v = be.buf(nt, c.n_kv_heads * hd)?; // [n, n_kv·hd]
        inp.matmul(be, &[&a.wq, &a.wk, &a.wv], &mut [&mut q, &mut k, &mut v])?;
        let attn = Attn {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
        };
        let prep = QkPrep {
            q_norm: a.q_norm.as_ref(),
            k_norm: a.k_norm.as_ref(),
            eps: c.eps,
            rope_q: &c.rope,
            rope_k: &c.rope,
            freq_factors: None,
        };
        let mut att = be.buf(nt, q_dim)?; // [n, n_heads·hd]
                                          // q/k norm and RoPE, the KV store, attention and the output gate.
        be.attention_block(
            kv, a.kv_layer, pos0, &mut q, a.gated, &mut k, &v, &prep, &attn, &mut att,
        )?;
        let mut o = be.buf(nt, c.n_embd)?; // [n, H]
        be.matmul(&a.wo, &att, &mut o)?;
        Ok(o)
    }

    fn delta_forward(
        &self,
        be: &B,
        kv: &mut B::Kv,
        d: &DeltaW<B>,
        inp: NormIn<'_, B>,
    ) -> Result<B::Buf> {
        let c = &self.cfg;
        let s = c
            .ssm
            .as_ref()
            .ok_or_else(|| ModelError::Unsupported("no ssm config".into()))?;
        let nt = inp.rows(be);
        let mut qkv = be.buf(nt, s.conv_channels())?; // [n, 2·key_dim + value_dim]
        let mut z = be.buf(nt, s.value_dim())?; // [n, value_dim]
        let mut beta = be.buf(nt, s.n_v_heads)?; // [n, n_v]
        let mut alpha = be.buf(nt, s.n_v_heads)?; // [n, n_v]
        be.prefetch_rec(kv, d.rec_layer)?;
        // Every projection of xn in one call (one launch on a GPU where the types agree).
        match &d.beta_alpha {
            BetaAlpha::Split {
                beta: wb,
                alpha: wa,
            } => {
                inp.matmul(
                    be,
                    &[&d.qkv, &d.gate, wb, wa],
                    &mut [&mut qkv, &mut z, &mut beta, &mut alpha],
                )?;
            }
            BetaAlpha::Fused(w) => {
                let r = s.n_v_heads / s.n_k_heads;
                let mut ba = be.buf(nt, 2 * s.n_v_heads)?; // [n, n_k·(b r | a r)]
                inp.matmul(be, &[&d.qkv, &d.gate, w], &mut [&mut qkv, &mut z, &mut ba])?;
                be.copy_cols(&ba, 0, r, 2 * r, s.n_k_heads, &mut beta)?;
                be.copy_cols(&ba, r, r, 2 * r, s.n_k_heads, &mut alpha)?;
            }
        }
        let net = DeltaNet {
            n_k_heads: s.n_k_heads,
            n_v_heads: s.n_v_heads,
            d_k: s.d_k,
            d_v: s.d_v,
            map: s.map,
        };
        let mut core = be.buf(nt, s.value_dim())?; // [n, value_dim]
        be.prefetch(&[&d.out])?;
        // The short conv, the delta rule and the gated norm (one kernel for a GPU decode row).
        be.delta_net(
            kv,
            d.rec_layer,
            &mut qkv,
            &d.conv,
            &alpha,
            &beta,
            &d.a_neg,
            &d.dt_bias,
            &net,
            &d.norm,
            &z,
            c.eps,
            &mut core,
        )?;
        let mut o = be.buf(nt, c.n_embd)?; // [n, H]
        be.matmul(&d.out, &core, &mut o)?;
        Ok(o)
    }

    fn ffn_forward(&self, be: &B, ffn: &Ffn<B>, inp: NormIn<'_, B>) -> Result<B::Buf> {
        let c = &self.cfg;
        let nt = inp.rows(be);
        let h = c.n_embd;
        let mut o = be.buf(nt, h)?; // [n, H]
        match ffn {
            Ffn::Dense { gate, up, down } => {
                let mut g = be.buf(nt, c.n_ff)?; // [n, F]
                let mut u = be.buf(nt, c.n_ff)?; // [n, F]
                inp.matmul_glu(be, (gate, up, &[down]), &mut g, &mut u)?;
                be.matmul(down, &g, &mut o)?;
            }
            Ffn::Moe {
                router,
                gate,
                up,
                down,
                shared,
            } => {
                let xn = inp.normed(be)?;
                let (e, f, k) = (c.n_expert, c.n_ff_exp, c.n_expert_used);
                let mut logits = be.buf(nt, e)?; // [n, E]
                be.matmul(router, xn, &mut logits)?;
                let mut host = vec![0f32; nt * e];
                be.read(&logits, 0, nt, &mut host)?;
                let routes = route(&host, e, k);
                be.write(&mut o, &vec![0f32; nt * h], nt, h)?;
                let mut xe = be.buf(1, h)?;
                let mut ge = be.buf(1, f)?;
                let mut ue = be.buf(1, f)?;
                let mut oe = be.buf(1, h)?;
                for (ex, (rows, weights)) in routes.iter().enumerate() {
                    if rows.is_empty() {
                        continue;
                    }
                    be.gather_rows(xn, rows, &mut xe)?; // [m, H]
                    match up {
                        Some(up) => {
                            be.matmul_rows(gate, ex * f, f, &xe, &mut ge)?; // [m, F]
                            be.matmul_rows(up, ex * f, f, &xe, &mut ue)?; // [m, F]
                        }
                        None => {
                            be.matmul_rows(gate, 2 * ex * f, f, &xe, &mut ge)?; // [m, F]
                            be.matmul_rows(gate, (2 * ex + 1) * f, f, &xe, &mut ue)?;
                        }
                    }
                    be.glu(&mut ge, &ue, GluAct::Silu)?;
                    be.matmul_rows(down, ex * h, h, &ge, &mut oe)?; // [m, H]
                    be.scatter_add_rows(&mut o, rows, weights, &oe)?;
                }
                if let Some(s) = shared {
                    let fs = s.n_ff;
                    let mut g = be.buf(nt, fs)?; // [n, Fs]
                    let mut u = be.buf(nt, fs)?; // [n, Fs]
                    be.matmul(&s.gate, xn, &mut g)?;
                    be.matmul(&s.up, xn, &mut u)?;
                    be.glu(&mut g, &u, GluAct::Silu)?;
                    let mut so = be.buf(nt, h)?; // [n, H]
                    be.matmul(&s.down, &g, &mut so)?;
                    let all: Vec<u32> = (0..nt as u32).collect();
                    let scale = match &s.gate_inp {
                        Some(gi) => {
                            let mut gl = be.buf(nt, 1)?; // [n, 1]
                            be.matmul(gi, xn, &mut gl)?;
                            let mut gh = vec![0f32; nt];
                            be.read(&gl, 0, nt, &mut gh)?;
                            gh.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect()
                        }
                        None => vec![1.0; nt],
                    };
                    be.scatter_add_rows(&mut o, &all, &scale, &so)?;
                }
            }
        }
        Ok(o)
    }
}

/// Softmax over each token's router logits, the top `k` experts, weights renormalised to
/// sum to 1 (Qwen3-MoE with norm_topk_prob, Qwen3.5-MoE, llama.cpp's `norm_w`). Returns per
/// expert the token rows routed to it and their weights.
fn route(logits: &[f32], n_expert: usize, k: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut out = vec![(Vec::new(), Vec::new()); n_expert];
    let mut p = vec![0f32; n_expert];
    let mut idx: Vec<usize> = Vec::with_capacity(n_expert);
    for (t, row) in logits.chunks_exact(n_expert).enumerate() {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let mut sum = 0f32;
        for (pi, &x) in p.iter_mut().zip(row) {
            *pi = (x - max).exp();
            sum += *pi;
        }
        p.iter_mut().for_each(|x| *x /= sum);
        idx.clear();
        idx.extend(0..n_expert);
        // Highest probability first; ties to the lower index.
        idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        let top = &idx[..k];
        let norm: f32 = top.iter().map(|&i| p[i]).sum();
        for &i in top {
            out[i].0.push(t as u32);
            out[i].1.push(p[i] / norm);
        }
    }
    out
}

impl<B: Backend> Qwen35<B> {
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

impl<B: Backend> CausalLm<B> for Qwen35<B> {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_kv(&self, be: &B, n_ctx: usize, ty: KvType) -> Result<B::Kv> {
        let c = &self.cfg;
        let mut kv = be.kv_alloc(&KvShape {
            n_layers: self.n_kv_layers(),
            n_ctx,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            ty,
        })?;
        let n_rec = c.recurrent.iter().filter(|&&r| r).count();
        if let (Some(s), true) = (&c.ssm, n_rec > 0) {
            be.rec_alloc(
                &mut kv,
                &RecShape {
                    n_layers: n_rec,
                    conv_channels: s.conv_channels(),
                    conv_kernel: s.conv_kernel,
                    n_v_heads: s.n_v_heads,
                    d_k: s.d_k,
                    d_v: s.d_v,
                },
            )?;
        }
        Ok(kv)
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

impl<B: Backend> Qwen35<B> {
    /// The layers: runs `tokens` after what `kv` holds and returns the residual stream
    /// `[n, H]` before the output norm.
    fn hidden(&self, be: &B, kv: &mut B::Kv, tokens: &[u32]) -> Result<B::Buf> {
        let c = &self.cfg;
        let nt = tokens.len();
        let pos0 = be.kv_len(kv);
        check_room(pos0, nt, be.kv_capacity(kv))?;
        let mut x = be.buf(nt, c.n_embd)?; // [n, H] residual stream
        be.embed(&self.tok_embd, tokens, 1.0, &mut x)?;
        let mut xn = be.buf(nt, c.n_embd)?; // [n, H]
                                            // The previous layer's FFN output, added to x by this layer's input norm.
        let mut prev: Option<B::Buf> = None;
        for l in &self.layers {
            // Each norm is told which matrices the GEMV after it reads (Backend::prefetch).
            if prev.is_some() {
                match &l.mixer {
                    Mixer::Attn(a) => be.prefetch(&[&a.wq, &a.wk])?,
                    Mixer::Delta(d) => be.prefetch(&[&d.qkv, &d.gate])?,
                }
            }
            let inp = NormIn {
                x: &mut x,
                add: prev.as_ref(),
                w: &l.attn_norm,
                eps: c.eps,
                xn: &mut xn,
            };
            let o = match &l.mixer {
                Mixer::Attn(a) => self.attn_forward(be, kv, a, pos0, inp)?,
                Mixer::Delta(d) => self.delta_forward(be, kv, d, inp)?,
            };
            if let Ffn::Dense { gate, up, .. } = &l.ffn {
                be.prefetch(&[gate, up])?;
            }
            let inp = NormIn {
                x: &mut x,
                add: Some(&o),
                w: &l.post_norm,
                eps: c.eps,
                xn: &mut xn,
            };
            prev = Some(self.ffn_forward(be, &l.ffn, inp)?);
        }
        if let Some(o) = prev {
            be.add(&mut x, &o)?;
        }
        be.kv_commit(kv, pos0 + nt)?;
        Ok(x)
    }
}

/// A block's input: `xn = rms_norm(x, w)` (the first layer), or after `x += add` (the block
/// before's output), made by the call that also runs the projections reading it
/// (`Backend::add_rms_norm_matmul`), so a backend may finish the norm inside them.
struct NormIn<'a, B: Backend> {
    x: &'a mut B::Buf,
    add: Option<&'a B::Buf>,
    w: &'a B::Vector,
    eps: f32,
    xn: &'a mut B::Buf,
}

impl<'a, B: Backend> NormIn<'a, B> {
    fn rows(&self, be: &B) -> usize {
        be.buf_shape(self.x).0
    }

    /// `outs[i] = ws[i] · xn`.
    fn matmul(self, be: &B, ws: &[&B::Mat], outs: &mut [&mut B::Buf]) -> Result<()> {
        match self.add {
            Some(y) => be.add_rms_norm_matmul(self.x, y, self.w, self.eps, self.xn, ws, outs)?,
            None => {
                be.rms_norm(self.x, self.w, self.eps, self.xn)?;
                be.matmul_multi(ws, self.xn, outs)?;
            }
        }
        Ok(())
    }

    /// The gated MLP's projections and SiLU GLU of xn (`next`: what the GEMV after reads).
    fn matmul_glu(
        self,
        be: &B,
        (gate, up, next): (&B::Mat, &B::Mat, &[&B::Mat]),
        g: &mut B::Buf,
        u: &mut B::Buf,
    ) -> Result<()> {
        match self.add {
            Some(y) => be.add_rms_norm_matmul_glu(
                self.x,
                y,
                self.w,
                self.eps,
                self.xn,
                (gate, up, next),
                GluAct::Silu,
                g,
                u,
            )?,
            None => {
                be.rms_norm(self.x, self.w, self.eps, self.xn)?;
                be.prefetch(next)?;
                be.matmul_glu(gate, up, self.xn, GluAct::Silu, g, u)?;
            }
        }
        Ok(())
    }

    /// xn itself, for readers other than one projection call (the MoE's router and experts).
    fn normed(self, be: &B) -> Result<&'a B::Buf> {
        match self.add {
            Some(y) => be.add_rms_norm(self.x, y, self.w, self.eps, self.xn)?,
            None => be.rms_norm(self.x, self.w, self.eps, self.xn)?,
        }
        Ok(self.xn)
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_picks_top_k_and_renormalises() {
        // Two tokens, four experts.
        let logits = [0.0, 2.0, 1.0, -1.0, 3.0, 3.0, 0.0, 0.0];
        let r = route(&logits, 4, 2);
        assert_eq!(r[1].0, vec![0, 1]);
        assert_eq!(r[2].0, vec![0]);
        assert_eq!(r[0].0, vec![1]);
        assert!(r[3].0.is_empty());
        let (e1, e2) = (1f32.exp(), 2f32.exp());
        assert!((r[1].1[0] - e2 / (e1 + e2)).abs() < 1e-6);
        assert!((r[0].1[0] - 0.5).abs() < 1e-6 && (r[1].1[1] - 0.5).abs() < 1e-6);
    }
}
