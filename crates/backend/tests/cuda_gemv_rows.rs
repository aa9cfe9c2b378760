//! The tensor-core GEMV of 3–8 activation rows (gemv_rows.cu, the verify forward's
//! matmuls) on the GPU: every kernel shape (tiles a block, K parts, by group, through the
//! ring of group slots) against the q8_1-rounded product, the dp4a GEMV and each other bit
//! for bit, on fresh random inputs with ragged shapes.
//!
//! Runs only where a CUDA GPU is usable; elsewhere (CI) each test prints why and passes.
#![cfg(feature = "cuda")]

mod cuda_common;
use cuda_common::{
    check_q8_1, cpu, download, exact_product, gpu, gpu_with, n_diff, random_mat, randv, rel, rng,
    upload,
};

use neagari_backend::cuda::CudaBackend;
use neagari_backend::Backend;
use neagari_quant::GgmlType;

/// The tensor-core GEMV of 3–8 activation rows (gemv_rows.cu) on every format that has
/// one (the per-16 K-quants' two mma a unit too), 2–8 rows, ragged shapes (rows not a
/// multiple of its 16, a few units per warp and many): the q8_1-rounded product
/// (`check_q8_1`), close to the dp4a GEMV it replaces (`NEAGARI_CUDA_MV_TC=0`) and to the
/// tile loaded into registers (NEAGARI_CUDA_MVRT=0; sm_90 takes it by bulk copy), and
/// `matmul_multi` equal to the single matmuls bit for bit.
#[test]
fn multi_row_gemv_on_tensor_cores() {
    let Some(_) = gpu() else { return };
    // With Q3_K's, Q5_K's and Q6_K's `mvr` too (opt-in: NEAGARI_CUDA_MVR_K16).
    let k16 = ("NEAGARI_CUDA_MVR_K16", "1");
    // The 8-warp kernels throughout, so `matmul_multi` is the single products' bits (a
    // small single matrix takes `mvrt_4w` by default: `wide_tile_gemv_on_narrow_grids`).
    let g = gpu_with(&[k16, ("NEAGARI_CUDA_MVRT_W16", "0")]);
    let def = gpu_with(&[]);
    let off = gpu_with(&[("NEAGARI_CUDA_MV_TC", "0")]);
    // The tiles loaded into registers (`mvr`) rather than by bulk copies (`mvrt_*`, sm_90).
    let regs = gpu_with(&[("NEAGARI_CUDA_MVRT", "0"), k16]);
    let c = cpu();
    let mut r = rng();
    for ty in [
        GgmlType::Q1_0,
        GgmlType::TQ2_0,
        GgmlType::Q4_K,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
        GgmlType::Q5_K,
        GgmlType::Q3_K,
        GgmlType::Q2_K,
    ] {
        let block = if ty.row_bytes(32).is_some() { 32 } else { 256 };
        // The formats without a bulk-copy tile (`mvr` only) need no tile shapes.
        let tiled = matches!(ty, GgmlType::Q1_0 | GgmlType::TQ2_0 | GgmlType::Q4_K);
        // `mvrt_*` takes 4, 2 or 1 tiles a block by the row's size (Q1_0: 48, 80 and 144
        // blocks a row; TQ2_0: 3, 20 and 24 or 48; Q4_K: 7, 20 and 24) and splits K where no
        // tile of whole rows fits (Q4_K's 144 blocks: 2 tiles of 4 parts); every shape is
        // forced below.
        for (rows, cols) in [
            (5, block),
            (37, block * 3),
            (130, block * 20),
            (16, block * 7),
            (19, block * 24),
            (19, block * 48),
            (19, block * 80),
            (19, block * 144),
        ] {
            if !tiled && rows == 19 && cols != block * 24 {
                continue;
            }
            let (t, deq) = random_mat(&mut r, ty, rows, cols);
            let (m, mo, mc, mr) = (
                g.load_mat(&t).unwrap(),
                off.load_mat(&t).unwrap(),
                c.load_mat(&t).unwrap(),
                regs.load_mat(&t).unwrap(),
            );
            assert!(
                g.gemv_rows_on(&m, 8),
                "{ty}: 8 rows not on the tensor cores"
            );
            assert!(
                !off.gemv_rows_on(&mo, 8),
                "{ty}: NEAGARI_CUDA_MV_TC=0 ignored"
            );
            let opt_in = matches!(ty, GgmlType::Q3_K | GgmlType::Q5_K | GgmlType::Q6_K);
            assert_eq!(
                def.gemv_rows_on(&def.load_mat(&t).unwrap(), 8),
                !opt_in,
                "{ty}: the default's choice of kernel for 8 rows"
            );
            let (t2, _) = random_mat(&mut r, ty, 21, cols);
            let m2 = g.load_mat(&t2).unwrap();
            for n in 2..=8usize {
                let x = randv(&mut r, n * cols, 1.0);
                let want = exact_product(&deq, &x, rows, cols);
                let mut out = g.buf(1, 1).unwrap();
                g.matmul(&m, &upload(&g, &x, n, cols), &mut out).unwrap();
                assert_eq!(g.buf_shape(&out), (n, rows));
                let got = download(&g, &out);
                let mut oo = off.buf(1, 1).unwrap();
                off.matmul(&mo, &upload(&off, &x, n, cols), &mut oo)
                    .unwrap();
                let dp4a = download(&off, &oo);
                let mut ro = regs.buf(1, 1).unwrap();
                regs.matmul(&mr, &upload(&regs, &x, n, cols), &mut ro)
                    .unwrap();
                // The tile in shared memory takes 8 warps a block, so its units meet in
                // another order.
                let er = rel(&got, &download(&regs, &ro));
                assert!(
                    er < 1e-4,
                    "{ty} {rows}x{cols}, {n} rows: bulk-copy tile vs register tile {er:.2e}"
                );
                let mut co = c.buf(1, 1).unwrap();
                c.matmul(&mc, &upload(&c, &x, n, cols), &mut co).unwrap();
                let ce = rel(&download(&c, &co), &want);
                let (e, eo) = (rel(&got, &want), rel(&got, &dp4a));
                eprintln!(
                    "{ty} {rows}x{cols}, {n} rows: tensor cores {e:.2e}, dp4a {:.2e}, CPU \
                     {ce:.2e}; tensor cores vs dp4a {eo:.2e}",
                    rel(&dp4a, &want)
                );
                check_q8_1(
                    &got,
                    &deq,
                    &x,
                    rows,
                    cols,
                    &format!("{ty} {rows}x{cols}, {n} rows"),
                );
                // The same integer dots, summed in another order.
                assert!(eo < 1e-4, "{ty} {rows}x{cols}, {n} rows: vs dp4a {eo:.2e}");
                // Two matrices in one launch: the single products exactly.
                let xb = upload(&g, &x, n, cols);
                let (mut a, mut b) = (g.buf(1, 1).unwrap(), g.buf(1, 1).unwrap());
                g.matmul_multi(&[&m, &m2], &xb, &mut [&mut a, &mut b])
                    .unwrap();
                let mut b1 = g.buf(1, 1).unwrap();
                g.matmul(&m2, &xb, &mut b1).unwrap();
                assert!(
                    download(&g, &a) == got,
                    "{ty} {rows}x{cols}, {n} rows: multi"
                );
                assert!(
                    download(&g, &b) == download(&g, &b1),
                    "{ty} {rows}x{cols}, {n} rows: multi, second matrix"
                );
            }
        }
    }
    if g.gemv_rows_plan(
        &g.load_mat(&random_mat(&mut r, GgmlType::Q1_0, 16, 1024).0)
            .unwrap(),
        8,
    )
    .is_none()
    {
        eprintln!("no bulk-copy tile GEMV on this GPU (sm_90+)");
        return;
    }
    // The 27B's rows take the shapes measured for them (docs/BENCHMARKS.md): TQ2_0's rows
    // end in half a group of its layout and stay whole; Q4_K's ffn_down, whose tile would
    // not fit whole, goes through the ring in 2-tile blocks of whole rows (MVRQ_TILES;
    // split in 4 parts without it); Q1_0's ffn_down in thirds for twice the tiles.
    for (ty, cols, want) in [
        (GgmlType::Q1_0, 5120, (4, 1)),
        (GgmlType::Q1_0, 17408, (4, 3)),
        (GgmlType::TQ2_0, 5120, (4, 1)),
        (GgmlType::TQ2_0, 17408, (1, 1)),
        (GgmlType::Q4_K, 5120, (2, 1)),
        (GgmlType::Q4_K, 17408, (2, 1)),
    ] {
        let m = g.load_mat(&random_mat(&mut r, ty, 16, cols).0).unwrap();
        assert_eq!(g.gemv_rows_plan(&m, 8), Some(want), "{ty} {cols}-wide rows");
    }
    // Every (tiles a block, K parts) shape of `mvrt_*`, forced, against `mvr`: rows of 10
    // groups (Q1_0, Q4_K; 4 parts cut them 3, 3, 3, 1, 3 parts 4, 4, 2) fit all; TQ2_0's two
    // lengths share them but 3 parts (4 whole-row tiles fit only its 2 groups, 4 parts need
    // more, 3 parts of 4 groups leave the last none). 37 rows: a ragged last tile.
    let mut seen = std::collections::HashSet::new();
    for (mt, parts) in [
        (4, 1),
        (2, 1),
        (1, 1),
        (4, 2),
        (2, 2),
        (1, 2),
        (4, 4),
        (2, 4),
        (1, 4),
        (4, 3),
        (2, 3),
        (1, 3),
    ] {
        // This shape (tiles a block, K parts) and the settings given.
        let (mt_s, parts_s) = (mt.to_string(), parts.to_string());
        // Eight warps a block everywhere: `mvrt_4w` (a one-matrix grid under the SMs, 37
        // rows here) sums in another order than the by-group kernels; its own test is below.
        let gpu_with = |extra: &[(&str, &str)]| {
            let mut v = vec![
                ("NEAGARI_CUDA_MVRT", mt_s.as_str()),
                ("NEAGARI_CUDA_MVRT_SPLIT", parts_s.as_str()),
                ("NEAGARI_CUDA_MVRT_W16", "0"),
            ];
            v.extend_from_slice(extra);
            gpu_with(&v)
        };
        // The tile by group (`mvrc_*`, every format: rows are whole groups at all four
        // widths below), against the same shape with the tile in one copy.
        let (mvrc, mvrq) = ("NEAGARI_CUDA_MVRC", "NEAGARI_CUDA_MVRQ");
        let fb = gpu_with(&[(mvrc, "1"), (mvrq, "0")]);
        // By group through a ring of two slots (`mvrq_*`), where more groups than that.
        let ring = gpu_with(&[(mvrc, "1"), (mvrq, "2")]);
        let one = gpu_with(&[(mvrc, "0")]);
        // The K parts meeting in a cluster always (NEAGARI_CUDA_MVRT_CLUSTER=1; by default
        // 2 parts only) and never (=0: through global memory), in one bulk copy, by group
        // (one tensor copy, `mvrc`) and through the ring: the same sums in the same order.
        let clu = "NEAGARI_CUDA_MVRT_CLUSTER";
        let one_cl = gpu_with(&[(mvrc, "0"), (clu, "1")]);
        let one_nc = gpu_with(&[(mvrc, "0"), (clu, "0")]);
        let fb_nc = gpu_with(&[(mvrc, "1"), (mvrq, "0"), (clu, "0")]);
        let ring_nc = gpu_with(&[(mvrc, "1"), (mvrq, "2"), (clu, "0")]);
        for (ty, cols) in [
            (GgmlType::Q1_0, 10240),
            (GgmlType::Q4_K, 2560),
            (GgmlType::TQ2_0, 4096),
            (GgmlType::TQ2_0, 8192),
        ] {
            let (t, deq) = random_mat(&mut r, ty, 37, cols);
            let (t2, _) = random_mat(&mut r, ty, 21, cols);
            let (m, m2, mr) = (
                fb.load_mat(&t).unwrap(),
                fb.load_mat(&t2).unwrap(),
                regs.load_mat(&t).unwrap(),
            );
            if fb.gemv_rows_plan(&m, 8) != Some((mt, parts)) {
                continue;
            }
            for n in [3usize, 8] {
                let x = randv(&mut r, n * cols, 1.0);
                let what = format!("{ty} 37x{cols}, {n} rows, {mt} tiles, {parts} parts");
                let xb = upload(&fb, &x, n, cols);
                let mut out = fb.buf(1, 1).unwrap();
                fb.matmul(&m, &xb, &mut out).unwrap();
                let got = download(&fb, &out);
                let mut ro = regs.buf(1, 1).unwrap();
                regs.matmul(&mr, &upload(&regs, &x, n, cols), &mut ro)
                    .unwrap();
                let er = rel(&got, &download(&regs, &ro));
                assert!(er < 1e-4, "{what}: vs register tile {er:.2e}");
                check_q8_1(&got, &deq, &x, 37, cols, &what);
                // By group or in one copy, the same arithmetic in the same order.
                let mut oo = one.buf(1, 1).unwrap();
                one.matmul(
                    &one.load_mat(&t).unwrap(),
                    &upload(&one, &x, n, cols),
                    &mut oo,
                )
                .unwrap();
                assert!(download(&one, &oo) == got, "{what}: by group vs one copy");
                let mut qo = ring.buf(1, 1).unwrap();
                let rm = ring.load_mat(&t).unwrap();
                let rxb = upload(&ring, &x, n, cols);
                ring.matmul(&rm, &rxb, &mut qo).unwrap();
                assert!(download(&ring, &qo) == got, "{what}: ring vs by group");
                let (mut ra, mut rb) = (ring.buf(1, 1).unwrap(), ring.buf(1, 1).unwrap());
                let rm2 = ring.load_mat(&t2).unwrap();
                ring.matmul_multi(&[&rm, &rm2], &rxb, &mut [&mut ra, &mut rb])
                    .unwrap();
                assert!(download(&ring, &ra) == got, "{what}: ring, multi");
                for (nc, how) in [
                    (&one_cl, "one copy, clusters"),
                    (&one_nc, "one copy, no cluster"),
                    (&fb_nc, "by group, no cluster"),
                    (&ring_nc, "ring, no cluster"),
                ] {
                    let (ncm, ncm2) = (nc.load_mat(&t).unwrap(), nc.load_mat(&t2).unwrap());
                    let ncx = upload(nc, &x, n, cols);
                    let mut o = nc.buf(1, 1).unwrap();
                    nc.matmul(&ncm, &ncx, &mut o).unwrap();
                    assert!(download(nc, &o) == got, "{what}: {how}");
                    let (mut a, mut b) = (nc.buf(1, 1).unwrap(), nc.buf(1, 1).unwrap());
                    nc.matmul_multi(&[&ncm, &ncm2], &ncx, &mut [&mut a, &mut b])
                        .unwrap();
                    assert!(download(nc, &a) == got, "{what}: {how}, multi");
                }
                let (mut a, mut b) = (fb.buf(1, 1).unwrap(), fb.buf(1, 1).unwrap());
                fb.matmul_multi(&[&m, &m2], &xb, &mut [&mut a, &mut b])
                    .unwrap();
                let mut b1 = fb.buf(1, 1).unwrap();
                fb.matmul(&m2, &xb, &mut b1).unwrap();
                assert!(download(&fb, &a) == got, "{what}: multi");
                assert!(
                    download(&fb, &b) == download(&fb, &b1),
                    "{what}: multi, second matrix"
                );
            }
            seen.insert((ty, mt, parts));
        }
    }
    // Every format ran every shape.
    assert_eq!(seen.len(), 33, "{seen:?}");
}

