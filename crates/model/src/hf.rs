//! `ModelSource` over a Hugging Face model directory: `config.json` plus safetensors
//! (bf16/f16/f32 checkpoints, and MLX affine packs with `"quantization"` in the config and,
//! for PrismML packs, `hadamard.json`).
//!
//! The models read GGUF key and tensor names, so this file owns the translation, as
//! llama.cpp's converter (`convert_hf_to_gguf.py`, `conversion/{llama,gemma}.py`) does it:
//! - config fields → `{arch}.*` keys; `rope_type: llama3` → a computed `rope_freqs` vector;
//! - HF tensor names → GGUF names (one table per family, below);
//! - Gemma 3's RMSNorm multiplies by `1 + w`: the converter stores `w + 1`, so norm vectors
//!   are shifted here (small vectors, at load);
//! - Llama q/k: the converter permutes rows within each head so that GGUF runs the GPT-J
//!   RoPE pairing (2i, 2i+1) on what HF rotates as the NeoX pairing (i, i + d/2). Both
//!   q and k get the same permutation, so q·k is unchanged and the permuted model with
//!   GPT-J RoPE equals the unpermuted one with NeoX RoPE. Rather than copying two big
//!   matrices per layer, this source keeps them as stored and declares
//!   `neagari.rope_neox = true`, which `llama.rs` honours.
//!
//! - Qwen3.5 / Qwen3.5-MoE (`qwen35`, `qwen35moe`; docs/QWEN35_HF_TO_GGUF.md): zero-centred
//!   norms get +1 (not the DeltaNet `linear_attn.norm`), `A_log` becomes `ssm_a = −exp(A_log)`,
//!   `conv1d [C,1,K]` is served as `[C,K]` (same bytes), value heads stay in HF's grouped
//!   order and `{arch}.ssm.v_head_order = "grouped"` says so (the converter permutes them to
//!   tiled order instead), fused experts (`experts.gate_up_proj [E,2F,H]`) are served as
//!   `ffn_gate_up_exps`, and the `mtp.*` block becomes block `num_hidden_layers`. Per-expert
//!   checkpoints (`experts.{e}.gate_proj`, as transformers saves them) are the one place a
//!   matrix is copied: the experts are stacked into one owned `[E, F, H]` buffer, since
//!   separate tensors of the file cannot be one view.
//! - Qwen3-Next (`qwen3next`): as Qwen3.5, except that `in_proj_qkvz` interleaves
//!   `[q | k | v | z]` per key head while the model reads `attn_qkv` (all q, all k, all v)
//!   and `attn_gate` (all z): those two are row-gathered copies, the second place a matrix
//!   is copied. `in_proj_ba` is served as `ssm_ba` unchanged.
//!
//! Matrices are never converted: bf16/f16/f32 tensors are views of the mmap with their
//! ggml type; MLX codes/scales/biases go to the backend as an `AffineTensor`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use neagari_backend::{AffineTensor, HostTensor, SharedBytes, WeightData, WeightDesc};
use neagari_formats::safetensors::{Dtype, SafeTensors, StTensor};
use neagari_quant::mlx_affine::{AffineLayout, ScaleType};
use neagari_quant::GgmlType;
use serde_json::Value as Json;

use crate::hadamard::{HadamardSpec, RotatedSet};
use crate::source::ModelSource;
use crate::{ModelError, Result};

/// A metadata value under a GGUF key.
#[derive(Clone, Debug, PartialEq)]
enum Meta {
    U(u64),
    F(f32),
    S(String),
    B(bool),
    Arr(Vec<u64>),
}

/// Per-module MLX quantization: the default and the per-path overrides of `"quantization"`.
#[derive(Clone, Debug, Default)]
struct QuantConfig {
    default: Option<AffineLayout>,
    /// Module path → layout, or `None` for `false` (kept in float).
    overrides: BTreeMap<String, Option<AffineLayout>>,
}

pub struct HfSource {
    st: Arc<SafeTensors>,
    dir: PathBuf,
    arch: String,
    meta: BTreeMap<String, Meta>,
    /// GGUF tensor name → HF tensor name as stored (`…q_proj.weight`).
    names: BTreeMap<String, String>,
    quant: QuantConfig,
    rotated: RotatedSet,
    /// Llama 3 `rope_freqs`, computed from `rope_scaling`.
    llama3_freqs: Option<Vec<f32>>,
    /// Stacked GGUF expert tensor → the per-expert HF tensors, expert order.
    stacked: BTreeMap<String, Vec<String>>,
    /// GGUF tensor → (HF matrix, its row ranges in order): Qwen3-Next's `in_proj_qkvz`.
    gathered: BTreeMap<String, (String, Rows)>,
}

fn bad(key: &str, msg: impl Into<String>) -> ModelError {
    ModelError::BadKey {
        key: key.to_string(),
        msg: msg.into(),
    }
}

/// The hybrid families (gated DeltaNet + gated attention): Qwen3.5 and Qwen3-Next.
fn is_qwen35(arch: &str) -> bool {
    matches!(arch, "qwen35" | "qwen35moe" | "qwen3next")
}

