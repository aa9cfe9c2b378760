//! Token sampling: turns one step's logits into the next token, in llama.cpp's chain order
//! (common/sampling.cpp): repetition/frequency/presence penalties over the last N accepted
//! tokens → top-k → top-p → min-p → temperature → a seeded draw.
//!
//! Each stage follows llama.cpp's sampler of the same name (src/llama-sampler.cpp, upstream
//! 0c1e570): top-p and min-p see temperature-1 probabilities, since temperature comes last;
//! a temperature ≤ 0 means greedy argmax (ties go to the lowest token id). Tested against
//! llama.cpp's chain through llama-cpp-python (tests/fixtures/sampler_chains.json, made by
//! scripts/sampler_reference.py) and against the expected values of llama.cpp's
//! tests/test-sampling.cpp.
//!
//! The random draw uses xoshiro256** (Blackman & Vigna) seeded through splitmix64, written
//! here so that a seed gives the same tokens on every platform and crate version. It does not
//! reproduce llama.cpp's mt19937 stream.
//!
//! Cost per step over a vocabulary of n: penalties O(window); top-k by a bounded heap, O(n)
//! compares plus heap work only for the few logits that beat the current k-th best; without
//! top-k, top-p sorts the best 256 candidates, then chunks four times larger only as far as the
//! nucleus reaches; a draw with no truncation at all sorts nothing.

use std::collections::hash_map::RandomState;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};

use neagari_backend::Penalties;

/// The largest top-k whose candidates a decode loop asks the model for instead of the
/// logits (`Session::decode_top_k`): a device selects up to 64 of a 262,144-token
/// vocabulary in two launches (CUDA `top_k`); larger ones read the logits back as before.
pub const TOP_K_CANDIDATES_MAX: usize = 64;

/// Sampling parameters; `Default` gives llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// ≤ 0: greedy.
    pub temperature: f32,
    /// ≤ 0: disabled.
    pub top_k: i32,
    /// ≥ 1: disabled.
    pub top_p: f32,
    /// ≤ 0: disabled.
    pub min_p: f32,
    /// 1: disabled. Divides positive logits of recent tokens, multiplies negative ones.
    pub repeat_penalty: f32,
    /// Window of accepted tokens the penalties look at; 0 disables them, negative means every
    /// accepted token.
    pub repeat_last_n: i32,
    /// Subtracted once from the logit of every token in the window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window.
    pub frequency_penalty: f32,
    /// `None`: seeded from process entropy.
    pub seed: Option<u64>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplerConfig {
    /// Greedy without penalties: the pick depends on the logits alone, so it can be made
    /// where the logits are (`Session::decode_greedy`).
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0 && !self.penalties_active()
    }

    /// Where the chain's first truncation is a top-k of at most `max`, that k: the draw
    /// then depends only on the k best penalized logits, so a device can apply the
    /// penalties ([`Sampler::penalties`]), select the k best and bring back k pairs
    /// (`Session::decode_top_k`, then [`Sampler::sample_top_k`]).
    pub fn top_k_only(&self, max: usize) -> Option<usize> {
        let k = usize::try_from(self.top_k).ok()?;
        (self.temperature > 0.0 && (1..=max).contains(&k)).then_some(k)
    }

    /// A chain without top-k that truncates by top-p or min-p: its draw is often settled
    /// by the best few penalized logits and the row's softmax sums, so a device can bring
    /// back those instead of the logits (`Session::decode_next`, [`Sampler::settles`]).
    pub fn truncates_without_top_k(&self) -> bool {
        self.temperature > 0.0 && self.top_k <= 0 && (self.top_p < 1.0 || self.min_p > 0.0)
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n != 0
            && !(self.repeat_penalty == 1.0
                && self.frequency_penalty == 0.0
                && self.presence_penalty == 0.0)
    }
}

#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f32,
    p: f32,
}

