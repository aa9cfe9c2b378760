//! The row-wise float ops split a prefill's rows across the thread pool: every value must
//! be what one thread computes (bit for bit), on fresh random data, for 1, 2 and 3 threads,
//! and a decode-sized buffer (inline) must agree with the same rows of a big one.

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{Backend, GluAct, HostTensor, Rope, SharedBytes};
use neagari_quant::GgmlType;
use rand::{Rng, SeedableRng};

/// Every op on `[rows, cols]` buffers, results read back in order.
fn run(threads: usize, rows: usize, x: &[f32], y: &[f32], w: &[f32]) -> Vec<Vec<f32>> {
    let be = CpuBackend::new(&CpuOptions {
        threads,
        scalar_only: false,
    });
    let cols = 1024;
    let n = rows * cols;
    let buf = |v: &[f32]| {
        let mut b = be.buf(rows, cols).expect("buf");
        be.write(&mut b, &v[..n], rows, cols).expect("write");
        b
    };
    let read = |b: &<CpuBackend as Backend>::Buf| {
        let mut h = vec![0f32; n];
        be.read(b, 0, rows, &mut h).expect("read");
        h
    };
    let mut out = Vec::new();
    let wv = be
        .load_vector(&HostTensor {
            name: "w".into(),
            ty: GgmlType::F32,
            shape: vec![256],
            bytes: SharedBytes::from_vec(w[..256].iter().flat_map(|v| v.to_le_bytes()).collect()),
        })
        .expect("vector");
    let mut a = buf(x);
    be.rms_norm_inplace(&mut a, &wv, 1e-6).expect("rms_norm");
    out.push(read(&a));
    let mut a = buf(x);
    be.add(&mut a, &buf(y)).expect("add");
    out.push(read(&a));
    for act in [GluAct::GeluTanh, GluAct::Silu] {
        let mut a = buf(x);
        be.glu(&mut a, &buf(y), act).expect("glu");
        out.push(read(&a));
    }
    for neox in [false, true] {
        let mut a = buf(x);
        be.rope(&mut a, 256, 37, &Rope::plain(256, 10_000.0, neox), None)
            .expect("rope");
        out.push(read(&a));
    }
    out
}

#[test]
fn row_ops_across_threads_are_bit_identical() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7061);
    let rows = 133;
    let n = rows * 1024;
    let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-12.0f32..12.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
    let w: Vec<f32> = (0..256).map(|_| rng.gen_range(0.5f32..1.5)).collect();
    let one = run(1, rows, &x, &y, &w);
    for threads in [2, 3] {
        let many = run(threads, rows, &x, &y, &w);
        for (k, (a, b)) in one.iter().zip(&many).enumerate() {
            assert!(
                a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits()),
                "op {k} differs with {threads} threads"
            );
        }
    }
    // Two rows stay below the split threshold; RoPE of the first two rows at the same
    // positions, norms, adds and GLUs row by row must equal the big buffer's rows.
    let small = run(2, 2, &x, &y, &w);
    for (k, (a, b)) in one.iter().zip(&small).enumerate() {
        assert!(
            b.iter().zip(a).all(|(p, q)| p.to_bits() == q.to_bits()),
            "op {k}: inline rows differ from split rows"
        );
    }
}