/// HF → GGUF names of one layer tensor (without the `model.layers.{i}.` prefix).
fn layer_name(arch: &str, rest: &str) -> Option<&'static str> {
    let gemma = arch == "gemma3";
    let q35 = is_qwen35(arch);
    Some(match rest {
        "post_attention_layernorm" if q35 => "post_attention_norm",
        "linear_attn.in_proj_qkv" if q35 => "attn_qkv",
        "linear_attn.in_proj_z" if q35 => "attn_gate",
        "linear_attn.in_proj_b" if q35 => "ssm_beta",
        "linear_attn.in_proj_a" if q35 => "ssm_alpha",
        "linear_attn.in_proj_ba" if q35 => "ssm_ba",
        "linear_attn.conv1d" if q35 => "ssm_conv1d",
        "linear_attn.norm" if q35 => "ssm_norm",
        "linear_attn.out_proj" if q35 => "ssm_out",
        "mlp.gate" if q35 => "ffn_gate_inp",
        "mlp.shared_expert.gate_proj" if q35 => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" if q35 => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" if q35 => "ffn_down_shexp",
        "mlp.shared_expert_gate" if q35 => "ffn_gate_inp_shexp",
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" if gemma => "ffn_norm",
        "post_feedforward_layernorm" if gemma => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    })
}

/// `model.language_model.*` (Qwen3.5 VL) and `language_model.model.*` (Gemma 3 VL) →
/// `model.*`; other prefixes unchanged.
fn strip_vl(module: &str) -> std::borrow::Cow<'_, str> {
    if let Some(r) = module.strip_prefix("model.language_model.") {
        return format!("model.{r}").into();
    }
    module
        .strip_prefix("language_model.")
        .unwrap_or(module)
        .into()
}

/// The module path (HF spelling, `language_model.` stripped) and suffix → GGUF name.
fn module_to_gguf(arch: &str, module: &str, suffix: &str) -> Option<String> {
    let m = strip_vl(module);
    let m = m.as_ref();
    let base = match m {
        "model.embed_tokens" => "token_embd".to_string(),
        "model.norm" => "output_norm".to_string(),
        "lm_head" => "output".to_string(),
        _ => {
            let rest = m.strip_prefix("model.layers.")?;
            let (i, rest) = rest.split_once('.')?;
            let i: usize = i.parse().ok()?;
            format!("blk.{i}.{}", layer_name(arch, rest)?)
        }
    };
    Some(format!("{base}.{suffix}"))
}

/// A full HF tensor name → GGUF name (`None` for tensors the models do not read, and for
/// `mtp.*` and per-expert tensors, which `HfSource` maps itself).
pub fn hf_to_gguf(arch: &str, name: &str) -> Option<String> {
    let (module, suffix) = name.rsplit_once('.')?;
    match suffix {
        "weight" | "bias" => module_to_gguf(arch, module, suffix),
        _ if is_qwen35(arch) => {
            // Parameters without a `.weight` suffix: GDN `A_log` / `dt_bias` and fused
            // experts `mlp.experts.{gate_up_proj,down_proj}`.
            let m = strip_vl(module);
            let rest = m.strip_prefix("model.layers.")?;
            let (i, rest) = rest.split_once('.')?;
            let i: usize = i.parse().ok()?;
            let g = match (rest, suffix) {
                ("linear_attn", "A_log") => "ssm_a",
                ("linear_attn", "dt_bias") => "ssm_dt.bias",
                ("mlp.experts", "gate_up_proj") => "ffn_gate_up_exps.weight",
                ("mlp.experts", "down_proj") => "ffn_down_exps.weight",
                _ => return None,
            };
            Some(format!("blk.{i}.{g}"))
        }
        _ => None,
    }
}

/// A per-expert tensor `model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight` →
/// (stacked GGUF name, e).
fn per_expert(name: &str) -> Option<(String, usize)> {
    let m = strip_vl(name.strip_suffix(".weight")?);
    let rest = m.strip_prefix("model.layers.")?;
    let (i, rest) = rest.split_once(".mlp.experts.")?;
    let i: usize = i.parse().ok()?;
    let (e, proj) = rest.split_once('.')?;
    let e: usize = e.parse().ok()?;
    let g = match proj {
        "gate_proj" => "ffn_gate_exps",
        "up_proj" => "ffn_up_exps",
        "down_proj" => "ffn_down_exps",
        _ => return None,
    };
    Some((format!("blk.{i}.{g}.weight"), e))
}

/// A Qwen3.5 `mtp.*` tensor → GGUF name; the MTP block is block `n_layers`.
fn mtp_name(arch: &str, name: &str, n_layers: u64) -> Option<String> {
    let (module, suffix) = name.rsplit_once('.')?;
    let g = match module {
        "mtp.fc" => "nextn.eh_proj".to_string(),
        "mtp.pre_fc_norm_embedding" => "nextn.enorm".to_string(),
        "mtp.pre_fc_norm_hidden" => "nextn.hnorm".to_string(),
        "mtp.norm" => "nextn.shared_head_norm".to_string(),
        _ => {
            let rest = module.strip_prefix("mtp.layers.")?;
            let (j, rest) = rest.split_once('.')?;
            let j: u64 = j.parse().ok()?;
            let blk = n_layers + j;
            return Some(format!("blk.{blk}.{}.{suffix}", layer_name(arch, rest)?));
        }
    };
    Some(format!("blk.{n_layers}.{g}.{suffix}"))
}

fn ggml_type(d: Dtype) -> Option<GgmlType> {
    Some(match d {
        Dtype::F32 => GgmlType::F32,
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
        Dtype::I8 => GgmlType::I8,
        Dtype::I16 => GgmlType::I16,
        // uint32 words (MLX codes): raw 4-byte elements.
        Dtype::I32 | Dtype::U32 => GgmlType::I32,
        Dtype::I64 => GgmlType::I64,
        Dtype::F64 => GgmlType::F64,
        _ => return None,
    })
}

fn scale_type(d: Dtype) -> Option<ScaleType> {
    Some(match d {
        Dtype::F16 => ScaleType::F16,
        Dtype::BF16 => ScaleType::BF16,
        Dtype::F32 => ScaleType::F32,
        _ => return None,
    })
}

