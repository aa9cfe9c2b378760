//! The fused ops against the separate ones and the CPU: `matmul_multi` and the residual
//! add + norm, gate/up with the GLU, the norm finished inside the GEMV, q/k norm + RoPE,
//! the attention block.

use crate::check_float_op;
use crate::cuda_common::{
    check_q8_1, cpu, download, exact_product, gpu, gpu_with, n_diff, random_mat, randv, rel, rng,
    upload, vector,
};
use neagari_backend::cuda::CudaBackend;
use neagari_backend::{Attn, Backend, GluAct, HostTensor, KvShape, KvType, QkPrep, Rope};
use neagari_quant::GgmlType;
use rand::rngs::StdRng;

/// `matmul_multi` (one launch over up to four matrices of a format) equals the separate
/// matmuls bit for bit (same per-row sums) and the exact product within the integer GEMV's
/// bar; mixed formats or widths fall back; `add_rms_norm` equals `add` then `rms_norm` on
/// the GPU bit for bit and the CPU's within float error, and its q8_1 output feeds the next
/// matmul.
#[test]
fn fused_multi_matmul_and_add_norm() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut r = rng();
    multi_matches_single(&g, &mut r);
    // The repacked formats with 3 row groups a block (gemv_int.cu `mvq_step`; the default
    // gives these small matrices one).
    let g3 = gpu_with(&[("NEAGARI_CUDA_MV_GROUPS", "3")]);
    multi_matches_single(&g3, &mut r);

    // The fused add_rms_norm also carries a prefetch hint (prefetch.rs) on every shape
    // below: a Q1_0 matrix of 4.6 MB (more than the norm's 4 MiB cap: cut) and one of 144
    // bytes; the hint must change nothing.
    let pf = [
        g.load_mat(&random_mat(&mut r, GgmlType::Q1_0, 4096, 1024 * 8).0)
            .unwrap(),
        g.load_mat(&random_mat(&mut r, GgmlType::Q1_0, 1, 1024).0)
            .unwrap(),
    ];
    // add_rms_norm: fused vs the two ops. Up to 8 rows of 5120 or 768 run as clusters of
    // 8 or 3 blocks a row (add_rms_norm_cl on Hopper, else one row over 20 or 3 blocks,
    // add_rms_norm_row, whose calls of different block counts in a row meet at its
    // barrier); 9000-wide rows take the loop past the 8 values a thread keeps in
    // registers, 12 rows are past the q8_1-writing decode sizes.
    for (n, cols) in [
        (1usize, 5120usize),
        (1, 768),
        (1, 5120),
        (3, 768),
        (8, 5120),
        (2, 9000),
        (12, 256),
    ] {
        let (x, y, w) = (
            randv(&mut r, n * cols, 2.0),
            randv(&mut r, n * cols, 1.0),
            randv(&mut r, cols, 1.0),
        );
        let wv = vector(&g, &w);
        let mut xf = upload(&g, &x, n, cols);
        let mut of = g.buf(1, 1).unwrap();
        g.prefetch(&[&pf[n % 2], &pf[(n + 1) % 2]]).unwrap();
        g.add_rms_norm(&mut xf, &upload(&g, &y, n, cols), &wv, 1e-6, &mut of)
            .unwrap();
        let mut xs = upload(&g, &x, n, cols);
        g.add(&mut xs, &upload(&g, &y, n, cols)).unwrap();
        let mut os = g.buf(1, 1).unwrap();
        g.rms_norm(&xs, &wv, 1e-6, &mut os).unwrap();
        assert!(
            download(&g, &xf) == download(&g, &xs),
            "add_rms_norm sum {n}x{cols}"
        );
        assert!(
            download(&g, &of) == download(&g, &os),
            "add_rms_norm norm {n}x{cols}"
        );
        let mut xc = upload(&c, &x, n, cols);
        let mut oc = c.buf(1, 1).unwrap();
        c.add_rms_norm(
            &mut xc,
            &upload(&c, &y, n, cols),
            &vector(&c, &w),
            1e-6,
            &mut oc,
        )
        .unwrap();
        check_float_op("add_rms_norm", 1e-5, download(&c, &oc), download(&g, &of));
        // norm_add_rms_norm (Gemma's post-norm, add, norm): fused vs the three GPU ops.
        if cols <= 8192 {
            let wy = randv(&mut r, cols, 1.0);
            let wyv = vector(&g, &wy);
            let (mut xf, mut yf) = (upload(&g, &x, n, cols), upload(&g, &y, n, cols));
            let mut of = g.buf(1, 1).unwrap();
            g.norm_add_rms_norm(&mut xf, &mut yf, &wyv, &wv, 1e-6, &mut of)
                .unwrap();
            let (mut xs, mut ys) = (upload(&g, &x, n, cols), upload(&g, &y, n, cols));
            g.rms_norm_inplace(&mut ys, &wyv, 1e-6).unwrap();
            g.add(&mut xs, &ys).unwrap();
            let mut os = g.buf(1, 1).unwrap();
            g.rms_norm(&xs, &wv, 1e-6, &mut os).unwrap();
            assert!(
                download(&g, &yf) == download(&g, &ys),
                "norm_add y {n}x{cols}"
            );
            assert!(
                download(&g, &xf) == download(&g, &xs),
                "norm_add x {n}x{cols}"
            );
            assert!(
                download(&g, &of) == download(&g, &os),
                "norm_add out {n}x{cols}"
            );
            let (mut xc, mut yc) = (upload(&c, &x, n, cols), upload(&c, &y, n, cols));
            let mut oc = c.buf(1, 1).unwrap();
            c.norm_add_rms_norm(
                &mut xc,
                &mut yc,
                &vector(&c, &wy),
                &vector(&c, &w),
                1e-6,
                &mut oc,
            )
            .unwrap();
            check_float_op(
                "norm_add_rms_norm",
                1e-5,
                download(&c, &oc),
                download(&g, &of),
            );
            if cols == 768 {
                let (t, deq) = random_mat(&mut r, GgmlType::Q8_0, 64, cols);
                let m = g.load_mat(&t).unwrap();
                let mut out = g.buf(1, 1).unwrap();
                g.matmul(&m, &of, &mut out).unwrap();
                let want = exact_product(&deq, &download(&c, &oc), 64, cols);
                let e = rel(&download(&g, &out), &want);
                assert!(e < 1.2e-2, "norm_add_rms_norm → matmul: {e:.2e}");
            }
        }
        // Its q8_1 output feeds the next matmul.
        if cols == 768 || n == 8 {
            let (t, deq) = random_mat(&mut r, GgmlType::Q4_K, 64, cols);
            let m = g.load_mat(&t).unwrap();
            let mut out = g.buf(1, 1).unwrap();
            g.matmul(&m, &of, &mut out).unwrap();
            let want = exact_product(&deq, &download(&c, &oc), 64, cols);
            let e = rel(&download(&g, &out), &want);
            assert!(e < 1.2e-2, "add_rms_norm → matmul: {e:.2e}");
        }
    }
}