/// The 8-row GEMV by group through a ring of slots (`mvrq_*`, NEAGARI_CUDA_MVRQ) against
/// the same kernel with every group in flight (`mvrc_*`) bit for bit, on matrices of
/// thousands of blocks and repeated launches (the ring's slots are reused several times a
/// block: a phase taken too early reads a slot before its group lands). One run of the
/// 27B Q4_K head at 8 slots once differed (max rel 1.1e-1 against the dp4a reference,
/// `examples/cuda_gemv`) before the slot reads were fenced from the next bulk copy; this
/// passed on the H200 before the ring became the default (BENCHMARKS session 30).
#[test]
fn ring_gemv_equals_by_group() {
    let Some(_) = gpu() else { return };
    let fb = gpu_with(&[("NEAGARI_CUDA_MVRC", "1"), ("NEAGARI_CUDA_MVRQ", "0")]);
    // (slots, tiles of whole rows: NEAGARI_CUDA_MVRQ_TILES, 0 none)
    let rings: Vec<(String, CudaBackend)> =
        [(4usize, "0"), (8, "0"), (12, "0"), (8, "2"), (8, "4")]
            .into_iter()
            .map(|(n, tiles)| {
                let what = format!("{n} slots, whole-row tiles {tiles:?}");
                let slots = n.to_string();
                let be = gpu_with(&[
                    ("NEAGARI_CUDA_MVRC", "1"),
                    ("NEAGARI_CUDA_MVRQ", slots.as_str()),
                    ("NEAGARI_CUDA_MVRQ_TILES", tiles),
                ]);
                (what, be)
            })
            .collect();
    let probe = fb
        .load_mat(&random_mat(&mut rng(), GgmlType::Q4_K, 16, 5120).0)
        .unwrap();
    if fb.gemv_rows_plan(&probe, 8).is_none() {
        eprintln!("no bulk-copy tile GEMV on this GPU (sm_90+)");
        return;
    }
    let mut r = rng();
    // (format, rows, cols): 5120-wide rows are 20 Q4_K groups (5 of a warp's), 5 of Q1_0's.
    for (ty, rows, cols) in [
        (GgmlType::Q4_K, 32768, 5120),
        (GgmlType::Q4_K, 4096, 17408),
        (GgmlType::Q1_0, 16384, 10240),
        (GgmlType::TQ2_0, 8192, 8192),
    ] {
        let (t, _) = random_mat(&mut r, ty, rows, cols);
        let m = fb.load_mat(&t).unwrap();
        for n in [3usize, 8] {
            let x = randv(&mut r, n * cols, 1.0);
            let mut out = fb.buf(1, 1).unwrap();
            fb.matmul(&m, &upload(&fb, &x, n, cols), &mut out).unwrap();
            let want = download(&fb, &out);
            for (what, ring) in &rings {
                let rm = ring.load_mat(&t).unwrap();
                let xb = upload(ring, &x, n, cols);
                // Whole rows through the ring where the tile of one would not fit (Q4_K
                // 17,408 wide, NEAGARI_CUDA_MVRQ_TILES): the same sums in another order.
                let same = ring.gemv_rows_plan(&rm, n) == fb.gemv_rows_plan(&m, n);
                // Back to back (each launch may start while the one before finishes),
                // then read.
                let mut outs: Vec<_> = (0..8).map(|_| ring.buf(1, 1).unwrap()).collect();
                for o in &mut outs {
                    ring.matmul(&rm, &xb, o).unwrap();
                }
                for (rep, o) in outs.iter().enumerate() {
                    let got = download(ring, o);
                    let bad = if same {
                        n_diff(&got, &want)
                    } else {
                        (rel(&got, &want) > 1e-5) as usize
                    };
                    assert!(
                        bad == 0,
                        "{ty} {rows}x{cols}, {n} rows, {what}, launch {rep}: {bad} \
                         values differ from by group (rel {:.1e})",
                        rel(&got, &want)
                    );
                }
            }
        }
    }
}