fn parse_layout(v: &Json, key: &str) -> Result<AffineLayout> {
    if let Some(mode) = v.get("mode").and_then(Json::as_str) {
        if mode != "affine" {
            return Err(ModelError::Unsupported(format!(
                "MLX quantization mode {mode:?} ({key}); only \"affine\" is implemented"
            )));
        }
    }
    let bits = v.get("bits").and_then(Json::as_u64).unwrap_or(4);
    let group = v.get("group_size").and_then(Json::as_u64).unwrap_or(64);
    AffineLayout::new(bits as u32, group as usize).map_err(|e| bad(key, e.to_string()))
}

fn parse_quant(cfg: &Json) -> Result<QuantConfig> {
    let mut q = QuantConfig::default();
    if let Some(qc) = cfg.get("quantization_config") {
        // A non-MLX quantizer (GPTQ, AWQ, FP8, …) declares its method here.
        if let Some(m) = qc.get("quant_method").and_then(Json::as_str) {
            return Err(ModelError::Unsupported(format!(
                "quantization method {m:?} in config.json"
            )));
        }
    }
    let Some(Json::Object(obj)) = cfg.get("quantization") else {
        return Ok(q);
    };
    q.default = Some(parse_layout(&cfg["quantization"], "quantization")?);
    for (k, v) in obj {
        match v {
            Json::Object(_) => {
                q.overrides.insert(k.clone(), Some(parse_layout(v, k)?));
            }
            Json::Bool(false) => {
                q.overrides.insert(k.clone(), None);
            }
            _ => {}
        }
    }
    Ok(q)
}

/// `rope_parameters` (transformers ≥ 5) or the older top-level `rope_theta`/`rope_scaling`.
struct RopeCfg {
    theta: Option<f64>,
    scaling: Option<Json>,
    theta_local: Option<f64>,
}

fn rope_cfg(c: &Json) -> RopeCfg {
    let rp = c.get("rope_parameters");
    let full = rp.and_then(|r| r.get("full_attention")).or(rp);
    let theta = c.get("rope_theta").and_then(Json::as_f64).or_else(|| {
        full.and_then(|f| f.get("rope_theta"))
            .and_then(Json::as_f64)
    });
    let scaling = match c.get("rope_scaling") {
        Some(Json::Null) | None => full.cloned(),
        Some(s) => Some(s.clone()),
    };
    let theta_local = c
        .get("rope_local_base_freq")
        .and_then(Json::as_f64)
        .or_else(|| {
            rp.and_then(|r| r.get("sliding_attention"))
                .and_then(|s| s.get("rope_theta"))
                .and_then(Json::as_f64)
        });
    RopeCfg {
        theta,
        scaling,
        theta_local,
    }
}

