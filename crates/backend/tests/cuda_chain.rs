//! The decode chain (cuda/chain.rs, kernels/chain.cu; NEAGARI_CUDA_CHAIN=1) on the GPU: a
//! hybrid layer's one-token ops recorded inside a decode step and run as one persistent
//! launch give what the separate kernels give on the same inputs, in a warm step, the step
//! captured into a CUDA graph and its replay; its GEMVs hold to the q8_1-rounded product;
//! an op the chain does not take (a Q8_0 matrix) ends it and reads what it wrote.
//!
//! Runs only where a CUDA GPU of sm_90 or newer is usable; elsewhere (CI) it prints why and
//! passes.
#![cfg(feature = "cuda")]

mod cuda_common;
use cuda_common::{check_q8, download, gpu, random_mat, randv, rel, rng};

use neagari_backend::cuda::CudaBackend;
use neagari_backend::{Backend, GluAct, HostTensor, KvShape, KvType};
use neagari_quant::GgmlType;

fn vector(be: &CudaBackend, v: &[f32]) -> <CudaBackend as Backend>::Vector {
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    be.load_vector(&cuda_common::tensor(
        "w",
        GgmlType::F32,
        vec![v.len()],
        bytes,
    ))
    .unwrap()
}

/// What one layer's ops leave, read back in this order.
const NAMES: [&str; 13] = [
    "x", "xn", "g", "u", "o2", "xn2", "qa", "qb", "qc", "p", "xf", "head", "o",
];

struct Layer {
    out: HostTensor,
    gate: HostTensor,
    up: HostTensor,
    down: HostTensor,
    a: HostTensor,
    b: HostTensor,
    c: HostTensor,
    q8: HostTensor,
    /// Dequantized `a` (for the q8_1 product).
    a_deq: Vec<f32>,
    g1: Vec<f32>,
    g2: Vec<f32>,
}

type Mat = <CudaBackend as Backend>::Mat;
type Buf = <CudaBackend as Backend>::Buf;

/// A layer on one backend: its weights, and the step's input buffers (allocated once, so a
/// recorded step's addresses stay valid).
struct Dev {
    m: [Mat; 8],
    g1: <CudaBackend as Backend>::Vector,
    g2: <CudaBackend as Backend>::Vector,
    x: Buf,
    core: Buf,
}

fn dev(be: &CudaBackend, l: &Layer, h: usize, f2: usize) -> Dev {
    let m = |t: &HostTensor| be.load_mat(t).unwrap();
    Dev {
        m: [
            m(&l.out),
            m(&l.gate),
            m(&l.up),
            m(&l.down),
            m(&l.a),
            m(&l.b),
            m(&l.c),
            m(&l.q8),
        ],
        g1: vector(be, &l.g1),
        g2: vector(be, &l.g2),
        x: be.buf(1, h).unwrap(),
        core: be.buf(1, f2).unwrap(),
    }
}

/// A hybrid layer's decode ops (out-proj, norm, GLU, down, norm, the next in-proj), then a
/// Q8_0 GEMV (not chained) whose output goes back into the chain, a last add and norm and a
/// GEMV of that. Inside a step when `kv` is given; returns the outputs of `NAMES`.
fn run(
    be: &CudaBackend,
    d: &mut Dev,
    x0: &[f32],
    core: &[f32],
    kv: Option<&<CudaBackend as Backend>::Kv>,
) -> Vec<Vec<f32>> {
    let h = x0.len();
    be.write(&mut d.x, x0, 1, h).unwrap();
    be.write(&mut d.core, core, 1, core.len()).unwrap();
    if let Some(kv) = kv {
        be.step_begin(kv, &[1]).unwrap();
    }
    let [wo, wg, wu, wd, wa, wb, wc, wq] = &d.m;
    let x = &mut d.x;
    let b = |n: usize| be.buf(1, n).unwrap();
    let (mut o, mut xn, mut g, mut u, mut o2, mut xn2) = (b(h), b(h), b(1), b(1), b(h), b(h));
    let (mut qa, mut qb, mut qc, mut p, mut xf, mut head) = (b(1), b(1), b(1), b(h), b(h), b(1));
    be.matmul(wo, &d.core, &mut o).unwrap();
    be.add_rms_norm(x, &o, &d.g1, 1e-6, &mut xn).unwrap();
    be.matmul_glu(wg, wu, &xn, GluAct::Silu, &mut g, &mut u)
        .unwrap();
    be.matmul(wd, &g, &mut o2).unwrap();
    be.add_rms_norm(x, &o2, &d.g2, 1e-6, &mut xn2).unwrap();
    be.matmul_multi(&[wa, wb, wc], &xn2, &mut [&mut qa, &mut qb, &mut qc])
        .unwrap();
    be.matmul(wq, &xn2, &mut p).unwrap();
    be.add(x, &p).unwrap();
    be.rms_norm(x, &d.g1, 1e-6, &mut xf).unwrap();
    be.matmul(wa, &xf, &mut head).unwrap();
    let out: Vec<Vec<f32>> = [
        &*x, &xn, &g, &u, &o2, &xn2, &qa, &qb, &qc, &p, &xf, &head, &o,
    ]
    .iter()
    .map(|b| download(be, b))
    .collect();
    if kv.is_some() {
        be.step_end();
    }
    out
}

