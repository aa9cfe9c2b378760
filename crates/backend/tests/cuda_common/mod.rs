//! Helpers shared by the GPU suites (`cuda_ops.rs`, `cuda_hybrid.rs`, `cuda_gemv_rows.rs`):
//! the device or a printed reason to skip, the CPU backend they compare with, seeded random
//! inputs, the relative error measure, host tensors, buffers up and down.
// Each suite uses some of them.
#![allow(dead_code)]

use std::io::Write;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::cuda::{probe, CudaBackend};
use neagari_backend::{Backend, HostTensor, SharedBytes};
use neagari_quant::GgmlType;
use rand::{rngs::StdRng, Rng, SeedableRng};

/// GPU 0, or `None` with a note on stderr where no CUDA device is usable (CI).
pub fn gpu() -> Option<CudaBackend> {
    if let Some(why) = probe().unavailable {
        // Straight to stderr: the test harness would swallow eprintln! of a passing test.
        let _ = writeln!(std::io::stderr(), "note: skipping a CUDA test: {why}");
        return None;
    }
    let _env = env_lock();
    Some(CudaBackend::new(0).expect("open GPU 0"))
}

/// Held while a backend is opened: the NEAGARI_CUDA_* settings one test sets (the
/// process's environment) must not reach a backend another test opens beside it.
fn env_lock() -> std::sync::MutexGuard<'static, ()> {
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// GPU 0 opened with these NEAGARI_CUDA_* settings (the backend reads them once, when it
/// is made); they are unset again after.
pub fn gpu_with(vars: &[(&str, &str)]) -> CudaBackend {
    let _env = env_lock();
    for (k, v) in vars {
        std::env::set_var(k, v);
    }
    let g = CudaBackend::new(0).expect("open GPU 0");
    for (k, _) in vars {
        std::env::remove_var(k);
    }
    g
}

pub fn cpu() -> CpuBackend {
    CpuBackend::new(&CpuOptions {
        threads: 2,
        scalar_only: false,
    })
}

/// Fresh inputs every run; the seed is printed so a failure can be replayed (NEAGARI_SEED).
pub fn rng() -> StdRng {
    let seed: u64 = std::env::var("NEAGARI_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

pub fn randv(r: &mut StdRng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| r.gen_range(-amp..amp)).collect()
}

/// ‖a − b‖ / ‖b‖; a non-finite output fails.
pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        assert!(x.is_finite(), "non-finite output {x}");
        num += ((x - y) as f64).powi(2);
        den += (*y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// An f32 vector (a norm's weight) on `be`.
pub fn vector<B: Backend>(be: &B, v: &[f32]) -> B::Vector {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    be.load_vector(&tensor("v", GgmlType::F32, vec![v.len()], bytes))
        .expect("vector")
}

pub fn tensor(name: &str, ty: GgmlType, shape: Vec<usize>, bytes: Vec<u8>) -> HostTensor {
    HostTensor {
        name: name.into(),
        ty,
        shape,
        bytes: SharedBytes::from_vec(bytes),
    }
}

/// The integer GEMV computes `deq · x` with x as its quant_q8_1 rounds it (int8 codes per
/// 32 values, d = max|v| / 127, ties to even), up to f32 sums: held to that product, on
/// the host in f64, within 1e-4.
pub fn check_q8_1(got: &[f32], deq: &[f32], x: &[f32], rows: usize, cols: usize, what: &str) {
    let xr: Vec<f32> = x
        .chunks(32)
        .flat_map(|u| {
            let amax = u.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            u.iter().map(move |&v| {
                if amax == 0.0 {
                    0.0
                } else {
                    (v / d).round_ties_even() * d
                }
            })
        })
        .collect();
    let e = rel(got, &exact_product(deq, &xr, rows, cols));
    assert!(e < 1e-4, "{what}: {e:.2e} from the q8_1-rounded product");
}

/// `deq [rows, cols]` · `x [n, cols]` in f64.
pub fn exact_product(deq: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let n = x.len() / cols;
    let mut out = vec![0f32; n * rows];
    for i in 0..n {
        for j in 0..rows {
            let mut s = 0f64;
            for k in 0..cols {
                s += deq[j * cols + k] as f64 * x[i * cols + k] as f64;
            }
            out[i * rows + j] = s as f32;
        }
    }
    out
}

/// A random `[rows, cols]` matrix of type `ty` and its exact dequantized values.
pub fn random_mat(
    r: &mut StdRng,
    ty: GgmlType,
    rows: usize,
    cols: usize,
) -> (HostTensor, Vec<f32>) {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    let mut bytes = vec![0u8; rb * rows];
    for row in 0..rows {
        let v = randv(r, cols, 1.0);
        neagari_quant::quantize_row(ty, &v, &mut bytes[row * rb..(row + 1) * rb]).expect("quant");
    }
    let mut deq = vec![0f32; rows * cols];
    for row in 0..rows {
        neagari_quant::dequantize_row(
            ty,
            &bytes[row * rb..(row + 1) * rb],
            &mut deq[row * cols..(row + 1) * cols],
        )
        .expect("dequant");
    }
    (tensor("w", ty, vec![rows, cols], bytes), deq)
}

/// `x` (`rows` × `cols`) in a new buffer of `be`.
pub fn upload<B: Backend>(be: &B, x: &[f32], rows: usize, cols: usize) -> B::Buf {
    let mut b = be.buf(rows, cols).expect("buf");
    be.write(&mut b, x, rows, cols).expect("write");
    b
}

/// A buffer of `be` back on the host.
pub fn download<B: Backend>(be: &B, b: &B::Buf) -> Vec<f32> {
    let (rows, cols) = be.buf_shape(b);
    let mut h = vec![f32::NAN; rows * cols];
    be.read(b, 0, rows, &mut h).expect("read");
    h
}

/// Differing values of two outputs (0: the same bits).
pub fn n_diff(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}