/// Llama 3's per-pair frequency divisors (llama.cpp's converter computes the same vector).
fn llama3_rope_freqs(s: &Json, base: f64, dim: usize) -> Vec<f32> {
    let g = |k: &str, d: f64| s.get(k).and_then(Json::as_f64).unwrap_or(d);
    let factor = g("factor", 8.0);
    let lo = g("low_freq_factor", 1.0);
    let hi = g("high_freq_factor", 4.0);
    let old = g("original_max_position_embeddings", 8192.0);
    let (lo_wl, hi_wl) = (old / lo, old / hi);
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f64 / dim as f64);
            let wl = 2.0 * std::f64::consts::PI / freq;
            let f = if wl < hi_wl {
                1.0
            } else if wl > lo_wl {
                factor
            } else {
                let smooth = (old / wl - lo) / (hi - lo);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

impl HfSource {
    /// Opens a model directory, or a `.safetensors` / `.index.json` file whose directory
    /// holds `config.json`.
    pub fn open(path: &Path) -> Result<Self> {
        let dir = if path.is_dir() {
            path.to_path_buf()
        } else {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        };
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path)
            .map_err(|e| bad("config.json", format!("{}: {e}", cfg_path.display())))?;
        let cfg: Json =
            serde_json::from_str(&text).map_err(|e| bad("config.json", e.to_string()))?;
        // Repacks whose runtime does more than affine + Hadamard: refused by name rather than
        // loaded as a plain pack that would compute fluent garbage.
        if cfg.get("jang_config").is_some() || dir.join("jang_config.json").is_file() {
            return Err(ModelError::Unsupported(
                "JANG repack (jang_config): its tensor manifest and ternary packing are not \
                 implemented"
                    .into(),
            ));
        }
        if let Some(rt) = cfg.get("requires_runtime").and_then(Json::as_str) {
            if cfg.get("hadamard_config").is_none() {
                return Err(ModelError::Unsupported(format!(
                    "the pack requires its own runtime {rt:?}"
                )));
            }
        }
        let st = SafeTensors::open(path).map_err(|e| ModelError::Unsupported(e.to_string()))?;
        let mut src = Self::from_parts(Arc::new(st), &cfg, &dir)?;
        let hj = cfg
            .get("hadamard_config")
            .and_then(Json::as_str)
            .map(|f| dir.join(f))
            .or_else(|| Some(dir.join("hadamard.json")).filter(|p| p.is_file()));
        if let Some(p) = hj {
            let text = std::fs::read_to_string(&p)
                .map_err(|e| bad("hadamard_config", format!("{}: {e}", p.display())))?;
            src.set_rotation(HadamardSpec::from_json(&text)?)?;
        }
        Ok(src)
    }

    /// A source from an open checkpoint and its parsed `config.json`.
    pub fn from_parts(st: Arc<SafeTensors>, config: &Json, dir: &Path) -> Result<Self> {
        let quant = parse_quant(config)?;
        // Multimodal configs keep the language model's fields under `text_config`.
        let c = config.get("text_config").unwrap_or(config);
        let model_type = c
            .get("model_type")
            .or_else(|| config.get("model_type"))
            .and_then(Json::as_str)
            .ok_or_else(|| ModelError::MissingKey("config.json model_type".into()))?;
        let arch = match model_type {
            "llama" | "mistral" => "llama",
            "qwen2" => "qwen2",
            "qwen3" => "qwen3",
            "gemma3" | "gemma3_text" => "gemma3",
            "qwen3_5" | "qwen3_5_text" => "qwen35",
            "qwen3_5_moe" | "qwen3_5_moe_text" => "qwen35moe",
            "qwen3_next" => "qwen3next",
            other => return Err(ModelError::UnsupportedArch(other.to_string())),
        }
        .to_string();
        let n_layers = c.get("num_hidden_layers").and_then(Json::as_u64);
        let mut names = BTreeMap::new();
        let mut experts: BTreeMap<String, BTreeMap<usize, String>> = BTreeMap::new();
        let mut mtp_layers = 0;
        let mut gathered = BTreeMap::new();
        for (n, _) in st.tensors() {
            if let Some(g) = hf_to_gguf(&arch, n) {
                names.insert(g, n.to_string());
                continue;
            }
            if !is_qwen35(&arch) {
                continue;
            }
            if let Some(i) = n
                .strip_prefix("model.layers.")
                .and_then(|r| r.strip_suffix(".linear_attn.in_proj_qkvz.weight"))
                .and_then(|i| i.parse::<usize>().ok())
            {
                let (qkv, z) = qkvz_rows(c)?;
                gathered.insert(format!("blk.{i}.attn_qkv.weight"), (n.to_string(), qkv));
                gathered.insert(format!("blk.{i}.attn_gate.weight"), (n.to_string(), z));
            } else if let Some((g, e)) = per_expert(n) {
                experts.entry(g).or_default().insert(e, n.to_string());
            } else if let Some(g) = n_layers.and_then(|l| mtp_name(&arch, n, l)) {
                // One MTP block (Qwen3.5 ships `mtp_num_hidden_layers = 1`).
                if n == "mtp.fc.weight" {
                    mtp_layers = 1;
                }
                names.insert(g, n.to_string());
            }
        }
        let mut stacked = BTreeMap::new();
        for (g, per) in experts {
            // Experts 0..E, every one present.
            if per.keys().copied().eq(0..per.len()) {
                stacked.insert(g, per.into_values().collect());
            } else {
                return Err(bad(
                    &g,
                    "per-expert tensors with gaps in the expert numbers",
                ));
            }
        }
        let mut src = HfSource {
            st,
            dir: dir.to_path_buf(),
            arch: arch.clone(),
            meta: BTreeMap::new(),
            names,
            quant,
            rotated: RotatedSet::default(),
            llama3_freqs: None,
            stacked,
            gathered,
        };
        src.read_config(c)?;
        if is_qwen35(&arch) {
            src.read_qwen35_config(c, mtp_layers)?;
        }
        Ok(src)
    }

    fn read_config(&mut self, c: &Json) -> Result<()> {
        let arch = self.arch.clone();
        let u = |k: &str| c.get(k).and_then(Json::as_u64);
        let f = |k: &str| c.get(k).and_then(Json::as_f64);
        let mut put = |k: &str, v: Meta| {
            self.meta.insert(format!("{arch}.{k}"), v);
        };
        let req = |k: &str| u(k).ok_or_else(|| ModelError::MissingKey(format!("config.json {k}")));
        let n_layers = req("num_hidden_layers")?;
        let hidden = req("hidden_size")?;
        let heads = req("num_attention_heads")?;
        put("block_count", Meta::U(n_layers));
        put("embedding_length", Meta::U(hidden));
        // MoE configs (Qwen3.5-MoE) may have no dense FFN width.
        match u("intermediate_size") {
            Some(v) => put("feed_forward_length", Meta::U(v)),
            None if arch == "qwen35moe" => {}
            None => put("feed_forward_length", Meta::U(req("intermediate_size")?)),
        }
        put("attention.head_count", Meta::U(heads));
        put(
            "attention.head_count_kv",
            Meta::U(u("num_key_value_heads").unwrap_or(heads)),
        );
        let head_dim = u("head_dim").unwrap_or(if arch == "gemma3" {
            256
        } else {
            hidden / heads.max(1)
        });
        put("attention.key_length", Meta::U(head_dim));
        put("attention.value_length", Meta::U(head_dim));
        put("rope.dimension_count", Meta::U(head_dim));
        if let Some(n) = u("max_position_embeddings") {
            put("context_length", Meta::U(n));
        }
        let eps = f("rms_norm_eps").unwrap_or(if arch == "gemma3" { 1e-6 } else { 1e-5 });
        put("attention.layer_norm_rms_epsilon", Meta::F(eps as f32));
        let rope = rope_cfg(c);
        let theta = rope
            .theta
            .unwrap_or(if arch == "gemma3" { 1e6 } else { 1e4 });
        put("rope.freq_base", Meta::F(theta as f32));
        if let Some(s) = &rope.scaling {
            let ty = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Json::as_str)
                .unwrap_or("default");
            let factor = s.get("factor").and_then(Json::as_f64);
            match ty {
                "default" => {}
                "linear" => {
                    put("rope.scaling.type", Meta::S("linear".into()));
                    put("rope.scaling.factor", Meta::F(factor.unwrap_or(1.0) as f32));
                }
                "yarn" => {
                    put("rope.scaling.type", Meta::S("yarn".into()));
                    put("rope.scaling.factor", Meta::F(factor.unwrap_or(1.0) as f32));
                    if let Some(o) = s
                        .get("original_max_position_embeddings")
                        .and_then(Json::as_u64)
                    {
                        put("rope.scaling.original_context_length", Meta::U(o));
                    }
                    for (hk, gk) in [
                        ("beta_fast", "rope.scaling.yarn_beta_fast"),
                        ("beta_slow", "rope.scaling.yarn_beta_slow"),
                    ] {
                        if let Some(v) = s.get(hk).and_then(Json::as_f64) {
                            put(gk, Meta::F(v as f32));
                        }
                    }
                    if let Some(v) = s
                        .get("attention_factor")
                        .or_else(|| s.get("attn_factor"))
                        .and_then(Json::as_f64)
                    {
                        put("rope.scaling.attn_factor", Meta::F(v as f32));
                    }
                }
                "llama3" if arch == "llama" => {
                    // Stored as the `rope_freqs` tensor, as the converter does.
                }
                other => {
                    return Err(ModelError::Unsupported(format!(
                        "RoPE scaling {other:?} in config.json"
                    )))
                }
            }
        }
        if arch == "gemma3" {
            put(
                "rope.freq_base_swa",
                Meta::F(rope.theta_local.unwrap_or(1e4) as f32),
            );
            if let Some(w) = u("sliding_window") {
                put("attention.sliding_window", Meta::U(w));
            }
            if let Some(Json::Array(lt)) = c.get("layer_types") {
                let pat: Option<Vec<u64>> = lt
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("sliding_attention") => Some(1),
                        Some("full_attention") => Some(0),
                        _ => None,
                    })
                    .collect();
                let pat = pat.ok_or_else(|| bad("layer_types", "unknown layer type"))?;
                put("attention.sliding_window_pattern", Meta::Arr(pat));
            } else if let Some(p) = u("sliding_window_pattern") {
                put("attention.sliding_window_pattern", Meta::U(p));
            }
            if let Some(cap) = f("final_logit_softcapping") {
                put("final_logit_softcapping", Meta::F(cap as f32));
            }
        }
        if arch == "llama" {
            self.meta.insert("neagari.rope_neox".into(), Meta::B(true));
        }
        self.meta
            .insert("general.architecture".into(), Meta::S(arch.clone()));
        let name = self
            .dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| arch.clone());
        self.meta.insert("general.name".into(), Meta::S(name));
        // Llama 3 rope scaling: computed now, served as `rope_freqs.weight`.
        if let Some(s) = rope.scaling.as_ref().filter(|s| {
            s.get("rope_type").and_then(Json::as_str) == Some("llama3") && arch == "llama"
        }) {
            self.llama3_freqs = Some(llama3_rope_freqs(s, theta, head_dim as usize));
        }
        Ok(())
    }

    /// The hybrid keys: layer types, DeltaNet sizes, experts, partial RoPE and MTP.
    fn read_qwen35_config(&mut self, c: &Json, mtp_layers: u64) -> Result<()> {
        let arch = self.arch.clone();
        let req = |k: &str| {
            c.get(k)
                .and_then(Json::as_u64)
                .ok_or_else(|| ModelError::MissingKey(format!("config.json {k}")))
        };
        let n_layers = req("num_hidden_layers")?;
        let head_dim = match self.meta.get(&format!("{arch}.attention.key_length")) {
            Some(Meta::U(v)) => *v,
            _ => return Err(ModelError::MissingKey("config.json head_dim".into())),
        };
        let rp = c.get("rope_parameters");
        let partial = c
            .get("partial_rotary_factor")
            .or_else(|| rp.and_then(|r| r.get("partial_rotary_factor")))
            .and_then(Json::as_f64)
            .unwrap_or(1.0);
        let recurrent: Vec<u64> = match c.get("layer_types") {
            Some(Json::Array(lt)) => lt
                .iter()
                .map(|t| match t.as_str() {
                    Some("linear_attention") => Ok(1),
                    Some("full_attention") => Ok(0),
                    _ => Err(bad("layer_types", format!("unknown layer type {t}"))),
                })
                .collect::<Result<_>>()?,
            _ => {
                let every = c
                    .get("full_attention_interval")
                    .and_then(Json::as_u64)
                    .unwrap_or(4)
                    .max(1);
                (0..n_layers)
                    .map(|i| u64::from((i + 1) % every != 0))
                    .collect()
            }
        };
        if recurrent.len() as u64 != n_layers {
            return Err(bad(
                "layer_types",
                format!("{} entries for {n_layers} layers", recurrent.len()),
            ));
        }
        let (nk, nv, dk, dv) = (
            req("linear_num_key_heads")?,
            req("linear_num_value_heads")?,
            req("linear_key_head_dim")?,
            req("linear_value_head_dim")?,
        );
        let mut put = |k: &str, v: Meta| {
            self.meta.insert(format!("{arch}.{k}"), v);
        };
        put("block_count", Meta::U(n_layers + mtp_layers));
        if mtp_layers > 0 {
            put("nextn_predict_layers", Meta::U(mtp_layers));
        }
        put(
            "rope.dimension_count",
            Meta::U((head_dim as f64 * partial).round() as u64),
        );
        put("attention.recurrent_layers", Meta::Arr(recurrent));
        put("ssm.conv_kernel", Meta::U(req("linear_conv_kernel_dim")?));
        put("ssm.state_size", Meta::U(dk));
        put("ssm.group_count", Meta::U(nk));
        put("ssm.time_step_rank", Meta::U(nv));
        put("ssm.inner_size", Meta::U(dv * nv));
        // Value heads are served in HF order (grouped by key head), not llama.cpp's tiled one.
        put("ssm.v_head_order", Meta::S("grouped".into()));
        for (hk, gk) in [
            ("num_experts", "expert_count"),
            ("num_experts_per_tok", "expert_used_count"),
            ("moe_intermediate_size", "expert_feed_forward_length"),
            (
                "shared_expert_intermediate_size",
                "expert_shared_feed_forward_length",
            ),
        ] {
            if let Some(v) = c.get(hk).and_then(Json::as_u64) {
                put(gk, Meta::U(v));
            }
        }
        Ok(())
    }

    /// Applies a Hadamard declaration: every declared weight must be one this source maps.
    pub fn set_rotation(&mut self, spec: HadamardSpec) -> Result<()> {
        let arch = self.arch.clone();
        if is_qwen35(&arch) {
            // The rotation's V-head order (`gdn_v_grouped`) against the grouped order served
            // here has not been checked against a reference.
            return Err(ModelError::Unsupported(
                "Hadamard-rotated weights on a Qwen3.5 hybrid safetensors checkpoint".into(),
            ));
        }
        let set = RotatedSet::resolve(spec, |n| {
            let n = n.strip_suffix(".weight").unwrap_or(n);
            module_to_gguf(&arch, n, "weight")
        })?;
        // Stored signs (`P.signs`) must agree with the declaration.
        for g in &set.names {
            let Some(hf) = self.names.get(g) else {
                return Err(ModelError::Unsupported(format!(
                    "Hadamard-rotated weights: declared {g} is not in the checkpoint"
                )));
            };
            let module = hf.strip_suffix(".weight").unwrap_or(hf);
            if let Some(t) = self.st.tensor(&format!("{module}.signs")) {
                let stored = self
                    .floats(t)
                    .ok_or_else(|| bad(&format!("{module}.signs"), "not an f16/bf16/f32 vector"))?;
                let want = set.rotation_of(g, stored.len())?;
                if want.map(|r| r.signs.to_vec()) != Some(stored) {
                    return Err(ModelError::Unsupported(format!(
                        "Hadamard-rotated weights: {module}.signs differ from hadamard.json"
                    )));
                }
            }
        }
        self.rotated = set;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn view(&self, t: &StTensor) -> Option<SharedBytes> {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.st.files().get(t.file)?.clone();
        SharedBytes::new(owner, t.start, t.len)
    }

    /// A float tensor's values as f32 (small vectors only).
    fn floats(&self, t: &StTensor) -> Option<Vec<f32>> {
        let ty = ggml_type(t.dtype)?;
        let n: usize = t.shape.iter().product();
        let mut out = vec![0f32; n];
        neagari_quant::dequantize_row(ty, self.st.bytes(t), &mut out).ok()?;
        Some(out)
    }

    /// The MLX layout of module `m` when it is quantized (`m.scales` present).
    fn affine_layout(&self, module: &str) -> Result<Option<AffineLayout>> {
        if self.st.tensor(&format!("{module}.scales")).is_none() {
            return Ok(None);
        }
        let path = module.strip_prefix("language_model.").unwrap_or(module);
        let l = match self
            .quant
            .overrides
            .get(module)
            .or_else(|| self.quant.overrides.get(path))
        {
            Some(Some(l)) => Some(*l),
            Some(None) => None,
            None => self.quant.default,
        };
        l.map(Some).ok_or_else(|| {
            bad(
                &format!("{module}.scales"),
                "quantized tensors without a \"quantization\" entry in config.json",
            )
        })
    }

    fn affine(&self, module: &str, l: AffineLayout) -> Result<(Vec<usize>, AffineTensor)> {
        let get = |s: &str| {
            let n = format!("{module}.{s}");
            self.st.tensor(&n).ok_or(ModelError::MissingTensor(n))
        };
        let (w, s, b) = (get("weight")?, get("scales")?, get("biases")?);
        let name = format!("{module}.weight");
        let [out, words] = w.shape[..] else {
            return Err(bad(&name, format!("codes of shape {:?}", w.shape)));
        };
        if !matches!(w.dtype, Dtype::U32 | Dtype::I32) {
            return Err(bad(&name, format!("codes of dtype {:?}", w.dtype)));
        }
        let cols = words * 32 / l.bits as usize;
        let st = scale_type(s.dtype)
            .filter(|_| s.dtype == b.dtype)
            .ok_or_else(|| {
                bad(
                    &name,
                    format!("scales {:?} / biases {:?}", s.dtype, b.dtype),
                )
            })?;
        let want = [out, cols / l.group];
        if s.shape != want || b.shape != want || words * 32 % l.bits as usize != 0 {
            return Err(bad(
                &name,
                format!(
                    "codes {:?}, scales {:?}, biases {:?} do not fit {}-bit groups of {}",
                    w.shape, s.shape, b.shape, l.bits, l.group
                ),
            ));
        }
        let view = |t: &StTensor| {
            self.view(t)
                .ok_or_else(|| bad(&name, "tensor bytes outside the file"))
        };
        Ok((
            vec![out, cols],
            AffineTensor {
                layout: l,
                scale_type: st,
                codes: view(w)?,
                scales: view(s)?,
                biases: view(b)?,
            },
        ))
    }
}