/// `matmul_multi` equals the separate matmuls bit for bit, and the q8_1-rounded product
/// (`check_q8_1`); mixed formats fall back.
fn multi_matches_single(g: &CudaBackend, r: &mut StdRng) {
    let cols = 768;
    for ty in [
        GgmlType::Q1_0,
        GgmlType::TQ2_0,
        GgmlType::Q4_K,
        GgmlType::Q8_0,
    ] {
        // Five matrices (two launches), one of 48 rows and one of 3.
        let shapes = [300usize, 48, 3, 129, 1000];
        let mats: Vec<(HostTensor, Vec<f32>)> = shapes
            .iter()
            .map(|&rows| random_mat(r, ty, rows, cols))
            .collect();
        let dm: Vec<_> = mats.iter().map(|(t, _)| g.load_mat(t).unwrap()).collect();
        for n in [1usize, 2, 3, 8] {
            let x = randv(r, n * cols, 1.0);
            let xb = upload(g, &x, n, cols);
            let mut outs: Vec<_> = shapes.iter().map(|_| g.buf(1, 1).unwrap()).collect();
            {
                let ws: Vec<_> = dm.iter().collect();
                let mut os: Vec<_> = outs.iter_mut().collect();
                g.matmul_multi(&ws, &xb, &mut os).unwrap();
            }
            for (i, m) in dm.iter().enumerate() {
                let mut one = g.buf(1, 1).unwrap();
                g.matmul(m, &xb, &mut one).unwrap();
                let (a, b) = (download(g, &outs[i]), download(g, &one));
                assert_eq!(g.buf_shape(&outs[i]), (n, shapes[i]));
                assert!(a == b, "{ty} matrix {i}, {n} rows: multi ≠ single");
                // Tensor-core rows (3–8) round x as the dp4a GEMV does.
                check_q8_1(
                    &a,
                    &mats[i].1,
                    &x,
                    shapes[i],
                    cols,
                    &format!("{ty} matrix {i}, {n} rows"),
                );
            }
        }
    }
    // Mixed formats: the fallback, still the separate products.
    let (ta, da) = random_mat(r, GgmlType::Q4_K, 64, 512);
    let (tb, db) = random_mat(r, GgmlType::Q8_0, 32, 512);
    let x = randv(r, 512, 1.0);
    let xb = upload(g, &x, 1, 512);
    let (ma, mb) = (g.load_mat(&ta).unwrap(), g.load_mat(&tb).unwrap());
    let (mut oa, mut ob) = (g.buf(1, 1).unwrap(), g.buf(1, 1).unwrap());
    g.matmul_multi(&[&ma, &mb], &xb, &mut [&mut oa, &mut ob])
        .unwrap();
    assert!(rel(&download(g, &oa), &exact_product(&da, &x, 64, 512)) < 1.2e-2);
    assert!(rel(&download(g, &ob), &exact_product(&db, &x, 32, 512)) < 1.2e-2);
    // Two formats after `prepare_multi` (one `mvqp*` launch for one row, the first
    // matrix's format first whatever the order): bit for bit the separate matmuls. Gemma
    // 3's Q4_K_M q, k, v (Q5_0, Q5_0, Q8_0 at 640), a Q8_0 first, and Q4_K beside Q6_K.
    use GgmlType::*;
    let groups: [(&[(GgmlType, usize)], usize); 3] = [
        (&[(Q5_0, 1024), (Q5_0, 256), (Q8_0, 256)], 640),
        (&[(Q8_0, 40), (Q5_0, 300), (Q8_0, 7), (Q5_0, 64)], 2048),
        (&[(Q4_K, 96), (Q6_K, 130)], 1536),
    ];
    for (group, cols) in groups {
        let dm: Vec<_> = group
            .iter()
            .map(|&(ty, rows)| g.load_mat(&random_mat(r, ty, rows, cols).0).unwrap())
            .collect();
        let ws: Vec<_> = dm.iter().collect();
        g.prepare_multi(&ws).unwrap();
        for n in [1usize, 2] {
            let xb = upload(g, &randv(r, n * cols, 1.0), n, cols);
            let mut outs: Vec<_> = group.iter().map(|_| g.buf(1, 1).unwrap()).collect();
            {
                let mut os: Vec<_> = outs.iter_mut().collect();
                g.matmul_multi(&ws, &xb, &mut os).unwrap();
            }
            for (i, m) in dm.iter().enumerate() {
                let mut one = g.buf(1, 1).unwrap();
                g.matmul(m, &xb, &mut one).unwrap();
                assert_eq!(g.buf_shape(&outs[i]), (n, group[i].1));
                assert!(
                    download(g, &outs[i]) == download(g, &one),
                    "{:?} matrix {i} of two formats, {n} rows: multi ≠ single",
                    group[i].0
                );
            }
        }
    }
}