/// Each op of `run` by the separate kernels (`be`, no chain), fed what the chain's run left
/// (`got`, in NAMES order) as its inputs, so an op that is right differs from the chain's
/// only by the order of its sums (the same inputs, the same q8_1 codes). Held to the
/// separate kernels' own run instead, the two drift apart by design: their sums differ in
/// the last bit, and a value that sits at a rounding edge of its q8_1 code then takes the
/// other code in the next GEMV, which moves that GEMV by ~1e-4 and everything after it
/// (session 33: the 27B shapes did so in a third of the steps).
fn reference(
    be: &CudaBackend,
    d: &Dev,
    x0: &[f32],
    core: &[f32],
    got: &[Vec<f32>],
) -> Vec<Vec<f32>> {
    let h = x0.len();
    let get = |name: &str| &got[NAMES.iter().position(|n| *n == name).unwrap()];
    let up = |v: &[f32]| {
        let mut b = be.buf(1, v.len()).unwrap();
        be.write(&mut b, v, 1, v.len()).unwrap();
        b
    };
    let b = |n: usize| be.buf(1, n).unwrap();
    let [wo, wg, wu, wd, wa, wb, wc, wq] = &d.m;
    let (mut o, mut xn, mut g, mut u, mut o2, mut xn2) = (b(h), b(h), b(1), b(1), b(h), b(h));
    let (mut qa, mut qb, mut qc, mut p, mut xf, mut head) = (b(1), b(1), b(1), b(h), b(h), b(1));
    be.matmul(wo, &up(core), &mut o).unwrap();
    // x: x0 + o + o2 + p, each add on what the chain gave.
    let mut x = up(x0);
    be.add_rms_norm(&mut x, &up(get("o")), &d.g1, 1e-6, &mut xn)
        .unwrap();
    be.matmul_glu(wg, wu, &up(get("xn")), GluAct::Silu, &mut g, &mut u)
        .unwrap();
    be.matmul(wd, &up(get("g")), &mut o2).unwrap();
    be.add_rms_norm(&mut x, &up(get("o2")), &d.g2, 1e-6, &mut xn2)
        .unwrap();
    let xn2_in = up(get("xn2"));
    be.matmul_multi(&[wa, wb, wc], &xn2_in, &mut [&mut qa, &mut qb, &mut qc])
        .unwrap();
    be.matmul(wq, &xn2_in, &mut p).unwrap();
    be.add(&mut x, &up(get("p"))).unwrap();
    be.rms_norm(&up(get("x")), &d.g1, 1e-6, &mut xf).unwrap();
    be.matmul(wa, &up(get("xf")), &mut head).unwrap();
    [
        &x, &xn, &g, &u, &o2, &xn2, &qa, &qb, &qc, &p, &xf, &head, &o,
    ]
    .iter()
    .map(|b| download(be, b))
    .collect()
}

/// Per format (Q1_0, Q4_K, TQ2_0) and shape (a small one with K split in parts and TQ2_0's
/// rows ending in a short group, and the 27B's 5120 / 17408 / 6144): the chain over five
/// steps of one key (warm ones until the arena stops growing, the capture, replays), each
/// op against the separate kernels on the chain's own inputs (`reference`, within rel
/// 1e-4: sums in another order), and the chain's last GEMV against the q8_1 product of what
/// it read.
#[test]
fn chain_equals_separate_kernels() {
    let Some(plain) = gpu() else { return };
    if plain.arch() < "sm_90" {
        eprintln!(
            "note: skipping the chain test: {} is older than sm_90",
            plain.arch()
        );
        return;
    }
    // The chain with its norms folded into the GEMVs after them (the default) and with
    // each norm an instruction of its own (NEAGARI_CUDA_CHAIN_FOLD=0).
    for fold in ["1", "0"] {
        std::env::set_var("NEAGARI_CUDA_CHAIN", "1");
        std::env::set_var("NEAGARI_CUDA_CHAIN_FOLD", fold);
        let ch = CudaBackend::new(0).expect("open GPU 0");
        std::env::remove_var("NEAGARI_CUDA_CHAIN");
        std::env::remove_var("NEAGARI_CUDA_CHAIN_FOLD");
        eprintln!("note: norms folded: {fold}");
        chain_vs_plain(&plain, &ch);
    }
}