impl ModelSource for HfSource {
    fn architecture(&self) -> Result<String> {
        Ok(self.arch.clone())
    }

    fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(Meta::U(v)) => Ok(Some(*v)),
            Some(v) => Err(bad(key, format!("expected an integer, found {v:?}"))),
        }
    }

    fn f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(Meta::F(v)) => Ok(Some(*v)),
            Some(Meta::U(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(bad(key, format!("expected a number, found {v:?}"))),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<String>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(Meta::S(s)) => Ok(Some(s.clone())),
            Some(v) => Err(bad(key, format!("expected a string, found {v:?}"))),
        }
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.meta.get(key) {
            None => Ok(None),
            Some(Meta::B(b)) => Ok(Some(*b)),
            Some(v) => Err(bad(key, format!("expected a bool, found {v:?}"))),
        }
    }

    fn u64_array_opt(&self, key: &str) -> Result<Option<Vec<u64>>> {
        match self.meta.get(key) {
            Some(Meta::Arr(a)) => Ok(Some(a.clone())),
            _ => Ok(None),
        }
    }

    fn tensor(&self, name: &str) -> Option<HostTensor> {
        if name == "rope_freqs.weight" {
            let v = self.llama3_freqs.as_ref()?;
            return Some(owned_f32(name, v.clone()));
        }
        if let Some(per) = self.stacked.get(name) {
            return self.stack(name, per);
        }
        if let Some((hf, rows)) = self.gathered.get(name) {
            return self.gather(name, hf, rows);
        }
        let hf = self.names.get(name)?;
        let t = self.st.tensor(hf)?;
        // Gemma's and Qwen3.5's norms compute x·(1 + w); the models read GGUF's stored
        // w + 1. Qwen3.5's DeltaNet norm is a plain RMSNorm.
        let zero_centred =
            self.arch == "gemma3" || (is_qwen35(&self.arch) && !name.ends_with("ssm_norm.weight"));
        if zero_centred && name.ends_with("norm.weight") {
            let v = self.floats(t)?.into_iter().map(|x| x + 1.0).collect();
            return Some(owned_f32(name, v));
        }
        if name.ends_with(".ssm_a") {
            let v = self.floats(t)?.into_iter().map(|x| -x.exp()).collect();
            return Some(owned_f32(name, v));
        }
        let shape = match t.shape[..] {
            // conv1d `[C, 1, K]`: the same bytes as `[C, K]`.
            [c, 1, k] if name.ends_with("ssm_conv1d.weight") => vec![c, k],
            _ => t.shape.clone(),
        };
        Some(HostTensor {
            name: name.to_string(),
            ty: ggml_type(t.dtype)?,
            shape,
            bytes: self.view(t)?,
        })
    }

    fn weight(&self, name: &str) -> Result<Option<WeightDesc>> {
        if let Some((hf, _)) = self.gathered.get(name) {
            let module = hf.strip_suffix(".weight").unwrap_or(hf);
            if self.affine_layout(module)?.is_some() {
                return Err(ModelError::Unsupported(format!(
                    "{hf}: splitting a quantized fused q/k/v/z projection"
                )));
            }
        }
        if self.stacked.contains_key(name) || self.gathered.contains_key(name) {
            return Ok(self.tensor(name).map(|t| WeightDesc {
                name: name.to_string(),
                shape: t.shape.clone(),
                data: WeightData::Ggml(t),
                rotation: None,
            }));
        }
        let Some(hf) = self.names.get(name) else {
            return Ok(None);
        };
        let module = hf.strip_suffix(".weight").unwrap_or(hf);
        let (shape, data) = match self.affine_layout(module)? {
            Some(l) => {
                let (shape, a) = self.affine(module, l)?;
                (shape, WeightData::MlxAffine(a))
            }
            None => match self.tensor(name) {
                Some(t) => (t.shape.clone(), WeightData::Ggml(t)),
                None => return Err(bad(name, format!("{hf}: dtype not loadable as a matrix"))),
            },
        };
        let width = shape.last().copied().unwrap_or(0);
        let rotation = self.rotated.rotation_of(name, width)?;
        Ok(Some(WeightDesc {
            name: name.to_string(),
            shape,
            data,
            rotation,
        }))
    }
}