/// `matmul_glu` (gate, up and the GLU in one launch, plus the q8_1 of its output where the
/// rows are whole 32-value units) against `matmul_multi` + `glu` on the GPU (the same
/// bits), the CPU backend, and the down projection of its output against the down
/// projection of the separate ops' output; a later change of the output must not reuse
/// the q8_1 it left.
#[test]
fn fused_matmul_glu() {
    let Some(g0) = gpu() else { return };
    let c = cpu();
    let mut r = rng();
    // (format, ffn rows, model width): Gemma 3 270M's, a ragged one (no q8_1), wider ones.
    // One row of TQ2_0 takes gemv_stream.cu's `mvsg_R` (the 27B's 5120-wide rows: 2 × 16 × 4;
    // 1024 wide: 4 × 4 × 4; ragged 200 rows: no q8_1, a partial last block); Q1_0 does
    // where NEAGARI_CUDA_MVSG forces a shape (`g8` below, 8 × 2 × 4).
    let g8 = gpu_with(&[("NEAGARI_CUDA_MVSG", "8x2x4")]);
    // 3–8 rows of Q1_0 take gemv_rows.cu's `mvrtg_4`; capped at one block an SM, a block
    // takes several tile blocks, the next one's copy in flight (`gl2`) or after the current
    // one (`gl1`). On 132 SMs, 8192 rows (256 tile blocks) give 124 blocks a second one,
    // 8704 rows (272) give 8 blocks a third: whole with NEAGARI_CUDA_GLU_SPLIT=0 (`gl2`,
    // `gl1`), else (the default) 40 items of a fifth of K (`gls`, `gls1`: three parts),
    // whose sums meet in another order than the whole tile's: g and u within 1e-6 of the
    // separate ops, not the same bits.
    // One block an SM, `bufs` tiles of shared memory, the leftover in up to `split` parts.
    let glu_loop = |bufs: &str, split: &str| {
        gpu_with(&[
            ("NEAGARI_CUDA_GLU_LOOP", "1"),
            ("NEAGARI_CUDA_GLU_BUFS", bufs),
            ("NEAGARI_CUDA_GLU_SPLIT", split),
        ])
    };
    let (gl2, gl1) = (glu_loop("2", "0"), glu_loop("1", "0"));
    let (gls, gls1) = (glu_loop("2", "5"), glu_loop("1", "3"));
    let cases = [
        (&gl2, GgmlType::Q1_0, 8192, 5120),
        (&gl2, GgmlType::Q1_0, 8704, 5120),
        (&gl1, GgmlType::Q1_0, 8704, 5120),
        (&gls, GgmlType::Q1_0, 8704, 5120),
        (&gls1, GgmlType::Q1_0, 8704, 5120),
        (&g8, GgmlType::Q1_0, 1024, 5120),
        (&g0, GgmlType::Q1_0, 1024, 5120),
        (&g0, GgmlType::TQ2_0, 512, 5120),
        (&g0, GgmlType::Q1_0, 200, 512),
        (&g0, GgmlType::TQ2_0, 200, 1024),
        (&g0, GgmlType::Q1_0, 2048, 640),
        (&g0, GgmlType::Q8_0, 2048, 640),
        (&g0, GgmlType::Q4_K, 1024, 768),
        (&g0, GgmlType::TQ2_0, 512, 1024),
        (&g0, GgmlType::Q8_0, 200, 256),
        (&g0, GgmlType::Q6_K, 768, 4096),
    ];
    for (g, ty, f, h) in cases {
        let (tg, _) = random_mat(&mut r, ty, f, h);
        let (tu, _) = random_mat(&mut r, ty, f, h);
        let (gm, um) = (g.load_mat(&tg).unwrap(), g.load_mat(&tu).unwrap());
        let (gc, uc) = (c.load_mat(&tg).unwrap(), c.load_mat(&tu).unwrap());
        let down = (f % 32 == 0).then(|| {
            let (t, deq) = random_mat(&mut r, GgmlType::Q8_0, 64, f);
            (g.load_mat(&t).unwrap(), deq)
        });
        for n in [1usize, 2, 3, 8] {
            for act in [GluAct::Silu, GluAct::GeluTanh] {
                let x = randv(&mut r, n * h, 1.0);
                let xb = upload(g, &x, n, h);
                let name = format!("matmul_glu {ty} {f}x{h} {act:?}, {n} rows");
                // Fused, then the down projection reading the q8_1 it left.
                let (mut gf, mut uf) = (g.buf(1, 1).unwrap(), g.buf(1, 1).unwrap());
                g.matmul_glu(&gm, &um, &xb, act, &mut gf, &mut uf).unwrap();
                let down_f = down.as_ref().map(|(m, _)| {
                    let mut o = g.buf(1, 1).unwrap();
                    g.matmul(m, &gf, &mut o).unwrap();
                    download(g, &o)
                });
                // The separate ops.
                let (mut gs, mut us) = (g.buf(1, 1).unwrap(), g.buf(1, 1).unwrap());
                g.matmul_multi(&[&gm, &um], &xb, &mut [&mut gs, &mut us])
                    .unwrap();
                g.glu(&mut gs, &us, act).unwrap();
                let down_s = down.as_ref().map(|(m, _)| {
                    let mut o = g.buf(1, 1).unwrap();
                    g.matmul(m, &gs, &mut o).unwrap();
                    download(g, &o)
                });
                let (vf, vs) = (download(g, &gf), download(g, &gs));
                assert_eq!(g.buf_shape(&gf), (n, f));
                let d = n_diff(&vf, &vs);
                eprintln!(
                    "{name}: {d} of {} values differ from the separate ops",
                    vf.len()
                );
                check_float_op(&format!("{name} vs separate"), 1e-6, vs.clone(), vf.clone());
                let (uf_v, us_v) = (download(g, &uf), download(g, &us));
                if std::ptr::eq(g, &gls) || std::ptr::eq(g, &gls1) {
                    check_float_op(&format!("{name}: up"), 1e-6, us_v, uf_v);
                } else {
                    assert_eq!(n_diff(&uf_v, &us_v), 0, "{name}: up");
                }
                let (mut gcb, mut ucb) = (c.buf(1, 1).unwrap(), c.buf(1, 1).unwrap());
                c.matmul_glu(&gc, &uc, &upload(&c, &x, n, h), act, &mut gcb, &mut ucb)
                    .unwrap();
                // Each side quantizes x its own way (q8_1 / q8_K).
                check_float_op(
                    &format!("{name} vs CPU"),
                    3e-2,
                    download(&c, &gcb),
                    vf.clone(),
                );
                if let (Some(a), Some(b), Some((m, deq))) = (down_f, down_s, &down) {
                    if d == 0 {
                        assert_eq!(n_diff(&a, &b), 0, "{name}: down projection");
                    }
                    check_q8_1(&a, deq, &vf, 64, f, &format!("{name} → down"));
                    // g changes: the down projection must quantize it afresh.
                    let y = randv(&mut r, n * f, 1.0);
                    let mut g2 = g.buf(1, 1).unwrap();
                    g.matmul_glu(&gm, &um, &xb, act, &mut g2, &mut uf).unwrap();
                    g.add(&mut g2, &upload(g, &y, n, f)).unwrap();
                    let sum: Vec<f32> = vf.iter().zip(&y).map(|(a, b)| a + b).collect();
                    let mut o = g.buf(1, 1).unwrap();
                    g.matmul(m, &g2, &mut o).unwrap();
                    // Held to the q8_1-rounded product: a stale input misses it by far, and
                    // the exact product is 1–1.3% away from it here (rounding alone).
                    let what = format!("{name}: stale q8_1 after add");
                    check_q8_1(&download(g, &o), deq, &sum, 64, f, &what);
                }
            }
        }
    }
}

