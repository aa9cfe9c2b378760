//! `neagari synth`: a random-weight GGUF with the exact shape, tensor types and metadata
//! of a real model, so GPU speed and GPU-vs-CPU agreement can be measured where the real
//! weights are not available. Seeded and deterministic; a pool of rows is quantized once
//! per (type, width) and matrices are filled with rows drawn from it, so writing runs at
//! disk speed, streaming (no tensor is held whole), with a progress bar.
//!
//! Dense shapes (gemma3-270m, llama3-8b, qwen3-0.6b) are written here with a placeholder
//! SPM vocabulary (control tokens, the 256 byte tokens, then `▁tN`). The hybrid
//! qwen3.6-27b shape (`qwen35` arch: 64 layers, 48 Gated DeltaNet + 16 gated attention) is
//! `neagari_model::synth`'s writer, with a byte-level BPE vocabulary of the real size.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use neagari_formats::{Array, GgmlType, GgufWriter, Value};
use neagari_model::synth::{write_qwen35_with_progress, SynthShape};

#[derive(clap::Args, Debug)]
pub struct SynthArgs {
    /// Shape to copy: qwen3.6-27b (hybrid Gated DeltaNet, `qwen35` arch), gemma3-270m
    /// (the test model: its Q4_K_M type mix unless --type), llama3-8b, qwen3-0.6b.
    #[arg(long = "like")]
    pub like: String,
    /// Type of every matrix (Q1_0, TQ2_0, Q2_0, Q4_K, Q8_0, F16, Q4_0, Q6_K, …; default
    /// Q4_K); norms and other vectors stay F32.
    #[arg(long = "type")]
    pub ty: Option<String>,
    /// The file to write.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Seed of the random weights (same seed, same file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Fewer layers than the real model (qwen3.6-27b only; every fourth layer stays
    /// attention), for small files of the same widths.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Another FFN width (qwen3.6-27b only; a multiple of 256), for measuring how the
    /// step's time follows a matrix's rows. Widths that are not a multiple of 1,024 also
    /// change the kernel that runs ffn_down (its K split needs whole repacked groups).
    #[arg(long)]
    pub ffn: Option<usize>,
}

struct Shape {
    arch: &'static str,
    n_layers: usize,
    n_embd: usize,
    n_ff: usize,
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    n_vocab: usize,
    tied: bool,
}

fn shape(like: &str) -> Result<Shape> {
    Ok(match like {
        "gemma3-270m" => Shape {
            arch: "gemma3",
            n_layers: 18,
            n_embd: 640,
            n_ff: 2048,
            n_heads: 4,
            n_kv: 1,
            head_dim: 256,
            n_vocab: 262144,
            tied: true,
        },
        "llama3-8b" => Shape {
            arch: "llama",
            n_layers: 32,
            n_embd: 4096,
            n_ff: 14336,
            n_heads: 32,
            n_kv: 8,
            head_dim: 128,
            n_vocab: 128256,
            tied: false,
        },
        "qwen3-0.6b" => Shape {
            arch: "qwen3",
            n_layers: 28,
            n_embd: 1024,
            n_ff: 3072,
            n_heads: 16,
            n_kv: 8,
            head_dim: 128,
            n_vocab: 151936,
            tied: true,
        },
        other => {
            bail!("unknown --like '{other}' (qwen3.6-27b, gemma3-270m, llama3-8b, qwen3-0.6b)")
        }
    })
}

fn parse_type(s: &str) -> Result<GgmlType> {
    use GgmlType::*;
    Ok(match s.to_ascii_uppercase().as_str() {
        "F32" => F32,
        "F16" => F16,
        "BF16" => BF16,
        "Q4_0" => Q4_0,
        "Q4_1" => Q4_1,
        "Q5_0" => Q5_0,
        "Q5_1" => Q5_1,
        "Q8_0" => Q8_0,
        "Q2_K" => Q2_K,
        "Q3_K" => Q3_K,
        "Q4_K" => Q4_K,
        "Q5_K" => Q5_K,
        "Q6_K" => Q6_K,
        "Q1_0" => Q1_0,
        "Q2_0" => Q2_0,
        "TQ1_0" => TQ1_0,
        "TQ2_0" => TQ2_0,
        other => bail!("unsupported --type {other}"),
    })
}

