//! Writes a random-weight GGUF of the Qwen3.6-27B shape (or fewer layers), loads it and runs
//! one decode step, reporting the file's tensor bytes, the per-sequence state and peak RSS.
//!
//! cargo run --release -p neagari-model --example qwen35_synth -- PATH [LAYERS] [q4_k|q8_0]
//! (an existing PATH is reused; LAYERS defaults to 64, the full model)

use std::io::BufWriter;
use std::sync::Arc;
use std::time::Instant;

use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{Backend, KvType};
use neagari_formats::{GgmlType, Gguf};
use neagari_model::gguf::GgufSource;
use neagari_model::synth::{write_qwen35, SynthShape};

fn status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: qwen35_synth PATH [LAYERS] [q4_k|q8_0]")?;
    let mut shape = SynthShape::qwen36_27b();
    if let Some(n) = args.get(2) {
        shape.n_layers = n.parse()?;
    }
    let ty = match args.get(3).map(String::as_str) {
        None | Some("q4_k") => GgmlType::Q4_K,
        Some("q8_0") => GgmlType::Q8_0,
        Some(o) => return Err(format!("type {o}").into()),
    };
    if !std::path::Path::new(path).exists() {
        let t = Instant::now();
        let f = BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
        let n = write_qwen35(f, &shape, ty, 42)?;
        println!(
            "wrote {path}: {} layers, {ty}, {:.2} GB of tensors in {:.1} s (peak RSS {:.0} MB)",
            shape.n_layers,
            n as f64 / 1e9,
            t.elapsed().as_secs_f64(),
            status_kb("VmHWM:") as f64 / 1024.0
        );
    }
    let be = CpuBackend::new(&CpuOptions::default());
    let t = Instant::now();
    let file = Arc::new(Gguf::open(path)?);
    let model = neagari_model::load(&be, &GgufSource::new(file))?;
    let info = model.info().clone();
    println!(
        "loaded {} ({} layers) in {:.2} s: weights {:.3} GB, read per token {:.3} GB; RSS {:.0} MB",
        info.arch,
        info.n_layers,
        t.elapsed().as_secs_f64(),
        info.weight_bytes as f64 / 1e9,
        info.decode_bytes as f64 / 1e9,
        status_kb("VmRSS:") as f64 / 1024.0
    );
    let n_ctx = 256;
    let mut kv = model.new_kv(&be, n_ctx, KvType::F16)?;
    println!(
        "state for n_ctx {n_ctx}: recurrent {:.1} MB; RSS {:.0} MB",
        kv.rec_bytes() as f64 / 1e6,
        status_kb("VmRSS:") as f64 / 1024.0
    );
    for step in 0..2 {
        let t = Instant::now();
        let logits = model.forward(&be, &mut kv, &[1000 + step], false)?;
        let finite = logits.iter().all(|v| v.is_finite());
        println!(
            "step {step}: {:.2} s, {} logits, finite {finite}, pos {}; peak RSS {:.0} MB",
            t.elapsed().as_secs_f64(),
            logits.len(),
            be.kv_len(&kv),
            status_kb("VmHWM:") as f64 / 1024.0
        );
    }
    Ok(())
}
