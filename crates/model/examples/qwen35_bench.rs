//! Hybrid-model speed figures for docs/BENCHMARKS.md.
//!
//! 1. Prefill tok/s of a synthetic qwen35 model at 256 and 2048 tokens (n_batch 512): the
//!    Gated DeltaNet layers run the chunked form, so tok/s should hold as the prompt grows.
//! 2. One Gated DeltaNet layer of the Qwen3.6-27B shape in decode: time per step against
//!    the bytes it must move (its packed weights plus its recurrent state).
//!
//! cargo run --release -p neagari-model --example qwen35_bench [-- q4_k|q8_0 [all|decode|prefill] [THREADS]]

use std::io::BufWriter;
use std::sync::Arc;
use std::time::Instant;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{
    Backend, DeltaNet, HeadMap, HostTensor, KvShape, KvType, RecShape, SharedBytes,
};
use neagari_formats::{GgmlType, Gguf};
use neagari_model::gguf::GgufSource;
use neagari_model::synth::{write_qwen35, SynthShape};

fn random_mat(
    be: &CpuBackend,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    seed: u32,
) -> neagari_backend::cpu::CpuMat {
    let rb = ty.row_bytes(cols).expect("whole blocks");
    // A handful of quantized noise rows, repeated: content does not matter for timing.
    let mut pool = vec![0u8; 8 * rb];
    let mut x = vec![0f32; cols];
    for r in 0..8 {
        for (i, v) in x.iter_mut().enumerate() {
            *v = (((i as u32).wrapping_mul(2654435761) ^ (seed + r as u32)) % 1000) as f32 / 1000.0
                - 0.5;
        }
        neagari_quant::quantize_row(ty, &x, &mut pool[r * rb..(r + 1) * rb]).unwrap();
    }
    let mut bytes = Vec::with_capacity(rows * rb);
    for r in 0..rows {
        bytes.extend_from_slice(&pool[(r % 8) * rb..(r % 8 + 1) * rb]);
    }
    be.load_mat(&HostTensor {
        name: "w".into(),
        ty,
        shape: vec![rows, cols],
        bytes: SharedBytes::from_vec(bytes),
    })
    .unwrap()
}

fn prefill_bench(be: &CpuBackend, ty: GgmlType) -> Result<(), Box<dyn std::error::Error>> {
    let shape = SynthShape {
        n_layers: 8,
        n_embd: 1024,
        n_ff: 3072,
        n_heads: 8,
        n_kv_heads: 2,
        head_dim: 128,
        n_vocab: 32_000,
        ssm_k_heads: 4,
        ssm_v_heads: 12,
        ssm_d_k: 128,
        ssm_d_v: 128,
        conv_kernel: 4,
        full_attention_interval: 4,
        rope_dims: 32,
        rope_base: 1e7,
    };
    let path = std::env::temp_dir().join(format!("neagari_bench_{}_{ty}.gguf", std::process::id()));
    write_qwen35(BufWriter::new(std::fs::File::create(&path)?), &shape, ty, 7)?;
    let file = Arc::new(Gguf::open(&path)?);
    let model = neagari_model::load(be, &GgufSource::new(file))?;
    println!(
        "prefill: synthetic qwen35 8 layers (6 DeltaNet + 2 attention), hidden 1024, {ty}, {:.0} MB",
        model.info().weight_bytes as f64 / 1e6
    );
    let n_batch = 512;
    // Interleaved repetitions, best of each: other processes on the machine move single
    // runs by ±30%.
    let sizes = [256usize, 2048];
    let mut best = [f64::MAX; 2];
    for _ in 0..3 {
        for (b, &n) in best.iter_mut().zip(&sizes) {
            let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7919) % 32_000).collect();
            let mut kv = model.new_kv(be, 2048, KvType::F16)?;
            let t = Instant::now();
            for c in ids.chunks(n_batch) {
                model.forward(be, &mut kv, c, false)?;
            }
            *b = b.min(t.elapsed().as_secs_f64());
        }
    }
    for (b, n) in best.iter().zip(sizes) {
        println!("  {n:>5} tokens: {b:.2} s, {:.1} tok/s", n as f64 / b);
    }
    println!(
        "  tok/s at 2048 / tok/s at 256 = {:.2}",
        (2048.0 / best[1]) / (256.0 / best[0])
    );
    std::fs::remove_file(&path).ok();
    Ok(())
}