/// xorshift64*: seeded, fast, good enough for weights.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn uni(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

const POOL_ROWS: usize = 1024;

/// `rows` freshly drawn rows of `cols`, quantized on every core, streamed in chunks.
fn write_random_rows<W: Write>(
    dw: &mut neagari_formats::GgufDataWriter<W>,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    rng: &mut Rng,
) -> Result<()> {
    let rb = ty
        .row_bytes(cols)
        .with_context(|| format!("{ty} cannot hold rows of {cols}"))?;
    let amp = (3.0 / cols as f32).sqrt();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    const CHUNK: usize = 8192;
    let mut r0 = 0;
    while r0 < rows {
        let n = CHUNK.min(rows - r0);
        let mut buf = vec![0u8; n * rb];
        let per = n.div_ceil(threads);
        let seeds: Vec<u64> = (0..threads).map(|_| rng.next() | 1).collect();
        std::thread::scope(|sc| {
            for (t, part) in buf.chunks_mut(per * rb).enumerate() {
                let seed = seeds[t];
                sc.spawn(move || {
                    let mut g = Rng(seed);
                    let mut row = vec![0f32; cols];
                    for dst in part.chunks_mut(rb) {
                        row.iter_mut().for_each(|x| *x = amp * g.uni());
                        let _ = neagari_quant::quantize_row(ty, &row, dst);
                    }
                });
            }
        });
        dw.write_chunk(&buf)?;
        r0 += n;
    }
    Ok(())
}

