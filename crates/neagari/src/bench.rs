//! `neagari bench`: prefill and decode throughput like llama-bench (pp = a batch of
//! random tokens from an empty cache, tg = single-token steps), peak memory, and bytes read
//! per decoded token as a share of this machine's measured read bandwidth.

use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::load::{DeviceBackend, Loaded};
use neagari_engine::sampler::{Sampler, SamplerConfig};

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    /// Prompt tokens for the prefill test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens for the decode test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Decode test at depth: prefill this many random tokens first (untimed, once), then
    /// time the generated tokens on top of them, each repetition from the same depth
    /// (llama-bench's `-d`).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Skip the memory-bandwidth measurement.
    #[arg(long)]
    pub no_bandwidth: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Decode test: take the greedy pick on the device (only the token id comes back)
    /// instead of reading the logits back each step.
    #[arg(long)]
    pub argmax: bool,
    /// Decode test: bring back the K best logits each step (top-k sampling's candidates,
    /// what `run` and `serve` ask for under a top-k chain of K ≤ 64) instead of all of them.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_k: usize,
    /// Decode test: also draw a token each step with llama.cpp's default chain (top-k 40,
    /// top-p 0.95, min-p 0.05, temperature 0.8; seeded), as `run` does: from the logits,
    /// or with `--top-k` from the K best (the sampler's top-k set to K). The inputs stay
    /// the teacher-forced random tokens.
    #[arg(long)]
    pub sample: bool,
    /// Also time an N-token forward (speculative verification: N rows through the decode
    /// kernels) against a one-token step at the same position (0 skips it).
    #[arg(long, default_value_t = 0)]
    pub verify: usize,
    /// Time each GPU kernel of one greedy decode step (and of one `--verify` step) after
    /// 64 tokens and print where the step's time goes.
    #[arg(long)]
    pub profile: bool,
}

#[derive(Serialize)]
struct Report {
    model: String,
    file_bytes: u64,
    backend: String,
    threads: usize,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    reps: usize,
    pp_tok_s: Option<f64>,
    pp_tok_s_sd: Option<f64>,
    tg_tok_s: Option<f64>,
    tg_tok_s_sd: Option<f64>,
    peak_rss_bytes: u64,
    decode_bytes_per_token: usize,
    read_bandwidth_bytes_s: Option<f64>,
    bandwidth_share: Option<f64>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, var.sqrt())
}

/// Deterministic pseudo-random tokens (llama-bench also feeds random ids).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

pub fn run(args: &BenchArgs) -> Result<()> {
    crate::on_device!(args.model, false, run_on, args)
}

