//! Every CUDA op against a host reference on fresh random inputs, at several shapes with
//! ragged tails. Matmul and embedding are checked against the weights as the CPU's
//! dequantizer decodes them (f64 products), so each GPU format decoder is checked against
//! the reference one; the float ops (norms, RoPE, GLU, soft-cap, attention over the KV
//! cache) against the CPU backend through the same `Backend` calls.
//!
//! Runs only where a CUDA GPU is usable; elsewhere (CI) each test prints why and passes.
#![cfg(feature = "cuda")]

mod cuda_common;
use cuda_common::{
    check_q8_1, cpu, download, exact_product, gpu, gpu_with, random_mat, randv, rel, rng, upload,
    vector,
};
use std::io::Write;

use neagari_backend::cuda::CudaBackend;
use neagari_backend::{Attn, Backend, Candidates, GluAct, KvShape, KvType, Penalties, Rope};
use neagari_quant::GgmlType;
use rand::{rngs::StdRng, Rng};

/// NVRTC alone (no GPU needed): every module compiles for Hopper and for an older arch.
#[test]
fn kernels_compile_with_nvrtc() {
    if !neagari_backend::cuda::nvrtc_present() {
        let _ = writeln!(
            std::io::stderr(),
            "note: skipping the NVRTC compile test: libnvrtc.so not found"
        );
        return;
    }
    for arch in ["sm_90", "sm_80"] {
        neagari_backend::cuda::compile_all(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
}

const FORMATS: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q1_0,
    GgmlType::TQ2_0,
];

/// Formats whose GEMV quantizes the activations to int8 (q8_1) and dots with dp4a.
fn int_gemv(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

#[test]
fn matmul_and_embed_every_format() {
    let Some(g) = gpu() else { return };
    let mut r = rng();
    // By default the shape picks the weight rows per block of the single-row GEMV.
    matmul_and_embed(&g, &mut r, false);
    // The integer GEMV with each number of rows per block, then the f32 GEMV, on every
    // shape (one row of Q1_0 / TQ2_0 takes gemv_stream.cu's GEMV; NEAGARI_CUDA_MVS=0 gives
    // it to gemv_int.cu's); Q1_0 and TQ2_0 (repack.rs's layout) also with one warp a block
    // (several rounds of steps a thread on the wider rows) and with 3 row groups a block
    // (the small test matrices get one by default; the groups variants also give the other
    // formats' rows of ≤ 32 units groups of one warp), and in ggml's layout
    // (NEAGARI_CUDA_REPACK=0, the kernels before the repacked layout); with one warp and
    // 4 rows a block, `mvq1x4u` for rows of several rounds (NEAGARI_CUDA_MVQ_SPLIT, on by
    // default) and `mvq1x4` for them (NEAGARI_CUDA_MVQ_SPLIT=0).
    let variants = [
        ("int", "8", &[][..]),
        ("int", "4", &[][..]),
        ("int", "2", &[][..]),
        ("int", "1", &[][..]),
        (
            "int",
            "8",
            &[("NEAGARI_CUDA_MV_WARPS", "1"), ("NEAGARI_CUDA_MVS", "0")][..],
        ),
        (
            "int",
            "8",
            &[("NEAGARI_CUDA_MV_GROUPS", "3"), ("NEAGARI_CUDA_MVS", "0")][..],
        ),
        (
            "int",
            "2",
            &[("NEAGARI_CUDA_MV_GROUPS", "5"), ("NEAGARI_CUDA_MVS", "0")][..],
        ),
        ("int", "8", &[("NEAGARI_CUDA_MVS", "0")][..]),
        // One warp a block and 4 rows: every row past 32 units takes `mvq1x4u` (several
        // rounds a thread, gemv_int.cu's mvq_split), then `mvq1x4` with the switch off.
        (
            "int",
            "4",
            &[
                ("NEAGARI_CUDA_MV_WARPS", "1"),
                ("NEAGARI_CUDA_MVS", "0"),
                ("NEAGARI_CUDA_MVQ_SPLIT", "1"),
            ][..],
        ),
        (
            "int",
            "4",
            &[
                ("NEAGARI_CUDA_MV_WARPS", "1"),
                ("NEAGARI_CUDA_MVS", "0"),
                ("NEAGARI_CUDA_MVQ_SPLIT", "0"),
            ][..],
        ),
        ("int", "4", &[("NEAGARI_CUDA_REPACK", "0")][..]),
        ("float", "4", &[][..]),
        ("float", "2", &[][..]),
        ("float", "4", &[("NEAGARI_CUDA_REPACK", "0")][..]),
    ];
    for (mv, rows, extra) in variants {
        let mut vars = vec![("NEAGARI_CUDA_MV", mv), ("NEAGARI_CUDA_MV_ROWS", rows)];
        vars.extend_from_slice(extra);
        let gv = gpu_with(&vars);
        matmul_and_embed(&gv, &mut r, mv == "float");
    }
}

fn matmul_and_embed(g: &CudaBackend, r: &mut StdRng, float_gemv: bool) {
    let c = cpu();
    for ty in FORMATS {
        let block = if ty.row_bytes(32).is_some() { 32 } else { 256 };
        // (rows, cols): fewer rows than a block's warps, ragged rows, several blocks per row;
        // 21 blocks of 256 (Q1_0: 5 whole groups of 8 blocks in repack.rs's layout and 2
        // blocks; TQ2_0: 2 and 5).
        let mut shapes = vec![
            (5, block * 2),
            (37, block * 3),
            (300, 1024.max(block * 4)),
            (19, block * 21),
        ];
        if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            shapes.push((19, 48)); // a row that is not whole 32-value units
            shapes.push((7, 70)); // nor a multiple of 4 values
        }
        for (rows, cols) in shapes {
            let (t, deq) = random_mat(r, ty, rows, cols);
            let m = g.load_mat(&t).expect("load_mat");
            let mc = c.load_mat(&t).expect("cpu load_mat");
            for n in [1usize, 2, 3, 8, 13, 64] {
                let x = randv(r, n * cols, 1.0);
                let mut want = vec![0f32; n * rows];
                for i in 0..n {
                    for j in 0..rows {
                        let mut s = 0f64;
                        for k in 0..cols {
                            s += deq[j * cols + k] as f64 * x[i * cols + k] as f64;
                        }
                        want[i * rows + j] = s as f32;
                    }
                }
                let xb = upload(g, &x, n, cols);
                let mut out = g.buf(1, 1).expect("buf");
                g.matmul(&m, &xb, &mut out).expect("matmul");
                assert_eq!(g.buf_shape(&out), (n, rows));
                let got = download(g, &out);
                let e = rel(&got, &want);
                // The float GEMV (≤ 8 rows) is f32 throughout; the integer one rounds the
                // activations to int8 per 32 values, as the CPU backend's integer kernels do
                // (per 32 for the legacy formats, per 256 for the K-quants and TQ2_0), so it
                // is held to the CPU's error on the same product (plus a floor for the
                // noise of small products). Larger batches meet cuBLAS in f16; F32 weights
                // go through an f32 GEMM.
                let tol = if n <= 8 && int_gemv(ty) && !float_gemv {
                    let mut co = c.buf(1, 1).expect("cpu buf");
                    c.matmul(&mc, &upload(&c, &x, n, cols), &mut co)
                        .expect("cpu matmul");
                    let ce = rel(&download(&c, &co), &want);
                    eprintln!("{ty} {rows}x{cols}, {n} rows: GPU {e:.2e}, CPU {ce:.2e}");
                    check_q8_1(
                        &got,
                        &deq,
                        &x,
                        rows,
                        cols,
                        &format!("{ty} {rows}x{cols}, {n} rows"),
                    );
                    // Against the exact product only a sanity bound: the int8 rounding's
                    // error is noise of the inputs (a 5-output product's passed twice the
                    // CPU's about one run in a hundred).
                    0.1
                } else if n <= 8 || !g.has_cublas() || ty == GgmlType::F32 {
                    1e-5
                } else {
                    3e-3
                };
                assert!(e < tol, "{ty} {rows}x{cols}, {n} rows: rel error {e:.2e}");
            }
            // Embedding rows, scaled.
            let ids: Vec<u32> = (0..7).map(|_| r.gen_range(0..rows as u32)).collect();
            let mut out = g.buf(1, 1).expect("buf");
            g.embed(&m, &ids, 1.5, &mut out).expect("embed");
            let got = download(g, &out);
            let want: Vec<f32> = ids
                .iter()
                .flat_map(|&id| {
                    deq[id as usize * cols..(id as usize + 1) * cols]
                        .iter()
                        .map(|v| v * 1.5)
                })
                .collect();
            assert!(rel(&got, &want) < 1e-6, "{ty} embed");
        }
    }
}

/// RMSNorm and GLU of decode rows also write the next matmul's q8_1 input; the matmul
/// must see exactly what they wrote, and must not reuse it once the buffer changes.
#[test]
fn fused_q8_1_inputs_feed_the_matmul() {
    if gpu().is_none() {
        return;
    }
    // Every quantized matmul on the integer GEMV, so a stale q8_1 input would show.
    let g = gpu_with(&[("NEAGARI_CUDA_MV", "int")]);
    let c = cpu();
    let mut r = rng();
    let cols = 512;
    // A prefetch hint (prefetch.rs) rides on every GLU below; it must change nothing.
    let pf = g
        .load_mat(&random_mat(&mut r, GgmlType::Q1_0, 64, 1024).0)
        .unwrap();
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q6_K] {
        let (t, deq) = random_mat(&mut r, ty, 96, cols);
        let m = g.load_mat(&t).expect("load_mat");
        for n in [1usize, 3] {
            let x = randv(&mut r, n * cols, 1.0);
            let nw = randv(&mut r, cols, 1.0);
            // RMSNorm → matmul, twice on the same weights (the second reuses the q8_1).
            let xb = upload(&g, &x, n, cols);
            let mut xn = g.buf(1, 1).unwrap();
            g.rms_norm(&xb, &vector(&g, &nw), 1e-6, &mut xn).unwrap();
            let (xn_cpu, _) = norms(&c, &x, n, cols, &nw);
            let want = exact_product(&deq, &xn_cpu, 96, cols);
            for pass in 0..2 {
                let mut out = g.buf(1, 1).unwrap();
                g.matmul(&m, &xn, &mut out).unwrap();
                let e = rel(&download(&g, &out), &want);
                assert!(e < 1.2e-2, "{ty} norm→matmul {n} rows pass {pass}: {e:.2e}");
            }
            // The normed buffer changes (xn += y): the matmul must quantize it afresh.
            let y = randv(&mut r, n * cols, 1.0);
            g.add(&mut xn, &upload(&g, &y, n, cols)).unwrap();
            let sum: Vec<f32> = xn_cpu.iter().zip(&y).map(|(a, b)| a + b).collect();
            let mut out = g.buf(1, 1).unwrap();
            g.matmul(&m, &xn, &mut out).unwrap();
            let e = rel(&download(&g, &out), &exact_product(&deq, &sum, 96, cols));
            assert!(e < 1.2e-2, "{ty} stale q8_1 after add, {n} rows: {e:.2e}");
            // GLU → matmul.
            for act in [GluAct::Silu, GluAct::GeluTanh] {
                let (a, b) = (randv(&mut r, n * cols, 2.0), randv(&mut r, n * cols, 1.0));
                let mut gate = upload(&g, &a, n, cols);
                g.prefetch(&[&pf]).unwrap();
                g.glu(&mut gate, &upload(&g, &b, n, cols), act).unwrap();
                let mut gc = upload(&c, &a, n, cols);
                c.glu(&mut gc, &upload(&c, &b, n, cols), act).unwrap();
                let want = exact_product(&deq, &download(&c, &gc), 96, cols);
                let mut out = g.buf(1, 1).unwrap();
                g.matmul(&m, &gate, &mut out).unwrap();
                let e = rel(&download(&g, &out), &want);
                assert!(e < 1.2e-2, "{ty} glu {act:?}→matmul {n} rows: {e:.2e}");
            }
        }
    }
}

