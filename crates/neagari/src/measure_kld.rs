//! `neagari measure --kld-base BASE.gguf -m MODEL.gguf FILE`: how far a (quantized) model's
//! next-token distributions are from a reference model's over the same windows of text —
//! KL divergence, top-1 agreement, both perplexities — printed like llama-perplexity's
//! `--kl-divergence` summary. The two models must share the tokenizer.
//!
//! `--kld-save FILE` writes the base model's log-probabilities instead (llama-perplexity's
//! `--kl-divergence-base` layout) and `--kld-base FILE` then reads them, so the two models
//! never share memory; files made by llama-perplexity read the same way.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use neagari_engine::kld::{
    kl_divergence, kl_divergence_saved, save_base, summarize, KldPosition, KldSummary, Side,
};
use neagari_engine::kld_file::BaseHeader;
use neagari_tokenizer::Tokenizer;

use crate::load::Loaded;
use crate::measure::MeasureArgs;

/// Same vocabulary, same token texts, same BOS handling: the ids mean the same thing.
fn same_tokenizer(a: &Tokenizer, b: &Tokenizer) -> Result<()> {
    if a.n_vocab() != b.n_vocab() {
        bail!(
            "the models do not share a tokenizer: {} vs {} tokens",
            a.n_vocab(),
            b.n_vocab()
        );
    }
    if let Some(id) = (0..a.n_vocab() as u32).find(|&i| a.token_text(i) != b.token_text(i)) {
        bail!(
            "the models do not share a tokenizer: token {id} is {:?} in one and {:?} in the other",
            String::from_utf8_lossy(a.token_text(id).unwrap_or_default()),
            String::from_utf8_lossy(b.token_text(id).unwrap_or_default())
        );
    }
    if a.add_bos() != b.add_bos() || a.bos() != b.bos() || a.vocab_type() != b.vocab_type() {
        bail!("the models do not share a tokenizer: BOS handling or vocabulary type differ");
    }
    Ok(())
}

/// Whether `path` starts with the base-file magic rather than a GGUF's.
pub fn is_saved_base(path: &Path) -> bool {
    let mut magic = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == b"_logits_"
}

fn progress(n_chunk: usize) -> ProgressBar {
    let bar = ProgressBar::new(n_chunk as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} chunks, {msg} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// The text's tokens as llama-perplexity makes them (one trailing newline dropped, BOS
/// added when the vocabulary wants it) and the number of whole windows to use.
fn windows(
    a: &MeasureArgs,
    tok: &Tokenizer,
    path: &Path,
    n_ctx: usize,
) -> Result<(Vec<u32>, usize)> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut text = String::from_utf8_lossy(&text).into_owned();
    if text.ends_with('\n') {
        text.pop();
    }
    let tokens = tok.encode(&text, true, false);
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
    Ok((tokens, n_chunk))
}

fn bos_of(tok: &Tokenizer) -> Option<u32> {
    if tok.add_bos() {
        tok.bos()
    } else {
        None
    }
}

/// `measure -m BASE --kld-save FILE TEXT`.
pub fn save(a: &MeasureArgs, out: &Path, text_path: &Path) -> Result<()> {
    let mut args = a.model.clone();
    let n_ctx = args.ctx_size.unwrap_or(512);
    args.ctx_size = Some(n_ctx);
    let l = Loaded::open_cpu(&args, false)?;
    let (tokens, n_chunk) = windows(a, &l.tokenizer, text_path, n_ctx)?;
    let mut sess = l.session(n_ctx)?;
    let mut w = BufWriter::new(
        File::create(out).with_context(|| format!("cannot create {}", out.display()))?,
    );
    let bar = progress(n_chunk);
    bar.set_message("saving base log-probabilities");
    let nll = save_base(
        &l.be,
        Side {
            model: l.model.as_ref(),
            sess: &mut sess,
        },
        &tokens,
        n_chunk,
        bos_of(&l.tokenizer),
        l.n_batch,
        &mut w,
        |_| bar.inc(1),
    )?;
    bar.finish_and_clear();
    std::io::Write::flush(&mut w)?;
    let ppl = (nll.iter().sum::<f64>() / nll.len().max(1) as f64).exp();
    eprintln!(
        "saved {} positions of {n_chunk} chunks of {n_ctx} to {} (base perplexity {ppl:.4})",
        nll.len(),
        out.display()
    );
    Ok(())
}

/// `measure -m MODEL --kld-base FILE`: the windows and base log-probabilities come from
/// the file; no text is needed.
pub fn run_saved(a: &MeasureArgs, base: &Path) -> Result<()> {
    let mut r = BufReader::new(
        File::open(base).with_context(|| format!("cannot open {}", base.display()))?,
    );
    let header = BaseHeader::read(&mut r).with_context(|| format!("reading {}", base.display()))?;
    let mut args = a.model.clone();
    args.ctx_size = Some(header.n_ctx);
    let l = Loaded::open_cpu(&args, false)?;
    if l.tokenizer.n_vocab() != header.n_vocab {
        bail!(
            "{} was made with a vocabulary of {} tokens; the model has {}",
            base.display(),
            header.n_vocab,
            l.tokenizer.n_vocab()
        );
    }
    let mut sess = l.session(header.n_ctx)?;
    let n_chunk = a.chunks.map_or(header.n_chunk, |c| c.min(header.n_chunk));
    let header = BaseHeader {
        n_chunk,
        tokens: header.tokens[..n_chunk * header.n_ctx].to_vec(),
        ..header
    };
    let bar = progress(n_chunk);
    let t = Instant::now();
    let pos = kl_divergence_saved(
        &l.be,
        Side {
            model: l.model.as_ref(),
            sess: &mut sess,
        },
        &header,
        &mut r,
        bos_of(&l.tokenizer),
        l.n_batch,
        |c, p| report(&bar, c, p),
    )?;
    bar.finish_and_clear();
    finish(a, &pos, n_chunk, header.n_ctx, t);
    Ok(())
}