/// Higher logit first, then lower id: the order every stage sorts by.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Heap entry ordered so that the heap's top is the worst kept candidate.
#[derive(Clone, Copy)]
struct Worst(Candidate);

impl PartialEq for Worst {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Worst {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // "Greater" = worse = lower logit, or same logit and higher id.
        by_logit_desc(&self.0, &other.0)
    }
}

/// xoshiro256** seeded by splitmix64.
#[derive(Debug, Clone)]
struct Rng {
    s: [u64; 4],
}

impl Rng {
    fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Samples tokens with a [`SamplerConfig`], keeping the penalty window and the RNG state of
/// one sequence.
#[derive(Debug, Clone)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    /// Accepted tokens in the penalty window, oldest first.
    window: VecDeque<u32>,
    /// Occurrences of each token in `window`.
    counts: HashMap<u32, u32>,
    /// Survivors of the chain; reused across steps. Shape: [n_candidates].
    cand: Vec<Candidate>,
    /// Penalized copy of the logits for `probs`, which leaves its input alone. Shape: [n_vocab].
    scratch: Vec<f32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        let seed = cfg.seed.unwrap_or_else(|| {
            // RandomState is keyed from OS entropy once per process and varied per instance.
            let mut h = RandomState::new().build_hasher();
            h.write_u64(std::process::id().into());
            h.finish()
        });
        Sampler {
            cfg,
            rng: Rng::new(seed),
            window: VecDeque::new(),
            counts: HashMap::new(),
            cand: Vec::new(),
            scratch: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token of the sequence (prompt or generated) for the penalties.
    pub fn accept(&mut self, token: u32) {
        let last_n = self.cfg.repeat_last_n;
        if last_n == 0 {
            return;
        }
        *self.counts.entry(token).or_insert(0) += 1;
        if last_n > 0 && self.window.len() >= last_n as usize {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
        self.window.push_back(token);
    }

    /// Forgets the penalty window (a new sequence); the RNG stream continues.
    pub fn reset(&mut self) {
        self.window.clear();
        self.counts.clear();
    }

    /// Runs the chain and draws a token. Penalties are applied to `logits` in place (they hold
    /// the penalized values afterwards). Does not call [`Sampler::accept`]. Empty logits give 0.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.apply_penalties(logits);
        self.run_chain(logits, false);
        let r = self.rng.next_f64();
        pick(&self.cand, r).unwrap_or(0)
    }

    /// The penalties the chain applies before its top-k now (llama.cpp's `penalties` over
    /// the window's counts; none when they are off), for `Backend::top_k`.
    pub fn penalties(&self) -> Penalties {
        let c = &self.cfg;
        if !c.penalties_active() {
            return Penalties::default();
        }
        let sub = |count: u32| count as f32 * c.frequency_penalty + c.presence_penalty;
        Penalties {
            repeat: c.repeat_penalty,
            tokens: self.counts.iter().map(|(&t, &n)| (t, sub(n))).collect(),
        }
    }

    /// [`Sampler::sample`] for a config with [`SamplerConfig::top_k_only`], from the k best
    /// penalized logits (`top`: (id, logit), highest first, the lowest id among equals, NaN
    /// left out, as `Backend::top_k` gives them after [`Sampler::penalties`]) instead of all
    /// of them: the same chain after its top-k, so the same token for the same RNG state.
    /// Empty `top` gives 0.
    pub fn sample_top_k(&mut self, top: &[(u32, f32)]) -> u32 {
        self.cand.clear();
        self.cand.extend(
            top.iter()
                .map(|&(id, logit)| Candidate { id, logit, p: 0.0 }),
        );
        if !self.cand.is_empty() {
            self.finish_chain(true, false);
        }
        let r = self.rng.next_f64();
        pick(&self.cand, r).unwrap_or(0)
    }

    /// For a chain with [`SamplerConfig::truncates_without_top_k`]: whether the `k` best
    /// penalized logits of a row (`top`: highest first, as `Backend::candidates` gives them;
    /// fewer than `k` where the row has fewer that are not NaN) with the row's largest value
    /// `max` and Σ exp(v − max) over it (`sum`) settle the draw — whether top-p's nucleus
    /// or min-p's survivors lie among them, so that no other value of the row survives.
    pub fn settles(&self, top: &[(u32, f32)], k: usize, max: f32, sum: f32) -> bool {
        self.survivors(top, k, max, sum).is_some()
    }

    /// [`Sampler::sample`] for a chain with [`SamplerConfig::truncates_without_top_k`] from
    /// what [`Sampler::settles`] accepted: the same chain on the survivors, so the same
    /// token for the same RNG state where `sum` is the sum `sample`'s top-p makes (f32, in
    /// id order; a device's differs in the last bits). 0 where they do not settle it.
    pub fn sample_candidates(&mut self, top: &[(u32, f32)], k: usize, max: f32, sum: f32) -> u32 {
        self.cand = self.survivors(top, k, max, sum).unwrap_or_default();
        if !self.cand.is_empty() {
            for c in &mut self.cand {
                c.logit /= self.cfg.temperature;
            }
            softmax(&mut self.cand);
        }
        let r = self.rng.next_f64();
        pick(&self.cand, r).unwrap_or(0)
    }

    /// [`Sampler::sample`] of logits the chain's penalties were already applied to (as
    /// `Backend::candidates` brings back a whole row).
    pub fn sample_penalized(&mut self, logits: &[f32]) -> u32 {
        self.run_chain(logits, false);
        let r = self.rng.next_f64();
        pick(&self.cand, r).unwrap_or(0)
    }

    /// The survivors of top-p and min-p (before temperature) in the order `sample` draws
    /// them, from `settles`'s inputs; `None` where values outside `top` might survive or
    /// the sums are not finite (the whole row decides then).
    fn survivors(
        &self,
        top: &[(u32, f32)],
        k: usize,
        max: f32,
        sum: f32,
    ) -> Option<Vec<Candidate>> {
        let cfg = &self.cfg;
        // Every value of the row that is not NaN is in `top`.
        let whole = top.len() < k;
        let mut cand: Vec<Candidate> = top
            .iter()
            .map(|&(id, logit)| Candidate { id, logit, p: 0.0 })
            .collect();
        // `sample`'s order (a device ranks −0 with +0).
        cand.sort_by(by_logit_desc);
        if cfg.top_p < 1.0 {
            if !(max.is_finite() && sum.is_finite() && sum > 0.0) {
                return None;
            }
            // softmax_f32's probabilities, summed in `top_p`'s order.
            let mut cum = 0.0f32;
            let keep = cand.iter().position(|c| {
                cum += (c.logit - max).exp() / sum;
                cum >= cfg.top_p
            });
            match keep {
                Some(i) => cand.truncate(i + 1),
                None if whole => {}
                None => return None,
            }
        }
        if cfg.min_p > 0.0 {
            let best = *cand.first()?;
            let threshold = best.logit + cfg.min_p.ln();
            if cfg.top_p >= 1.0 && !whole && cand.last().is_some_and(|c| c.logit >= threshold) {
                return None;
            }
            cand.retain(|c| c.logit >= threshold);
            if cand.is_empty() {
                cand.push(best);
            }
            if cfg.top_p >= 1.0 {
                // Without top-p, `sample` keeps the row's (id) order.
                cand.sort_by_key(|c| c.id);
            }
        }
        Some(cand)
    }

    /// The distribution the chain leaves: surviving candidates with their probabilities
    /// (summing to 1), most likely first, ties by lower id. `logits` are not modified.
    pub fn probs(&mut self, logits: &[f32]) -> Vec<(u32, f32)> {
        if self.cfg.penalties_active() && !self.counts.is_empty() {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            scratch.extend_from_slice(logits);
            self.apply_penalties(&mut scratch);
            self.run_chain(&scratch, true);
            self.scratch = scratch;
        } else {
            self.run_chain(logits, true);
        }
        self.cand.iter().map(|c| (c.id, c.p)).collect()
    }

    /// Draws from a given distribution (e.g. one [`Sampler::probs`] returned, possibly
    /// adjusted, as speculative decoding's residual); weights need not sum to 1. `None` when
    /// no weight is positive.
    pub fn draw(&mut self, dist: &[(u32, f32)]) -> Option<u32> {
        let total: f64 = dist.iter().map(|&(_, p)| f64::from(p.max(0.0))).sum();
        if total.is_nan() || total <= 0.0 {
            return None;
        }
        let target = total * self.rng.next_f64();
        let mut run = 0.0f64;
        let mut last = None;
        for &(id, p) in dist {
            if p > 0.0 {
                run += f64::from(p);
                last = Some(id);
                if run > target {
                    return Some(id);
                }
            }
        }
        last
    }

    /// llama.cpp's `penalties` sampler over the window's counts.
    fn apply_penalties(&self, logits: &mut [f32]) {
        self.penalties().apply(logits);
    }

    /// Fills `self.cand` with the chain's survivors and their final probabilities, sorted.
    fn run_chain(&mut self, logits: &[f32], sort_output: bool) {
        let cfg = self.cfg.clone();
        self.cand.clear();
        if cfg.temperature <= 0.0 {
            if let Some(id) = argmax(logits) {
                self.cand.push(Candidate {
                    id,
                    logit: logits[id as usize],
                    p: 1.0,
                });
            }
            return;
        }
        let sorted = self.top_k(logits, cfg.top_k);
        if self.cand.is_empty() {
            return;
        }
        self.finish_chain(sorted, sort_output);
    }

    /// The chain after top-k over `self.cand` (`sorted`: in `by_logit_desc` order): top-p,
    /// min-p, temperature, the final probabilities.
    fn finish_chain(&mut self, mut sorted: bool, sort_output: bool) {
        let cfg = self.cfg.clone();
        if cfg.top_p < 1.0 {
            self.top_p(cfg.top_p, sorted);
            sorted = true;
        }
        if cfg.min_p > 0.0 {
            self.min_p(cfg.min_p);
        }
        for c in &mut self.cand {
            c.logit /= cfg.temperature;
        }
        softmax(&mut self.cand);
        // The draw walks candidates in any (deterministic) order; only `probs` promises one.
        if !sorted && sort_output {
            self.cand.sort_unstable_by(by_logit_desc);
        }
    }

    /// Candidates after top-k: the k best sorted (returns true), or every finite-or-infinite
    /// non-NaN logit in id order when top-k is off (returns false).
    fn top_k(&mut self, logits: &[f32], k: i32) -> bool {
        let all = |l: &[f32], out: &mut Vec<Candidate>| {
            out.extend(
                l.iter()
                    .enumerate()
                    .filter(|(_, l)| !l.is_nan())
                    .map(|(i, &l)| Candidate {
                        id: i as u32,
                        logit: l,
                        p: 0.0,
                    }),
            );
        };
        if k <= 0 || k as usize >= logits.len() {
            all(logits, &mut self.cand);
            if k > 0 {
                self.cand.sort_unstable_by(by_logit_desc);
                return true;
            }
            return false;
        }
        let k = k as usize;
        if k <= 1024 {
            // Bounded heap: most logits lose one compare against the current k-th best.
            let mut heap: BinaryHeap<Worst> = BinaryHeap::with_capacity(k + 1);
            // The k-th best logit so far; the common case is one compare against it.
            let mut bar = f32::NEG_INFINITY;
            for (i, &l) in logits.iter().enumerate() {
                // Ids rise during the scan, so an equal logit never beats a kept one; NaN never
                // compares greater.
                let beats_bar = l > bar;
                if heap.len() == k && !beats_bar {
                    continue;
                }
                if l.is_nan() {
                    continue;
                }
                let c = Candidate {
                    id: i as u32,
                    logit: l,
                    p: 0.0,
                };
                if heap.len() < k {
                    heap.push(Worst(c));
                } else if let Some(mut worst) = heap.peek_mut() {
                    *worst = Worst(c);
                }
                if heap.len() == k {
                    bar = heap.peek().map_or(f32::NEG_INFINITY, |w| w.0.logit);
                }
            }
            self.cand.extend(heap.into_iter().map(|w| w.0));
        } else {
            all(logits, &mut self.cand);
            if self.cand.len() > k {
                self.cand.select_nth_unstable_by(k - 1, by_logit_desc);
                self.cand.truncate(k);
            }
        }
        self.cand.sort_unstable_by(by_logit_desc);
        true
    }

    /// llama.cpp's top-p: the smallest prefix (by probability) whose mass reaches `p`.
    fn top_p(&mut self, p: f32, sorted: bool) {
        // Probabilities at temperature 1, summed in the candidates' current order as llama.cpp.
        softmax_f32(&mut self.cand);
        let n = self.cand.len();
        // Sort lazily: the nucleus is usually within the first few hundred candidates.
        let mut sorted_upto = if sorted { n } else { 0 };
        let mut cum = 0.0f32;
        let mut keep = n;
        for i in 0..n {
            if i == sorted_upto {
                // Sort the next chunk (256, then 4x larger each time) of the unsorted rest.
                let chunk = if sorted_upto == 0 {
                    256
                } else {
                    sorted_upto * 4
                }
                .min(n);
                let rest = &mut self.cand[sorted_upto..];
                let m = chunk - sorted_upto;
                if m < rest.len() {
                    rest.select_nth_unstable_by(m - 1, by_logit_desc);
                    rest[..m].sort_unstable_by(by_logit_desc);
                } else {
                    rest.sort_unstable_by(by_logit_desc);
                }
                sorted_upto = chunk;
            }
            cum += self.cand[i].p;
            if cum >= p {
                keep = i + 1;
                break;
            }
        }
        if keep == n && sorted_upto < n {
            self.cand[sorted_upto..].sort_unstable_by(by_logit_desc);
        }
        self.cand.truncate(keep);
    }

    /// llama.cpp's min-p: keep logits ≥ max + ln(p), i.e. probability ≥ p · p_max.
    fn min_p(&mut self, p: f32) {
        let max = self
            .cand
            .iter()
            .map(|c| c.logit)
            .fold(f32::NEG_INFINITY, f32::max);
        let threshold = max + p.ln();
        let best = self.cand.iter().copied().min_by(by_logit_desc);
        self.cand.retain(|c| c.logit >= threshold);
        if self.cand.is_empty() {
            // p > 1: llama.cpp keeps the single best.
            self.cand.extend(best);
        }
    }
}

/// Highest logit, lowest id among equals; NaN ignored. `None` for empty or all-NaN input.
fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if l <= b => {}
            _ => best = Some((i, l)),
        }
    }
    best.map(|(i, _)| i as u32)
}

