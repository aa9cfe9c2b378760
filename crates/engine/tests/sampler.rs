//! The sampler against llama.cpp: its chain run through llama-cpp-python
//! (tests/fixtures/sampler_chains.json, scripts/sampler_reference.py) and the expected values
//! of its tests/test-sampling.cpp; plus statistical and determinism checks of the draw.

use std::collections::HashMap;
use std::path::PathBuf;

use neagari_engine::sampler::{Sampler, SamplerConfig};
use serde_json::Value;

/// Every stage off: temperature 1, no top-k/top-p/min-p, no penalties.
fn neutral() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        seed: Some(7),
    }
}

fn ln(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

/// test-sampling.cpp's check: the surviving candidates, in llama.cpp's order, with |Δp| < 1e-5.
/// Our order is by probability, so compare the multiset of probabilities sorted.
fn assert_probs(got: &[(u32, f32)], want: &[f32], what: &str) {
    let mut g: Vec<f32> = got.iter().map(|c| c.1).collect();
    let mut w = want.to_vec();
    g.sort_by(|a, b| b.total_cmp(a));
    w.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(g.len(), w.len(), "{what}: got {got:?}, want {want:?}");
    for (a, b) in g.iter().zip(&w) {
        assert!((a - b).abs() < 1e-5, "{what}: got {got:?}, want {want:?}");
    }
}

#[test]
fn llama_cpp_test_sampling_cases() {
    let p4 = [0.1f32, 0.2, 0.3, 0.4];
    let run = |cfg: SamplerConfig, probs: &[f32]| Sampler::new(cfg).probs(&ln(probs));

    // test_temp
    assert_probs(&run(neutral(), &p4), &[0.1, 0.2, 0.3, 0.4], "temp 1");
    assert_probs(
        &run(
            SamplerConfig {
                temperature: 0.0,
                ..neutral()
            },
            &p4,
        ),
        &[1.0],
        "temp 0",
    );

    // test_top_k
    for (k, want) in [
        (1, &[1.0f32][..]),
        (3, &[0.44444, 0.33333, 0.22222][..]),
        (4, &[0.4, 0.3, 0.2, 0.1][..]),
        (0, &[0.1, 0.2, 0.3, 0.4][..]),
    ] {
        assert_probs(
            &run(
                SamplerConfig {
                    top_k: k,
                    ..neutral()
                },
                &p4,
            ),
            want,
            &format!("top_k {k}"),
        );
    }

    // test_top_p
    for (p, want) in [
        (0.0, &[1.0f32][..]),
        (0.7, &[0.571429, 0.428571][..]),
        (0.8, &[0.44444, 0.33333, 0.22222][..]),
        (1.0, &[0.1, 0.2, 0.3, 0.4][..]),
    ] {
        assert_probs(
            &run(
                SamplerConfig {
                    top_p: p,
                    ..neutral()
                },
                &p4,
            ),
            want,
            &format!("top_p {p}"),
        );
    }

    // test_min_p
    for (p, want) in [
        (0.00, vec![0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0]),
        (0.24, vec![0.1 / 1.0, 0.2 / 1.0, 0.3 / 1.0, 0.4 / 1.0]),
        (0.26, vec![0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.49, vec![0.2 / 0.9, 0.3 / 0.9, 0.4 / 0.9]),
        (0.51, vec![0.3 / 0.7, 0.4 / 0.7]),
        (0.74, vec![0.3 / 0.7, 0.4 / 0.7]),
        (0.76, vec![0.4 / 0.4]),
        (1.00, vec![0.4 / 0.4]),
        (1.05, vec![0.4 / 0.4]),
    ] {
        assert_probs(
            &run(
                SamplerConfig {
                    min_p: p,
                    ..neutral()
                },
                &p4,
            ),
            &want,
            &format!("min_p {p}"),
        );
    }

    // test_penalties: (history, expected by token id, repeat, frequency, presence)
    type PenaltyCase<'a> = (&'a [u32], [f32; 5], f32, f32, f32);
    let p5 = [0.2f32; 5];
    let cases: [PenaltyCase; 6] = [
        (&[0], [0.0, 0.25, 0.25, 0.25, 0.25], 50.0, 0.0, 0.0),
        (&[0, 1, 2], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (&[0, 1, 2, 0, 0], [0.0, 0.0, 0.0, 0.5, 0.5], 50.0, 0.0, 0.0),
        (
            &[0],
            [0.000011, 0.249997, 0.249997, 0.249997, 0.249997],
            1.0,
            5.0,
            5.0,
        ),
        (
            &[0, 1, 2],
            [0.000023, 0.000023, 0.000023, 0.499966, 0.499966],
            1.0,
            5.0,
            5.0,
        ),
        (
            &[0, 1, 2, 0, 0],
            [0.0, 0.000023, 0.000023, 0.499977, 0.499977],
            1.0,
            5.0,
            5.0,
        ),
    ];
    for (history, want, repeat, freq, presence) in cases {
        let cfg = SamplerConfig {
            repeat_penalty: repeat,
            frequency_penalty: freq,
            presence_penalty: presence,
            repeat_last_n: history.len() as i32,
            ..neutral()
        };
        let mut s = Sampler::new(cfg);
        for &t in history {
            s.accept(t);
        }
        let got: HashMap<u32, f32> = s.probs(&ln(&p5)).into_iter().collect();
        assert_eq!(got.len(), 5, "penalties keep every candidate");
        for (id, w) in want.iter().enumerate() {
            let g = got[&(id as u32)];
            assert!(
                (g - w).abs() < 1e-5,
                "penalties {history:?}: token {id} got {g}, want {w}"
            );
        }
    }
}

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sampler_chains.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture present")).expect("JSON")
}

fn config_of(c: &Value) -> SamplerConfig {
    let f = |k: &str| c[k].as_f64().unwrap() as f32;
    SamplerConfig {
        temperature: f("temperature"),
        top_k: c["top_k"].as_i64().unwrap() as i32,
        top_p: f("top_p"),
        min_p: f("min_p"),
        repeat_penalty: f("repeat_penalty"),
        repeat_last_n: c["repeat_last_n"].as_i64().unwrap() as i32,
        presence_penalty: f("presence_penalty"),
        frequency_penalty: f("frequency_penalty"),
        seed: Some(1),
    }
}

#[test]
fn chains_match_llama_cpp() {
    let doc = fixture();
    let cases = doc["cases"].as_array().unwrap();
    for (n, case) in cases.iter().enumerate() {
        let cfg = config_of(&case["config"]);
        let logits: Vec<f32> = case["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut s = Sampler::new(cfg.clone());
        for t in case["history"].as_array().unwrap() {
            s.accept(t.as_u64().unwrap() as u32);
        }
        let got: HashMap<u32, f32> = s.probs(&logits).into_iter().collect();
        let want: Vec<(u32, f32)> = case["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c[0].as_u64().unwrap() as u32, c[1].as_f64().unwrap() as f32))
            .collect();
        let what = format!("case {n} (vocab {}, {cfg:?})", logits.len());
        // llama.cpp's greedy keeps the losers with p = 0; we drop them.
        let live: Vec<&(u32, f32)> = want.iter().filter(|c| c.1 > 0.0).collect();
        assert_eq!(got.len(), live.len(), "{what}: candidate count");
        for (id, p) in live {
            let g = got
                .get(id)
                .unwrap_or_else(|| panic!("{what}: token {id} missing"));
            assert!(
                (g - p).abs() < 2e-6 + 1e-4 * p,
                "{what}: token {id} p {g} vs {p}"
            );
        }
    }
}

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut seed = 12345u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 20.0 - 10.0
    };
    for n in [1usize, 2, 17, 1000, 262_144] {
        let mut logits: Vec<f32> = (0..n).map(|_| next()).collect();
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let first = logits.iter().position(|&l| l == max).unwrap();
        let mut s = Sampler::new(SamplerConfig {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(s.sample(&mut logits) as usize, first, "n={n}");
        // A tie at a higher id does not win; one at a lower id does.
        if n > 2 {
            logits[n - 1] = max;
            assert_eq!(s.sample(&mut logits) as usize, first);
            if first > 0 {
                logits[0] = max;
                assert_eq!(s.sample(&mut logits), 0);
            }
        }
    }
    // NaN never wins.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    });
    assert_eq!(s.sample(&mut [f32::NAN, 1.0, 0.5]), 1);
}

#[test]
fn top_k_on_a_gemma_sized_vocab_keeps_exactly_the_k_best() {
    let n = 262_144;
    let mut seed = 99u64;
    let logits: Vec<f32> = (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % 1_000_000) as f32 / 50_000.0
        })
        .collect();
    for k in [1, 40, 1000, 5000] {
        let cfg = SamplerConfig {
            top_k: k,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..neutral()
        };
        let got: Vec<u32> = Sampler::new(cfg)
            .probs(&logits)
            .iter()
            .map(|c| c.0)
            .collect();
        // Reference: a full sort by (logit desc, id asc).
        let mut ids: Vec<u32> = (0..n as u32).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        ids.truncate(k as usize);
        assert_eq!(got, ids, "k={k}");
    }
}

/// Pearson's chi-square of draws against the distribution `probs()` reports.
fn chi_square(cfg: SamplerConfig, logits: &[f32], draws: usize) -> (f64, usize) {
    let mut s = Sampler::new(cfg);
    let dist = s.probs(logits);
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for _ in 0..draws {
        let mut l = logits.to_vec();
        *counts.entry(s.sample(&mut l)).or_default() += 1;
    }
    assert!(
        counts.keys().all(|id| dist.iter().any(|c| c.0 == *id)),
        "drew outside the support"
    );
    let chi2 = dist
        .iter()
        .map(|&(id, p)| {
            let e = p as f64 * draws as f64;
            let o = *counts.get(&id).unwrap_or(&0) as f64;
            (o - e) * (o - e) / e
        })
        .sum();
    (chi2, dist.len() - 1)
}

#[test]
fn draws_follow_the_reported_distribution() {
    let logits = [1.0f32, 0.5, 2.0, -1.0, 0.0, 1.5, -0.5, 0.25];
    // χ² critical values at p = 0.001 for 7 and 3 degrees of freedom.
    let (chi2, df) = chi_square(neutral(), &logits, 200_000);
    assert_eq!(df, 7);
    assert!(chi2 < 24.322, "chi2 {chi2} with {df} dof");

    let cfg = SamplerConfig {
        top_k: 4,
        temperature: 0.7,
        ..neutral()
    };
    let (chi2, df) = chi_square(cfg, &logits, 200_000);
    assert_eq!(df, 3);
    assert!(chi2 < 16.266, "chi2 {chi2} with {df} dof");

    // A biased draw is caught: counting against a distribution it does not follow fails.
    let mut s = Sampler::new(neutral());
    let dist = s.probs(&logits);
    let skewed: Vec<(u32, f32)> = dist
        .iter()
        .map(|&(id, p)| (id, if id == 2 { p * 1.1 } else { p }))
        .collect();
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for _ in 0..200_000 {
        *counts.entry(s.draw(&skewed).unwrap()).or_default() += 1;
    }
    let chi2: f64 = dist
        .iter()
        .map(|&(id, p)| {
            let e = p as f64 * 200_000.0;
            let o = counts[&id] as f64;
            (o - e) * (o - e) / e
        })
        .sum();
    assert!(chi2 > 24.322, "a 10% bias went unnoticed (chi2 {chi2})");
}

#[test]
fn seeded_sampling_is_deterministic() {
    let logits: Vec<f32> = (0..500).map(|i| ((i * 37 % 101) as f32) / 25.0).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplerConfig {
            seed: Some(seed),
            repeat_penalty: 1.1,
            ..Default::default()
        });
        (0..200)
            .map(|_| {
                let mut l = logits.clone();
                let t = s.sample(&mut l);
                s.accept(t);
                t
            })
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(42), run(42));
    assert_ne!(run(42), run(43));
    // More than one token is drawn: the sequence is not trivially constant.
    let a = run(42);
    assert!(a.iter().any(|&t| t != a[0]));
}

