//! K-quant reference code against references no one here wrote, through fixtures made by
//! scripts/quant_reference_k.py: gguf-py's dequantization (bit for bit), ggml's `_ref`
//! quantizers (byte for byte), ggml's scalar dot products, and gguf-py's dequantization
//! of every K-quant tensor of the real test model (when NEAGARI_TEST_MODEL is set).

mod common;

use common::{
    check_dequant, check_dot, check_fixture_dequant, check_fixture_quantizer, f32s, fixture, hex,
};
use neagari_quant::{dequantize_row, quantize_row, GgmlType};
use neagari_quant::{BlockQ2_K, BlockQ3_K, BlockQ4_K, BlockQ5_K, BlockQ6_K, BlockQ8_K};
use std::io::{Read, Seek, SeekFrom};

const WEIGHT_TYPES: [GgmlType; 5] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Reference dot of a weight row of type `ty` with a Q8_K row, through the typed API.
fn dot(ty: GgmlType, w: &[u8], a: &[BlockQ8_K]) -> f32 {
    use bytemuck::cast_slice;
    match ty {
        GgmlType::Q2_K => neagari_quant::q2_k::dot(cast_slice::<u8, BlockQ2_K>(w), a),
        GgmlType::Q3_K => neagari_quant::q3_k::dot(cast_slice::<u8, BlockQ3_K>(w), a),
        GgmlType::Q4_K => neagari_quant::q4_k::dot(cast_slice::<u8, BlockQ4_K>(w), a),
        GgmlType::Q5_K => neagari_quant::q5_k::dot(cast_slice::<u8, BlockQ5_K>(w), a),
        GgmlType::Q6_K => neagari_quant::q6_k::dot(cast_slice::<u8, BlockQ6_K>(w), a),
        _ => unreachable!(),
    }
}

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    for ty in WEIGHT_TYPES {
        let f = fixture(&format!("{}.json", ty.name().to_lowercase()));
        check_fixture_dequant(ty, &f, "ggml-quantized blocks");
    }
}

#[test]
fn quantizers_match_ggml_ref_byte_for_byte() {
    for ty in WEIGHT_TYPES.into_iter().chain([GgmlType::Q8_K]) {
        let f = fixture(&format!("{}.json", ty.name().to_lowercase()));
        check_fixture_quantizer(ty, &f, &format!("quantize_row_{}_ref", ty.name()));
    }
}

#[test]
fn q8_k_dequantize_matches_ggml() {
    let f = fixture("q8_k.json");
    check_dequant(
        GgmlType::Q8_K,
        &hex(&f["blocks"]),
        &f32s(&f["dequant"]),
        "Q8_K",
    );
}

#[test]
fn dots_match_ggml_generic() {
    for ty in WEIGHT_TYPES {
        let f = fixture(&format!("{}.json", ty.name().to_lowercase()));
        for (wkey, dkey) in [("blocks", "dots"), ("random_blocks", "random_dots")] {
            let w = hex(&f[wkey]);
            let nb = w.len() / ty.info().bytes;
            let mut wf = vec![0f32; nb * 256];
            dequantize_row(ty, &w, &mut wf).expect("dequantize");
            for (r, (araw, want)) in f["act_q8k"]
                .as_array()
                .expect("acts")
                .iter()
                .zip(f[dkey].as_array().expect("dots"))
                .enumerate()
            {
                let araw = hex(araw);
                let a: &[BlockQ8_K] = &bytemuck::cast_slice::<u8, BlockQ8_K>(&araw)[..nb];
                let mut af = vec![0f32; nb * 256];
                neagari_quant::q8_k::dequantize(a, &mut af);
                let want = want.as_f64().expect("dot") as f32;
                let what = format!("{ty} {wkey} row {r}");
                check_dot(&wf, &af, dot(ty, &w, a), want, 1e-5, &what);
            }
        }
    }
}

#[test]
fn model_sample_blocks_match_gguf() {
    let f = fixture("gemma3_kquants.json");
    let samples = f["samples"].as_array().expect("samples");
    assert!(!samples.is_empty());
    for s in samples {
        let ty = match s["type"].as_str() {
            Some("Q4_K") => GgmlType::Q4_K,
            Some("Q6_K") => GgmlType::Q6_K,
            other => panic!("unexpected sample type {other:?}"),
        };
        check_dequant(
            ty,
            &hex(&s["block"]),
            &f32s(&s["dequant"]),
            &format!("{} block {}", s["name"], s["block_index"]),
        );
    }
}