/// One matrix on 4 whole-row tiles whose grid leaves SMs without a block takes `mvrt_4w`,
/// twice the warps each on half of K's steps (the 27B's ssm_out and o, 5,120 rows: 80
/// blocks). The warps' sums meet in another order, so the product is `mvrt_4`'s
/// (NEAGARI_CUDA_MVRT_W16=0) within float error, not its bits; a matrix of many blocks
/// keeps `mvrt_4`.
#[test]
fn wide_tile_gemv_on_narrow_grids() {
    let Some(_) = gpu() else { return };
    let def = gpu_with(&[("NEAGARI_CUDA_MVRT_W16", "0")]);
    let wide = gpu_with(&[]);
    let mut r = rng();
    let probe = def
        .load_mat(&random_mat(&mut r, GgmlType::Q1_0, 16, 5120).0)
        .unwrap();
    if def.gemv_rows_plan(&probe, 8).is_none() {
        eprintln!("no bulk-copy tile GEMV on this GPU (sm_90+)");
        return;
    }
    // (format, rows, cols, whether mvrt_4w runs): 5,120 rows of 4 tiles are 80 blocks,
    // under any sm_90 part's SMs (114–132); 16,384 rows are 256. 1,000 rows: a ragged
    // last tile.
    for (ty, rows, cols, runs) in [
        (GgmlType::Q1_0, 5120, 6144, true),
        (GgmlType::TQ2_0, 5120, 5120, true),
        (GgmlType::Q1_0, 1000, 5120, true),
        (GgmlType::Q1_0, 16384, 5120, false),
    ] {
        let (t, deq) = random_mat(&mut r, ty, rows, cols);
        let (md, mw) = (def.load_mat(&t).unwrap(), wide.load_mat(&t).unwrap());
        for n in [3usize, 8] {
            let x = randv(&mut r, n * cols, 1.0);
            let mut od = def.buf(1, 1).unwrap();
            def.matmul(&md, &upload(&def, &x, n, cols), &mut od)
                .unwrap();
            let xw = upload(&wide, &x, n, cols);
            let mut ow = wide.buf(1, 1).unwrap();
            wide.profile_begin().unwrap();
            wide.matmul(&mw, &xw, &mut ow).unwrap();
            let names: Vec<String> = wide
                .profile_end()
                .unwrap()
                .into_iter()
                .map(|k| k.name)
                .collect();
            let what = format!("{ty} {rows}x{cols}, {n} rows");
            assert_eq!(
                names.iter().any(|k| k == "mvrt_4w"),
                runs,
                "{what}: kernels {names:?}"
            );
            let (got, want) = (download(&wide, &ow), download(&def, &od));
            let e = rel(&got, &want);
            eprintln!("{what}: mvrt_4w vs mvrt_4 {e:.2e} ({names:?})");
            if runs {
                assert!(e < 1e-5, "{what}: vs mvrt_4 {e:.2e}");
            } else {
                assert_eq!(n_diff(&got, &want), 0, "{what}: not mvrt_4's bits");
            }
            check_q8_1(&got, &deq, &x, rows, cols, &what);
        }
    }
}