#[test]
fn penalty_window_forgets_old_tokens() {
    // With a window of 2, a token accepted three steps ago is no longer penalized.
    let logits = ln(&[0.25, 0.25, 0.25, 0.25]);
    let cfg = SamplerConfig {
        repeat_penalty: 50.0,
        repeat_last_n: 2,
        ..neutral()
    };
    let mut s = Sampler::new(cfg);
    for t in [0, 1, 2] {
        s.accept(t);
    }
    let got: HashMap<u32, f32> = s.probs(&logits).into_iter().collect();
    assert!((got[&0] - got[&3]).abs() < 1e-6, "{got:?}");
    assert!(got[&1] < 1e-6 && got[&2] < 1e-6, "{got:?}");
    // probs() leaves its input alone; sample() penalizes in place.
    let mut l = logits.clone();
    s.sample(&mut l);
    assert_eq!(l[0], logits[0]);
    assert!(l[1] < logits[1]);
}

#[test]
fn defaults_are_llama_cpp_defaults() {
    let d = SamplerConfig::default();
    assert_eq!(
        (
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            d.repeat_penalty,
            d.repeat_last_n
        ),
        (0.8, 40, 0.95, 0.05, 1.0, 64)
    );
    assert_eq!((d.presence_penalty, d.frequency_penalty), (0.0, 0.0));
}

#[test]
fn empty_and_degenerate_inputs_do_not_panic() {
    let mut s = Sampler::new(SamplerConfig::default());
    assert_eq!(s.sample(&mut []), 0);
    assert!(s.probs(&[]).is_empty());
    let mut all_inf = [f32::NEG_INFINITY; 3];
    let t = s.sample(&mut all_inf);
    assert!(t < 3);
    assert_eq!(s.draw(&[]), None);
    assert_eq!(s.draw(&[(3, 0.0)]), None);
}