fn run_on<B: DeviceBackend>(l: Loaded<B>, args: &BenchArgs) -> Result<()> {
    let info = l.model.info().clone();
    let n_ctx = (args.n_prompt.max(args.depth) + args.n_gen + 1).max(16);
    let vocab = info.n_vocab;
    let reps = args.reps.max(1);
    let bos = l.tokenizer.bos().unwrap_or(0);

    let mut pp = Vec::new();
    let mut tg = Vec::new();
    // One warm-up of each so page faults and lazy tables are not timed.
    let mut sess = l.session(n_ctx)?;
    if args.n_prompt > 0 {
        let toks = random_tokens(args.n_prompt.min(32), vocab, 1);
        sess.prefill(l.model.as_ref(), &l.be, &toks, l.n_batch, |_, _| true)?;
    }
    // Decode at depth: one untimed prefill (again after a prefill test replaced it); each
    // repetition then returns to its checkpoint (a hybrid model's recurrent state cannot
    // be truncated back).
    let mut at_depth = None;
    for r in 0..reps {
        if args.n_prompt > 0 {
            let mut toks = random_tokens(args.n_prompt, vocab, 100 + r as u64);
            toks[0] = bos;
            sess.truncate(&l.be, 0)?;
            at_depth = None;
            let t = Instant::now();
            sess.prefill(l.model.as_ref(), &l.be, &toks, l.n_batch, |_, _| true)?;
            l.be.sync()?;
            pp.push(args.n_prompt as f64 / t.elapsed().as_secs_f64());
        }
        if args.n_gen > 0 {
            let toks = random_tokens(args.n_gen, vocab, 200 + r as u64);
            if args.depth == 0 {
                sess.truncate(&l.be, 0)?;
            } else if let Some(cp) = &at_depth {
                sess.restore(&l.be, cp)?;
            } else {
                let mut ctx = random_tokens(args.depth, vocab, 300);
                ctx[0] = bos;
                sess.truncate(&l.be, 0)?;
                sess.prefill(l.model.as_ref(), &l.be, &ctx, l.n_batch, |_, _| true)?;
                at_depth = Some(sess.checkpoint(&l.be)?);
            }
            let t = Instant::now();
            // Teacher-forced random tokens; `--argmax` brings back the greedy pick instead
            // of the logits.
            let first = if args.depth > 0 { toks[0] } else { bos };
            let mut sampler = Sampler::new(SamplerConfig {
                top_k: if args.top_k > 0 {
                    args.top_k as i32
                } else {
                    40
                },
                seed: Some(r as u64),
                ..SamplerConfig::default()
            });
            let mut drawn = 0u64;
            for &tok in std::iter::once(&first).chain(&toks[1..]) {
                if args.argmax {
                    sess.decode_greedy(l.model.as_ref(), &l.be, tok)?;
                } else if args.top_k > 0 {
                    let pen = sampler.penalties();
                    let top = sess.decode_top_k(l.model.as_ref(), &l.be, tok, args.top_k, &pen)?;
                    if args.sample {
                        drawn += u64::from(sampler.sample_top_k(&top));
                    }
                } else {
                    let mut logits = sess.decode(l.model.as_ref(), &l.be, tok)?;
                    if args.sample {
                        drawn += u64::from(sampler.sample(&mut logits));
                    }
                }
            }
            std::hint::black_box(drawn);
            l.be.sync()?;
            tg.push(args.n_gen as f64 / t.elapsed().as_secs_f64());
        }
    }
    if args.verify > 0 {
        let v = time_verify(&l, args.verify, vocab, reps)?;
        let n = args.verify;
        println!(
            "verify{n}: {n}-token forward {:.3} ms, one-token step {:.3} ms, ratio {:.2}",
            v.fwd * 1e3,
            v.step * 1e3,
            v.fwd / v.step
        );
        println!(
            "verify{n} greedy (a decode step of {n} tokens, every row's pick): {:.3} ms, \
             one-token greedy step {:.3} ms, ratio {:.2}",
            v.fwd_greedy * 1e3,
            v.step_greedy * 1e3,
            v.fwd_greedy / v.step_greedy
        );
    }
    if args.profile {
        profile_steps(&l, args.verify, vocab)?;
    }
    let peak = crate::load::peak_rss_bytes();
    let bw = if args.no_bandwidth {
        None
    } else {
        Some(l.be.read_bandwidth()?)
    };
    let pp_s = (!pp.is_empty()).then(|| mean_sd(&pp));
    let tg_s = (!tg.is_empty()).then(|| mean_sd(&tg));
    let share = match (bw, tg_s) {
        (Some(bw), Some((tg, _))) => Some(info.decode_bytes as f64 * tg / bw),
        _ => None,
    };
    let rep = Report {
        model: info.name.clone(),
        file_bytes: l.file_bytes,
        backend: l.be.name(),
        threads: l.be.threads(),
        n_prompt: args.n_prompt,
        n_gen: args.n_gen,
        depth: args.depth,
        reps,
        pp_tok_s: pp_s.map(|x| x.0),
        pp_tok_s_sd: pp_s.map(|x| x.1),
        tg_tok_s: tg_s.map(|x| x.0),
        tg_tok_s_sd: tg_s.map(|x| x.1),
        peak_rss_bytes: peak,
        decode_bytes_per_token: info.decode_bytes,
        read_bandwidth_bytes_s: bw,
        bandwidth_share: share,
    };
    if args.json {
        println!("{}", serde_json::to_string(&rep)?);
        return Ok(());
    }
    println!("| model | size | backend | test | t/s |");
    println!("| --- | ---: | --- | --- | ---: |");
    let size = format!("{:.2} MiB", l.file_bytes as f64 / (1u64 << 20) as f64);
    if let Some((m, sd)) = pp_s {
        println!(
            "| {} | {size} | {} | pp{} | {m:.2} ± {sd:.2} |",
            info.name, rep.backend, args.n_prompt
        );
    }
    if let Some((m, sd)) = tg_s {
        println!(
            "| {} | {size} | {} | tg{}{} | {m:.2} ± {sd:.2} |",
            info.name,
            rep.backend,
            args.n_gen,
            if args.depth > 0 {
                format!(" @ d{}", args.depth)
            } else {
                String::new()
            }
        );
    }
    println!();
    println!("peak RSS: {:.1} MiB", peak as f64 / (1u64 << 20) as f64);
    println!(
        "weight bytes read per decoded token: {:.1} MiB",
        info.decode_bytes as f64 / (1u64 << 20) as f64
    );
    if let Some(bw) = bw {
        if l.be.threads() > 0 {
            println!(
                "measured read bandwidth ({} threads): {:.1} GB/s",
                l.be.threads(),
                bw / 1e9
            );
        } else {
            println!(
                "measured device copy bandwidth (read + write): {:.1} GB/s",
                bw / 1e9
            );
        }
    }
    if let Some(s) = share {
        println!("decode uses {:.0}% of it", s * 100.0);
    }
    Ok(())
}

