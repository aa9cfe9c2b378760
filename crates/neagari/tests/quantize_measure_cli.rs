//! The `quantize` and `measure --kld-base` commands end to end on the tiny f16 fixture:
//! the file written is what the library writes (whose tensors equal llama.cpp's, see
//! crates/engine/tests/quantize_llama_cpp.rs), the size printed before starting is the
//! size written, and refusals are clear one-line errors.

use std::path::PathBuf;
use std::process::Command;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn neagari(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_neagari"))
        .args(args)
        .output()
        .expect("run neagari")
}

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("neagari-cli-{}-{name}", std::process::id()))
}

#[test]
fn quantize_then_measure_kld() {
    let src = fixtures().join("quantize/tiny_f16.gguf");
    let out = tmp("q4_k_m.gguf");
    let o = neagari(&[
        "quantize",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "q4_k",
        "-t",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // "output file X MiB" is printed before the work and equals the file's size.
    let planned: f64 = err
        .split("output file ")
        .nth(1)
        .and_then(|s| s.split(" MiB").next())
        .and_then(|s| s.parse().ok())
        .expect("size estimate printed");
    let size = std::fs::metadata(&out).unwrap().len() as f64 / (1024.0 * 1024.0);
    assert!((planned - size).abs() < 0.006, "{planned} vs {size}");
    assert!(err.contains("Q4_K_M"), "{err}");

    let o = neagari(&[
        "measure",
        "--kld-base",
        src.to_str().unwrap(),
        "-m",
        out.to_str().unwrap(),
        fixtures().join("quantize/kld_text.txt").to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "3",
        "-t",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(j["chunks"], 3);
    assert_eq!(j["positions"], 3 * 31);
    let kld = j["mean_kld"].as_f64().unwrap();
    // Q4_K_M sits closer to f16 than Q4_0 does on this model (llama.cpp's Q4_0 reference:
    // mean KLD 0.083 over all chunks); both must be well above zero.
    assert!(kld > 0.0 && kld < 0.083, "{kld}");
    assert!(j["median_kld"].as_f64().unwrap() <= j["max_kld"].as_f64().unwrap());
    let _ = std::fs::remove_file(&out);
}

#[test]
fn refusals_are_clear() {
    let src = fixtures().join("quantize/tiny_f16.gguf");
    let out = tmp("x.gguf");
    let o = neagari(&[
        "quantize",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "Q9_K",
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown --type") && err.contains("Q4_K_M"),
        "{err}"
    );

    let o = neagari(&[
        "quantize",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "Q2_K_S",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("importance"));
    assert!(!out.exists());

    // Requantizing a Q8_0 model needs consent.
    let q8 = fixtures().join("tiny/llama_q8.gguf");
    let o = neagari(&[
        "quantize",
        q8.to_str().unwrap(),
        out.to_str().unwrap(),
        "--type",
        "Q4_0",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--allow-requantize"));
}

#[test]
fn kld_through_a_saved_base_file() {
    let fx = fixtures().join("quantize");
    let base = fx.join("tiny_f16.gguf");
    let text = fx.join("kld_text.txt");
    let q = tmp("q8.gguf");
    let saved = tmp("base.kld");
    let o = neagari(&[
        "quantize",
        base.to_str().unwrap(),
        q.to_str().unwrap(),
        "--type",
        "Q8_0",
    ]);
    assert!(o.status.success());
    let o = neagari(&[
        "measure",
        "-m",
        base.to_str().unwrap(),
        "--kld-save",
        saved.to_str().unwrap(),
        text.to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "4",
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // From the file (no text needed), then side by side over the same windows.
    let from_file = neagari(&[
        "measure",
        "-m",
        q.to_str().unwrap(),
        "--kld-base",
        saved.to_str().unwrap(),
        "--json",
        "-t",
        "2",
    ]);
    assert!(
        from_file.status.success(),
        "{}",
        String::from_utf8_lossy(&from_file.stderr)
    );
    let live = neagari(&[
        "measure",
        "-m",
        q.to_str().unwrap(),
        "--kld-base",
        base.to_str().unwrap(),
        text.to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "4",
        "--json",
        "-t",
        "2",
    ]);
    assert!(live.status.success());
    let a: serde_json::Value = serde_json::from_slice(&from_file.stdout).unwrap();
    let b: serde_json::Value = serde_json::from_slice(&live.stdout).unwrap();
    assert_eq!(a["positions"], b["positions"]);
    assert_eq!(a["same_top"], b["same_top"]);
    assert_eq!(a["ppl"], b["ppl"]);
    // Saved log-probs are rounded to ≤ 1.2e-4 (kld_file.rs).
    let (ka, kb) = (
        a["mean_kld"].as_f64().unwrap(),
        b["mean_kld"].as_f64().unwrap(),
    );
    assert!((ka - kb).abs() < 3e-4, "{ka} vs {kb}");
    let _ = std::fs::remove_file(&q);
    let _ = std::fs::remove_file(&saved);
}
