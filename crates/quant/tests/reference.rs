//! The simple formats against references no one here wrote: the `gguf` Python package's
//! quantize/dequantize and ggml's `_ref` quantizers and `ggml_vec_dot_*` (via ctypes).
//! Fixtures are made by scripts/quant_reference.py; see its docstring.

use neagari_quant::{
    dequantize_row, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, quantize_row, BlockQ8_0, BlockQ8_1,
    GgmlType,
};
use serde_json::Value;

struct Fixture {
    k: usize,
    rows: usize,
    x: Vec<f32>,
    q: Vec<u8>,
    json: Value,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("fixture hex"))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("fixture array")
        .iter()
        .map(|b| f32::from_bits(b.as_u64().expect("fixture bits") as u32))
        .collect()
}

fn load(ty: GgmlType) -> Fixture {
    let path = format!(
        "{}/tests/fixtures/{}.json",
        env!("CARGO_MANIFEST_DIR"),
        ty.name().to_lowercase()
    );
    let text = std::fs::read_to_string(&path).expect("fixture file");
    let json: Value = serde_json::from_str(&text).expect("fixture json");
    assert_eq!(json["type"], ty.name());
    Fixture {
        k: json["k"].as_u64().unwrap() as usize,
        rows: json["rows"].as_u64().unwrap() as usize,
        x: floats(&json["x"]),
        q: hex(json["q"].as_str().unwrap()),
        json,
    }
}

const WEIGHTS: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    for ty in WEIGHTS {
        let f = load(ty);
        let want = floats(&f.json["dq"]);
        let rb = ty.row_bytes(f.k).unwrap();
        let mut got = vec![0f32; f.k];
        for r in 0..f.rows {
            dequantize_row(ty, &f.q[r * rb..(r + 1) * rb], &mut got).unwrap();
            for (j, (g, w)) in got.iter().zip(&want[r * f.k..(r + 1) * f.k]).enumerate() {
                if ty == GgmlType::F16 && g.is_nan() && w.is_nan() {
                    // numpy keeps an f16 signalling NaN signalling when widening; F16C (and so
                    // ggml on x86, and our kernels) quiets it. Both are NaN; payloads differ.
                    continue;
                }
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{ty} row {r} value {j}: {g} vs gguf {w}"
                );
            }
        }
    }
}

#[test]
fn quantize_matches_gguf_bytes() {
    for ty in WEIGHTS {
        let f = load(ty);
        // gguf's and ggml's _ref quantizers agree on these fixtures (the script records it);
        // if they ever part ways, the bytes below are gguf's.
        if let Some(eq) = f.json.get("ggml_ref_equal") {
            assert_eq!(
                eq, true,
                "{ty}: gguf and ggml _ref disagree; see the fixture"
            );
        }
        let rb = ty.row_bytes(f.k).unwrap();
        let mut got = vec![0u8; rb];
        for r in 0..f.rows {
            quantize_row(ty, &f.x[r * f.k..(r + 1) * f.k], &mut got).unwrap();
            let want = &f.q[r * rb..(r + 1) * rb];
            if ty == GgmlType::F16 {
                // A signalling NaN narrows to a signalling f16 NaN in numpy, to a quiet one
                // with F16C and in `half` (and so in ggml on x86). Compare NaN-ness there.
                for (j, (g, w)) in got.chunks(2).zip(want.chunks(2)).enumerate() {
                    let (g, w) = (
                        u16::from_le_bytes([g[0], g[1]]),
                        u16::from_le_bytes([w[0], w[1]]),
                    );
                    let nan = |h: u16| h & 0x7c00 == 0x7c00 && h & 0x3ff != 0;
                    assert!(
                        g == w || (nan(g) && nan(w)),
                        "F16 row {r} value {j}: {g:#x} vs {w:#x}"
                    );
                }
                continue;
            }
            if got != want {
                let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{ty} row {r}: first differing byte {i}: {} vs gguf {}",
                    got[i], want[i]
                );
            }
        }
    }
}