/// Runs the same float op on both backends and compares.
fn check_float_op(name: &str, tol: f64, cpu_out: Vec<f32>, gpu_out: Vec<f32>) {
    let e = rel(&gpu_out, &cpu_out);
    eprintln!("{name}: rel error {e:.2e}");
    assert!(e < tol, "{name}: rel error {e:.2e} ≥ {tol:.0e}");
}

fn norms<B: Backend>(
    be: &B,
    x: &[f32],
    rows: usize,
    cols: usize,
    w: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let xb = upload(be, x, rows, cols);
    let wv = vector(be, w);
    let mut out = be.buf(1, 1).unwrap();
    be.rms_norm(&xb, &wv, 1e-6, &mut out).unwrap();
    let mut inplace = upload(be, x, rows, cols);
    be.rms_norm_inplace(&mut inplace, &wv, 1e-6).unwrap();
    (download(be, &out), download(be, &inplace))
}

fn elementwise<B: Backend>(
    be: &B,
    a: &[f32],
    b: &[f32],
    bias: &[f32],
    rows: usize,
    cols: usize,
) -> Vec<Vec<f32>> {
    let mut res = Vec::new();
    let bb = upload(be, b, rows, cols);
    let mut x = upload(be, a, rows, cols);
    be.add(&mut x, &bb).unwrap();
    res.push(download(be, &x));
    let mut x = upload(be, a, rows, cols);
    be.add_bias(&mut x, &vector(be, bias)).unwrap();
    res.push(download(be, &x));
    for act in [GluAct::Silu, GluAct::GeluTanh] {
        let mut x = upload(be, a, rows, cols);
        be.glu(&mut x, &bb, act).unwrap();
        res.push(download(be, &x));
    }
    let mut x = upload(be, a, rows, cols);
    be.softcap(&mut x, 3.0).unwrap();
    res.push(download(be, &x));
    let mut x = upload(be, a, rows, cols);
    let mut row = be.buf(1, 1).unwrap();
    be.copy_row(&x, rows - 1, &mut row).unwrap();
    res.push(download(be, &row));
    be.add(&mut x, &bb).unwrap();
    res
}

