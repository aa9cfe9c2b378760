//! One sequence's state on the device: its KV cache and the tokens it holds. Prefill runs in
//! batches of `n_batch` tokens through the matrix-matrix kernels; a new prompt that shares a
//! prefix with what the cache holds only prefills the part that differs.

use neagari_backend::{Backend, BackendError, Candidates, KvType, Penalties, Settles};
use neagari_model::{CausalLm, ModelError};

use crate::sampler::{Sampler, TOP_K_CANDIDATES_MAX};

/// What [`Session::decode_next`] brings back.
pub enum Next {
    /// The next token, drawn where the logits are.
    Token(u32),
    /// The logits, for the caller to mask or read and then sample.
    Logits(Vec<f32>),
}

/// A saved position of a `Session` (see `Session::checkpoint`).
pub struct Checkpoint<B: Backend> {
    kv: B::Kv,
    n_tokens: usize,
}

pub struct Session<B: Backend> {
    kv: B::Kv,
    /// Tokens whose keys and values are in `kv`, in order.
    tokens: Vec<u32>,
    n_ctx: usize,
    /// Set once the cache refused to truncate backwards (recurrent state): from then on
    /// each prefill leaves a checkpoint before its last token for the next prompt to reuse.
    rewind_refused: bool,
    /// That checkpoint; `tokens[..n_tokens]` are unchanged since it was taken.
    prompt_cp: Option<Checkpoint<B>>,
}