/// What `add_rms_norm_matmul` leaves: x after the add, the normed row, each projection.
type NormOut = (Vec<f32>, Vec<f32>, Vec<Vec<f32>>);

/// `add_rms_norm_matmul` of x's rows (w's length wide) on `be` (false: `add_rms_norm` then
/// `matmul_multi`).
fn norm_then_matmul<B: Backend>(
    be: &B,
    mats: &[HostTensor],
    (x, y, w): (&[f32], &[f32], &[f32]),
    one_call: bool,
) -> NormOut {
    let cols = w.len();
    let rows = x.len() / cols;
    let ms: Vec<B::Mat> = mats.iter().map(|t| be.load_mat(t).unwrap()).collect();
    let refs: Vec<&B::Mat> = ms.iter().collect();
    let (mut xb, yb, wv) = (
        upload(be, x, rows, cols),
        upload(be, y, rows, cols),
        vector(be, w),
    );
    let mut xn = be.buf(1, 1).unwrap();
    let mut outs: Vec<B::Buf> = mats.iter().map(|_| be.buf(1, 1).unwrap()).collect();
    let mut orefs: Vec<&mut B::Buf> = outs.iter_mut().collect();
    if one_call {
        be.add_rms_norm_matmul(&mut xb, &yb, &wv, 1e-6, &mut xn, &refs, &mut orefs)
            .unwrap();
    } else {
        be.add_rms_norm(&mut xb, &yb, &wv, 1e-6, &mut xn).unwrap();
        be.matmul_multi(&refs, &xn, &mut orefs).unwrap();
    }
    let o = outs.iter().map(|o| download(be, o)).collect();
    (download(be, &xb), download(be, &xn), o)
}

