//! The engine worker: one thread that owns the model and one [`Session`], and runs queued
//! generation jobs one at a time, first in first out. The session's KV cache survives between
//! jobs, so a request that starts with the tokens of the previous one (the next turn of a
//! conversation, an agent's next step) prefills only what differs.
//!
//! A job reports through an unbounded channel; when the HTTP side drops its receiver (the
//! client went away, or a stop condition was met there) the worker notices between prefill
//! chunks and between decode steps and moves on. A panic inside a job is caught, reported to
//! that job as a failure, and the cache is cleared; the worker keeps serving.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use neagari_backend::{Backend, KvType};
use neagari_engine::sampler::{Sampler, SamplerConfig};
use neagari_engine::session::{Next, Session};
use neagari_model::CausalLm;
use neagari_tokenizer::chat_template::ChatTemplate;
use neagari_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::grammar::Constraint;
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

/// What the worker needs to run a model, built on the worker thread by the loader.
pub struct EngineParts<B: Backend> {
    pub be: B,
    pub model: Box<dyn CausalLm<B>>,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// The file's Jinja template source, when it has one (tool-call format detection).
    pub template_source: Option<String>,
    pub n_ctx: usize,
    pub n_batch: usize,
    pub kv_type: KvType,
    /// KV caches kept (each `n_ctx` tokens): requests go to the one sharing the longest
    /// prefix, so interleaved conversations each keep their cache.
    pub slots: usize,
    /// The id `/v1/models` lists.
    pub model_name: String,
}

/// What the HTTP side shares once the model is loaded.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
    pub template_source: Option<String>,
    pub n_ctx: usize,
    pub model_name: String,
    /// Where the model runs (`Backend::name`).
    pub device: String,
    /// `llguidance` needs the vocabulary as a token trie; built once, lazily.
    pub guidance: OnceLock<Result<std::sync::Arc<llguidance::ParserFactory>, String>>,
}

/// Sampling and stopping parameters of one job.
pub struct GenParams {
    pub sampler: SamplerConfig,
    /// Tokens to generate at most (already clamped to the room left in the context).
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability with the `n` most likely alternatives.
    pub top_logprobs: Option<usize>,
    /// Structured output: a token mask and a parser that follows the sampled tokens.
    pub constraint: Option<Box<dyn Constraint>>,
    /// Never stop at an end-of-generation token (benchmarks: a fixed number of tokens).
    pub ignore_eos: bool,
    /// Test hook: panic inside the job (only set when the server runs with the test env var).
    pub debug_panic: bool,
    /// Set by the request's side to end the generation at the next token as if at an
    /// end-of-generation token (the single tool call a request allows is complete).
    pub halt: Option<Arc<AtomicBool>>,
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: UnboundedSender<Event>,
}

#[derive(Debug, Clone)]
pub struct TokenLogprob {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// Most likely alternatives at that step, best first: (token, bytes, logprob).
    pub top: Vec<(String, Vec<u8>, f32)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token (or the constraint's grammar completed).
    Eog,
    /// One of the stop strings; its index in `GenParams::stop`.
    Stop(usize),
    /// `max_tokens` or the end of the context.
    Length,
}

#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
}

#[derive(Debug)]
pub enum Event {
    /// The job left the queue; the cache held `cached_tokens` of the prompt.
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// Generated text (may be empty while a stop string is pending) and, when asked for, the
    /// log-probabilities of the tokens that produced it.
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the server is busy: {0} requests are queued (limit {1}); retry shortly")]
    Busy(usize, usize),
    #[error("the engine is not running")]
    Gone,
}

/// The HTTP side's handle on the worker.
pub struct Queue {
    tx: std::sync::mpsc::Sender<Job>,
    /// Jobs waiting or running.
    depth: Arc<AtomicUsize>,
    limit: usize,
}

impl Queue {
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        let d = self.depth.fetch_add(1, Ordering::SeqCst);
        if d >= self.limit {
            self.depth.fetch_sub(1, Ordering::SeqCst);
            return Err(SubmitError::Busy(d, self.limit));
        }
        self.tx.send(job).map_err(|_| {
            self.depth.fetch_sub(1, Ordering::SeqCst);
            SubmitError::Gone
        })
    }

    pub fn depth(&self) -> usize {
        self.depth.load(Ordering::SeqCst)
    }
}

pub type Loader<B> = Box<dyn FnOnce() -> anyhow::Result<EngineParts<B>> + Send>;

