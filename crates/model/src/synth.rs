//! Random-weight GGUFs of a Qwen3.5/3.6 hybrid shape, written streaming (no tensor is held
//! whole): for memory and speed work on shapes whose real weights are not on the machine.
//! The file is what llama.cpp's converter would write for such a checkpoint (`qwen35` arch,
//! folded norms, `ssm_a` negative), with matrices in one quantized type.
//!
//! Each matrix row is one of a small pool of rows per row width, made by the quant crate's
//! reference quantizer from uniform noise of variance `1/in` (so activations stay O(1));
//! the pool keeps generation at write speed for a 15 GB file.

use std::io::Write;

use neagari_formats::{GgmlType, GgufError, GgufWriter};
use neagari_quant::QuantError;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Quant(#[from] QuantError),
    #[error("{0}")]
    Shape(String),
}

/// The hyper-parameters of a `qwen35` file.
#[derive(Clone, Debug)]
pub struct SynthShape {
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub ssm_k_heads: usize,
    pub ssm_v_heads: usize,
    pub ssm_d_k: usize,
    pub ssm_d_v: usize,
    pub conv_kernel: usize,
    /// Layer i is full attention iff `(i + 1) % interval == 0`.
    pub full_attention_interval: usize,
    pub rope_dims: usize,
    pub rope_base: f32,
}

impl SynthShape {
    /// Qwen3.6-27B (the Bonsai 27B backbone): 64 layers, 48 Gated DeltaNet + 16 gated
    /// attention, hidden 5120, FFN 17408, 24 query / 4 KV heads of 256 (64 rotary dims),
    /// DeltaNet 16 key / 48 value heads of 128, vocabulary 248,320.
    pub fn qwen36_27b() -> Self {
        SynthShape {
            n_layers: 64,
            n_embd: 5120,
            n_ff: 17408,
            n_heads: 24,
            n_kv_heads: 4,
            head_dim: 256,
            n_vocab: 248_320,
            ssm_k_heads: 16,
            ssm_v_heads: 48,
            ssm_d_k: 128,
            ssm_d_v: 128,
            conv_kernel: 4,
            full_attention_interval: 4,
            rope_dims: 64,
            rope_base: 10_000_000.0,
        }
    }

    pub fn is_recurrent(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_attention_interval.max(1))
    }

    fn key_dim(&self) -> usize {
        self.ssm_k_heads * self.ssm_d_k
    }

    fn value_dim(&self) -> usize {
        self.ssm_v_heads * self.ssm_d_v
    }

    /// Tensors as (name, HF-order shape `[out, in]` or `[n]`, quantized?).
    fn tensors(&self) -> Vec<(String, Vec<usize>, bool)> {
        let h = self.n_embd;
        let mut t = vec![
            ("token_embd.weight".to_string(), vec![self.n_vocab, h], true),
            ("output_norm.weight".to_string(), vec![h], false),
            ("output.weight".to_string(), vec![self.n_vocab, h], true),
        ];
        for i in 0..self.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            t.push((n("attn_norm"), vec![h], false));
            t.push((n("post_attention_norm"), vec![h], false));
            if self.is_recurrent(i) {
                let ch = 2 * self.key_dim() + self.value_dim();
                let nv = self.ssm_v_heads;
                t.push((n("attn_qkv"), vec![ch, h], true));
                t.push((n("attn_gate"), vec![self.value_dim(), h], true));
                t.push((n("ssm_beta"), vec![nv, h], true));
                t.push((n("ssm_alpha"), vec![nv, h], true));
                t.push((n("ssm_conv1d"), vec![ch, self.conv_kernel], false));
                t.push((format!("blk.{i}.ssm_a"), vec![nv], false));
                t.push((format!("blk.{i}.ssm_dt.bias"), vec![nv], false));
                t.push((n("ssm_norm"), vec![self.ssm_d_v], false));
                t.push((n("ssm_out"), vec![h, self.value_dim()], true));
            } else {
                let q = self.n_heads * self.head_dim;
                let kv = self.n_kv_heads * self.head_dim;
                t.push((n("attn_q"), vec![2 * q, h], true));
                t.push((n("attn_k"), vec![kv, h], true));
                t.push((n("attn_v"), vec![kv, h], true));
                t.push((n("attn_output"), vec![h, q], true));
                t.push((n("attn_q_norm"), vec![self.head_dim], false));
                t.push((n("attn_k_norm"), vec![self.head_dim], false));
            }
            t.push((n("ffn_gate"), vec![self.n_ff, h], true));
            t.push((n("ffn_up"), vec![self.n_ff, h], true));
            t.push((n("ffn_down"), vec![h, self.n_ff], true));
        }
        t
    }
}

/// splitmix64: a small, fast, seedable generator (quality is irrelevant here).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