/// A decode row's residual add and norm finished inside the Q4_K GEMV that reads it (norm.rs
/// `norm_matmul_op`: `add_norm_part`, then `mvqm1x4u` scaling its sums by 1/rms; 8 rows,
/// a verify's, `mvrmq`; Q1_0's 8 rows `mvrmt_4`, its GLU `mvrtg_4`; Q1_0's and TQ2_0's one
/// row the streaming `mvs_R`, TQ2_0's GLU `mvsg_R`): x and the normed rows are the separate ops' bits, the projections
/// within float error of theirs (x·w is quantized, not x·w/rms: some values differ, which
/// shows the fold ran) and of the CPU's; without the fold (NEAGARI_CUDA_NORM_FOLD=0) the
/// one call is the separate ops, bit for bit. A matmul of the normed row afterwards
/// quantizes it afresh; the GLU form matches too.
///
/// "Within float error" allows a q8_1 code or two a call to round the other way: x·w and
/// x·w/rms are the same codes except where v/d lands within an ulp of a half (about 2e-6
/// of the values, so one call in eight has one). A flipped code moves its row's
/// projections by w·d: 1–2e-4 relative over 8 rows, 2–4e-4 over one (numpy, these shapes).
/// Seed 1241845939309039959 gives one in the 8-row GLU (1.22e-4, the same on every replay:
/// not a race). A wrong 1/rms or a lost tile is 1e-2 and more.
#[test]
fn norm_folded_into_gemv() {
    // Room for two flipped q8_1 codes in one row (see above).
    const FOLD_TOL: f64 = 1e-3;
    let Some(_) = gpu() else { return };
    let g = gpu_with(&[
        ("NEAGARI_CUDA_NORM_FOLD", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_ROWS", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_TILE", "1"),
        ("NEAGARI_CUDA_NORM_FOLD_STREAM", "1"),
    ]);
    let g0 = gpu_with(&[("NEAGARI_CUDA_NORM_FOLD", "0")]);
    let c = cpu();
    let mut r = rng();
    // Q4_K: the 27B's 5120 wide (three warps, two rounds for two of them), four matrices as
    // its DeltaNet in-projection (cut down); Llama 3 8B's 4096 wide (two warps, two rounds),
    // three matrices as its q/k/v. (At least 4 · 4 · 132 rows in all and 4096 wide: fewer
    // rows or narrower ones take 2-row blocks, not `mvqm1x4u`.) 8 rows of the first: the
    // ring GEMV. Q1_0 and TQ2_0, one row: the streaming GEMV `mvs_R` (the 27B's in-projection
    // shape: its blocks must be at least 5120 / 32, one a 32 values of the normed row); Q1_0,
    // 8 rows: `mvrmt_4`.
    let shapes: [(GgmlType, usize, usize, &[usize]); 6] = [
        (GgmlType::Q4_K, 1, 5120, &[2048, 1024, 64, 64]),
        (GgmlType::Q4_K, 1, 4096, &[2048, 512, 512]),
        (GgmlType::Q4_K, 8, 5120, &[2048, 1024, 64, 64]),
        (GgmlType::Q1_0, 8, 5120, &[2048, 1024, 64, 64]),
        (GgmlType::Q1_0, 1, 5120, &[10240, 6144, 64, 64]),
        (GgmlType::TQ2_0, 1, 5120, &[10240, 6144, 64, 64]),
    ];
    for (ty, n, cols, rows) in shapes {
        let mats: Vec<HostTensor> = rows
            .iter()
            .map(|&m| random_mat(&mut r, ty, m, cols).0)
            .collect();
        let (x, y, w) = (
            randv(&mut r, n * cols, 2.0),
            randv(&mut r, n * cols, 1.0),
            randv(&mut r, cols, 1.0),
        );
        let xyw = (&x[..], &y[..], &w[..]);
        let (xf, nf, of) = norm_then_matmul(&g, &mats, xyw, true);
        let (xs, ns, os) = norm_then_matmul(&g, &mats, xyw, false);
        let (x0, n0, o0) = norm_then_matmul(&g0, &mats, xyw, true);
        let (_, nc, oc) = norm_then_matmul(&c, &mats, xyw, true);
        let name = format!("norm into {ty:?} {cols} wide, {n} row(s)");
        assert_eq!(n_diff(&xf, &xs), 0, "{name}: x");
        assert_eq!(n_diff(&nf, &ns), 0, "{name}: normed row");
        assert_eq!(
            (n_diff(&x0, &xs), n_diff(&n0, &ns)),
            (0, 0),
            "{name}: unfolded"
        );
        let (of, os, o0, oc) = (of.concat(), os.concat(), o0.concat(), oc.concat());
        assert_eq!(n_diff(&o0, &os), 0, "{name}: unfolded projections");
        let d = n_diff(&of, &os);
        eprintln!(
            "{name}: {d} of {} projections differ from the separate ops'",
            of.len()
        );
        assert!(d > 0, "{name}: the fold did not run");
        check_float_op(&format!("{name} vs separate"), FOLD_TOL, os, of.clone());
        check_float_op(&format!("{name} vs CPU"), 3e-2, oc, of);
        check_float_op(&format!("{name}: normed row vs CPU"), 1e-5, nc, nf);
    }
    // A matmul of the normed rows after the fold (here Q8_0) takes a fresh q8_1 of them, not
    // the fold's q8_1 of x·w; and the GLU form: Q4_K's gate of 2048 × 5120 is past
    // GLU_FUSE_MAX (the GEMVs and the GLU kernel apart), one row and 8; Q1_0's one row
    // takes `mvs_R` over both, then the GLU kernel, its 8 rows `mvrtg_4`; TQ2_0's one row
    // `mvsg_R` (10240 rows: 160 blocks of 64). The 27B's Q1_0 gate/up at 8 rows: 544 tile
    // blocks in rounds of 2 an SM, the 16 left in parts of K (unless NEAGARI_CUDA_GLU_SPLIT=0
    // is set for the run).
    let cols = 5120;
    let glus: [(GgmlType, usize, &[usize]); 4] = [
        (GgmlType::Q4_K, 2048, &[1, 8]),
        (GgmlType::Q1_0, 2048, &[1, 8]),
        (GgmlType::Q1_0, 17408, &[8]),
        (GgmlType::TQ2_0, 10240, &[1]),
    ];
    for (ty, rows, counts) in glus {
        let (tg, tu) = (
            random_mat(&mut r, ty, rows, cols).0,
            random_mat(&mut r, ty, rows, cols).0,
        );
        let tq = random_mat(&mut r, GgmlType::Q8_0, 256, cols).0;
        for &n in counts {
            let (x, y, w) = (
                randv(&mut r, n * cols, 2.0),
                randv(&mut r, n * cols, 1.0),
                randv(&mut r, cols, 1.0),
            );
            let glu = |be: &CudaBackend, one_call: bool| {
                let (gm, um, qm) = (
                    be.load_mat(&tg).unwrap(),
                    be.load_mat(&tu).unwrap(),
                    be.load_mat(&tq).unwrap(),
                );
                let (mut xb, yb, wv) = (
                    upload(be, &x, n, cols),
                    upload(be, &y, n, cols),
                    vector(be, &w),
                );
                let (mut xn, mut gb, mut ub, mut qb) = (
                    be.buf(1, 1).unwrap(),
                    be.buf(1, 1).unwrap(),
                    be.buf(1, 1).unwrap(),
                    be.buf(1, 1).unwrap(),
                );
                if one_call {
                    be.add_rms_norm_matmul_glu(
                        &mut xb,
                        &yb,
                        &wv,
                        1e-6,
                        &mut xn,
                        (&gm, &um, &[]),
                        GluAct::Silu,
                        &mut gb,
                        &mut ub,
                    )
                    .unwrap();
                } else {
                    be.add_rms_norm(&mut xb, &yb, &wv, 1e-6, &mut xn).unwrap();
                    be.matmul_glu(&gm, &um, &xn, GluAct::Silu, &mut gb, &mut ub)
                        .unwrap();
                }
                be.matmul(&qm, &xn, &mut qb).unwrap();
                (download(be, &xn), download(be, &gb), download(be, &qb))
            };
            let name = format!("{ty:?} GLU fold, {n} row(s)");
            let (nf, gf, qf) = glu(&g, true);
            let (ns, gs, qs) = glu(&g, false);
            assert_eq!(n_diff(&nf, &ns), 0, "{name}: normed rows");
            assert_eq!(
                n_diff(&qf, &qs),
                0,
                "{name}: a later matmul of the normed rows"
            );
            let d = n_diff(&gf, &gs);
            eprintln!(
                "{name}: {d} of {} values differ from the separate ops'",
                gf.len()
            );
            assert!(d > 0, "{name}: the fold did not run");
            check_float_op(&format!("{name} vs separate"), FOLD_TOL, gs, gf);
        }
    }
}