/// llama.cpp's `softmax_impl`: f32 exponentials and f32 sum in array order.
fn softmax_f32(cand: &mut [Candidate]) {
    let max = cand
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for c in cand.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += c.p;
    }
    for c in cand.iter_mut() {
        c.p /= sum;
    }
}

/// llama.cpp's `dist` normalization: f32 exponentials, f64 sum. All logits -inf (every token
/// penalized away): uniform over the candidates rather than NaN.
fn softmax(cand: &mut [Candidate]) {
    let max = cand
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        let u = 1.0 / cand.len() as f32;
        cand.iter_mut().for_each(|c| c.p = u);
        return;
    }
    let mut sum = 0.0f64;
    for c in cand.iter_mut() {
        c.p = (c.logit - max).exp();
        sum += f64::from(c.p);
    }
    for c in cand.iter_mut() {
        c.p = (f64::from(c.p) / sum) as f32;
    }
}

/// The candidate where the running probability mass first reaches `r` ∈ [0, 1).
fn pick(cand: &[Candidate], r: f64) -> Option<u32> {
    let total: f64 = cand.iter().map(|c| f64::from(c.p)).sum();
    let target = r * total;
    let mut run = 0.0f64;
    for c in cand {
        run += f64::from(c.p);
        if run > target {
            return Some(c.id);
        }
    }
    cand.last().map(|c| c.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xoshiro_matches_reference_stream() {
        // Blackman & Vigna's xoshiro256** with state {1, 2, 3, 4}: the first outputs of the
        // reference C implementation.
        let mut r = Rng { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..10).map(|_| r.next_u64()).collect();
        let want = [
            11520,
            0,
            1509978240,
            1215971899390074240,
            1216172134540287360,
            607988272756665600,
            16172922978634559625,
            8476171486693032832,
            10595114339597558777,
            2904607092377533576,
        ];
        assert_eq!(got, want);
    }

    /// `sample_top_k` on the k best penalized logits (`Penalties::apply`, then `top_k_host`:
    /// what a device's `Backend::top_k` returns) draws the token `sample` draws from all of
    /// them, step after step (each pick accepted into the penalty window), for configs
    /// whose chain starts with that top-k; `top_k_only` says which those are.
    #[test]
    fn top_k_candidates_sample_as_the_full_logits() {
        let mut r = Rng::new(7);
        let cases = [
            (40, 0.95, 0.05, 0.8, 1.0, 0.0, 0.0),
            (1, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0),
            (5, 0.5, 0.0, 1.5, 1.1, 0.0, 0.0),
            (64, 1.0, 0.2, 0.3, 1.0, 0.3, 0.5),
            (3, 0.9, 0.0, 0.01, 1.3, 0.1, 0.0),
        ];
        for (i, (k, top_p, min_p, temp, rp, freq, pres)) in cases.into_iter().enumerate() {
            let cfg = SamplerConfig {
                top_k: k,
                top_p,
                min_p,
                temperature: temp,
                repeat_penalty: rp,
                frequency_penalty: freq,
                presence_penalty: pres,
                repeat_last_n: 16,
                seed: Some(i as u64),
            };
            assert_eq!(cfg.top_k_only(64), Some(k as usize));
            let (mut full, mut cand) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
            for step in 0..200 {
                // Logits in a narrow range with repeats (ties), both signs, a NaN now and
                // then; a few tokens favoured so that the window repeats them.
                let mut logits: Vec<f32> = (0..1000)
                    .map(|_| ((r.next_f64() * 40.0).floor() / 8.0 - 2.0) as f32)
                    .collect();
                for t in 0..8 {
                    logits[t * 37] += 3.0;
                }
                logits[step * 5 % 1000] = f32::NAN;
                let mut pen = logits.clone();
                cand.penalties().apply(&mut pen);
                let top = neagari_backend::top_k_host(&pen, k as usize);
                let (a, b) = (full.sample(&mut logits), cand.sample_top_k(&top));
                assert_eq!(a, b, "{i} {step}");
                full.accept(a);
                cand.accept(b);
            }
        }
        let greedy = SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        };
        assert_eq!(greedy.top_k_only(64), None);
        assert_eq!(SamplerConfig::default().top_k_only(16), None);
        let no_top_k = SamplerConfig {
            top_k: 0,
            ..SamplerConfig::default()
        };
        assert_eq!(no_top_k.top_k_only(64), None);
    }

    /// A chain without top-k that truncates (top-p, min-p or both): where the 64 best
    /// penalized logits and the row's softmax sums settle the draw (`settles`),
    /// `sample_candidates` draws the token `sample` draws from every logit; elsewhere
    /// `sample_penalized` of the penalized row does — step after step, each pick accepted.
    /// Rows of a peaked and of a flat kind, so that both happen; a 40-token vocabulary is
    /// whole among the 64 and always settles.
    #[test]
    fn candidates_settle_and_sample_as_the_full_logits() {
        let mut r = Rng::new(11);
        let cases = [
            (0.95, 0.0, 0.8, 1.0, 0.0),
            (0.5, 0.05, 1.2, 1.1, 0.2),
            (1.0, 0.05, 0.7, 1.0, 0.0),
            (1.0, 0.3, 1.0, 1.3, 0.0),
            (0.9, 2.0, 0.5, 1.0, 0.0),
        ];
        for (i, (top_p, min_p, temp, rp, freq)) in cases.into_iter().enumerate() {
            let cfg = SamplerConfig {
                top_k: if i % 2 == 0 { 0 } else { -1 },
                top_p,
                min_p,
                temperature: temp,
                repeat_penalty: rp,
                frequency_penalty: freq,
                presence_penalty: 0.0,
                repeat_last_n: 16,
                seed: Some(i as u64),
            };
            assert!(cfg.truncates_without_top_k() && cfg.top_k_only(64).is_none());
            let (mut full, mut cand) = (Sampler::new(cfg.clone()), Sampler::new(cfg));
            let (mut settled, mut whole) = (0, 0);
            for step in 0..300 {
                let n = if step % 10 == 9 { 40 } else { 3000 };
                // Flat rows on a grid (ties), or the same with 1–40 tokens raised by 4–10
                // (a model's peaked rows); a NaN now and then; a few tokens favoured so
                // that the window repeats them.
                let grid = |r: &mut Rng, w: f64| ((r.next_f64() * w * 8.0).floor() / 8.0) as f32;
                let mut logits: Vec<f32> = (0..n).map(|_| grid(&mut r, 4.0) - 4.0).collect();
                if step % 3 != 0 {
                    let m = 1 + (r.next_u64() % 40) as usize;
                    for _ in 0..m {
                        let t = (r.next_u64() % n as u64) as usize;
                        logits[t] += 4.0 + grid(&mut r, 6.0);
                    }
                }
                for t in 0..8 {
                    logits[t * 37 % n] += 1.0;
                }
                logits[step * 5 % n] = f32::NAN;
                let mut pen = logits.clone();
                cand.penalties().apply(&mut pen);
                let top = neagari_backend::top_k_host(&pen, 64);
                let (max, sum) = neagari_backend::softmax_sum_host(&pen);
                let b = if cand.settles(&top, 64, max, sum) {
                    settled += 1;
                    cand.sample_candidates(&top, 64, max, sum)
                } else {
                    whole += 1;
                    cand.sample_penalized(&pen)
                };
                let a = full.sample(&mut logits);
                assert_eq!(a, b, "case {i} step {step}");
                full.accept(a);
                cand.accept(b);
                if n == 40 {
                    assert!(cand.settles(&top, 64, max, sum), "case {i} step {step}");
                }
            }
            eprintln!("case {i}: {settled} settled, {whole} whole rows");
            assert!(settled >= 30, "case {i}: {settled} settled");
            if min_p < 1.0 {
                assert!(whole >= 10, "case {i}: {whole} whole rows");
            }
        }
        // A row of NaN, or sums that are not finite: the row decides.
        let s = Sampler::new(SamplerConfig {
            top_k: 0,
            ..SamplerConfig::default()
        });
        assert!(!s.settles(&[], 64, f32::NEG_INFINITY, 0.0));
        assert!(!s.settles(&[(3, 1.0)], 64, f32::INFINITY, f32::NAN));
    }

    #[test]
    fn seeding_is_splitmix64() {
        // splitmix64's published first output from state 0.
        assert_eq!(Rng::new(0).s[0], 0xe220_a839_7b1d_cdaf);
    }
}