/// Medians of `time_verify` (seconds).
struct Verify {
    /// An `n`-token forward as a prefill (last row's logits read back).
    fwd: f64,
    /// A one-token decode step (logits read back).
    step: f64,
    /// `Session::verify_greedy` of `n` tokens (one decode step, every row's greedy pick).
    fwd_greedy: f64,
    /// A one-token `decode_greedy` step.
    step_greedy: f64,
}

/// Medians of an `n`-token forward and of a one-token decode step at the same position
/// after 64 tokens, each from a checkpoint it is restored to (so hybrid caches work): the
/// forward as a prefill (last row's logits back) and as `verify_greedy` (a recorded step,
/// every row's pick back), the step with its logits and with the greedy pick; four untimed
/// rounds first (recorded steps warm up, then are captured).
fn time_verify<B: DeviceBackend>(
    l: &Loaded<B>,
    n: usize,
    vocab: usize,
    reps: usize,
) -> Result<Verify> {
    let mut sess = l.session(64 + n + 1)?;
    let toks = random_tokens(64 + n, vocab, 300);
    sess.prefill(l.model.as_ref(), &l.be, &toks[..64], l.n_batch, |_, _| true)?;
    let cp = sess.checkpoint(&l.be)?;
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let m = l.model.as_ref();
    for round in 0..reps.max(3) * 4 + 4 {
        let mut times = [0f64; 4];
        for (i, time) in times.iter_mut().enumerate() {
            let start = Instant::now();
            match i {
                0 => {
                    sess.prefill(m, &l.be, &toks[64..64 + n], l.n_batch.max(n), |_, _| true)?;
                }
                1 => {
                    sess.decode(m, &l.be, toks[64])?;
                }
                2 => {
                    sess.verify_greedy(m, &l.be, &toks[64..64 + n])?;
                }
                _ => {
                    sess.decode_greedy(m, &l.be, toks[64])?;
                }
            }
            l.be.sync()?;
            *time = start.elapsed().as_secs_f64();
            sess.restore(&l.be, &cp)?;
        }
        if round >= 4 {
            for (v, x) in t.iter_mut().zip(times) {
                v.push(x);
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    Ok(Verify {
        fwd: median(&mut t[0]),
        step: median(&mut t[1]),
        fwd_greedy: median(&mut t[2]),
        step_greedy: median(&mut t[3]),
    })
}

/// Prints the kernel times of one greedy decode step and, with `verify` > 0, of one
/// `verify`-token greedy step, after 64 tokens (graphs off: every kernel is timed alone).
fn profile_steps<B: DeviceBackend>(l: &Loaded<B>, verify: usize, vocab: usize) -> Result<()> {
    let m = l.model.as_ref();
    let mut sess = l.session(64 + verify.max(1) + 1)?;
    let toks = random_tokens(64 + verify.max(1), vocab, 400);
    sess.prefill(m, &l.be, &toks[..64], l.n_batch, |_, _| true)?;
    let cp = sess.checkpoint(&l.be)?;
    let mut steps = vec![(1, "decode step")];
    if verify > 0 {
        steps.push((verify, "verify step"));
    }
    for (n, what) in steps {
        // One untimed run first, so lazily made buffers and kernels are not in the figure.
        for timed in [false, true] {
            if timed && !l.be.profile_begin()? {
                println!("profile: this backend has no per-kernel timing");
                return Ok(());
            }
            let t = Instant::now();
            if n == 1 {
                sess.decode_greedy(m, &l.be, toks[64])?;
            } else {
                sess.verify_greedy(m, &l.be, &toks[64..64 + n])?;
            }
            l.be.sync()?;
            let wall = t.elapsed().as_secs_f64();
            sess.restore(&l.be, &cp)?;
            if timed {
                print_profile(&format!("{what}, {n} token(s)"), &l.be.profile_end()?, wall);
            }
        }
    }
    Ok(())
}

fn print_profile(what: &str, rows: &[crate::load::KernelRow], wall: f64) {
    let total: f64 = rows.iter().map(|r| r.seconds).sum();
    let launches: usize = rows.iter().map(|r| r.launches).sum();
    println!(
        "\nprofile, {what}: {:.3} ms in {launches} kernels ({:.3} ms wall with a timed launch each)",
        total * 1e3,
        wall * 1e3
    );
    println!("| kernel | grid | launches | µs each | ms | share |");
    println!("| --- | --- | ---: | ---: | ---: | ---: |");
    let shown = 30;
    for r in rows.iter().take(shown) {
        println!(
            "| {} | {} | {} | {:.2} | {:.3} | {:.1}% |",
            r.name,
            r.grid,
            r.launches,
            r.seconds * 1e6 / r.launches.max(1) as f64,
            r.seconds * 1e3,
            r.seconds / total.max(1e-12) * 100.0
        );
    }
    if rows.len() > shown {
        let rest: f64 = rows[shown..].iter().map(|r| r.seconds).sum();
        println!(
            "| {} others | | | | {:.3} | {:.1}% |",
            rows.len() - shown,
            rest * 1e3,
            rest / total.max(1e-12) * 100.0
        );
    }
}

/// Streams a 512 MiB buffer with every thread of the pool and returns bytes per second
/// (best of three passes).
pub(crate) fn measure_read_bandwidth(be: &neagari_backend::cpu::CpuBackend) -> f64 {
    const BYTES: usize = 512 << 20;
    let buf: Vec<f32> = vec![1.0; BYTES / 4];
    let threads = be.threads();
    let per = buf.len() / threads;
    let mut best: f64 = 0.0;
    for _ in 0..3 {
        let t = Instant::now();
        let sums: Vec<std::sync::atomic::AtomicU32> =
            (0..threads).map(|_| Default::default()).collect();
        be.pool().run(threads, |i| {
            let s = neagari_backend::cpu::simd::dot(
                &buf[i * per..(i + 1) * per],
                &buf[i * per..(i + 1) * per],
            );
            sums[i].store(s.to_bits(), std::sync::atomic::Ordering::Relaxed);
        });
        best = best.max((per * threads * 4) as f64 / t.elapsed().as_secs_f64());
    }
    best
}
