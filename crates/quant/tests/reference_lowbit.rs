//! Low-bit formats against references no one here wrote, through fixtures made by
//! scripts/quant_reference_lowbit.py: gguf-py's / ggml's dequantization (bit for bit),
//! ggml's `_ref` quantizers (byte for byte) and ggml's scalar dot products. PQ2_0 and
//! PTQ1_0 have no library reference; the script derives theirs from ggml's Q2_0 and
//! gguf-py's TQ1_0 (see its doc).

mod common;

use common::{check_dequant, check_dot, check_fixture_dequant, check_fixture_quantizer, f32s, hex};
use neagari_quant::{dequantize_row, quantize_row, GgmlType};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    common::fixture(&format!("lowbit/{name}.json"))
}

/// Types with a full fixture (ggml and/or gguf-py know them).
const TYPES: [GgmlType; 13] = [
    GgmlType::Q1_0,
    GgmlType::Q2_0,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

/// True when the type meets Q8_0 activations (else Q8_K).
fn q8_0_act(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q1_0 | GgmlType::Q2_0 | GgmlType::PQ2_0 | GgmlType::PTQ1_0 | GgmlType::IQ4_NL
    )
}

/// Reference dot through the typed API of the quant crate.
fn dot(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
    use bytemuck::cast_slice as c;
    use neagari_quant::*;
    let a0 = || c::<u8, BlockQ8_0>(a);
    let ak = || c::<u8, BlockQ8_K>(a);
    match ty {
        GgmlType::Q1_0 => q1_0::dot(c(w), a0()),
        GgmlType::Q2_0 => q2_0::dot(c(w), a0()),
        GgmlType::PQ2_0 => pq2_0::dot(c(w), a0()),
        GgmlType::PTQ1_0 => ptq1_0::dot(c(w), a0()),
        GgmlType::IQ4_NL => iq4_nl::dot(c(w), a0()),
        GgmlType::TQ1_0 => tq1_0::dot(c(w), ak()),
        GgmlType::TQ2_0 => tq2_0::dot(c(w), ak()),
        GgmlType::IQ4_XS => iq4_xs::dot(c(w), ak()),
        GgmlType::IQ2_XXS => iq2_xxs::dot(c(w), ak()),
        GgmlType::IQ2_XS => iq2_xs::dot(c(w), ak()),
        GgmlType::IQ2_S => iq2_s::dot(c(w), ak()),
        GgmlType::IQ3_XXS => iq3_xxs::dot(c(w), ak()),
        GgmlType::IQ3_S => iq3_s::dot(c(w), ak()),
        GgmlType::IQ1_S => iq1_s::dot(c(w), ak()),
        GgmlType::IQ1_M => iq1_m::dot(c(w), ak()),
        _ => unreachable!("{ty}"),
    }
}

fn act_values(ty: GgmlType, a: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    if q8_0_act(ty) {
        neagari_quant::q8_0::dequantize(&bytemuck::cast_slice(a)[..n / 32], &mut out);
    } else {
        neagari_quant::q8_k::dequantize(&bytemuck::cast_slice(a)[..n / 256], &mut out);
    }
    out
}

/// Checks `dot(w, act row r)` against `want[r]` within `rel` of Σ|w·a|.
fn check_dots(ty: GgmlType, w: &[u8], acts: &Value, want: &Value, rel: f64, what: &str) {
    let n = w.len() / ty.info().bytes * ty.info().block;
    let mut wf = vec![0f32; n];
    dequantize_row(ty, w, &mut wf).expect("dequantize");
    let arb = if q8_0_act(ty) {
        n / 32 * 34
    } else {
        n / 256 * 292
    };
    for (r, (araw, want)) in acts
        .as_array()
        .expect("acts")
        .iter()
        .zip(want.as_array().expect("dots"))
        .enumerate()
    {
        let araw = &hex(araw)[..arb];
        let af = act_values(ty, araw, n);
        let want = want.as_f64().expect("dot") as f32;
        let ours = dot(ty, w, araw);
        check_dot(&wf, &af, ours, want, rel, &format!("{what} row {r}"));
    }
}

#[test]
fn dequantize_matches_references_bit_for_bit() {
    for ty in TYPES {
        let f = fixture(&ty.name().to_lowercase());
        let what = f["comment"].as_str().unwrap_or_default();
        check_fixture_dequant(ty, &f, &format!("quantized blocks ({what})"));
    }
}

#[test]
fn quantizers_match_ggml_ref_byte_for_byte() {
    for ty in TYPES {
        let f = fixture(&ty.name().to_lowercase());
        if f["quantizer_ref"] != Value::Bool(true) {
            continue;
        }
        check_fixture_quantizer(ty, &f, "_ref quantizer");
    }
}

#[test]
fn dots_match_ggml_generic() {
    for ty in TYPES {
        let f = fixture(&ty.name().to_lowercase());
        for (wkey, dkey) in [("blocks", "dots"), ("random_blocks", "random_dots")] {
            check_dots(
                ty,
                &hex(&f[wkey]),
                &f["act"],
                &f[dkey],
                1e-6,
                &format!("{ty} {wkey}"),
            );
        }
    }
}

#[test]
fn pq2_0_matches_ggml_q2_0_pairs() {
    let f = fixture("pq2_0");
    let w = hex(&f["random_blocks"]);
    check_dequant(GgmlType::PQ2_0, &w, &f32s(&f["random_dequant"]), "PQ2_0");
    // ggml sums the same integer parts per 64 weights: equal up to f32 summation order.
    check_dots(
        GgmlType::PQ2_0,
        &w,
        &f["act"],
        &f["dots_approx"],
        1e-6,
        "PQ2_0",
    );
}

#[test]
fn ptq1_0_decodes_in_stage_order() {
    let f = fixture("ptq1_0");
    check_dequant(
        GgmlType::PTQ1_0,
        &hex(&f["random_blocks"]),
        &f32s(&f["random_dequant"]),
        "PTQ1_0",
    );
}

/// The group-128 quantizers reuse the group-64 / 256 ones: quantizing then dequantizing
/// keeps every weight's sign and lands on {−d, 0, +d}.
#[test]
fn group_128_quantizers_round_trip_ternary() {
    let x: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    for ty in [GgmlType::PQ2_0, GgmlType::PTQ1_0] {
        let mut q = vec![0u8; ty.row_bytes(x.len()).unwrap()];
        quantize_row(ty, &x, &mut q).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize_row(ty, &q, &mut y).unwrap();
        for (blk, (xs, ys)) in x.chunks(128).zip(y.chunks(128)).enumerate() {
            let d = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = half::f16::from_f32(d).to_f32();
            for (a, b) in xs.iter().zip(ys) {
                let want = (a / xs.iter().fold(0f32, |m, v| m.max(v.abs()))).round() * d;
                assert_eq!(*b, want, "{ty} block {blk}: {a} → {b}");
            }
        }
    }
}