/// Row ranges of a matrix, in serving order.
type Rows = Vec<std::ops::Range<usize>>;

/// Qwen3-Next `in_proj_qkvz` rows: per key head `[q dk | k dk | v r·dv | z r·dv]`. Returns
/// the row ranges of `attn_qkv` (q of every head, then k, then v) and of `attn_gate` (z).
fn qkvz_rows(c: &Json) -> Result<(Rows, Rows)> {
    let req = |k: &str| {
        c.get(k)
            .and_then(Json::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingKey(format!("config.json {k}")))
    };
    let (nk, nv) = (req("linear_num_key_heads")?, req("linear_num_value_heads")?);
    let (dk, dv) = (req("linear_key_head_dim")?, req("linear_value_head_dim")?);
    if nk == 0 || nv % nk != 0 {
        return Err(bad(
            "linear_num_value_heads",
            format!("{nv} value heads for {nk} key heads"),
        ));
    }
    let vr = nv / nk * dv;
    let per = 2 * dk + 2 * vr;
    let head = |h: usize, off: usize, len: usize| h * per + off..h * per + off + len;
    let mut qkv: Rows = (0..nk).map(|h| head(h, 0, dk)).collect();
    qkv.extend((0..nk).map(|h| head(h, dk, dk)));
    qkv.extend((0..nk).map(|h| head(h, 2 * dk, vr)));
    let z = (0..nk).map(|h| head(h, 2 * dk + vr, vr)).collect();
    Ok((qkv, z))
}