struct QkInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    ff: Option<Vec<f32>>,
    rows: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
    with_norm: bool,
    rope_q: Rope,
    rope_k: Rope,
    pos0: usize,
}

/// `qk_norm_rope` (`fused`) or the norms and RoPE calls it stands for on a backend.
fn qk_run<B: Backend>(be: &B, fused: bool, a: &QkInputs) -> (Vec<f32>, Vec<f32>) {
    let mut qb = upload(be, &a.q, a.rows, a.nh * a.hd);
    let mut kb = upload(be, &a.k, a.rows, a.nkv * a.hd);
    let (wqv, wkv) = (vector(be, &a.wq), vector(be, &a.wk));
    let ffv = a.ff.as_ref().map(|f| vector(be, f));
    let (nq, nk) = if a.with_norm {
        (Some(&wqv), Some(&wkv))
    } else {
        (None, None)
    };
    if fused {
        be.qk_norm_rope(
            &mut qb,
            &mut kb,
            nq,
            nk,
            1e-6,
            a.hd,
            a.pos0,
            &a.rope_q,
            &a.rope_k,
            ffv.as_ref(),
        )
        .unwrap();
    } else {
        if let Some(w) = nq {
            be.rms_norm_inplace(&mut qb, w, 1e-6).unwrap();
        }
        if let Some(w) = nk {
            be.rms_norm_inplace(&mut kb, w, 1e-6).unwrap();
        }
        be.rope(&mut qb, a.hd, a.pos0, &a.rope_q, ffv.as_ref())
            .unwrap();
        be.rope(&mut kb, a.hd, a.pos0, &a.rope_k, ffv.as_ref())
            .unwrap();
    }
    (download(be, &qb), download(be, &kb))
}