const POOL: usize = 16;

/// Writes the file to `w` and returns the bytes of tensor data.
pub fn write_qwen35<W: Write>(
    w: W,
    shape: &SynthShape,
    ty: GgmlType,
    seed: u64,
) -> Result<u64, SynthError> {
    write_qwen35_with_progress(w, shape, ty, seed, &mut |_, _| {})
}

/// `write_qwen35`, calling `progress(done, total)` with bytes of tensor data as they are
/// written (for a progress bar).
pub fn write_qwen35_with_progress<W: Write>(
    w: W,
    shape: &SynthShape,
    ty: GgmlType,
    seed: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64, SynthError> {
    let arch = "qwen35";
    let mut g = GgufWriter::new();
    let k = |s: &str| format!("{arch}.{s}");
    g.add("general.architecture", arch)?;
    g.add("general.name", "synthetic qwen35")?;
    g.add(k("block_count"), shape.n_layers as u32)?;
    g.add(k("context_length"), 262_144u32)?;
    g.add(k("embedding_length"), shape.n_embd as u32)?;
    g.add(k("feed_forward_length"), shape.n_ff as u32)?;
    g.add(k("attention.head_count"), shape.n_heads as u32)?;
    g.add(k("attention.head_count_kv"), shape.n_kv_heads as u32)?;
    g.add(k("attention.key_length"), shape.head_dim as u32)?;
    g.add(k("attention.value_length"), shape.head_dim as u32)?;
    g.add(k("attention.layer_norm_rms_epsilon"), 1e-6f32)?;
    g.add(k("rope.freq_base"), shape.rope_base)?;
    g.add(k("rope.dimension_count"), shape.rope_dims as u32)?;
    g.add(k("rope.dimension_sections"), vec![11u32, 11, 10, 0])?;
    g.add(k("ssm.conv_kernel"), shape.conv_kernel as u32)?;
    g.add(k("ssm.state_size"), shape.ssm_d_k as u32)?;
    g.add(k("ssm.group_count"), shape.ssm_k_heads as u32)?;
    g.add(k("ssm.time_step_rank"), shape.ssm_v_heads as u32)?;
    g.add(k("ssm.inner_size"), shape.value_dim() as u32)?;
    g.add(
        k("attention.recurrent_layers"),
        (0..shape.n_layers)
            .map(|i| shape.is_recurrent(i))
            .collect::<Vec<bool>>(),
    )?;
    g.add(
        k("full_attention_interval"),
        shape.full_attention_interval as u32,
    )?;
    add_vocab(&mut g, shape.n_vocab)?;
    let tensors = shape.tensors();
    for (name, s, quant) in &tensors {
        let t = if *quant { ty } else { GgmlType::F32 };
        let ne: Vec<u64> = s.iter().rev().map(|&d| d as u64).collect();
        g.add_tensor(name.clone(), &ne, t)?;
    }
    let total: u64 = g.tensor_infos()?.iter().map(|t| t.n_bytes).sum();
    let mut out = g.start(w)?;
    let mut done = 0u64;
    let mut rng = Rng(seed);
    // Row pools by input width.
    let mut pools: Vec<(usize, Vec<u8>, usize)> = Vec::new();
    for (name, s, quant) in &tensors {
        if !*quant {
            let n: usize = s.iter().product();
            let vals: Vec<f32> = (0..n).map(|_| vector_value(name, s, &mut rng)).collect();
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            out.write_tensor(&bytes)?;
            done += bytes.len() as u64;
            progress(done, total);
            continue;
        }
        let (rows, cols) = (s[0], s[1]);
        let rb = ty
            .row_bytes(cols)
            .ok_or_else(|| SynthError::Shape(format!("{name}: {cols} not whole {ty} blocks")))?;
        if !pools.iter().any(|p| p.0 == cols) {
            let a = (3.0 / cols as f32).sqrt();
            let mut bytes = vec![0u8; POOL * rb];
            let mut x = vec![0f32; cols];
            for r in 0..POOL {
                x.iter_mut().for_each(|v| *v = a * rng.uniform());
                neagari_quant::quantize_row(ty, &x, &mut bytes[r * rb..(r + 1) * rb])?;
            }
            pools.push((cols, bytes, rb));
        }
        let pool = &pools.iter().find(|p| p.0 == cols).expect("pool").1;
        let off = (rng.next() % POOL as u64) as usize;
        // A few rows at a time keeps the writes large without holding the tensor.
        let mut buf = Vec::with_capacity(64 * rb);
        for r in 0..rows {
            let p = (r * 7 + off) % POOL;
            buf.extend_from_slice(&pool[p * rb..(p + 1) * rb]);
            if buf.len() >= 64 * rb {
                out.write_chunk(&buf)?;
                done += buf.len() as u64;
                progress(done, total);
                buf.clear();
            }
        }
        out.write_chunk(&buf)?;
        done += buf.len() as u64;
        progress(done, total);
    }
    out.finish()?;
    Ok(total)
}

/// A byte-level BPE vocabulary with a single merge (every byte its own token, "ab", then
/// control tokens up to `n_vocab`), so the engine's loader and `neagari bench` accept the file. Text
/// through it is about one token per byte.
fn add_vocab(g: &mut GgufWriter, n_vocab: usize) -> Result<(), SynthError> {
    if n_vocab < 260 {
        return Ok(());
    }
    // GPT-2's reversible byte → printable character map.
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut extra = 0;
    for b in 0u32..256 {
        let c = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        tokens.push(char::from_u32(c).unwrap_or('?').to_string());
    }
    let mut types = vec![1i32; 256];
    for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] {
        tokens.push(t.to_string());
        types.push(3);
    }
    // The tokenizer wants at least one merge.
    tokens.push("ab".to_string());
    types.push(1);
    while tokens.len() < n_vocab {
        tokens.push(format!("<|unused_{}|>", tokens.len()));
        types.push(3);
    }
    g.add("tokenizer.ggml.model", "gpt2")?;
    g.add("tokenizer.ggml.pre", "qwen35")?;
    g.add("tokenizer.ggml.tokens", tokens)?;
    g.add("tokenizer.ggml.token_type", types)?;
    g.add("tokenizer.ggml.merges", vec!["a b".to_string()])?;
    g.add("tokenizer.ggml.eos_token_id", 258u32)?;
    g.add("tokenizer.ggml.padding_token_id", 256u32)?;
    Ok(())
}

