//! KL divergence of a model against a base model over the same windows of text, as
//! llama-perplexity's `--kl-divergence` reports it: per scored position KL(base ‖ model),
//! whether the two argmaxes agree, each model's negative log-likelihood of the next token
//! and the change in that token's probability; then mean, median and percentiles.
//!
//! Windows are the perplexity ones (`perplexity.rs`): chunks of `n_ctx` tokens, the first
//! replaced by BOS when the vocabulary adds one, the second half scored. Differences from
//! llama.cpp, all on the side of precision: both models run here side by side, so the
//! base's probabilities are exact f64 rather than llama.cpp's 16-bit quantized
//! log-probabilities from a saved file, and no term is dropped (llama.cpp skips base
//! probabilities below e^-16).

use neagari_backend::Backend;
use neagari_model::{CausalLm, ModelError};

use crate::kld_file::{self, BaseHeader, KldFileError};
use crate::session::Session;

#[derive(Debug, thiserror::Error)]
pub enum KldError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    File(#[from] KldFileError),
}

/// One scored position.
#[derive(Clone, Copy, Debug, Default)]
pub struct KldPosition {
    /// KL(base ‖ model) in nats.
    pub kld: f64,
    pub same_top: bool,
    pub nll_base: f64,
    pub nll: f64,
    /// p_model(next) − p_base(next).
    pub p_diff: f64,
}

/// Log-softmax of one row in f64.
fn log_softmax(logits: &[f32], out: &mut [f64]) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = l as f64 - lse;
    }
}

fn argmax(l: &[f32]) -> usize {
    (0..l.len()).fold(0, |b, i| if l[i] > l[b] { i } else { b })
}

/// Compares one position's logits (`base`, `model`: [n_vocab]) for next token `next`.
pub fn compare_position(base: &[f32], model: &[f32], next: usize) -> KldPosition {
    let mut lb = vec![0f64; base.len()]; // [n_vocab] base log-probs
    let mut lm = vec![0f64; model.len()]; // [n_vocab] model log-probs
    log_softmax(base, &mut lb);
    log_softmax(model, &mut lm);
    let kld = lb
        .iter()
        .zip(&lm)
        .map(|(&b, &m)| b.exp() * (b - m))
        .sum::<f64>();
    KldPosition {
        // Rounding can leave a hair below zero for identical distributions.
        kld: kld.max(0.0),
        same_top: argmax(base) == argmax(model),
        nll_base: -lb[next],
        nll: -lm[next],
        p_diff: lm[next].exp() - lb[next].exp(),
    }
}

/// Compares a position against base log-probabilities decoded from a saved file
/// (`base_lp`: [n_vocab]), with llama-perplexity's rule that base log-probabilities at or
/// below −16 (clamped when saved) add nothing to the divergence.
pub fn compare_position_saved(base_lp: &[f32], model: &[f32], next: usize) -> KldPosition {
    let mut lm = vec![0f64; model.len()]; // [n_vocab] model log-probs
    log_softmax(model, &mut lm);
    let kld = base_lp
        .iter()
        .zip(&lm)
        .filter(|(&b, _)| b > -16.0)
        .map(|(&b, &m)| (b as f64).exp() * (b as f64 - m))
        .sum::<f64>();
    let top_b = (0..base_lp.len()).fold(0, |b, i| if base_lp[i] > base_lp[b] { i } else { b });
    KldPosition {
        kld: kld.max(0.0),
        same_top: top_b == argmax(model),
        nll_base: -(base_lp[next] as f64),
        nll: -lm[next],
        p_diff: lm[next].exp() - (base_lp[next] as f64).exp(),
    }
}

/// Runs one chunk through a model: prefill of the unscored half, then the scored half in
/// slices; `row(i, logits)` gets scored position i's logits ([n_vocab]).
fn scored_rows<B: Backend>(
    be: &B,
    side: &mut Side<'_, B>,
    chunk: &[u32],
    n_batch: usize,
    mut row: impl FnMut(usize, &[f32]) -> Result<(), KldError>,
) -> Result<(), KldError> {
    let n_ctx = chunk.len();
    let first = n_ctx / 2;
    let vocab = side.model.info().n_vocab;
    side.sess.truncate(be, 0)?;
    side.sess
        .prefill(side.model, be, &chunk[..first], n_batch, |_, _| true)?;
    let mut pos = first;
    while pos < n_ctx - 1 {
        let end = (pos + 64).min(n_ctx - 1);
        let l = side.sess.forward_all(side.model, be, &chunk[pos..end])?; // [end-pos, vocab]
        for (i, r) in l.chunks_exact(vocab).enumerate() {
            row(pos - first + i, r)?;
        }
        pos = end;
    }
    Ok(())
}

fn chunk_of(tokens: &[u32], c: usize, n_ctx: usize, bos: Option<u32>) -> Vec<u32> {
    let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
    if let Some(b) = bos {
        chunk[0] = b;
    }
    chunk
}