#[test]
fn float_ops_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut r = rng();
    for (rows, cols, group) in [(1, 640, 640), (3, 1024, 256), (17, 96, 16), (5, 200, 200)] {
        let x = randv(&mut r, rows * cols, 4.0);
        let w = randv(&mut r, group, 2.0);
        let (a1, a2) = norms(&c, &x, rows, cols, &w);
        let (b1, b2) = norms(&g, &x, rows, cols, &w);
        check_float_op("rms_norm", 1e-6, a1, b1);
        check_float_op("rms_norm_inplace", 1e-6, a2, b2);

        let a = randv(&mut r, rows * cols, 12.0);
        let b = randv(&mut r, rows * cols, 2.0);
        let bias = randv(&mut r, cols, 1.0);
        let ca = elementwise(&c, &a, &b, &bias, rows, cols);
        let ga = elementwise(&g, &a, &b, &bias, rows, cols);
        for (i, name) in ["add", "add_bias", "swiglu", "geglu", "softcap", "copy_row"]
            .iter()
            .enumerate()
        {
            // GeGLU rounds through f16 on both sides; a 1-ulp tanh difference can move one
            // f16 rounding step (5e-4 relative) on a few elements.
            check_float_op(
                name,
                if *name == "geglu" { 1e-4 } else { 1e-6 },
                ca[i].clone(),
                ga[i].clone(),
            );
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn rope_run<B: Backend>(
    be: &B,
    x: &[f32],
    rows: usize,
    cols: usize,
    hd: usize,
    pos0: usize,
    rope: &Rope,
    ff: Option<&[f32]>,
) -> Vec<f32> {
    let mut xb = upload(be, x, rows, cols);
    let ffv = ff.map(|f| vector(be, f));
    be.rope(&mut xb, hd, pos0, rope, ffv.as_ref()).unwrap();
    download(be, &xb)
}

/// The two non-plain RoPEs the rope tests run: YaRN (64 dims, NeoX pairing, a quarter of
/// the frequencies) and a partial rotation (32 dims, interleaved, half).
fn test_ropes() -> (Rope, Rope) {
    let mut yarn = Rope::plain(64, 10000.0, true);
    yarn.freq_scale = 0.25;
    yarn.ext_factor = 1.0;
    yarn.n_ctx_orig = 4096;
    let mut partial = Rope::plain(32, 500000.0, false);
    partial.freq_scale = 0.5;
    (yarn, partial)
}

#[test]
fn rope_variants_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut r = rng();
    let (yarn, partial) = test_ropes();
    let cases: Vec<(Rope, usize, bool)> = vec![
        (Rope::plain(128, 10000.0, false), 128, false),
        (Rope::plain(256, 1_000_000.0, true), 256, false),
        (Rope::plain(64, 500000.0, false), 64, true),
        (yarn, 64, false),
        (partial, 64, false),
    ];
    for (rope, hd, with_ff) in cases {
        for (rows, pos0) in [(1usize, 0usize), (1, 3000), (9, 17)] {
            let cols = hd * 3;
            let x = randv(&mut r, rows * cols, 2.0);
            let ff: Option<Vec<f32>> =
                with_ff.then(|| (0..rope.dims / 2).map(|i| 1.0 + (i % 7) as f32).collect());
            let a = rope_run(&c, &x, rows, cols, hd, pos0, &rope, ff.as_deref());
            let b = rope_run(&g, &x, rows, cols, hd, pos0, &rope, ff.as_deref());
            check_float_op(&format!("rope {rope:?} rows {rows} pos {pos0}"), 2e-5, a, b);
        }
    }
}

/// Prefill `n0` rows, then decode `steps` single rows over a `ty` cache; returns every
/// output.
#[allow(clippy::too_many_arguments)]
fn attention_run<B: Backend>(
    be: &B,
    ty: KvType,
    attn: &Attn,
    n_ctx: usize,
    n0: usize,
    steps: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    let (qd, kvd) = (
        attn.n_heads * attn.head_dim,
        attn.n_kv_heads * attn.head_dim,
    );
    let mut kv = be
        .kv_alloc(&KvShape {
            n_layers: 2,
            n_ctx,
            n_kv_heads: attn.n_kv_heads,
            head_dim: attn.head_dim,
            ty,
        })
        .unwrap();
    let mut all = Vec::new();
    let mut pos = 0;
    let mut chunks = vec![n0];
    chunks.extend(std::iter::repeat_n(1, steps));
    for n in chunks {
        let qb = upload(be, &q[pos * qd..(pos + n) * qd], n, qd);
        let kb = upload(be, &k[pos * kvd..(pos + n) * kvd], n, kvd);
        let vb = upload(be, &v[pos * kvd..(pos + n) * kvd], n, kvd);
        let mut out = be.buf(1, 1).unwrap();
        // Layer 1, so the layer offset into the cache is exercised.
        be.attention(&mut kv, 1, pos, &qb, &kb, &vb, attn, &mut out)
            .unwrap();
        be.kv_commit(&mut kv, pos + n).unwrap();
        all.extend(download(be, &out));
        pos += n;
    }
    all
}

#[test]
fn attention_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    // The grouped kernels run only over long caches by default: forced here.
    let gg = gpu_with(&[("NEAGARI_CUDA_ATT_GROUP", "1")]);
    let c = cpu();
    let mut r = rng();
    let cases = [
        // (cache, heads, kv heads, head_dim, window, softcap, prefill rows, decode steps)
        (
            KvType::F16,
            4usize,
            1usize,
            256usize,
            None,
            None,
            40usize,
            5usize,
        ),
        (KvType::F16, 8, 2, 64, Some(16), None, 37, 6),
        (KvType::F16, 6, 6, 16, None, Some(20.0f32), 9, 3),
        (KvType::F16, 32, 8, 128, None, None, 600, 3),
        (KvType::F16, 4, 1, 256, Some(512), None, 700, 2),
        // Head sizes off the 16-byte key loads (20) and off 32 (80: 3 value dims a lane).
        (KvType::F16, 2, 1, 20, None, None, 45, 3),
        (KvType::F16, 4, 2, 80, Some(40), None, 70, 3),
        // q8_0: every value path (8, 4, 2, 1 and 3 dims a lane) and key width (128, 64,
        // 32 a load round), a split decode (600) and a window.
        (KvType::Q8_0, 4, 1, 256, None, None, 40, 5),
        (KvType::Q8_0, 8, 2, 64, Some(16), None, 37, 6),
        (KvType::Q8_0, 6, 6, 32, None, Some(20.0), 9, 3),
        (KvType::Q8_0, 32, 8, 128, None, None, 600, 3),
        (KvType::Q8_0, 4, 1, 256, Some(512), None, 700, 2),
        (KvType::Q8_0, 4, 2, 96, None, None, 50, 3),
        // Shapes of the grouped kernels (`attention_group`: 2, 4, 6, 8 query heads a kv
        // head at head sizes 64, 128, 256; the cases above with 4 too), split and not.
        (KvType::F16, 24, 4, 256, None, None, 30, 3),
        (KvType::Q8_0, 24, 4, 256, None, None, 700, 2),
        (KvType::Q8_0, 16, 2, 128, None, Some(30.0), 300, 3),
        (KvType::F16, 16, 2, 64, Some(100), None, 400, 3),
        (KvType::F16, 4, 2, 128, None, None, 20, 3),
        (KvType::Q8_0, 12, 2, 64, None, None, 20, 3),
        (KvType::Q8_0, 4, 2, 256, Some(64), None, 300, 2),
    ];
    for (ty, nh, nkv, hd, window, softcap, n0, steps) in cases {
        let attn = Attn {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
            softcap,
        };
        let n = n0 + steps;
        let q = randv(&mut r, n * nh * hd, 2.0);
        let k = randv(&mut r, n * nkv * hd, 2.0);
        let v = randv(&mut r, n * nkv * hd, 1.0);
        let a = attention_run(&c, ty, &attn, n + 4, n0, steps, &q, &k, &v);
        let b = attention_run(&g, ty, &attn, n + 4, n0, steps, &q, &k, &v);
        let bg = attention_run(&gg, ty, &attn, n + 4, n0, steps, &q, &k, &v);
        let name =
            format!("attention {ty:?} {nh}/{nkv}x{hd} window {window:?} softcap {softcap:?}");
        if ty == KvType::Q8_0 {
            // The q8_0 rounding itself is larger than the two engines' difference: a GPU
            // that kept f16 rows would be as far from the CPU's q8_0 as its f16 is.
            let f = attention_run(&c, KvType::F16, &attn, n + 4, n0, steps, &q, &k, &v);
            let (to_f16, to_cpu) = (rel(&a, &f), rel(&b, &a));
            eprintln!("{name}: CPU q8_0 vs CPU f16 {to_f16:.2e}, GPU vs CPU {to_cpu:.2e}");
            assert!(
                to_cpu < to_f16 / 4.0,
                "{name}: GPU {to_cpu:.2e}, q8_0 {to_f16:.2e}"
            );
        }
        // The CPU rounds the softmax weights to f16 before meeting V (as ggml does); the GPU
        // keeps them in f32 inside an online softmax: ~1e-3 relative.
        check_float_op(&format!("{name} grouped"), 3e-3, a.clone(), bg);
        check_float_op(&name, 3e-3, a, b);
    }
}