impl HfSource {
    /// Rows `rows` of the matrix `hf`, copied in order into one `[Σ rows, cols]` tensor.
    fn gather(&self, name: &str, hf: &str, rows: &Rows) -> Option<HostTensor> {
        let t = self.st.tensor(hf)?;
        let ty = ggml_type(t.dtype)?;
        let [n_rows, cols] = t.shape[..] else {
            return None;
        };
        let row_bytes = t.len / n_rows.max(1);
        let src = self.st.bytes(t);
        let mut bytes = Vec::with_capacity(t.len);
        let mut n = 0;
        for r in rows {
            bytes.extend_from_slice(src.get(r.start * row_bytes..r.end * row_bytes)?);
            n += r.len();
        }
        Some(HostTensor {
            name: name.to_string(),
            ty,
            shape: vec![n, cols],
            bytes: SharedBytes::from_vec(bytes),
        })
    }

    /// Per-expert matrices `[F, H]` copied into one `[E, F, H]` buffer (`None` when they
    /// differ in dtype or shape, or are not plain float/int tensors).
    fn stack(&self, name: &str, per: &[String]) -> Option<HostTensor> {
        let first = self.st.tensor(per.first()?)?;
        let ty = ggml_type(first.dtype)?;
        let mut bytes = Vec::with_capacity(first.len * per.len());
        for n in per {
            let t = self.st.tensor(n)?;
            if t.dtype != first.dtype || t.shape != first.shape {
                return None;
            }
            bytes.extend_from_slice(self.st.bytes(t));
        }
        let mut shape = vec![per.len()];
        shape.extend_from_slice(&first.shape);
        Some(HostTensor {
            name: name.to_string(),
            ty,
            shape,
            bytes: SharedBytes::from_vec(bytes),
        })
    }
}

