//! GEMV speed on the CUDA backend at the Qwen3.6-27B decode step's shapes, with the weights
//! cold in L2 (each call reads another copy of the matrices, 256 MB or more in all, so they
//! come from DRAM as in a real step). Prints µs a call and the read rate. `ROWS=8` times
//! 8 activation rows (the verify of a speculative block) instead of one. The kernels' knobs
//! are the backend's NEAGARI_CUDA_* variables (cuda/mod.rs).
//!
//!     [ROWS=N] [SHAPES="name=RxC+RxC;…"] cargo run --release -p neagari-backend --example cuda_gemv -- [TYPE ...]
#![cfg_attr(not(feature = "cuda"), allow(unused))]

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use neagari_backend::cuda::{probe, CudaBackend};
    use neagari_backend::{Backend, HostTensor, SharedBytes};
    use neagari_quant::GgmlType;
    use std::time::Instant;

    if let Some(why) = probe().unavailable {
        println!("no CUDA device: {why}");
        return Ok(());
    }
    let be = CudaBackend::new(0)?;
    // The same products on the default kernels of every other knob's value, to check
    // the measured kernel's bits against (NEAGARI_CUDA_MVS=0 and NEAGARI_CUDA_MV_TC=0:
    // gemv_int.cu's).
    let knobs = ["NEAGARI_CUDA_MVS", "NEAGARI_CUDA_MV_TC"];
    let saved: Vec<_> = knobs.iter().map(|k| std::env::var(k).ok()).collect();
    for k in knobs {
        std::env::set_var(k, "0");
    }
    let reference = CudaBackend::new(0)?;
    for (k, v) in knobs.iter().zip(&saved) {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
    let nr: usize = match std::env::var("ROWS") {
        Ok(v) => v.parse().map_err(|_| format!("ROWS={v}: a row count"))?,
        Err(_) => 1,
    };
    let types: Vec<String> = std::env::args().skip(1).collect();
    let types = if types.is_empty() {
        vec!["Q1_0".to_string(), "TQ2_0".into(), "Q4_K".into()]
    } else {
        types
    };
    // (name, matrices [rows, cols] that read one input in one `matmul_multi`).
    // `SHAPES="name=ROWSxCOLS+ROWSxCOLS;…"` times those instead (a matrix count or row
    // count the model does not have: how a kernel's time follows its grid).
    let shapes: Vec<(String, Vec<(usize, usize)>)> = match std::env::var("SHAPES") {
        Ok(v) => parse_shapes(&v)?,
        Err(_) => [
            ("gate+up", vec![(17408, 5120), (17408, 5120)]),
            ("qkv+z", vec![(10240, 5120), (6144, 5120)]),
            ("down", vec![(5120, 17408)]),
            ("ssm_out", vec![(5120, 6144)]),
            ("head", vec![(248320, 5120)]),
        ]
        .into_iter()
        .map(|(n, m)| (n.to_string(), m))
        .collect(),
    };
    // Pseudo-random floats (xorshift), quantized per row.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for t in &types {
        let ty = [
            GgmlType::Q1_0,
            GgmlType::TQ2_0,
            GgmlType::Q4_K,
            GgmlType::Q8_0,
        ]
        .into_iter()
        .find(|ty| ty.name() == t)
        .ok_or(format!("type {t}: one of Q1_0, TQ2_0, Q4_K, Q8_0"))?;
        for (name, mats) in &shapes {
            let (name, mats) = (name.as_str(), mats.as_slice());
            let cols = mats[0].1;
            let rb = ty.row_bytes(cols).ok_or("row of whole blocks")?;
            // 64 distinct quantized rows, repeated.
            let mut block = vec![0u8; 64 * rb];
            for r in 0..64 {
                let v: Vec<f32> = (0..cols).map(|_| rnd()).collect();
                neagari_quant::quantize_row(ty, &v, &mut block[r * rb..(r + 1) * rb])?;
            }
            let bytes: usize = mats.iter().map(|m| m.0 * rb).sum();
            let copies = (256usize << 20).div_ceil(bytes).max(2);
            // A matrix of `rows` of the 64 rows, repeated.
            let host = |rows: usize| HostTensor {
                name: name.to_string(),
                ty,
                shape: vec![rows, cols],
                bytes: SharedBytes::from_vec(
                    (0..rows)
                        .flat_map(|r| block[(r % 64) * rb..][..rb].to_vec())
                        .collect(),
                ),
            };
            let mut sets = Vec::new();
            for _ in 0..copies {
                let mut set = Vec::new();
                for &(rows, _) in mats {
                    set.push(be.load_mat(&host(rows))?);
                }
                sets.push(set);
            }
            let x: Vec<f32> = (0..nr * cols).map(|_| rnd()).collect();
            let mut xb = be.buf(nr, cols)?;
            be.write(&mut xb, &x, nr, cols)?;
            let mut outs: Vec<_> = mats
                .iter()
                .map(|_| be.buf(1, 1))
                .collect::<Result<_, _>>()?;
            let mut call = |i: usize| -> Result<(), Box<dyn std::error::Error>> {
                let ws: Vec<_> = sets[i % copies].iter().collect();
                let mut os: Vec<_> = outs.iter_mut().collect();
                if ws.len() == 1 {
                    be.matmul(ws[0], &xb, os[0])?;
                } else {
                    be.matmul_multi(&ws, &xb, &mut os)?;
                }
                Ok(())
            };
            for i in 0..copies {
                call(i)?;
            }
            be.synchronize()?;
            let n = 200.max(2 * copies);
            let t0 = Instant::now();
            for i in 0..n {
                call(i)?;
            }
            be.synchronize()?;
            let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            // Bits against the reference kernels on the first copy (several rows: the
            // largest difference relative to the largest value of the whole output, as the
            // tensor-core kernels sum in another order).
            call(0)?;
            let (mut same, mut rel) = (true, 0f32);
            for (i, &(rows, _)) in mats.iter().enumerate() {
                let m = reference.load_mat(&host(rows))?;
                let mut rx = reference.buf(nr, cols)?;
                reference.write(&mut rx, &x, nr, cols)?;
                let mut ro = reference.buf(1, 1)?;
                reference.matmul(&m, &rx, &mut ro)?;
                let (mut a, mut b) = (vec![0f32; nr * rows], vec![0f32; nr * rows]);
                be.read(&outs[i], 0, nr, &mut a)?;
                reference.read(&ro, 0, nr, &mut b)?;
                same &= a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
                let top = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (p, q) in a.iter().zip(&b) {
                    rel = rel.max((p - q).abs() / top);
                }
            }
            let check = if same {
                "same bits".to_string()
            } else {
                format!("DIFFERENT bits (max rel {rel:.1e})")
            };
            println!(
                "{t:>6} {name:>8} x{nr} {:>7.1} MB {us:>8.2} µs {:>6.2} TB/s  {check}",
                bytes as f64 / 1e6,
                bytes as f64 / us / 1e6,
            );
        }
    }
    Ok(())
}

/// `name=ROWSxCOLS+ROWSxCOLS;…` (the matrices of one `matmul_multi`, all COLS wide).
#[cfg(feature = "cuda")]
type Shapes = Vec<(String, Vec<(usize, usize)>)>;
#[cfg(feature = "cuda")]
fn parse_shapes(v: &str) -> Result<Shapes, String> {
    let bad = || format!("SHAPES={v}: name=ROWSxCOLS+ROWSxCOLS;…");
    let mut out = Vec::new();
    for item in v.split(';').filter(|s| !s.trim().is_empty()) {
        let (name, mats) = item.split_once('=').ok_or_else(bad)?;
        let mats: Vec<(usize, usize)> = mats
            .split('+')
            .map(|m| {
                let (r, c) = m.trim().split_once('x')?;
                Some((r.parse().ok()?, c.parse().ok()?))
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        if mats.is_empty() || mats.len() > 4 || mats.iter().any(|m| m.1 != mats[0].1) {
            return Err(bad());
        }
        out.push((name.trim().to_string(), mats));
    }
    Ok(out)
}

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("built without the cuda feature");
}