/// The CUDA cache types: f16 and q8_0 (head sizes a multiple of 32), refused otherwise.
#[test]
fn kv_alloc_refuses_what_attention_cannot_read() {
    let Some(g) = gpu() else { return };
    let shape = |ty, head_dim| KvShape {
        n_layers: 2,
        n_ctx: 64,
        n_kv_heads: 2,
        head_dim,
        ty,
    };
    assert!(g.kv_alloc(&shape(KvType::Q8_0, 128)).is_ok());
    assert!(g.kv_alloc(&shape(KvType::F16, 80)).is_ok());
    for (ty, hd) in [(KvType::Q8_0, 80), (KvType::F32, 64), (KvType::F16, 512)] {
        let e = g.kv_alloc(&shape(ty, hd)).err().map(|e| e.to_string());
        eprintln!("{ty:?} head_dim {hd}: {e:?}");
        assert!(e.is_some(), "{ty:?} x {hd} accepted");
    }
}

/// Greedy argmax on the device against the host rule (highest, lowest index among equals,
/// NaN ignored) on random rows with planted ties, NaNs and infinities, at vocabulary sizes
/// with ragged tails.
/// `top_k` (ops.cu's `topk_chunks` + `topk_merge`: only k pairs come back; `penalize` first)
/// against the host rule written out here (a full sort by value, then index; NaN left out)
/// after `Penalties::apply`, with and without penalties, on rows with
/// ties at the k-th value, NaNs, ±inf and fewer than k values; a row too wide for one merge
/// (74 chunks × 64 > 4,096) takes the host path and must agree too.
#[test]
fn top_k_equals_host_rule_with_ties() {
    let Some(g) = gpu() else { return };
    let mut r = rng();
    let want = |row: &[f32], k: usize| -> Vec<(u32, f32)> {
        let mut v: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .filter(|(_, x)| !x.is_nan())
            .map(|(i, &x)| (i as u32, x))
            .collect();
        v.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap().then(a.0.cmp(&b.0)));
        v.truncate(k);
        v
    };
    for &(rows, cols, k) in &[
        (1, 248_320, 40),
        (2, 262_144, 64),
        (3, 151_936, 1),
        (2, 1000, 40),
        (1, 33, 64),
        (1, 300_000, 64),
    ] {
        // Values on a coarse grid: many ties, also across chunks.
        let mut x: Vec<f32> = randv(&mut r, rows * cols, 4.0)
            .iter()
            .map(|v| (v * 8.0).round() / 8.0)
            .collect();
        for row in 0..rows {
            let xs = &mut x[row * cols..(row + 1) * cols];
            match row % 3 {
                0 => {
                    for v in xs.iter_mut().step_by(7) {
                        *v = f32::NAN;
                    }
                    xs[cols - 1] = f32::INFINITY;
                }
                1 => {
                    xs.fill(f32::NAN);
                    xs[cols / 2] = -1.0;
                    xs[3] = f32::NEG_INFINITY;
                }
                _ => {}
            }
        }
        // Without penalties, then with the sampler's kind: 50 distinct tokens, the row's best
        // among them, one past the row.
        let mut ids: Vec<u32> = (0..50).map(|_| r.gen_range(0..cols as u32)).collect();
        ids.extend(want(&x[..cols], 3).iter().map(|&(i, _)| i));
        ids.push(cols as u32 + 5);
        ids.sort_unstable();
        ids.dedup();
        let pen = Penalties {
            repeat: 1.3,
            tokens: ids.iter().map(|&t| (t, r.gen_range(0.0..2.0))).collect(),
        };
        for pen in [Penalties::default(), pen] {
            let mut b = g.buf(rows, cols).unwrap();
            g.write(&mut b, &x, rows, cols).unwrap();
            let got = g.top_k(&b, k, &pen).unwrap();
            assert_eq!(got.len(), rows);
            for row in 0..rows {
                let mut xs = x[row * cols..(row + 1) * cols].to_vec();
                pen.apply(&mut xs);
                let n = pen.tokens.len();
                assert_eq!(
                    got[row],
                    want(&xs, k),
                    "{rows}x{cols} k {k} row {row} pen {n}"
                );
                assert_eq!(got[row], neagari_backend::top_k_host(&xs, k));
            }
        }
    }
}