/// Starts the worker thread: it runs `loader`, publishes [`Ready`] into `ready`, then serves
/// jobs. A loader error is stored in `load_error` and ends the thread.
pub fn spawn<B: Backend>(
    loader: Loader<B>,
    ready: Arc<OnceLock<Ready>>,
    load_error: Arc<OnceLock<String>>,
    metrics: Arc<Metrics>,
    queue_limit: usize,
) -> std::io::Result<Queue> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    let depth = Arc::new(AtomicUsize::new(0));
    let d2 = depth.clone();
    std::thread::Builder::new()
        .name("neagari-engine".into())
        .spawn(move || {
            let parts = match loader() {
                Ok(p) => p,
                Err(e) => {
                    let msg: Vec<String> = e.chain().map(|c| c.to_string()).collect();
                    let _ = load_error.set(msg.join(": "));
                    return;
                }
            };
            let mut w = match Worker::new(parts, metrics) {
                Ok(w) => w,
                Err(e) => {
                    let _ = load_error.set(e);
                    return;
                }
            };
            let _ = ready.set(Ready {
                tokenizer: w.tokenizer.clone(),
                template: w.template.clone(),
                template_source: w.template_source.clone(),
                n_ctx: w.n_ctx,
                model_name: w.model_name.clone(),
                device: w.be.name(),
                guidance: OnceLock::new(),
            });
            while let Ok(job) = rx.recv() {
                w.metrics
                    .queue_depth
                    .store(d2.load(Ordering::SeqCst), Ordering::Relaxed);
                w.run(job);
                d2.fetch_sub(1, Ordering::SeqCst);
                w.metrics
                    .queue_depth
                    .store(d2.load(Ordering::SeqCst), Ordering::Relaxed);
            }
        })?;
    Ok(Queue {
        tx,
        depth,
        limit: queue_limit.max(1),
    })
}

/// One KV cache and when it was last used.
struct Slot<B: Backend> {
    sess: Session<B>,
    used: u64,
}

struct Worker<B: Backend> {
    be: B,
    model: Box<dyn CausalLm<B>>,
    slots: Vec<Slot<B>>,
    /// The slot the current job runs in.
    cur: usize,
    clock: u64,
    tokenizer: Arc<Tokenizer>,
    template: Option<Arc<ChatTemplate>>,
    template_source: Option<String>,
    n_ctx: usize,
    n_batch: usize,
    model_name: String,
    metrics: Arc<Metrics>,
}

enum Outcome {
    Done(Finish, Usage),
    Cancelled(Usage),
}

impl<B: Backend> Worker<B> {
    fn new(p: EngineParts<B>, metrics: Arc<Metrics>) -> Result<Self, String> {
        let mut slots = Vec::new();
        for _ in 0..p.slots.max(1) {
            let sess = Session::new(p.model.as_ref(), &p.be, p.n_ctx, p.kv_type)
                .map_err(|e| format!("cannot allocate the KV cache: {e}"))?;
            slots.push(Slot { sess, used: 0 });
        }
        Ok(Worker {
            be: p.be,
            model: p.model,
            slots,
            cur: 0,
            clock: 0,
            tokenizer: Arc::new(p.tokenizer),
            template: p.template.map(Arc::new),
            template_source: p.template_source,
            n_ctx: p.n_ctx,
            n_batch: p.n_batch,
            model_name: p.model_name,
            metrics,
        })
    }

    fn run(&mut self, job: Job) {
        let events = job.events.clone();
        let r = catch_unwind(AssertUnwindSafe(|| self.generate(job)));
        let m = &self.metrics;
        match r {
            Ok(Ok(Outcome::Done(finish, usage))) => {
                m.record_job(&usage, false);
                log_job(&usage, &format!("{finish:?}"));
                let _ = events.send(Event::Done { finish, usage });
            }
            Ok(Ok(Outcome::Cancelled(usage))) => {
                m.record_job(&usage, true);
                log_job(&usage, "cancelled");
            }
            Ok(Err(msg)) => {
                let _ = events.send(Event::Failed(msg));
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                eprintln!("neagari serve: a request panicked in the engine: {what}");
                // The cache may be half-written; start the next job from an empty one.
                let _ = self.slots[self.cur].sess.truncate(&self.be, 0);
                let _ = events.send(Event::Failed(format!("internal error: {what}")));
            }
        }
    }

