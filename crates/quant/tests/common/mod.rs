//! Fixture reading and the comparisons that the reference tests share (reference_k.rs,
//! reference_lowbit.rs): bit-for-bit dequantization, byte-for-byte quantizer output, and
//! dot products within a tolerance relative to Σ|w·a|.

use neagari_quant::{dequantize_row, quantize_row, GgmlType};
use serde_json::Value;

/// The JSON fixture at `tests/fixtures/{rel}`.
pub fn fixture(rel: &str) -> Value {
    let path = format!("{}/tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("fixture json")
}

pub fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().expect("hex string");
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Little-endian f32s from a hex string.
pub fn f32s(v: &Value) -> Vec<f32> {
    hex(v)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Dequantizes `bytes` of type `ty` and asserts every value equals `want` bit for bit.
pub fn check_dequant(ty: GgmlType, bytes: &[u8], want: &[f32], what: &str) {
    let mut out = vec![0f32; want.len()];
    dequantize_row(ty, bytes, &mut out).expect("dequantize_row");
    assert_eq!(out.len(), want.len(), "{what}: length");
    for (i, (a, b)) in out.iter().zip(want).enumerate() {
        assert_eq!(
            a.to_bits(),
            b.to_bits(),
            "{what}: value {i}: ours {a} theirs {b}"
        );
    }
}

/// A fixture's two dequantization checks: its `blocks` (quantized by the reference, named
/// `quantized` in messages) against `dequant`, and its `random_blocks` against
/// `random_dequant`.
pub fn check_fixture_dequant(ty: GgmlType, f: &Value, quantized: &str) {
    check_dequant(
        ty,
        &hex(&f["blocks"]),
        &f32s(&f["dequant"]),
        &format!("{ty} {quantized}"),
    );
    check_dequant(
        ty,
        &hex(&f["random_blocks"]),
        &f32s(&f["random_dequant"]),
        &format!("{ty} random blocks"),
    );
}

/// Quantizes a fixture's `input` and asserts the blocks equal its `blocks` (made by ggml's
/// `reference` quantizer) byte for byte, block by block.
pub fn check_fixture_quantizer(ty: GgmlType, f: &Value, reference: &str) {
    let x = f32s(&f["input"]);
    let want = hex(&f["blocks"]);
    let mut ours = vec![0u8; want.len()];
    quantize_row(ty, &x, &mut ours).expect("quantize_row");
    let size = ty.info().bytes;
    for (b, (o, w)) in ours.chunks(size).zip(want.chunks(size)).enumerate() {
        assert_eq!(o, w, "{ty}: block {b} differs from ggml's {reference}");
    }
}

/// Asserts our dot `ours` of weight values `wf` with activation values `af` is within
/// `rel` of Σ|w·a| of ggml's `want`.
pub fn check_dot(wf: &[f32], af: &[f32], ours: f32, want: f32, rel: f64, what: &str) {
    // Scale of the terms, for a tolerance that is relative to what was summed.
    let mag: f64 = wf
        .iter()
        .zip(af)
        .map(|(x, y)| (*x as f64 * *y as f64).abs())
        .sum();
    let err = (ours - want).abs() as f64;
    assert!(
        err <= rel * mag + 1e-30,
        "{what}: ours {ours} ggml {want} (Σ|w·a| {mag})"
    );
}