/// Just enough GGUF reading to find tensor data: (name, type id, data offset in file).
fn gguf_tensors(path: &str) -> std::io::Result<Vec<(String, u32, u64)>> {
    let mut f = std::io::BufReader::new(std::fs::File::open(path)?);
    let mut pos = 0u64;
    fn rd<const N: usize>(f: &mut impl Read, pos: &mut u64) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        f.read_exact(&mut b)?;
        *pos += N as u64;
        Ok(b)
    }
    fn u32_(f: &mut impl Read, pos: &mut u64) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(rd::<4>(f, pos)?))
    }
    fn u64_(f: &mut impl Read, pos: &mut u64) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(rd::<8>(f, pos)?))
    }
    fn string(f: &mut impl Read, pos: &mut u64) -> std::io::Result<String> {
        let n = u64_(f, pos)? as usize;
        let mut b = vec![0u8; n];
        f.read_exact(&mut b)?;
        *pos += n as u64;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    // Skips one value of type `t`; returns it when it is a u32 (for general.alignment).
    fn skip(f: &mut impl Read, pos: &mut u64, t: u32) -> std::io::Result<Option<u32>> {
        match t {
            0 | 1 | 7 => drop(rd::<1>(f, pos)?),
            2 | 3 => drop(rd::<2>(f, pos)?),
            4 => return Ok(Some(u32_(f, pos)?)),
            5 | 6 => drop(rd::<4>(f, pos)?),
            10..=12 => drop(rd::<8>(f, pos)?),
            8 => drop(string(f, pos)?),
            9 => {
                let et = u32_(f, pos)?;
                let n = u64_(f, pos)?;
                for _ in 0..n {
                    skip(f, pos, et)?;
                }
            }
            _ => return Err(std::io::Error::other(format!("bad gguf value type {t}"))),
        }
        Ok(None)
    }
    assert_eq!(&rd::<4>(&mut f, &mut pos)?, b"GGUF");
    let _version = u32_(&mut f, &mut pos)?;
    let n_tensors = u64_(&mut f, &mut pos)?;
    let n_kv = u64_(&mut f, &mut pos)?;
    let mut align = 32u64;
    for _ in 0..n_kv {
        let key = string(&mut f, &mut pos)?;
        let t = u32_(&mut f, &mut pos)?;
        if let Some(v) = skip(&mut f, &mut pos, t)? {
            if key == "general.alignment" {
                align = v as u64;
            }
        }
    }
    let mut infos = Vec::new();
    for _ in 0..n_tensors {
        let name = string(&mut f, &mut pos)?;
        let nd = u32_(&mut f, &mut pos)?;
        for _ in 0..nd {
            u64_(&mut f, &mut pos)?;
        }
        let ty = u32_(&mut f, &mut pos)?;
        let off = u64_(&mut f, &mut pos)?;
        infos.push((name, ty, off));
    }
    let data = pos.div_ceil(align) * align;
    Ok(infos
        .into_iter()
        .map(|(n, t, o)| (n, t, data + o))
        .collect())
}

#[test]
fn model_tensors_match_gguf_fingerprints() {
    let Ok(path) = std::env::var("NEAGARI_TEST_MODEL") else {
        eprintln!(
            "NEAGARI_TEST_MODEL unset: skipping the full-tensor comparison with the real model"
        );
        return;
    };
    if !std::path::Path::new(&path).exists() {
        eprintln!("NEAGARI_TEST_MODEL={path} missing: skipping");
        return;
    }
    let f = fixture("gemma3_kquants.json");
    let tensors = gguf_tensors(&path).expect("read gguf");
    let mut file = std::fs::File::open(&path).expect("open model");
    let want = f["tensors"].as_array().expect("tensors");
    assert!(!want.is_empty());
    for t in want {
        let name = t["name"].as_str().expect("name");
        let (_, id, off) = tensors
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{name} not in model"));
        let ty = GgmlType::from_id(*id).expect("type id");
        assert_eq!(ty.name(), t["type"].as_str().expect("type"), "{name}");
        let nbytes = t["nbytes"].as_u64().expect("nbytes") as usize;
        let mut raw = vec![0u8; nbytes];
        file.seek(SeekFrom::Start(*off)).expect("seek");
        file.read_exact(&mut raw).expect("read tensor");
        let n = nbytes / ty.info().bytes * 256;
        let mut out = vec![0f32; n];
        dequantize_row(ty, &raw, &mut out).expect("dequantize");
        let fingerprint = out.iter().enumerate().fold(0u64, |acc, (i, v)| {
            acc.wrapping_add((v.to_bits() as u64).wrapping_mul(i as u64 + 1))
        });
        assert_eq!(
            fingerprint,
            t["fingerprint"].as_u64().expect("fingerprint"),
            "{name}: dequantized values differ from gguf's"
        );
    }
}

#[test]
fn entry_points_reject_bad_shapes() {
    let mut out = vec![0f32; 256];
    assert!(dequantize_row(GgmlType::Q4_K, &[0; 143], &mut out).is_err());
    let mut out = vec![0f32; 255];
    assert!(dequantize_row(GgmlType::Q4_K, &[0; 144], &mut out).is_err());
    let mut bytes = vec![0u8; 209];
    assert!(quantize_row(GgmlType::Q6_K, &[0.0; 256], &mut bytes).is_err());
}