#[test]
fn q8_1_quantize_matches_ggml_ref() {
    let f = load(GgmlType::Q8_1);
    let rb = GgmlType::Q8_1.row_bytes(f.k).unwrap();
    let mut got = vec![0u8; rb];
    for r in 0..f.rows {
        quantize_row(GgmlType::Q8_1, &f.x[r * f.k..(r + 1) * f.k], &mut got).unwrap();
        assert_eq!(got, &f.q[r * rb..(r + 1) * rb], "Q8_1 row {r}");
    }
}

/// Σ|w||a| of the dequantized operands: the scale the dot's rounding error is measured in.
fn abs_dot(ty: GgmlType, w: &[u8], act_ty: GgmlType, a: &[u8], k: usize) -> f64 {
    let (mut wf, mut af) = (vec![0f32; k], vec![0f32; k]);
    dequantize_row(ty, w, &mut wf).unwrap();
    dequantize_row(act_ty, a, &mut af).unwrap();
    wf.iter().zip(&af).map(|(x, y)| (x * y).abs() as f64).sum()
}

#[test]
fn activation_quantizers_and_dots_match_ggml() {
    for ty in &WEIGHTS[3..] {
        let ty = *ty;
        let f = load(ty);
        let act = &f.json["act"];
        let act_ty = match act["type"].as_str().unwrap() {
            "Q8_0" => GgmlType::Q8_0,
            "Q8_1" => GgmlType::Q8_1,
            other => panic!("unexpected activation type {other}"),
        };
        let ax = floats(&act["x"]);
        let aq_want = hex(act["q"].as_str().unwrap());
        let dots = floats(&act["dot"]);
        let (wb, ab) = (ty.row_bytes(f.k).unwrap(), act_ty.row_bytes(f.k).unwrap());
        let mut aq = vec![0u8; ab];
        for r in 0..f.rows {
            quantize_row(act_ty, &ax[r * f.k..(r + 1) * f.k], &mut aq).unwrap();
            assert_eq!(aq, &aq_want[r * ab..(r + 1) * ab], "{ty}: {act_ty} row {r}");
            let w = &f.q[r * wb..(r + 1) * wb];
            let got = match ty {
                GgmlType::Q4_0 => q4_0::dot(bytemuck::cast_slice(w), q8(&aq)),
                GgmlType::Q5_0 => q5_0::dot(bytemuck::cast_slice(w), q8(&aq)),
                GgmlType::Q8_0 => q8_0::dot(bytemuck::cast_slice(w), q8(&aq)),
                GgmlType::Q4_1 => q4_1::dot(bytemuck::cast_slice(w), q81(&aq)),
                GgmlType::Q5_1 => q5_1::dot(bytemuck::cast_slice(w), q81(&aq)),
                _ => unreachable!(),
            };
            // ggml's SIMD dot sums the same exact per-block terms in another order.
            let scale = abs_dot(ty, w, act_ty, &aq, f.k).max(f64::MIN_POSITIVE);
            let err = (got as f64 - dots[r] as f64).abs() / scale;
            assert!(
                err < 1e-6,
                "{ty} row {r}: {got} vs ggml {} (normalized {err:e})",
                dots[r]
            );
        }
    }
}

fn q8(b: &[u8]) -> &[BlockQ8_0] {
    bytemuck::cast_slice(b)
}

fn q81(b: &[u8]) -> &[BlockQ8_1] {
    bytemuck::cast_slice(b)
}

#[test]
fn q8_1_sum_field_is_scaled_quant_sum() {
    // Independent of ggml: s must equal f16(d · Σq) for every block we produce, checked
    // here through the f16 d (so within the f16 rounding of d itself).
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01)
        .collect();
    let mut out = vec![BlockQ8_1::default(); 8];
    q8_1::quantize_row(&x, &mut out);
    for b in &out {
        let d = neagari_quant::float::f16_to_f32(b.d);
        let s = neagari_quant::float::f16_to_f32(b.s);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        assert!((s - d * sum as f32).abs() <= 2e-3 * (d * sum as f32).abs() + 1e-6);
    }
}