fn decode_layer_bench(be: &CpuBackend, ty: GgmlType) -> Result<(), Box<dyn std::error::Error>> {
    let s = SynthShape::qwen36_27b();
    let h = s.n_embd;
    let (nk, nv, dk, dv) = (s.ssm_k_heads, s.ssm_v_heads, s.ssm_d_k, s.ssm_d_v);
    let ch = 2 * nk * dk + nv * dv;
    let vd = nv * dv;
    let qkv = random_mat(be, ty, ch, h, 1);
    let z = random_mat(be, ty, vd, h, 2);
    let wb = random_mat(be, ty, nv, h, 3);
    let wa = random_mat(be, ty, nv, h, 4);
    let out = random_mat(be, ty, h, vd, 5);
    let mats = [&qkv, &z, &wb, &wa, &out];
    let w_bytes: usize = mats.iter().map(|m| be.mat_bytes(m)).sum();
    let mut kv = be.kv_alloc(&KvShape {
        n_layers: 0,
        n_ctx: 1,
        n_kv_heads: 1,
        head_dim: 32,
        ty: KvType::F16,
    })?;
    be.rec_alloc(
        &mut kv,
        &RecShape {
            n_layers: 1,
            conv_channels: ch,
            conv_kernel: s.conv_kernel,
            n_v_heads: nv,
            d_k: dk,
            d_v: dv,
        },
    )?;
    let s_bytes = kv.rec_bytes();
    let conv_w = vec![0.1f32; ch * s.conv_kernel];
    let a_neg = vec![-1.0f32; nv];
    let dt = vec![0.0f32; nv];
    let norm = vec![1.0f32; dv];
    let net = DeltaNet {
        n_k_heads: nk,
        n_v_heads: nv,
        d_k: dk,
        d_v: dv,
        map: HeadMap::Tiled,
    };
    let mut x = be.buf(1, h)?;
    be.write(
        &mut x,
        &(0..h)
            .map(|i| ((i % 13) as f32 - 6.0) / 6.0)
            .collect::<Vec<_>>(),
        1,
        h,
    )?;
    let (mut bq, mut bz, mut bb, mut ba, mut core, mut o) = (
        be.buf(1, ch)?,
        be.buf(1, vd)?,
        be.buf(1, nv)?,
        be.buf(1, nv)?,
        be.buf(1, vd)?,
        be.buf(1, h)?,
    );
    let steps = 30;
    be.write(&mut bq, &vec![0.01f32; ch], 1, ch)?;
    // The recurrent part alone (conv, delta rule, gated norm), on fixed inputs.
    let mut t_rec = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..steps {
            let mut q2 = bq.clone(); // [1, channels]
            be.ssm_conv(&mut kv, 0, &mut q2, &conv_w)?;
            be.gated_delta(&mut kv, 0, &q2, &ba, &bb, &a_neg, &dt, &net, &mut core)?;
            be.rms_norm_gated(&mut core, &norm, &bz, 1e-6)?;
        }
        t_rec = t_rec.min(t.elapsed().as_secs_f64() / steps as f64);
    }
    let mut step = |full: bool| -> Result<(), Box<dyn std::error::Error>> {
        be.matmul(&qkv, &x, &mut bq)?;
        be.matmul(&z, &x, &mut bz)?;
        be.matmul(&wb, &x, &mut bb)?;
        be.matmul(&wa, &x, &mut ba)?;
        if full {
            be.ssm_conv(&mut kv, 0, &mut bq, &conv_w)?;
            be.gated_delta(&mut kv, 0, &bq, &ba, &bb, &a_neg, &dt, &net, &mut core)?;
            be.rms_norm_gated(&mut core, &norm, &bz, 1e-6)?;
        }
        be.matmul(&out, &core, &mut o)?;
        Ok(())
    };
    for _ in 0..3 {
        step(true)?;
    }
    let time = |step: &mut dyn FnMut(bool) -> Result<(), Box<dyn std::error::Error>>,
                full: bool| {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..steps {
                step(full).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64() / steps as f64);
        }
        best
    };
    let t_full = time(&mut step, true);
    let t_mat = time(&mut step, false);
    let gbs = w_bytes as f64 / t_mat / 1e9;
    println!(
        "decode, one Gated DeltaNet layer of Qwen3.6-27B ({ty}): weights {:.1} MB, state {:.2} MB (conv {:.3} + matrix {:.2})",
        w_bytes as f64 / 1e6,
        s_bytes as f64 / 1e6,
        (ch * (s.conv_kernel - 1) * 4) as f64 / 1e6,
        (nv * dk * dv * 4) as f64 / 1e6
    );
    println!(
        "  matmuls only: {:.3} ms ({gbs:.1} GB/s of weights); whole layer: {:.3} ms",
        t_mat * 1e3,
        t_full * 1e3
    );
    println!(
        "  recurrent part alone (conv + delta rule + gated norm): {:.3} ms ({:.1} GB/s over 2x state)",
        t_rec * 1e3,
        2.0 * s_bytes as f64 / t_rec / 1e9
    );
    println!(
        "  whole layer at the matmuls' rate moves {:.1} MB = weights + {:.2}x state (read+write of the state would be 2x)",
        t_full * gbs * 1e3,
        (t_full * gbs * 1e9 - w_bytes as f64) / s_bytes as f64
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ty = match std::env::args().nth(1).as_deref() {
        None | Some("q4_k") => GgmlType::Q4_K,
        Some("q8_0") => GgmlType::Q8_0,
        Some(o) => return Err(format!("type {o}").into()),
    };
    let mut opts = CpuOptions::default();
    if let Some(t) = std::env::args().nth(3) {
        opts.threads = t.parse()?;
    }
    let be = CpuBackend::new(&opts);
    println!("{}", be.name());
    let only = std::env::args().nth(2);
    if only.as_deref() != Some("prefill") {
        decode_layer_bench(&be, ty)?;
    }
    if only.as_deref() != Some("decode") {
        prefill_bench(&be, ty)?;
    }
    Ok(())
}