/// `qk_norm_rope` (one launch) against the per-head norms and the two RoPE calls, on the
/// GPU (the same bits) and the CPU: with and without norms, both pairings, a partial
/// rotation, YaRN, frequency factors and a q-only attention factor (Gemma's scaled q).
#[test]
fn fused_qk_norm_rope() {
    let Some(g) = gpu() else { return };
    let c = cpu();
    let mut r = rng();
    let (yarn, partial) = crate::test_ropes();
    // (rope, head_dim, q heads, kv heads, norms, freq factors)
    let cases: Vec<(Rope, usize, usize, usize, bool, bool)> = vec![
        (Rope::plain(256, 10000.0, true), 256, 4, 1, true, false), // Gemma 3 270M
        (
            Rope::plain(256, 10_000_000.0, true),
            256,
            24,
            4,
            true,
            false,
        ), // Qwen3.6 27B
        (Rope::plain(128, 500000.0, false), 128, 32, 8, false, true), // Llama 3.1
        (Rope::plain(128, 1_000_000.0, true), 128, 16, 8, true, false),
        (yarn, 64, 6, 2, true, false),
        (partial, 64, 3, 3, true, false),
        (Rope::plain(80, 10000.0, true), 80, 5, 1, true, false), // ragged warp
    ];
    for (rope, hd, nh, nkv, with_norm, with_ff) in cases {
        for (rows, pos0) in [(1usize, 0usize), (1, 3000), (9, 17)] {
            for q_factor in [1.0f32, 0.0625] {
                let rope_q = Rope {
                    attn_factor: rope.attn_factor * q_factor,
                    ..rope
                };
                let q = randv(&mut r, rows * nh * hd, 2.0);
                let k = randv(&mut r, rows * nkv * hd, 2.0);
                let wq = randv(&mut r, hd, 1.5);
                let wk = randv(&mut r, hd, 1.5);
                let ff: Option<Vec<f32>> =
                    with_ff.then(|| (0..rope.dims / 2).map(|i| 1.0 + (i % 7) as f32).collect());
                let inp = QkInputs {
                    q,
                    k,
                    wq,
                    wk,
                    ff,
                    rows,
                    nh,
                    nkv,
                    hd,
                    with_norm,
                    rope_q,
                    rope_k: rope,
                    pos0,
                };
                let (qf, kf) = qk_run(&g, true, &inp);
                let (qs, ks) = qk_run(&g, false, &inp);
                let (qc, kc) = qk_run(&c, true, &inp);
                let name = format!(
                    "qk_norm_rope hd {hd} heads {nh}/{nkv} norm {with_norm} ff {with_ff} \
                     dims {} neox {} rows {rows} pos {pos0} q factor {q_factor}",
                    rope.dims, rope.neox
                );
                eprintln!(
                    "{name}: {} + {} values differ from the separate ops",
                    n_diff(&qf, &qs),
                    n_diff(&kf, &ks)
                );
                check_float_op(&format!("{name} q vs separate"), 1e-6, qs, qf.clone());
                check_float_op(&format!("{name} k vs separate"), 1e-6, ks, kf.clone());
                check_float_op(&format!("{name} q vs CPU"), 2e-5, qc, qf);
                check_float_op(&format!("{name} k vs CPU"), 2e-5, kc, kf);
            }
        }
    }
}