impl<B: Backend> Session<B> {
    pub fn new(
        model: &dyn CausalLm<B>,
        be: &B,
        n_ctx: usize,
        kv_type: KvType,
    ) -> Result<Self, ModelError> {
        Ok(Session {
            kv: model.new_kv(be, n_ctx, kv_type)?,
            tokens: Vec::new(),
            n_ctx,
            rewind_refused: false,
            prompt_cp: None,
        })
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Tokens currently in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forget everything after the first `len` tokens.
    pub fn truncate(&mut self, be: &B, len: usize) -> Result<(), ModelError> {
        let len = len.min(self.tokens.len());
        be.kv_truncate(&mut self.kv, len)?;
        self.tokens.truncate(len);
        self.drop_stale_checkpoint();
        Ok(())
    }

    fn drop_stale_checkpoint(&mut self) {
        if self
            .prompt_cp
            .as_ref()
            .is_some_and(|cp| cp.n_tokens > self.tokens.len())
        {
            self.prompt_cp = None;
        }
    }

    /// Keep the longest common prefix of the cache and `prompt` (at least one token of the
    /// prompt is left to run, so there are logits to sample from) and return its length.
    /// A hybrid model's recurrent state cannot be cut back: there a shorter prefix resumes
    /// from the checkpoint the last prefill left before its final token when that fits
    /// (a follow-up turn), else starts over from nothing (0 is returned).
    pub fn reuse_prefix(&mut self, be: &B, prompt: &[u32]) -> Result<usize, ModelError> {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(prompt.len().saturating_sub(1));
        match self.truncate(be, keep) {
            Ok(()) => Ok(keep),
            Err(ModelError::Backend(BackendError::CannotRewind { .. })) => {
                self.rewind_refused = true;
                if let Some(cp) = self.prompt_cp.take() {
                    if cp.n_tokens <= keep && be.kv_restore(&mut self.kv, &cp.kv).is_ok() {
                        self.tokens.truncate(cp.n_tokens);
                        let n = cp.n_tokens;
                        self.prompt_cp = Some(cp);
                        return Ok(n);
                    }
                }
                self.truncate(be, 0)?;
                Ok(0)
            }
            Err(e) => Err(e),
        }
    }

    /// A point to come back to with `restore` (cheap: the position and, for hybrid models,
    /// the recurrent state; attention entries are kept by truncation).
    pub fn checkpoint(&self, be: &B) -> Result<Checkpoint<B>, ModelError> {
        Ok(Checkpoint {
            kv: be.kv_snapshot(&self.kv)?,
            n_tokens: self.tokens.len(),
        })
    }

    /// Returns to a checkpoint taken from this session, forgetting what came after it.
    pub fn restore(&mut self, be: &B, cp: &Checkpoint<B>) -> Result<(), ModelError> {
        if cp.n_tokens > self.tokens.len() {
            return Err(ModelError::Unsupported(format!(
                "checkpoint at {} tokens is ahead of the session ({})",
                cp.n_tokens,
                self.tokens.len()
            )));
        }
        be.kv_restore(&mut self.kv, &cp.kv)?;
        self.tokens.truncate(cp.n_tokens);
        self.drop_stale_checkpoint();
        Ok(())
    }

    /// Runs `tokens` after what the cache holds, `n_batch` at a time, and returns the
    /// logits of the last one (`[n_vocab]`). `on_batch(done, total)` reports progress.
    pub fn prefill(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        tokens: &[u32],
        n_batch: usize,
        mut on_batch: impl FnMut(usize, usize) -> bool,
    ) -> Result<Option<Vec<f32>>, ModelError> {
        if self.tokens.len() + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextFull {
                tokens: tokens.len(),
                pos: self.tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        let mut logits = None;
        let mut done = 0;
        // With recurrent state, stop before the last token to leave a checkpoint.
        let split = if self.rewind_refused && tokens.len() >= 2 {
            tokens.len() - 1
        } else {
            tokens.len()
        };
        for (part, run) in [&tokens[..split], &tokens[split..]].into_iter().enumerate() {
            if part == 1 && !run.is_empty() {
                self.prompt_cp = self.checkpoint(be).ok();
            }
            for chunk in run.chunks(n_batch.max(1)) {
                logits = Some(model.forward(be, &mut self.kv, chunk, false)?);
                self.tokens.extend_from_slice(chunk);
                done += chunk.len();
                if !on_batch(done, tokens.len()) {
                    return Ok(None);
                }
            }
        }
        Ok(logits)
    }

    /// Runs one token and returns its logits.
    pub fn decode(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        token: u32,
    ) -> Result<Vec<f32>, ModelError> {
        be.step_begin(&self.kv, &[token])?;
        let logits = model.forward(be, &mut self.kv, &[token], false);
        be.step_end();
        let logits = logits?;
        self.tokens.push(token);
        Ok(logits)
    }

    /// Runs one token and returns the greedy pick of its logits (highest, lowest id among
    /// equals): what `decode` then a greedy sampler without penalties would choose, without
    /// bringing the logits back from a device.
    pub fn decode_greedy(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        token: u32,
    ) -> Result<u32, ModelError> {
        be.step_begin(&self.kv, &[token])?;
        let id = model.forward_greedy(be, &mut self.kv, &[token]);
        be.step_end();
        let id = id?;
        self.tokens.push(token);
        Ok(id)
    }

    /// Runs one token and returns the `k` best of its logits after `pen` as (id, logit),
    /// highest first (`CausalLm::forward_top_k`): what a top-k sampler keeps of `decode`'s
    /// logits, without bringing the logits back from a device.
    pub fn decode_top_k(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        token: u32,
        k: usize,
        pen: &Penalties,
    ) -> Result<Vec<(u32, f32)>, ModelError> {
        be.step_begin(&self.kv, &[token])?;
        let top = model.forward_top_k(be, &mut self.kv, &[token], k, pen);
        be.step_end();
        let top = top?;
        self.tokens.push(token);
        Ok(top)
    }

    /// Runs one token and returns its logits after `pen` as `Backend::candidates` gives
    /// them (`CausalLm::forward_candidates`): the `k` best with the row's softmax sums
    /// where `enough` says they settle the draw, else the whole penalized row.
    pub fn decode_candidates(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        token: u32,
        k: usize,
        pen: &Penalties,
        enough: &Settles<'_>,
    ) -> Result<Candidates, ModelError> {
        be.step_begin(&self.kv, &[token])?;
        let c = model.forward_candidates(be, &mut self.kv, &[token], k, pen, enough);
        be.step_end();
        let c = c?;
        self.tokens.push(token);
        Ok(c)
    }

    /// Runs one token and draws the next with `sampler` where its chain lets the draw be
    /// made from what a device brings back: greedy without penalties (`decode_greedy`: the
    /// id); greedy with them (the best penalized logit: a top-1); a chain whose first
    /// truncation is a top-k of at most TOP_K_CANDIDATES_MAX (`decode_top_k` with the
    /// sampler's penalties, then `Sampler::sample_top_k`: the token `sample` would draw from
    /// all the logits); a chain without top-k that truncates by top-p or min-p
    /// (`decode_candidates`: the best TOP_K_CANDIDATES_MAX and the row's softmax sums where
    /// they settle the draw, else the row). Otherwise, or where the caller needs the
    /// logits (`want_logits`: a grammar mask, logprobs), the logits; the caller samples
    /// (and accepts) as before.
    pub fn decode_next(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        token: u32,
        sampler: &mut Sampler,
        want_logits: bool,
    ) -> Result<Next, ModelError> {
        let cfg = sampler.config();
        if want_logits {
            return Ok(Next::Logits(self.decode(model, be, token)?));
        }
        if cfg.is_plain_greedy() {
            return Ok(Next::Token(self.decode_greedy(model, be, token)?));
        }
        if cfg.temperature <= 0.0 {
            let top = self.decode_top_k(model, be, token, 1, &sampler.penalties())?;
            return Ok(Next::Token(top.first().map_or(0, |&(id, _)| id)));
        }
        if let Some(k) = cfg.top_k_only(TOP_K_CANDIDATES_MAX) {
            let top = self.decode_top_k(model, be, token, k, &sampler.penalties())?;
            return Ok(Next::Token(sampler.sample_top_k(&top)));
        }
        if cfg.truncates_without_top_k() {
            let k = TOP_K_CANDIDATES_MAX;
            let enough = |top: &[(u32, f32)], max, sum| sampler.settles(top, k, max, sum);
            let c = self.decode_candidates(model, be, token, k, &sampler.penalties(), &enough)?;
            return Ok(Next::Token(match c {
                Candidates::Top { top, max, sum } => sampler.sample_candidates(&top, k, max, sum),
                Candidates::All(row) => sampler.sample_penalized(&row),
            }));
        }
        Ok(Next::Logits(self.decode(model, be, token)?))
    }

    /// Runs a few `tokens` (a speculative block: the last accepted token and the drafts) as
    /// one decode step and returns the greedy pick after each: pick `i` is what
    /// `decode_greedy` of `tokens[..=i]` one at a time would return, up to the rounding of
    /// a multi-row product. A device backend records and replays the step like a one-token
    /// step (up to 8 tokens on CUDA); a rejected draft is undone with `restore` or
    /// `truncate`.
    pub fn verify_greedy(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        tokens: &[u32],
    ) -> Result<Vec<u32>, ModelError> {
        if self.tokens.len() + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextFull {
                tokens: tokens.len(),
                pos: self.tokens.len(),
                n_ctx: self.n_ctx,
            });
        }
        be.step_begin(&self.kv, tokens)?;
        let ids = model.forward_greedy_all(be, &mut self.kv, tokens);
        be.step_end();
        let ids = ids?;
        self.tokens.extend_from_slice(tokens);
        Ok(ids)
    }

    /// Runs `tokens` and returns the logits of every one (`[n, n_vocab]`): perplexity and
    /// speculative verification.
    pub fn forward_all(
        &mut self,
        model: &dyn CausalLm<B>,
        be: &B,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let logits = model.forward(be, &mut self.kv, tokens, true)?;
        self.tokens.extend_from_slice(tokens);
        Ok(logits)
    }
}