fn report(bar: &ProgressBar, c: usize, p: &[KldPosition]) {
    let s = summarize(p, c + 1);
    bar.set_message(format!(
        "KLD {:.5}, same top {:.2}%",
        s.mean_kld,
        100.0 * s.same_top
    ));
    bar.inc(1);
}

fn finish(a: &MeasureArgs, pos: &[KldPosition], n_chunk: usize, n_ctx: usize, t: Instant) {
    let s = summarize(pos, n_chunk);
    if a.json {
        println!("{}", to_json(&s, n_ctx, t.elapsed().as_secs_f64()));
    } else {
        print_summary(&s, n_ctx, t.elapsed().as_secs_f64());
    }
}

pub fn run(a: &MeasureArgs, base_path: &Path, text_path: &Path) -> Result<()> {
    let mut args = a.model.clone();
    let n_ctx = args.ctx_size.unwrap_or(512);
    args.ctx_size = Some(n_ctx);
    if n_ctx < 8 {
        bail!("--ctx-size {n_ctx} is too small");
    }
    let l = Loaded::open_cpu(&args, false)?;
    let mut base_args = args.clone();
    base_args.model = base_path.to_path_buf();
    let b = Loaded::open_cpu(&base_args, false).context("cannot load the --kld-base model")?;
    same_tokenizer(&b.tokenizer, &l.tokenizer)?;
    if b.model.info().n_vocab != l.model.info().n_vocab {
        bail!(
            "the models' output heads differ: {} vs {} logits",
            b.model.info().n_vocab,
            l.model.info().n_vocab
        );
    }

    let (tokens, n_chunk) = windows(a, &l.tokenizer, text_path, n_ctx)?;
    let bos = bos_of(&l.tokenizer);

    let mut sess_b = b.session(n_ctx)?;
    let mut sess_m = l.session(n_ctx)?;
    let bar = progress(n_chunk);
    let t = Instant::now();
    // Both models run on the model's backend (same CPU options).
    let pos = kl_divergence(
        &l.be,
        Side {
            model: b.model.as_ref(),
            sess: &mut sess_b,
        },
        Side {
            model: l.model.as_ref(),
            sess: &mut sess_m,
        },
        &tokens,
        n_chunk,
        bos,
        l.n_batch,
        |c, p| report(&bar, c, p),
    )?;
    bar.finish_and_clear();
    finish(a, &pos, n_chunk, n_ctx, t);
    Ok(())
}

fn to_json(s: &KldSummary, n_ctx: usize, secs: f64) -> serde_json::Value {
    let pct: serde_json::Map<String, serde_json::Value> = s
        .kld_percentiles
        .iter()
        .map(|(f, v)| (format!("{}", f * 100.0), serde_json::json!(v)))
        .collect();
    serde_json::json!({
        "n_ctx": n_ctx, "chunks": s.chunks, "positions": s.positions,
        "mean_kld": s.mean_kld, "mean_kld_err": s.mean_kld_err, "median_kld": s.median_kld,
        "max_kld": s.max_kld, "min_kld": s.min_kld, "kld_percentiles": pct,
        "same_top": s.same_top, "ppl_base": s.ppl_base, "ppl": s.ppl,
        "ln_ppl_ratio": s.ln_ppl_ratio, "ppl_diff": s.ppl_diff,
        "rms_p_diff": s.rms_p_diff, "mean_p_diff": s.mean_p_diff, "seconds": secs,
    })
}

fn print_summary(s: &KldSummary, n_ctx: usize, secs: f64) {
    println!(
        "{} chunks of {n_ctx}, {} positions scored ({secs:.1} s)",
        s.chunks, s.positions
    );
    println!("Mean PPL(Q)              : {:10.6}", s.ppl);
    println!("Mean PPL(base)           : {:10.6}", s.ppl_base);
    println!("Mean ln(PPL(Q)/PPL(base)): {:10.6}", s.ln_ppl_ratio);
    println!("Mean PPL(Q)-PPL(base)    : {:10.6}", s.ppl_diff);
    println!("Mean    KLD: {:10.6} ± {:10.6}", s.mean_kld, s.mean_kld_err);
    println!("Maximum KLD: {:10.6}", s.max_kld);
    for (f, v) in s.kld_percentiles.iter().rev() {
        if *f == 0.1 {
            println!("Median  KLD: {:10.6}", s.median_kld);
        }
        println!("{:5.1}%  KLD: {:10.6}", f * 100.0, v);
    }
    println!("Minimum KLD: {:10.6}", s.min_kld);
    println!("Mean    Δp : {:7.3} %", 100.0 * s.mean_p_diff);
    println!("RMS     Δp : {:7.3} %", 100.0 * s.rms_p_diff);
    println!("Same top p : {:7.3} %", 100.0 * s.same_top);
}