/// Runs the base model over the windows and writes its log-probabilities in
/// llama-perplexity's base-file layout (`kld_file.rs`). Returns the base's per-position
/// negative log-likelihoods of the next token.
#[allow(clippy::too_many_arguments)]
pub fn save_base<B: Backend>(
    be: &B,
    mut base: Side<'_, B>,
    tokens: &[u32],
    n_chunk: usize,
    bos: Option<u32>,
    n_batch: usize,
    w: &mut impl std::io::Write,
    mut on_chunk: impl FnMut(usize),
) -> Result<Vec<f64>, KldError> {
    let n_ctx = base.sess.n_ctx();
    let n_chunk = n_chunk.min(tokens.len() / n_ctx);
    let header = BaseHeader {
        n_ctx,
        n_vocab: base.model.info().n_vocab,
        n_chunk,
        tokens: tokens[..n_chunk * n_ctx].to_vec(),
    };
    header.write(w)?;
    let mut nll = Vec::new();
    for c in 0..n_chunk {
        let chunk = chunk_of(tokens, c, n_ctx, bos);
        let first = n_ctx / 2;
        scored_rows(be, &mut base, &chunk, n_batch, |i, r| {
            let enc = kld_file::encode_position(r);
            kld_file::write_position(w, &enc)?;
            let mut lp = vec![0f64; r.len()];
            log_softmax(r, &mut lp);
            nll.push(-lp[chunk[first + i + 1] as usize]);
            Ok(())
        })?;
        on_chunk(c);
    }
    Ok(nll)
}

/// KL divergence of `model` from base log-probabilities saved by [`save_base`] or by
/// llama-perplexity (`header` already read from `r`), over the file's own tokens.
pub fn kl_divergence_saved<B: Backend>(
    be: &B,
    mut model: Side<'_, B>,
    header: &BaseHeader,
    r: &mut impl std::io::Read,
    bos: Option<u32>,
    n_batch: usize,
    mut on_chunk: impl FnMut(usize, &[KldPosition]),
) -> Result<Vec<KldPosition>, KldError> {
    let n_ctx = header.n_ctx;
    if model.sess.n_ctx() < n_ctx {
        return Err(KldFileError::Bad(format!(
            "computed with a context of {n_ctx}; the session holds {}",
            model.sess.n_ctx()
        ))
        .into());
    }
    if model.model.info().n_vocab != header.n_vocab {
        return Err(KldFileError::Bad(format!(
            "{} log-probabilities per position, the model has {} logits",
            header.n_vocab,
            model.model.info().n_vocab
        ))
        .into());
    }
    let mut out = Vec::new();
    let mut base_lp = vec![0f32; header.n_vocab]; // [n_vocab] decoded base log-probs
    for c in 0..header.n_chunk {
        let chunk = chunk_of(&header.tokens, c, n_ctx, bos);
        let first = n_ctx / 2;
        scored_rows(be, &mut model, &chunk, n_batch, |i, row| {
            let enc = kld_file::read_position(r, header.n_vocab)?;
            kld_file::decode_position(&enc, &mut base_lp);
            out.push(compare_position_saved(
                &base_lp,
                row,
                chunk[first + i + 1] as usize,
            ));
            Ok(())
        })?;
        on_chunk(c, &out);
    }
    Ok(out)
}

/// Summary statistics, named as llama-perplexity prints them.
#[derive(Clone, Debug, Default)]
pub struct KldSummary {
    pub positions: usize,
    pub chunks: usize,
    pub mean_kld: f64,
    /// Standard error of the mean.
    pub mean_kld_err: f64,
    pub median_kld: f64,
    pub max_kld: f64,
    pub min_kld: f64,
    /// (fraction, value) for 0.1%, 1%, 5%, 10%, 90%, 95%, 99%, 99.9%.
    pub kld_percentiles: Vec<(f64, f64)>,
    pub same_top: f64,
    pub ppl_base: f64,
    pub ppl: f64,
    /// ln(PPL(model) / PPL(base)).
    pub ln_ppl_ratio: f64,
    /// PPL(model) − PPL(base).
    pub ppl_diff: f64,
    pub rms_p_diff: f64,
    pub mean_p_diff: f64,
}

/// Linear interpolation between order statistics, as llama-perplexity computes its
/// percentiles (`values` sorted).
pub fn percentile(values: &[f64], fraction: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let p = fraction * (values.len() - 1) as f64;
    let i = p as usize;
    let f = p - i as f64;
    (1.0 - f) * values[i] + f * values[(i + 1).min(values.len() - 1)]
}

