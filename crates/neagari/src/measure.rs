//! `neagari measure --ppl FILE`: perplexity as llama-perplexity computes it — the whole text
//! tokenized once with BOS, cut into chunks of `n_ctx` tokens whose first token becomes
//! BOS, each chunk scored on its second half only.
//!
//! `neagari measure --kld-base BASE.gguf -m MODEL.gguf FILE`: over the same windows, the KL
//! divergence of MODEL from BASE, top-1 agreement and both perplexities (llama-perplexity
//! --kl-divergence, with both models run side by side instead of a saved base-logits file).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use neagari_engine::perplexity::perplexity;

use crate::load::Loaded;

#[derive(clap::Args, Debug)]
pub struct MeasureArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    /// Text file whose perplexity to measure.
    #[arg(long = "ppl")]
    pub ppl: Option<PathBuf>,
    /// The text file (same as --ppl).
    pub file: Option<PathBuf>,
    /// Reference for KL divergence: a GGUF with the same tokenizer (run side by side), or
    /// a base log-probability file from --kld-save or llama-perplexity --kl-divergence-base.
    #[arg(long = "kld-base")]
    pub kld_base: Option<PathBuf>,
    /// Save -m's log-probabilities over the text's windows to this file (llama-perplexity's
    /// --kl-divergence-base layout) for later `--kld-base FILE` runs.
    #[arg(long = "kld-save")]
    pub kld_save: Option<PathBuf>,
    /// Stop after this many chunks.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &MeasureArgs) -> Result<()> {
    if let Some(base) = &a.kld_base {
        if crate::measure_kld::is_saved_base(base) {
            return crate::measure_kld::run_saved(a, base);
        }
    }
    let Some(path) = a.ppl.as_ref().or(a.file.as_ref()) else {
        bail!("give the text file to measure over (as an argument or with --ppl)");
    };
    if let Some(base) = &a.kld_base {
        return crate::measure_kld::run(a, base, path);
    }
    if let Some(out) = &a.kld_save {
        return crate::measure_kld::save(a, out, path);
    }
    let mut args = a.model.clone();
    let n_ctx = args.ctx_size.unwrap_or(512);
    args.ctx_size = Some(n_ctx);
    crate::on_device!(args, false, measure_on, a, path, n_ctx)
}

fn measure_on<B: neagari_backend::Backend>(
    l: Loaded<B>,
    a: &MeasureArgs,
    path: &std::path::Path,
    n_ctx: usize,
) -> Result<()> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::from_utf8_lossy(&text).into_owned();
    // llama-perplexity reads the file the same way: one trailing newline dropped.
    if text.ends_with('\n') {
        text.pop();
    }
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
        bail!(
            "{} tokenizes to {} tokens, fewer than one context of {n_ctx}",
            path.display(),
            tokens.len()
        );
    }
    let mut sess = l.session(n_ctx)?;
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} chunks, ppl {msg} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t = Instant::now();
    let bos = if add_bos { l.tokenizer.bos() } else { None };
    let r = perplexity(
        l.model.as_ref(),
        &l.be,
        &mut sess,
        &tokens,
        n_chunk,
        bos,
        l.n_batch,
        |_, ppl| {
            bar.set_message(format!("{ppl:.4}"));
            bar.inc(1);
        },
    )?;
    let (ppl, count, per_chunk) = (r.ppl, r.tokens_scored, r.per_chunk);
    bar.finish_and_clear();

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