/// A bar over bytes of tensor data (drawn only on a terminal).
fn bar(total: u64) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(
            "{wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

/// The hybrid Qwen3.6-27B shape through `neagari_model::synth`.
fn run_qwen36(a: &SynthArgs) -> Result<()> {
    let mut shape = SynthShape::qwen36_27b();
    if let Some(n) = a.layers {
        if n == 0 {
            bail!("--layers must be at least 1");
        }
        shape.n_layers = n;
    }
    if let Some(f) = a.ffn {
        if f == 0 || f % 256 != 0 {
            bail!("--ffn must be a positive multiple of 256 (every type's block), got {f}");
        }
        shape.n_ff = f;
    }
    let ty =
        a.ty.as_deref()
            .map(parse_type)
            .transpose()?
            .unwrap_or(GgmlType::Q4_K);
    let f = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let t = std::time::Instant::now();
    let mut pb: Option<ProgressBar> = None;
    let n = write_qwen35_with_progress(
        BufWriter::with_capacity(1 << 22, f),
        &shape,
        ty,
        a.seed,
        &mut |done, total| {
            pb.get_or_insert_with(|| bar(total)).set_position(done);
        },
    )
    .with_context(|| format!("writing {}", a.output.display()))?;
    if let Some(b) = pb {
        b.finish_and_clear();
    }
    eprintln!(
        "wrote {}: qwen35, {} layers, {ty}, {:.2} GB of tensors in {:.1} s",
        a.output.display(),
        shape.n_layers,
        n as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

pub fn run(a: &SynthArgs) -> Result<()> {
    if matches!(a.like.as_str(), "qwen3.6-27b" | "qwen36-27b") {
        return run_qwen36(a);
    }
    if a.layers.is_some() || a.ffn.is_some() {
        bail!("--layers and --ffn are only for --like qwen3.6-27b");
    }
    let s = shape(&a.like)?;
    let one = a.ty.as_deref().map(parse_type).transpose()?;
    // The test model's Q4_K_M mix, tensor by tensor (neagari inspect of the real file).
    let gemma_mix = s.arch == "gemma3" && one.is_none();
    let ty_of = |role: &str| -> GgmlType {
        if gemma_mix {
            match role {
                "token_embd" | "attn_v" => GgmlType::Q8_0,
                "attn_output" => GgmlType::Q4_K,
                "ffn_down" => GgmlType::Q6_K,
                _ => GgmlType::Q5_0,
            }
        } else {
            one.unwrap_or(GgmlType::Q4_K)
        }
    };
    let (h, hd) = (s.n_embd, s.head_dim);
    let (qd, kvd) = (s.n_heads * hd, s.n_kv * hd);
    let p = s.arch;
    let mut w = GgufWriter::new();
    w.add("general.architecture", p)?;
    w.add("general.name", format!("synthetic {}", a.like).as_str())?;
    w.add(format!("{p}.context_length"), 8192u32)?;
    w.add(format!("{p}.embedding_length"), h as u32)?;
    w.add(format!("{p}.block_count"), s.n_layers as u32)?;
    w.add(format!("{p}.feed_forward_length"), s.n_ff as u32)?;
    w.add(format!("{p}.attention.head_count"), s.n_heads as u32)?;
    w.add(format!("{p}.attention.head_count_kv"), s.n_kv as u32)?;
    w.add(format!("{p}.attention.key_length"), hd as u32)?;
    w.add(format!("{p}.attention.value_length"), hd as u32)?;
    w.add(format!("{p}.attention.layer_norm_rms_epsilon"), 1e-6f32)?;
    match p {
        "gemma3" => {
            w.add(format!("{p}.rope.freq_base"), 1_000_000f32)?;
            w.add(format!("{p}.attention.sliding_window"), 512u32)?;
        }
        _ => {
            w.add(format!("{p}.rope.freq_base"), 500_000f32)?;
            w.add(format!("{p}.rope.dimension_count"), hd as u32)?;
        }
    }
    // Placeholder SPM vocabulary.
    let mut tokens = vec![
        "<pad>".to_string(),
        "<eos>".into(),
        "<bos>".into(),
        "<unk>".into(),
    ];
    let mut types = vec![3i32, 3, 3, 2];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let mut i = 0;
    while tokens.len() < s.n_vocab {
        tokens.push(format!("\u{2581}t{i}"));
        types.push(1);
        i += 1;
    }
    let scores: Vec<f32> = (0..s.n_vocab).map(|i| -(i as f32)).collect();
    w.add("tokenizer.ggml.model", "llama")?;
    w.add("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))?;
    w.add("tokenizer.ggml.scores", scores)?;
    w.add("tokenizer.ggml.token_type", types)?;
    w.add("tokenizer.ggml.bos_token_id", 2u32)?;
    w.add("tokenizer.ggml.eos_token_id", 1u32)?;
    w.add("tokenizer.ggml.unknown_token_id", 3u32)?;
    w.add("tokenizer.ggml.padding_token_id", 0u32)?;
    w.add("tokenizer.ggml.add_bos_token", true)?;
    w.add("tokenizer.ggml.add_space_prefix", false)?;
    w.add("general.quantization_version", 2u32)?;

    // (name, [out, in] in HF order, role); vectors have in == 0.
    let mut ts: Vec<(String, usize, usize, &str)> = Vec::new();
    ts.push(("token_embd.weight".into(), s.n_vocab, h, "token_embd"));
    if !s.tied {
        ts.push(("output.weight".into(), s.n_vocab, h, "output"));
    }
    ts.push(("output_norm.weight".into(), h, 0, "norm"));
    for l in 0..s.n_layers {
        let n = |x: &str| format!("blk.{l}.{x}.weight");
        ts.push((n("attn_norm"), h, 0, "norm"));
        ts.push((n("attn_q"), qd, h, "attn_q"));
        ts.push((n("attn_k"), kvd, h, "attn_k"));
        ts.push((n("attn_v"), kvd, h, "attn_v"));
        ts.push((n("attn_output"), h, qd, "attn_output"));
        if p != "llama" {
            ts.push((n("attn_q_norm"), hd, 0, "norm"));
            ts.push((n("attn_k_norm"), hd, 0, "norm"));
        }
        if p == "gemma3" {
            ts.push((n("post_attention_norm"), h, 0, "norm"));
            ts.push((n("post_ffw_norm"), h, 0, "norm"));
        }
        ts.push((n("ffn_norm"), h, 0, "norm"));
        ts.push((n("ffn_gate"), s.n_ff, h, "ffn_gate"));
        ts.push((n("ffn_up"), s.n_ff, h, "ffn_up"));
        ts.push((n("ffn_down"), h, s.n_ff, "ffn_down"));
    }
    for (name, out, inn, role) in &ts {
        if *inn == 0 {
            w.add_tensor(name.clone(), &[*out as u64], GgmlType::F32)?;
        } else {
            w.add_tensor(name.clone(), &[*inn as u64, *out as u64], ty_of(role))?;
        }
    }
    let f = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut dw = w.start(BufWriter::with_capacity(1 << 22, f))?;
    let mut rng = Rng(a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut pools: HashMap<(GgmlType, usize), (usize, Vec<u8>)> = HashMap::new();
    for (_, out, inn, role) in &ts {
        if *inn == 0 {
            // Norm weights near 1 (Gemma's are stored as 1 + w already).
            let v: Vec<u8> = (0..*out)
                .flat_map(|_| (1.0 + 0.1 * rng.uni()).to_le_bytes())
                .collect();
            dw.write_tensor(&v)?;
            continue;
        }
        let ty = ty_of(role);
        if *role == "token_embd" || *role == "output" {
            // Every vocabulary row distinct, so logits have no exact ties.
            write_random_rows(&mut dw, ty, *out, *inn, &mut rng)?;
            continue;
        }
        let (rb, pool) = pools.entry((ty, *inn)).or_insert_with(|| {
            let rb = ty.row_bytes(*inn).unwrap_or(0);
            // Uniform weights of variance 1/in keep activations of order one.
            let amp = (3.0 / *inn as f32).sqrt();
            let mut pool = vec![0u8; rb * POOL_ROWS];
            let mut row = vec![0f32; *inn];
            for r in 0..POOL_ROWS {
                row.iter_mut().for_each(|x| *x = amp * rng.uni());
                let _ = neagari_quant::quantize_row(ty, &row, &mut pool[r * rb..(r + 1) * rb]);
            }
            (rb, pool)
        });
        let rb = *rb;
        if rb == 0 {
            bail!("{ty} cannot hold rows of {inn}");
        }
        let mut buf = Vec::with_capacity(rb * 4096);
        for _ in 0..*out {
            let r = (rng.next() % POOL_ROWS as u64) as usize;
            buf.extend_from_slice(&pool[r * rb..(r + 1) * rb]);
            if buf.len() >= rb * 4096 {
                dw.write_chunk(&buf)?;
                buf.clear();
            }
        }
        dw.write_chunk(&buf)?;
    }
    let mut inner = dw.finish()?;
    inner.flush()?;
    eprintln!("wrote {}", a.output.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(like: &str, ffn: Option<usize>, out: &std::path::Path) -> SynthArgs {
        SynthArgs {
            like: like.into(),
            ty: Some("Q1_0".into()),
            output: out.to_path_buf(),
            seed: 1,
            layers: Some(1),
            ffn,
        }
    }

    /// `--ffn` is checked before anything is written, and only the hybrid shape takes it.
    #[test]
    fn ffn_width_is_checked_first() {
        // Never created: every call below fails first.
        let out = std::env::temp_dir().join(format!("neagari-ffn-{}.gguf", std::process::id()));
        for bad in [0, 100, 17_408 + 128] {
            let e = run(&args("qwen3.6-27b", Some(bad), &out)).unwrap_err();
            assert!(e.to_string().contains("multiple of 256"), "{e}");
        }
        let e = run(&args("gemma3-270m", Some(512), &out)).unwrap_err();
        assert!(e.to_string().contains("only for --like qwen3.6-27b"), "{e}");
        assert!(!out.exists());
    }
}