pub fn summarize(pos: &[KldPosition], chunks: usize) -> KldSummary {
    let n = pos.len();
    if n == 0 {
        return KldSummary {
            chunks,
            ..Default::default()
        };
    }
    let nf = n as f64;
    let mean = |f: &dyn Fn(&KldPosition) -> f64| pos.iter().map(f).sum::<f64>() / nf;
    let mean_kld = mean(&|p| p.kld);
    let var = mean(&|p| p.kld * p.kld) - mean_kld * mean_kld;
    let mut k: Vec<f64> = pos.iter().map(|p| p.kld).collect();
    k.sort_by(f64::total_cmp);
    let median = if n.is_multiple_of(2) {
        0.5 * (k[n / 2] + k[n / 2 - 1])
    } else {
        k[n / 2]
    };
    let nll_b = mean(&|p| p.nll_base);
    let nll = mean(&|p| p.nll);
    KldSummary {
        positions: n,
        chunks,
        mean_kld,
        mean_kld_err: if n > 10 && var > 0.0 {
            (var / (nf - 1.0)).sqrt()
        } else {
            0.0
        },
        median_kld: median,
        max_kld: k[n - 1],
        min_kld: k[0],
        kld_percentiles: [0.001, 0.01, 0.05, 0.1, 0.9, 0.95, 0.99, 0.999]
            .iter()
            .map(|&f| (f, percentile(&k, f)))
            .collect(),
        same_top: pos.iter().filter(|p| p.same_top).count() as f64 / nf,
        ppl_base: nll_b.exp(),
        ppl: nll.exp(),
        ln_ppl_ratio: nll - nll_b,
        ppl_diff: nll.exp() - nll_b.exp(),
        rms_p_diff: mean(&|p| p.p_diff * p.p_diff).sqrt(),
        mean_p_diff: mean(&|p| p.p_diff),
    }
}

/// One model with its session.
pub struct Side<'a, B: Backend> {
    pub model: &'a dyn CausalLm<B>,
    pub sess: &'a mut Session<B>,
}

/// Runs `n_chunk` windows of `tokens` through both models and compares every scored
/// position. Both sessions must have the same `n_ctx`. `on_chunk(i, running summary)`
/// reports progress.
#[allow(clippy::too_many_arguments)]
pub fn kl_divergence<B: Backend>(
    be: &B,
    base: Side<'_, B>,
    model: Side<'_, B>,
    tokens: &[u32],
    n_chunk: usize,
    bos: Option<u32>,
    n_batch: usize,
    mut on_chunk: impl FnMut(usize, &[KldPosition]),
) -> Result<Vec<KldPosition>, ModelError> {
    let n_ctx = base.sess.n_ctx().min(model.sess.n_ctx());
    let first = n_ctx / 2;
    let vocab = model.model.info().n_vocab;
    let mut out = Vec::new();
    for c in 0..n_chunk.min(tokens.len() / n_ctx) {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        for s in [&mut *base.sess, &mut *model.sess] {
            s.truncate(be, 0)?;
        }
        base.sess
            .prefill(base.model, be, &chunk[..first], n_batch, |_, _| true)?;
        model
            .sess
            .prefill(model.model, be, &chunk[..first], n_batch, |_, _| true)?;
        // The scored half runs in slices so the two logits buffers stay small.
        let mut pos = first;
        while pos < n_ctx - 1 {
            let end = (pos + 64).min(n_ctx - 1);
            let lb = base.sess.forward_all(base.model, be, &chunk[pos..end])?; // [end-pos, vocab]
            let lm = model.sess.forward_all(model.model, be, &chunk[pos..end])?; // [end-pos, vocab]
            for (i, (rb, rm)) in lb
                .chunks_exact(vocab)
                .zip(lm.chunks_exact(vocab))
                .enumerate()
            {
                out.push(compare_position(rb, rm, chunk[pos + i + 1] as usize));
            }
            pos = end;
        }
        on_chunk(c, &out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_distributions_have_zero_divergence() {
        let l = [0.5f32, -1.0, 2.0, 0.0];
        let p = compare_position(&l, &l, 2);
        assert!(p.kld.abs() < 1e-15 && p.same_top && p.p_diff == 0.0);
        // Adding a constant to every logit changes nothing.
        let m: Vec<f32> = l.iter().map(|x| x + 3.0).collect();
        assert!(compare_position(&l, &m, 0).kld < 1e-12);
    }

    #[test]
    fn divergence_of_two_coins() {
        // base (0.5, 0.5), model (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1).
        let b = [0f32, 0.0];
        let m = [0f32, (0.1f64 / 0.9).ln() as f32];
        let want = 0.5 * (0.5f64 / 0.9).ln() + 0.5 * (0.5f64 / 0.1).ln();
        let p = compare_position(&b, &m, 1);
        assert!((p.kld - want).abs() < 1e-6, "{} vs {want}", p.kld);
        assert!((p.p_diff - (0.1 - 0.5)).abs() < 1e-6);
    }

    #[test]
    fn percentiles_interpolate_like_llama_perplexity() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&v, 0.5), 3.0);
        assert!((percentile(&v, 0.9) - 4.6).abs() < 1e-12);
        assert_eq!(percentile(&v, 1.0), 5.0);
    }
}