fn chain_vs_plain(plain: &CudaBackend, ch: &CudaBackend) {
    let before = ch.chain_launches().expect("the chain is on");
    let mut r = rng();
    for (ty, h, f, f2) in [
        (GgmlType::Q1_0, 2048, 3072, 4096),
        (GgmlType::Q4_K, 1280, 3328, 2304),
        (GgmlType::TQ2_0, 1280, 3328, 2304),
        (GgmlType::Q1_0, 5120, 17408, 6144),
        (GgmlType::Q4_K, 5120, 17408, 6144),
        (GgmlType::TQ2_0, 5120, 17408, 6144),
    ] {
        let mut mat = |rows, cols| random_mat(&mut r, ty, rows, cols);
        let (out, _) = mat(h, f2);
        let (gate, _) = mat(f, h);
        let (up, _) = mat(f, h);
        let (down, _) = mat(h, f);
        let (a, a_deq) = mat(2 * h, h);
        let (b, _) = mat(f2, h);
        let (c, _) = mat(32, h);
        let (q8, _) = random_mat(&mut r, GgmlType::Q8_0, h, h);
        let l = Layer {
            out,
            gate,
            up,
            down,
            a,
            b,
            c,
            q8,
            a_deq,
            g1: randv(&mut r, h, 1.0)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect(),
            g2: randv(&mut r, h, 1.0)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect(),
        };
        let (dp, mut dc) = (dev(plain, &l, h, f2), dev(ch, &l, h, f2));
        // A cache a shape: its id is part of a recorded step's key, so a shape never
        // replays the graph of another (whose buffers are smaller).
        let kv = ch
            .kv_alloc(&KvShape {
                n_layers: 1,
                n_ctx: 64,
                n_kv_heads: 1,
                head_dim: 64,
                ty: KvType::F16,
            })
            .unwrap();
        let (c0, r0) = ch.graph_stats();
        let all = std::env::var("NEAGARI_CHAIN_TEST_ALL").is_ok();
        // NEAGARI_CUDA_CHAIN_Q1=p128 (an experiment) rounds Q1_0's activation a 128 values,
        // where the separate kernels round it a 32: ~1e-2 apart, so the ops are held to
        // 5e-2 and the head GEMV to its own rounding's exact product.
        let p128 =
            ty == GgmlType::Q1_0 && std::env::var("NEAGARI_CUDA_CHAIN_Q1").as_deref() == Ok("p128");
        let (bar, block) = if p128 { (5e-2, 128) } else { (1e-4, 32) };
        for step in 0..if all { 12 } else { 5 } {
            let x0 = randv(&mut r, h, 1.0);
            let core = randv(&mut r, f2, 1.0);
            let got = run(ch, &mut dc, &x0, &core, Some(&kv));
            let want = reference(plain, &dp, &x0, &core, &got);
            let errs: Vec<(&str, f64)> = NAMES
                .iter()
                .enumerate()
                .map(|(k, name)| (*name, rel(&got[k], &want[k])))
                .collect();
            if all {
                eprintln!("{ty:?} {h}x{f} step {step}: {errs:?}");
                for (k, (name, e)) in errs.iter().enumerate() {
                    if *e > 1e-5 {
                        eprintln!("    {name}: {}", diff_detail(&got[k], &want[k]));
                    }
                }
                continue;
            }
            for (name, e) in errs {
                assert!(e < bar, "{ty:?} {h}x{f}, step {step}: {name} off by {e}");
            }
            // The chain's head GEMV (a · xf, its input read back) against the exact
            // product of xf rounded as the chain rounds it.
            check_q8(
                &got[11],
                &l.a_deq,
                &got[10],
                2 * h,
                h,
                block,
                &format!("{ty:?} chain GEMV"),
            );
        }
        let (c1, r1) = ch.graph_stats();
        assert!(
            c1 > c0 && r1 > r0,
            "{ty:?} {h}x{f}: {} captures, {} replays",
            c1 - c0,
            r1 - r0
        );
    }
    let launched = ch.chain_launches().unwrap_or(0) - before;
    eprintln!("note: {launched} chain launches");
    // Two chains a step (before and after the Q8_0 GEMV), five steps a shape.
    if std::env::var("NEAGARI_CHAIN_TEST_ALL").is_err() {
        assert_eq!(launched, 6 * 5 * 2, "chain launches");
    }
}

/// Where two outputs differ (NEAGARI_CHAIN_TEST_ALL=1): how many values by over 1e-4 of
/// the largest, and the six that differ most (index: got vs want).
fn diff_detail(got: &[f32], want: &[f32]) -> String {
    let m = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let mut d: Vec<(usize, f32)> = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .enumerate()
        .collect();
    let n = d.iter().filter(|(_, v)| *v > 1e-4 * m).count();
    d.sort_by(|a, b| b.1.total_cmp(&a.1));
    let top: Vec<String> = d
        .iter()
        .take(6)
        .map(|&(i, _)| format!("{i}: {} vs {}", got[i], want[i]))
        .collect();
    format!(
        "{n} of {} off by > 1e-4 of {m}; {}",
        got.len(),
        top.join(", ")
    )
}
