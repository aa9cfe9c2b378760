//! Counters behind `GET /metrics`, in the Prometheus text exposition format.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::worker::Usage;

#[derive(Default)]
pub struct Metrics {
    /// HTTP responses by status code.
    by_status: Mutex<BTreeMap<u16, u64>>,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    /// Prefilled (not cached) tokens and the time spent on them, in microseconds.
    prefill_tokens: AtomicU64,
    prefill_us: AtomicU64,
    decode_tokens: AtomicU64,
    decode_us: AtomicU64,
    jobs: AtomicU64,
    cancelled: AtomicU64,
    pub queue_depth: AtomicUsize,
}

impl Metrics {
    pub fn record_status(&self, status: u16) {
        if let Ok(mut m) = self.by_status.lock() {
            *m.entry(status).or_insert(0) += 1;
        }
    }

    pub fn record_job(&self, u: &Usage, cancelled: bool) {
        let r = Ordering::Relaxed;
        self.jobs.fetch_add(1, r);
        if cancelled {
            self.cancelled.fetch_add(1, r);
        }
        self.prompt_tokens.fetch_add(u.prompt_tokens as u64, r);
        self.cached_tokens.fetch_add(u.cached_tokens as u64, r);
        self.completion_tokens
            .fetch_add(u.completion_tokens as u64, r);
        self.prefill_tokens
            .fetch_add((u.prompt_tokens - u.cached_tokens) as u64, r);
        self.prefill_us.fetch_add((u.prefill_s * 1e6) as u64, r);
        // The first token comes from the prefill's logits; decode time covers the rest.
        self.decode_tokens
            .fetch_add(u.completion_tokens.saturating_sub(1) as u64, r);
        self.decode_us.fetch_add((u.decode_s * 1e6) as u64, r);
    }

    pub fn render(&self) -> String {
        let r = Ordering::Relaxed;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP neagari_requests_total HTTP responses by status code."
        );
        let _ = writeln!(s, "# TYPE neagari_requests_total counter");
        if let Ok(m) = self.by_status.lock() {
            for (code, n) in m.iter() {
                let _ = writeln!(s, "neagari_requests_total{{status=\"{code}\"}} {n}");
            }
        }
        let counter = |s: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} counter");
            let _ = writeln!(s, "{name} {v}");
        };
        let gauge = |s: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} gauge");
            let _ = writeln!(s, "{name} {v}");
        };
        counter(
            &mut s,
            "neagari_generations_total",
            "Generation jobs run (cancelled included).",
            self.jobs.load(r),
        );
        counter(
            &mut s,
            "neagari_generations_cancelled_total",
            "Generation jobs stopped because the client went away.",
            self.cancelled.load(r),
        );
        counter(
            &mut s,
            "neagari_prompt_tokens_total",
            "Prompt tokens of all jobs.",
            self.prompt_tokens.load(r),
        );
        counter(
            &mut s,
            "neagari_prefix_cache_hit_tokens_total",
            "Prompt tokens reused from the KV cache instead of prefilled.",
            self.cached_tokens.load(r),
        );
        counter(
            &mut s,
            "neagari_completion_tokens_total",
            "Generated tokens.",
            self.completion_tokens.load(r),
        );
        let rate = |tok: &AtomicU64, us: &AtomicU64| {
            let us = us.load(r);
            if us == 0 {
                0.0
            } else {
                tok.load(r) as f64 / (us as f64 / 1e6)
            }
        };
        gauge(
            &mut s,
            "neagari_prefill_tokens_per_second",
            "Prefill throughput over all jobs.",
            rate(&self.prefill_tokens, &self.prefill_us),
        );
        gauge(
            &mut s,
            "neagari_decode_tokens_per_second",
            "Decode throughput over all jobs.",
            rate(&self.decode_tokens, &self.decode_us),
        );
        gauge(
            &mut s,
            "neagari_queue_depth",
            "Requests waiting or running in the engine.",
            self.queue_depth.load(r) as f64,
        );
        s
    }
}