fn owned_f32(name: &str, v: Vec<f32>) -> HostTensor {
    let n = v.len();
    HostTensor {
        name: name.to_string(),
        ty: GgmlType::F32,
        shape: vec![n],
        bytes: SharedBytes::from_vec(v.iter().flat_map(|x| x.to_le_bytes()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_per_family() {
        let m = |a, n| hf_to_gguf(a, n);
        assert_eq!(
            m("llama", "model.layers.3.self_attn.q_proj.weight").as_deref(),
            Some("blk.3.attn_q.weight")
        );
        assert_eq!(
            m("qwen2", "model.layers.0.self_attn.k_proj.bias").as_deref(),
            Some("blk.0.attn_k.bias")
        );
        assert_eq!(
            m("llama", "model.layers.1.post_attention_layernorm.weight").as_deref(),
            Some("blk.1.ffn_norm.weight")
        );
        assert_eq!(
            m("gemma3", "model.layers.1.post_attention_layernorm.weight").as_deref(),
            Some("blk.1.post_attention_norm.weight")
        );
        assert_eq!(
            m(
                "gemma3",
                "language_model.model.layers.1.pre_feedforward_layernorm.weight"
            )
            .as_deref(),
            Some("blk.1.ffn_norm.weight")
        );
        assert_eq!(
            m("llama", "lm_head.weight").as_deref(),
            Some("output.weight")
        );
        assert_eq!(m("llama", "model.layers.0.self_attn.q_proj.scales"), None);
        assert_eq!(m("llama", "model.rotary_emb.inv_freq"), None);
    }

    #[test]
    fn qwen35_names_map() {
        let m = |n| hf_to_gguf("qwen35moe", n);
        let cases = [
            ("model.layers.0.linear_attn.A_log", "blk.0.ssm_a"),
            ("model.layers.2.linear_attn.dt_bias", "blk.2.ssm_dt.bias"),
            (
                "model.language_model.layers.1.linear_attn.in_proj_qkv.weight",
                "blk.1.attn_qkv.weight",
            ),
            (
                "model.layers.1.post_attention_layernorm.weight",
                "blk.1.post_attention_norm.weight",
            ),
            (
                "model.layers.3.mlp.experts.gate_up_proj",
                "blk.3.ffn_gate_up_exps.weight",
            ),
            (
                "model.layers.3.mlp.shared_expert_gate.weight",
                "blk.3.ffn_gate_inp_shexp.weight",
            ),
            ("model.language_model.norm.weight", "output_norm.weight"),
        ];
        for (hf, g) in cases {
            assert_eq!(m(hf).as_deref(), Some(g), "{hf}");
        }
        assert_eq!(m("model.visual.blocks.0.attn.qkv.weight"), None);
        // Per-expert and MTP tensors are mapped by the source, not by name alone.
        assert_eq!(m("model.layers.0.mlp.experts.5.up_proj.weight"), None);
        assert_eq!(
            per_expert("model.layers.0.mlp.experts.5.up_proj.weight"),
            Some(("blk.0.ffn_up_exps.weight".into(), 5))
        );
        assert_eq!(
            mtp_name("qwen35", "mtp.layers.0.self_attn.q_norm.weight", 6).as_deref(),
            Some("blk.6.attn_q_norm.weight")
        );
        assert_eq!(
            mtp_name("qwen35", "mtp.pre_fc_norm_hidden.weight", 6).as_deref(),
            Some("blk.6.nextn.hnorm.weight")
        );
        // Qwen3.5-only names stay unmapped for the other families.
        assert_eq!(
            hf_to_gguf("qwen3", "model.layers.0.linear_attn.A_log"),
            None
        );
    }

    #[test]
    fn llama3_freqs_follow_the_published_rule() {
        let s: Json = serde_json::json!({"factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        let f = llama3_rope_freqs(&s, 500000.0, 128);
        // Highest frequencies are untouched, lowest divided by the factor.
        assert_eq!(f[0], 1.0);
        assert_eq!(*f.last().unwrap(), 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }
}
