//! neagari: run, chat with, benchmark, inspect and measure low-bit LLMs.

mod bench;
mod chat;
mod doctor;
mod generate;
mod inspect;
mod load;
mod measure;
mod measure_kld;
mod quantize;
mod run;
mod serve;
mod synth;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use neagari_backend::KvType;

#[derive(Parser)]
#[command(
    name = "neagari",
    version,
    about = "Inference engine for low-bit LLMs (GGUF)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Complete a prompt, streaming tokens to stdout.
    Run(run::RunArgs),
    /// Interactive chat in the terminal with the model's chat template.
    Chat(chat::ChatArgs),
    /// Prefill and decode throughput, peak memory and bandwidth use.
    Bench(bench::BenchArgs),
    /// Metadata, tensor table, tokenizer and template summary of a GGUF file.
    Inspect(inspect::InspectArgs),
    /// Perplexity over a text file; with --kld-base, KL divergence from a reference model.
    Measure(measure::MeasureArgs),
    /// Rewrite a GGUF with another quantization type (llama.cpp's mixtures).
    Quantize(quantize::QuantizeArgs),
    /// What this machine offers: CPU features and threads, CUDA GPUs, driver and NVRTC.
    Doctor,
    /// Write a random-weight GGUF of a real model's exact shape (e.g. --like qwen3.6-27b
    /// --type Q1_0), to measure speed at scale without downloading weights.
    Synth(synth::SynthArgs),
    /// OpenAI- and Anthropic-compatible HTTP server.
    Serve(serve::ServeArgs),
}

/// Options shared by every command that loads a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The model: a GGUF file, or an HF / MLX model directory (or its .safetensors file).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// CPU threads (default: all available cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Context size in tokens (default: the model's, capped at 4096).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Prompt tokens processed per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// KV cache element type: f16 or q8_0.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// Where to run: cpu, cuda (GPU 0) or cuda:N.
    #[arg(long = "device", default_value = "cpu")]
    pub device: load::Device,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Run(a) => run::run(a),
        Cmd::Chat(a) => chat::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Inspect(a) => inspect::run(a),
        Cmd::Measure(a) => measure::run(a),
        Cmd::Quantize(a) => quantize::run(a),
        Cmd::Doctor => doctor::run(),
        Cmd::Synth(a) => synth::run(a),
        Cmd::Serve(a) => serve::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the problem, its causes after colons; no backtrace.
            let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("neagari: error: {}", msg.join(": "));
            ExitCode::FAILURE
        }
    }
}