/// `candidates` (top-k with the row's softmax sums, `topk_chunks` + `topk_merge` with `ms`)
/// against the host: the same k best as `top_k_host` after the penalties, the row's max
/// exactly and Σ exp(v − max) within 1e-5 of an f64 sum; where `enough` says no, the whole
/// penalized row, exactly; a row of NaN gives (−∞, 0); a row too wide for one merge takes
/// the host path and comes back whole.
#[test]
fn candidates_carry_the_rows_softmax_sums() {
    let Some(g) = gpu() else { return };
    let mut r = rng();
    for &(rows, cols, k) in &[
        (1, 248_320, 64),
        (2, 151_936, 64),
        (1, 1000, 16),
        (1, 33, 64),
        (1, 300_000, 64),
    ] {
        let mut x = randv(&mut r, rows * cols, 6.0);
        for v in x.iter_mut().step_by(11) {
            *v = f32::NAN;
        }
        x[5] = f32::NEG_INFINITY;
        // Distinct tokens (the device applies them in parallel).
        let pen = Penalties {
            repeat: 1.2,
            tokens: (0..40.min(cols as u32))
                .map(|i| (i * 97 % cols as u32, 0.5))
                .collect(),
        };
        let last = &x[(rows - 1) * cols..];
        let mut want = last.to_vec();
        pen.apply(&mut want);
        let wide = cols.div_ceil(4096).next_power_of_two() * k > 4096;
        for settle in [true, false] {
            let mut b = g.buf(rows, cols).unwrap();
            g.write(&mut b, &x, rows, cols).unwrap();
            let got = g.candidates(&b, k, &pen, &|_, _, _| settle).unwrap();
            let tag = format!("{rows}x{cols} k {k} settle {settle}");
            match got {
                Candidates::Top { top, max, sum } => {
                    assert!(settle && !wide, "{tag}: Top");
                    assert_eq!(top, neagari_backend::top_k_host(&want, k), "{tag}");
                    let m = want
                        .iter()
                        .filter(|v| !v.is_nan())
                        .fold(f32::NEG_INFINITY, |a, &v| a.max(v));
                    assert_eq!(max, m, "{tag}");
                    let s: f64 = want
                        .iter()
                        .filter(|v| !v.is_nan())
                        .map(|&v| f64::from(v - m).exp())
                        .sum();
                    let e = (f64::from(sum) - s).abs() / s;
                    assert!(e < 1e-5, "{tag}: sum {sum} vs {s} ({e:e})");
                }
                Candidates::All(row) => {
                    assert!(!settle || wide, "{tag}: All");
                    // NaN stays NaN (its payload bits may not: the device's arithmetic
                    // on a penalized NaN makes its own).
                    let same = row
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan());
                    assert!(same && row.len() == cols, "{tag}: row");
                }
            }
        }
    }
    // A row of NaN: nothing to select, sums (−∞, 0).
    let x = vec![f32::NAN; 5000];
    let mut b = g.buf(1, 5000).unwrap();
    g.write(&mut b, &x, 1, 5000).unwrap();
    let got = g
        .candidates(&b, 64, &Penalties::default(), &|_, _, _| true)
        .unwrap();
    assert_eq!(
        got,
        Candidates::Top {
            top: Vec::new(),
            max: f32::NEG_INFINITY,
            sum: 0.0
        }
    );
}

