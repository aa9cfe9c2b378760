//! The terminal generation loop shared by `run` and `chat`: prefill what the cache does not
//! hold yet, then sample and decode until an end-of-generation token, the token limit or the
//! end of the context; pieces stream out as complete UTF-8.

use std::time::Instant;

use anyhow::Result;
use neagari_backend::Backend;
use neagari_engine::sampler::{Sampler, SamplerConfig};
use neagari_engine::session::{Next, Session};

use crate::load::Loaded;

/// Sampling flags, with llama.cpp's names and defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 = greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the repeat penalty looks back over.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: i32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (default: random).
    #[arg(long = "seed")]
    pub seed: Option<u64>,
}

impl SampleArgs {
    pub fn config(&self) -> SamplerConfig {
        SamplerConfig {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: Some(self.seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0)
            })),
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub prefill_s: f64,
    pub gen_tokens: usize,
    pub decode_s: f64,
    pub stopped_by: &'static str,
}

impl Stats {
    pub fn line(&self) -> String {
        let pre = self.prompt_tokens - self.cached_tokens;
        let pp = if self.prefill_s > 0.0 {
            pre as f64 / self.prefill_s
        } else {
            0.0
        };
        let tg = if self.decode_s > 0.0 {
            self.gen_tokens.saturating_sub(1) as f64 / self.decode_s
        } else {
            0.0
        };
        format!(
            "prefill {pre} tok ({} cached) {pp:.1} tok/s | decode {} tok {tg:.1} tok/s | stop: {}",
            self.cached_tokens, self.gen_tokens, self.stopped_by
        )
    }
}

/// Holds back bytes of an incomplete UTF-8 sequence until the next piece completes it.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // Invalid bytes that no continuation can fix: emit them replaced.
            Err(_) => self.pending.len(),
        };
        let out = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.pending.drain(..valid);
        out
    }

    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Generates after `prompt`, reusing whatever prefix `sess` already holds, calling
/// `emit(text)` for each complete piece. Returns the generated ids and timing.
pub fn generate<B: Backend>(
    l: &Loaded<B>,
    sess: &mut Session<B>,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_tokens: usize,
    mut emit: impl FnMut(&str),
) -> Result<(Vec<u32>, Stats)> {
    let mut st = Stats {
        prompt_tokens: prompt.len(),
        ..Default::default()
    };
    if prompt.len() >= sess.n_ctx() {
        anyhow::bail!(
            "the prompt has {} tokens but the context holds {} (raise --ctx-size)",
            prompt.len(),
            sess.n_ctx()
        );
    }
    let t = Instant::now();
    let keep = sess.reuse_prefix(&l.be, prompt)?;
    st.cached_tokens = keep;
    for &tok in &prompt[..keep] {
        sampler.accept(tok);
    }
    let mut logits = sess
        .prefill(
            l.model.as_ref(),
            &l.be,
            &prompt[keep..],
            l.n_batch,
            |_, _| true,
        )?
        .unwrap_or_default();
    for &tok in &prompt[keep..] {
        sampler.accept(tok);
    }
    st.prefill_s = t.elapsed().as_secs_f64();

    let mut out = Vec::new();
    let mut text = Utf8Stream::default();
    let t = Instant::now();
    st.stopped_by = "length";
    // Where the chain allows, the next token is drawn from what the device brings back
    // (the greedy id, or a top-k chain's k best: `Session::decode_next`).
    let mut next: Option<u32> = None;
    for i in 0..max_tokens {
        let tok = match next.take() {
            Some(t) => t,
            None => sampler.sample(&mut logits),
        };
        sampler.accept(tok);
        if l.tokenizer.is_eog(tok) {
            st.stopped_by = "eog";
            break;
        }
        out.push(tok);
        emit(&text.push(&l.tokenizer.token_to_piece(tok, false)));
        if i + 1 == max_tokens {
            break;
        }
        if sess.tokens().len() + 1 >= sess.n_ctx() {
            st.stopped_by = "context";
            break;
        }
        match sess.decode_next(l.model.as_ref(), &l.be, tok, sampler, false)? {
            Next::Token(t) => next = Some(t),
            Next::Logits(v) => logits = v,
        }
    }
    emit(&text.finish());
    st.gen_tokens = out.len();
    st.decode_s = t.elapsed().as_secs_f64();
    Ok((out, st))
}
