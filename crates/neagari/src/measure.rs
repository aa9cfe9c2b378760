//! `neagari measure --ppl FILE`: perplexity as llama-perplexity computes it — the whole text
//! tokenized once with BOS, cut into chunks of `n_ctx` tokens whose first token becomes
//! BOS, each chunk scored on its second half only.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::load::Loaded;

#[derive(clap::Args, Debug)]
pub struct MeasureArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    /// Text file whose perplexity to measure.
    #[arg(long = "ppl")]
    pub ppl: PathBuf,
    /// Stop after this many chunks.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `log p(tok)` under softmax(logits), with llama-perplexity's arithmetic.
pub fn log_prob(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max).exp()) as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

pub fn run(a: &MeasureArgs) -> Result<()> {
    let mut args = a.model.clone();
    let n_ctx = args.ctx_size.unwrap_or(512);
    args.ctx_size = Some(n_ctx);
    let l = Loaded::open(&args, false)?;
    let text = std::fs::read(&a.ppl).with_context(|| format!("cannot read {}", a.ppl.display()))?;
    let text = String::from_utf8_lossy(&text);
    let tokens = l.tokenizer.encode(&text, true, false);
    let add_bos = l.tokenizer.add_bos();
    if n_ctx < 8 {
        bail!("--ctx-size {n_ctx} is too small for perplexity");
    }
    let mut n_chunk = tokens.len() / n_ctx;
    if let Some(c) = a.chunks {
        n_chunk = n_chunk.min(c);
    }
    if n_chunk == 0 {
        bail!("{} tokenizes to {} tokens, fewer than one context of {n_ctx}", a.ppl.display(), tokens.len());
    }
    let first = n_ctx / 2;
    let vocab = l.model.info().n_vocab;
    let mut sess = l.session(n_ctx)?;
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} chunks, ppl {msg} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let (mut nll, mut count) = (0f64, 0usize);
    let mut per_chunk = Vec::new();
    for c in 0..n_chunk {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if add_bos {
            if let Some(b) = l.tokenizer.bos() {
                chunk[0] = b;
            }
        }
        sess.truncate(&l.be, 0)?;
        sess.prefill(l.model.as_ref(), &l.be, &chunk[..first], l.n_batch, |_, _| true)?;
        // The scored half runs in slices so the logits buffer stays small.
        let mut pos = first;
        while pos < n_ctx - 1 {
            let end = (pos + 64).min(n_ctx - 1);
            let logits = sess.forward_all(l.model.as_ref(), &l.be, &chunk[pos..end])?;
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                nll -= log_prob(row, chunk[pos + i + 1] as usize);
                count += 1;
            }
            pos = end;
        }
        per_chunk.push((nll / count as f64).exp());
        bar.set_message(format!("{:.4}", (nll / count as f64).exp()));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let ppl = (nll / count as f64).exp();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"ppl": ppl, "chunks": n_chunk, "n_ctx": n_ctx, "tokens_scored": count,
                               "per_chunk": per_chunk, "seconds": t.elapsed().as_secs_f64()})
        );
    } else {
        println!("perplexity: {ppl:.4} over {n_chunk} chunks of {n_ctx} ({count} tokens scored, {:.1} s)", t.elapsed().as_secs_f64());
    }
    Ok(())
}