#[test]
fn argmax_equals_host_rule_with_ties() {
    let Some(g) = gpu() else { return };
    let mut r = rng();
    // The rule, written independently of `argmax_host`: among non-NaN values the maximum,
    // then the smallest index holding it.
    let want = |row: &[f32]| -> u32 {
        let m = row
            .iter()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        row.iter().position(|&v| v == m).map_or(0, |i| i as u32)
    };
    for &(rows, cols) in &[(1, 262_144), (3, 151_936), (5, 1000), (2, 33), (1, 1)] {
        let mut x = randv(&mut r, rows * cols, 4.0);
        for row in 0..rows {
            let xs = &mut x[row * cols..(row + 1) * cols];
            match row % 5 {
                // A tie for the maximum at a high and a low index (the low one must win).
                0 if cols > 2 => {
                    let hi = r.gen_range(cols / 2..cols);
                    let lo = r.gen_range(0..cols / 2);
                    xs[hi] = 9.0;
                    xs[lo] = 9.0;
                }
                // NaNs everywhere around a maximum that is not NaN.
                1 => {
                    for v in xs.iter_mut().step_by(3) {
                        *v = f32::NAN;
                    }
                }
                // Every value equal: index 0.
                2 => xs.fill(-1.5),
                // +inf twice, and -inf elsewhere.
                3 if cols > 4 => {
                    xs[cols - 1] = f32::INFINITY;
                    xs[cols / 3] = f32::INFINITY;
                    xs[0] = f32::NEG_INFINITY;
                }
                _ => {}
            }
        }
        let mut b = g.buf(rows, cols).unwrap();
        g.write(&mut b, &x, rows, cols).unwrap();
        let got = g.argmax(&b).unwrap();
        for row in 0..rows {
            let xs = &x[row * cols..(row + 1) * cols];
            assert_eq!(got[row], want(xs), "{rows}x{cols} row {row}");
            assert_eq!(
                got[row],
                neagari_backend::argmax_host(xs),
                "{rows}x{cols} row {row}"
            );
        }
    }
    // A row of NaNs gives 0, as the host rule does.
    let mut b = g.buf(1, 77).unwrap();
    g.write(&mut b, &[f32::NAN; 77], 1, 77).unwrap();
    assert_eq!(g.argmax(&b).unwrap(), vec![0]);
}

// The fused ops' tests (a directory without main.rs: not a test target of its own).
#[path = "cuda_ops/fused.rs"]
mod fused;