/// Prefill then decode steps of `attention_block` on a fresh cache (layer 1), every output.
#[allow(clippy::too_many_arguments)]
/// Each chunk's output, and where `wo` is given its product with `wo` (the output
/// projection, which reads the q8_1 the attention kernel wrote on the GPU).
fn attention_block_run<B: Backend>(
    be: &B,
    ty: KvType,
    wo: Option<&B::Mat>,
    attn: &Attn,
    gated: bool,
    rope: &Rope,
    norms: Option<(&[f32], &[f32])>,
    chunks: &[usize],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let hd = attn.head_dim;
    let qd = attn.n_heads * hd * if gated { 2 } else { 1 };
    let kvd = attn.n_kv_heads * hd;
    let n: usize = chunks.iter().sum();
    let mut kv = be
        .kv_alloc(&KvShape {
            n_layers: 2,
            n_ctx: n + 3,
            n_kv_heads: attn.n_kv_heads,
            head_dim: hd,
            ty,
        })
        .unwrap();
    let nv = norms.map(|(a, b)| (vector(be, a), vector(be, b)));
    let prep = QkPrep {
        q_norm: nv.as_ref().map(|(a, _)| a),
        k_norm: nv.as_ref().map(|(_, b)| b),
        eps: 1e-6,
        rope_q: rope,
        rope_k: rope,
        freq_factors: None,
    };
    let (mut all, mut proj, mut pos) = (Vec::new(), Vec::new(), 0);
    for &m in chunks {
        let mut qb = upload(be, &q[pos * qd..(pos + m) * qd], m, qd);
        let mut kb = upload(be, &k[pos * kvd..(pos + m) * kvd], m, kvd);
        let vb = upload(be, &v[pos * kvd..(pos + m) * kvd], m, kvd);
        let mut out = be.buf(1, 1).unwrap();
        be.attention_block(
            &mut kv, 1, pos, &mut qb, gated, &mut kb, &vb, &prep, attn, &mut out,
        )
        .unwrap();
        be.kv_commit(&mut kv, pos + m).unwrap();
        if let Some(w) = wo {
            let mut o = be.buf(1, 1).unwrap();
            be.matmul(w, &out, &mut o).unwrap();
            proj.extend(download(be, &o));
        }
        all.extend(download(be, &out));
        pos += m;
    }
    (all, proj)
}

/// `attention_block` in two launches (the default: `qk_norm_rope` reading a
/// gated layer's queries and storing k, v; `attention` gating its output) against the
/// separate GPU ops (the same arithmetic) and the CPU: Qwen3.6's gated heads with a partial
/// rotation, ungated with and without norms, and a cache long enough that the decode
/// steps split over the positions (`att_combine` gates); each over an f16 and a q8_0 cache
/// (`qk_norm_rope_q8` quantizing what `kv_store_q8` would).
#[test]
fn attention_block_fused_matches_the_ops() {
    let Some(gf) = gpu() else { return };
    let g = gpu_with(&[("NEAGARI_CUDA_FUSE_ATTN", "0")]);
    let c = cpu();
    let mut r = rng();
    // (heads, kv heads, head_dim, gated, norms, rotated dims, prefill rows, decode steps)
    let cases = [
        (
            24usize, 4usize, 256usize, true, true, 64usize, 20usize, 3usize,
        ), // Qwen3.6 27B
        (4, 1, 256, false, true, 256, 9, 2),  // Gemma 3 270M
        (8, 2, 128, false, false, 128, 5, 2), // Llama
        (2, 1, 64, true, true, 64, 600, 2),   // 2 heads: decode splits
    ];
    let typed = cases
        .iter()
        .flat_map(|&c| [(KvType::F16, c), (KvType::Q8_0, c)]);
    for (ty, (nh, nkv, hd, gated, with_norm, dims, n0, steps)) in typed {
        let attn = Attn {
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            softcap: None,
        };
        let rope = Rope::plain(dims, 10_000_000.0, true);
        let n = n0 + steps;
        let qd = nh * hd * if gated { 2 } else { 1 };
        let q = randv(&mut r, n * qd, 2.0);
        let k = randv(&mut r, n * nkv * hd, 2.0);
        let v = randv(&mut r, n * nkv * hd, 1.0);
        let (wq, wk) = (randv(&mut r, hd, 1.5), randv(&mut r, hd, 1.5));
        let norms = with_norm.then_some((&wq[..], &wk[..]));
        let mut chunks = vec![n0];
        chunks.extend(std::iter::repeat_n(1, steps));
        // The output projection reads the q8_1 that attention (or att_combine) wrote.
        let (t, deq) = random_mat(&mut r, GgmlType::Q8_0, 48, nh * hd);
        let wo = gf.load_mat(&t).expect("load_mat");
        let (fused, proj) = attention_block_run(
            &gf,
            ty,
            Some(&wo),
            &attn,
            gated,
            &rope,
            norms,
            &chunks,
            &q,
            &k,
            &v,
        );
        let want = exact_product(&deq, &fused, 48, nh * hd);
        let e = rel(&proj, &want);
        eprintln!("attention → output projection: rel error {e:.2e}");
        assert!(e < 1.2e-2, "attention {nh}x{hd} → q8_1 → matmul: {e:.2e}");
        let (ops, _) = attention_block_run(
            &g, ty, None, &attn, gated, &rope, norms, &chunks, &q, &k, &v,
        );
        let (host, _) = attention_block_run(
            &c, ty, None, &attn, gated, &rope, norms, &chunks, &q, &k, &v,
        );
        let name =
            format!("attention_block {ty:?} {nh}/{nkv}x{hd} gated {gated} norms {with_norm}");
        eprintln!(
            "{name}: {} of {} values differ from the separate ops",
            n_diff(&fused, &ops),
            ops.len()
        );
        check_float_op(
            &format!("{name} vs separate GPU ops"),
            1e-6,
            ops,
            fused.clone(),
        );
        // The CPU's softmax weights are rounded to f16 (attention_matches_the_cpu).
        check_float_op(&format!("{name} vs CPU"), 3e-3, host, fused);
    }
}
