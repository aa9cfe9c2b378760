//! `neagari quantize IN OUT --type T`: a GGUF (f32/f16/bf16, or quantized with
//! `--allow-requantize`) rewritten with llama.cpp's mixture `T`, streamed to disk with a
//! progress bar. The driver lives in `neagari_engine::quantize`.

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use neagari_engine::quantize::{self, FileType, QuantizeInput, QuantizeParams, TypeParams};
use neagari_quant::GgmlType;

use crate::load::open_gguf;

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// Input GGUF (f32, f16 or bf16 weights).
    pub input: PathBuf,
    /// Output GGUF.
    pub output: PathBuf,
    /// Target mixture, named as llama-quantize names it: Q8_0, Q4_0, Q4_K_M (= Q4_K),
    /// Q6_K, Q2_K, TQ2_0, TQ1_0, Q1_0, Q2_0, F16, …; tensors llama.cpp keeps wider stay
    /// wider.
    #[arg(long = "type", short = 'T')]
    pub ty: String,
    /// Type of the token embeddings and the output head (both), e.g. Q8_0 or F16.
    #[arg(long = "keep-output")]
    pub keep_output: Option<String>,
    /// Type of output.weight only (llama-quantize --output-tensor-type).
    #[arg(long = "output-type")]
    pub output_type: Option<String>,
    /// Type of token_embd.weight only (llama-quantize --token-embedding-type).
    #[arg(long = "embd-type")]
    pub embd_type: Option<String>,
    /// Every quantizable tensor gets the mixture's base type (llama-quantize --pure).
    #[arg(long)]
    pub pure: bool,
    /// Allow quantizing tensors that are already quantized.
    #[arg(long = "allow-requantize")]
    pub allow_requantize: bool,
    /// Worker threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Print the plan and the size, write nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// List every tensor's type change.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

fn ggml_type(s: &str) -> Result<GgmlType> {
    let up = s.to_ascii_uppercase();
    (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.name() == up)
        .with_context(|| format!("unknown tensor type {s:?}"))
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

pub fn run(a: &QuantizeArgs) -> Result<()> {
    let Some(ftype) = FileType::parse(&a.ty) else {
        bail!(
            "unknown --type {:?}; known: {}",
            a.ty,
            FileType::names().join(", ")
        );
    };
    if a.input == a.output {
        bail!("input and output are the same file");
    }
    let keep = a.keep_output.as_deref().map(ggml_type).transpose()?;
    let output_type = a
        .output_type
        .as_deref()
        .map(ggml_type)
        .transpose()?
        .or(keep);
    let embd_type = a.embd_type.as_deref().map(ggml_type).transpose()?.or(keep);
    let threads = a
        .threads
        .unwrap_or_else(neagari_backend::cpu::default_threads)
        .max(1);

    let g = open_gguf(&a.input)?;
    let input = QuantizeInput::from_gguf(&g);
    let params = QuantizeParams {
        types: TypeParams {
            ftype,
            output_type,
            embd_type,
            pure: a.pure,
        },
        allow_requantize: a.allow_requantize,
    };
    let plan = quantize::plan(&input, &params)
        .with_context(|| format!("cannot quantize {} to {ftype}", a.input.display()))?;

    if a.verbose || a.dry_run {
        for t in &plan.tensors {
            let change = if t.from == t.to {
                format!("{} (kept)", t.to)
            } else {
                format!("{} -> {}", t.from, t.to)
            };
            eprintln!("{:<40} {:<22} {:?}", t.name, change, t.dims);
        }
    }
    eprintln!(
        "{} -> {}: {ftype}, {} tensors, {:.2} MiB -> {:.2} MiB of weights ({:.2} bits/weight), \
         output file {:.2} MiB{}",
        a.input.display(),
        a.output.display(),
        plan.tensors.len(),
        mib(plan.bytes_in()),
        mib(plan.bytes_out()),
        plan.bpw(),
        mib(plan.file_bytes),
        if plan.n_fallback > 0 {
            format!(
                "; {} tensor(s) fell back to another type (row width)",
                plan.n_fallback
            )
        } else {
            String::new()
        }
    );
    if a.dry_run {
        return Ok(());
    }

    // Written beside the target and renamed at the end, so a failed run leaves no
    // half-written model under the requested name.
    let tmp = a.output.with_extension("gguf.part");
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let bar = ProgressBar::new(plan.bytes_in());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {msg:36} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let expected = plan.file_bytes;
    let r = quantize::write(&input, plan, BufWriter::new(file), threads, |p| {
        bar.set_position(p.done);
        bar.set_message(p.tensor.to_string());
    });
    bar.finish_and_clear();
    let written = match r {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).context("quantization failed");
        }
    };
    std::fs::rename(&tmp, &a.output)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), a.output.display()))?;
    if written != expected {
        bail!("wrote {written} bytes, planned {expected}: this is a bug");
    }
    eprintln!(
        "wrote {} ({:.2} MiB) in {:.1} s",
        a.output.display(),
        mib(written),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