/// Values of the small f32 tensors, in the ranges real checkpoints have.
fn vector_value(name: &str, shape: &[usize], rng: &mut Rng) -> f32 {
    let u = rng.uniform();
    if name.ends_with("ssm_a") {
        // −exp(A_log), A_log in [0, 2.7]
        -(1.0 + 7.0 * (u + 1.0))
    } else if name.ends_with("ssm_dt.bias") {
        0.5 * u
    } else if name.contains("ssm_conv1d") {
        0.5 * u / (shape[1] as f32).sqrt()
    } else {
        // Norm weights (1 + w folded): around 1.
        1.0 + 0.1 * u
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use neagari_backend::cpu::{CpuBackend, CpuOptions};
    use neagari_backend::KvType;
    use neagari_formats::Gguf;

    use super::*;
    use crate::gguf::GgufSource;

    /// A small shape round-trips: the file loads as `qwen35` with the declared layer pattern
    /// and runs a step to finite logits.
    #[test]
    fn small_synthetic_file_loads_and_runs() {
        let shape = SynthShape {
            n_layers: 4,
            n_embd: 256,
            n_ff: 512,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 64,
            n_vocab: 300,
            ssm_k_heads: 2,
            ssm_v_heads: 4,
            ssm_d_k: 32,
            ssm_d_v: 32,
            conv_kernel: 4,
            full_attention_interval: 4,
            rope_dims: 16,
            rope_base: 1e7,
        };
        let mut bytes = Vec::new();
        let n = write_qwen35(&mut bytes, &shape, GgmlType::Q8_0, 1).unwrap();
        assert!(n > 0 && bytes.len() as u64 > n);
        let dir = std::env::temp_dir().join(format!("neagari_synth_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.gguf");
        std::fs::write(&path, &bytes).unwrap();
        let be = CpuBackend::new(&CpuOptions {
            threads: 1,
            scalar_only: false,
        });
        let file = Arc::new(Gguf::open(&path).unwrap());
        let m = crate::qwen35::Qwen35::load(&be, &GgufSource::new(file)).unwrap();
        assert_eq!(m.config().recurrent, vec![true, true, true, false]);
        // The memory plan's figure is what the cache holds (attention layers only, plus
        // the recurrent state).
        for ty in [KvType::F16, KvType::Q8_0] {
            let kv = crate::CausalLm::new_kv(&m, &be, 40, ty).unwrap();
            let info = crate::CausalLm::info(&m);
            assert_eq!(info.kv_bytes(40, ty), kv.bytes() as u64, "{ty:?}");
            assert!(info.rec_bytes > 0 && info.n_kv_layers == 1);
        }
        let mut kv = crate::CausalLm::new_kv(&m, &be, 8, KvType::F16).unwrap();
        let l = crate::CausalLm::forward(&m, &be, &mut kv, &[1, 2, 3], false).unwrap();
        assert_eq!(l.len(), 300);
        assert!(l.iter().all(|v| v.is_finite()));
        assert!(l.iter().any(|&v| v != l[0]));
        std::fs::remove_dir_all(&dir).ok();
    }
}