    /// The slot whose cache shares the longest prefix with `prompt`, unless using it would
    /// throw away more than half of what it holds (an agent's side request sharing only the
    /// template's first tokens): then the least recently used slot, so the main
    /// conversation's cache survives for its next turn.
    fn choose_slot(&self, prompt: &[u32]) -> usize {
        let common = |s: &Session<B>| {
            s.tokens()
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let (best, c) = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (i, common(&s.sess), s.used))
            .max_by_key(|&(_, c, used)| (c, used))
            .map(|(i, c, _)| (i, c))
            .unwrap_or((0, 0));
        if c * 2 >= self.slots[best].sess.tokens().len() {
            return best;
        }
        self.slots
            .iter()
            .enumerate()
            .min_by_key(|(_, s)| s.used)
            .map_or(best, |(i, _)| i)
    }

    fn generate(&mut self, job: Job) -> Result<Outcome, String> {
        let Job {
            prompt,
            mut params,
            events,
        } = job;
        let tok = self.tokenizer.clone();
        if prompt.is_empty() {
            return Err("empty prompt".into());
        }
        if prompt.len() >= self.n_ctx {
            return Err(format!(
                "the prompt has {} tokens but the context holds {}",
                prompt.len(),
                self.n_ctx
            ));
        }
        let mut usage = Usage {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let t0 = Instant::now();
        self.cur = self.choose_slot(&prompt);
        self.clock += 1;
        self.slots[self.cur].used = self.clock;
        let keep = self.slots[self.cur]
            .sess
            .reuse_prefix(&self.be, &prompt)
            .map_err(|e| e.to_string())?;
        usage.cached_tokens = keep;
        if prompt.len() - keep >= LOG_PREFILL_FROM {
            // A long prefill takes a while on CPU: say so before it starts.
            eprintln!(
                "neagari serve: prefilling {} tokens ({keep} of {} cached)",
                prompt.len() - keep,
                prompt.len()
            );
        }
        let _ = events.send(Event::Started {
            prompt_tokens: prompt.len(),
            cached_tokens: keep,
        });
        assert!(!params.debug_panic, "test panic requested");
        let mut sampler = Sampler::new(params.sampler.clone());
        let window = match params.sampler.repeat_last_n {
            n if n < 0 => prompt.len(),
            n => (n as usize).min(prompt.len()),
        };
        for &t in &prompt[prompt.len() - window..] {
            sampler.accept(t);
        }
        let mut prefilled = 0;
        let logits = self.slots[self.cur]
            .sess
            .prefill(
                self.model.as_ref(),
                &self.be,
                &prompt[keep..],
                self.n_batch,
                |done, _| {
                    prefilled = done;
                    !events.is_closed()
                },
            )
            .map_err(|e| e.to_string())?;
        usage.prefill_s = t0.elapsed().as_secs_f64();
        let Some(mut logits) = logits else {
            // Count only what was prefilled; those tokens stay cached for a retry.
            usage.prompt_tokens = keep + prefilled;
            return Ok(Outcome::Cancelled(usage));
        };

        // Where nothing needs the whole logits (no grammar, no EOS mask, no logprobs), the
        // next token is drawn from what a device brings back (`Session::decode_next`).
        let want_logits =
            params.constraint.is_some() || params.ignore_eos || params.top_logprobs.is_some();
        let mut next: Option<u32> = None;
        let t1 = Instant::now();
        let mut dec = StreamDecoder::new(false);
        let mut stop = StopMatcher::new(params.stop.clone());
        let mut finish = Finish::Length;
        let mut n = 0usize;
        let eog = tok.eog_ids();
        while n < params.max_tokens {
            if events.is_closed() {
                usage.completion_tokens = n;
                usage.decode_s = t1.elapsed().as_secs_f64();
                return Ok(Outcome::Cancelled(usage));
            }
            if params
                .halt
                .as_ref()
                .is_some_and(|h| h.load(Ordering::Relaxed))
            {
                finish = Finish::Eog;
                break;
            }
            let (t, lp) = match next.take() {
                Some(t) => (t, None),
                None => {
                    if let Some(c) = params.constraint.as_mut() {
                        c.mask(&mut logits)?;
                    }
                    if params.ignore_eos {
                        for &e in &eog {
                            if let Some(l) = logits.get_mut(e as usize) {
                                *l = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let lp = params
                        .top_logprobs
                        .map(|k| log_softmax_top(&logits, k.min(20)));
                    (sampler.sample(&mut logits), lp)
                }
            };
            sampler.accept(t);
            n += 1;
            let mut grammar_done = false;
            if let Some(c) = params.constraint.as_mut() {
                grammar_done = c.commit(t)?;
            }
            if tok.is_eog(t) {
                finish = Finish::Eog;
                break;
            }
            let mut logprobs = Vec::new();
            if let Some((lse, top)) = lp {
                let bytes = tok.token_to_piece(t, false);
                logprobs.push(TokenLogprob {
                    token: String::from_utf8_lossy(&bytes).into_owned(),
                    logprob: logits_raw_logprob(&logits, t, lse, &top),
                    bytes,
                    top: top
                        .iter()
                        .map(|&(id, l)| {
                            let b = tok.token_to_piece(id, false);
                            (String::from_utf8_lossy(&b).into_owned(), b, l)
                        })
                        .collect(),
                });
            }
            let piece = dec.push(&tok, t);
            let (text, hit) = stop.push(&piece);
            if !text.is_empty() || !logprobs.is_empty() {
                let _ = events.send(Event::Text { text, logprobs });
            }
            if let Some(i) = hit {
                finish = Finish::Stop(i);
                break;
            }
            if grammar_done {
                finish = Finish::Eog;
                break;
            }
            if n == params.max_tokens || self.slots[self.cur].sess.tokens().len() + 1 >= self.n_ctx
            {
                break;
            }
            match self.slots[self.cur]
                .sess
                .decode_next(self.model.as_ref(), &self.be, t, &mut sampler, want_logits)
                .map_err(|e| e.to_string())?
            {
                Next::Token(t) => next = Some(t),
                Next::Logits(v) => logits = v,
            }
        }
        if !matches!(finish, Finish::Stop(_)) {
            let (text, hit) = stop.push(&dec.finish());
            let rest = stop.finish();
            let text = text + &rest;
            if !text.is_empty() {
                let _ = events.send(Event::Text {
                    text,
                    logprobs: Vec::new(),
                });
            }
            if let Some(i) = hit {
                finish = Finish::Stop(i);
            }
        }
        usage.completion_tokens = n;
        usage.decode_s = t1.elapsed().as_secs_f64();
        Ok(Outcome::Done(finish, usage))
    }
}

/// Prefills at least this long are announced when they start.
const LOG_PREFILL_FROM: usize = 2048;

/// One line per request on stderr: what was prefilled, what was reused, how fast.
fn log_job(u: &Usage, end: &str) {
    let pre = u.prompt_tokens - u.cached_tokens;
    let pp = if u.prefill_s > 0.0 {
        pre as f64 / u.prefill_s
    } else {
        0.0
    };
    let tg = if u.decode_s > 0.0 {
        u.completion_tokens.saturating_sub(1) as f64 / u.decode_s
    } else {
        0.0
    };
    eprintln!(
        "neagari serve: prompt {} tok ({} cached), prefill {pre} tok {:.2} s ({pp:.0} tok/s), {} generated ({tg:.1} tok/s), end: {end}",
        u.prompt_tokens, u.cached_tokens, u.prefill_s, u.completion_tokens
    );
}

/// Log-sum-exp of `logits` and the `k` best (id, log-probability) pairs.
fn log_softmax_top(logits: &[f32], k: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .map(|&l| f64::from((l - max).exp()))
        .sum::<f64>();
    let lse = max + sum.ln() as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() < k || l > best[best.len() - 1].1 {
                let pos = best.partition_point(|&(_, b)| b >= l);
                best.insert(pos, (i as u32, l));
                best.truncate(k);
            }
        }
    }
    (lse, best.into_iter().map(|(i, l)| (i, l - lse)).collect())
}

/// The chosen token's log-probability under the unpenalized distribution. `logits` went
/// through the sampler's penalties in place, so the value is looked up in `top` first.
fn logits_raw_logprob(logits: &[f32], t: u32, lse: f32, top: &[(u32, f32)]) -> f32 {
    top.iter()
        .find(|&&(id, _)| id == t)
        .map(|&(_, l)| l)
        .unwrap_or_else(|| {
            logits
                .get(t as usize)
                .map_or(f32::NEG_INFINITY, |&l| l - lse)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_top_matches_direct_computation() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let (lse, top) = log_softmax_top(&logits, 2);
        let z: f32 = logits.iter().map(|l| l.exp()).sum();
        assert!((lse - z.ln()).abs() < 1e-5);
        assert_eq!(top[0].0, 1);
        assert_eq!(top[1].0, 2);
        assert!((top[0].1 - (3.0f32.exp() / z).ln()).abs() < 1e-5);
    }
}
