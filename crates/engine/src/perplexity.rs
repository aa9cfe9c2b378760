//! Perplexity as llama-perplexity computes it: the text's tokens cut into chunks of `n_ctx`,
//! each chunk's first token replaced by BOS, only the second half of each chunk scored.

use neagari_backend::Backend;
use neagari_model::{CausalLm, ModelError};

use crate::session::Session;

/// `log p(tok)` under softmax(logits), with llama-perplexity's arithmetic (f32 logits,
/// f64 sum of exponentials).
pub fn log_prob(logits: &[f32], tok: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    (logits[tok] - max) as f64 - sum.ln()
}

#[derive(Clone, Debug, Default)]
pub struct Perplexity {
    pub ppl: f64,
    pub chunks: usize,
    pub tokens_scored: usize,
    /// Running perplexity after each chunk.
    pub per_chunk: Vec<f64>,
}

/// Scores `tokens` in `n_chunk` chunks of `sess.n_ctx()` tokens. `bos` replaces each
/// chunk's first token when the model adds BOS. `on_chunk(i, ppl_so_far)` reports progress.
#[allow(clippy::too_many_arguments)]
pub fn perplexity<B: Backend>(
    model: &dyn CausalLm<B>,
    be: &B,
    sess: &mut Session<B>,
    tokens: &[u32],
    n_chunk: usize,
    bos: Option<u32>,
    n_batch: usize,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<Perplexity, ModelError> {
    let n_ctx = sess.n_ctx();
    let first = n_ctx / 2;
    let vocab = model.info().n_vocab;
    let (mut nll, mut count) = (0f64, 0usize);
    let mut out = Perplexity::default();
    for c in 0..n_chunk.min(tokens.len() / n_ctx) {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        sess.truncate(be, 0)?;
        sess.prefill(model, be, &chunk[..first], n_batch, |_, _| true)?;
        // The scored half runs in slices so the logits buffer stays small.
        let mut pos = first;
        while pos < n_ctx - 1 {
            let end = (pos + 64).min(n_ctx - 1);
            let logits = sess.forward_all(model, be, &chunk[pos..end])?;
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                nll -= log_prob(row, chunk[pos + i + 1] as usize);
                count += 1;
            }
            pos = end;
        }
        let ppl = (nll / count as f64).exp();
        out.per_chunk.push(ppl);
        on_chunk(c, ppl);
    }
    out.chunks = out.per_chunk.len();
    out.tokens_scored = count;
    out.ppl = if count > 0 {
        (nll / count as f64).exp()
    } else {
        f64::NAN
    };
    Ok(out)
}
