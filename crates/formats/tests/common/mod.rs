//! Helpers shared by the GGUF test binaries: fixture loading, the real-model switch,
//! a raw byte builder for malformed files, a seeded RNG and a no-panic harness.
#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use neagari_formats::{Array, GgmlType, Gguf, GgufError, GgufWriter, Value};
use serde_json::Value as J;

pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

pub fn fixture_json(name: &str) -> J {
    let text = std::fs::read_to_string(fixture_path(name)).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The real model named by NEAGARI_TEST_MODEL, or `None` (with a note) to skip.
pub fn test_model() -> Option<PathBuf> {
    match std::env::var_os("NEAGARI_TEST_MODEL") {
        Some(p) if Path::new(&p).is_file() => Some(PathBuf::from(p)),
        Some(p) => {
            eprintln!("NEAGARI_TEST_MODEL={p:?} is not a file: skipping real-model test");
            None
        }
        None => {
            eprintln!("NEAGARI_TEST_MODEL unset: skipping real-model test");
            None
        }
    }
}

/// Value type names used in the fixture specs → our tags.
pub fn type_id(name: &str) -> u32 {
    [
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64",
    ]
    .iter()
    .position(|&n| n == name)
    .unwrap_or_else(|| panic!("unknown type name {name}")) as u32
}

fn int<T: TryFrom<i128>>(j: &J) -> T
where
    T::Error: std::fmt::Debug,
{
    let i: i128 = match (j.as_u64(), j.as_i64()) {
        (Some(u), _) => u.into(),
        (None, Some(i)) => i.into(),
        _ => panic!("not an integer: {j}"),
    };
    T::try_from(i).expect("integer in range")
}

fn float(j: &J) -> f64 {
    j.as_f64().expect("number")
}

/// A fixture value spec (see scripts/gguf_reference.py) → `Value`.
pub fn spec_value(spec: &J) -> Value {
    let v = &spec["value"];
    match spec["type"].as_str().expect("type") {
        "u8" => Value::U8(int(v)),
        "i8" => Value::I8(int(v)),
        "u16" => Value::U16(int(v)),
        "i16" => Value::I16(int(v)),
        "u32" => Value::U32(int(v)),
        "i32" => Value::I32(int(v)),
        "f32" => Value::F32(float(v) as f32),
        "bool" => Value::Bool(v.as_bool().expect("bool")),
        "string" => Value::String(v.as_str().expect("string").to_string()),
        "u64" => Value::U64(int(v)),
        "i64" => Value::I64(int(v)),
        "f64" => Value::F64(float(v)),
        "array" => Value::Array(spec_array(spec)),
        t => panic!("unknown spec type {t}"),
    }
}

pub fn spec_array(spec: &J) -> Array {
    let items = spec["items"].as_array().expect("items");
    fn all<T>(items: &[J], f: impl Fn(&J) -> T) -> Vec<T> {
        items.iter().map(f).collect()
    }
    match spec["elem"].as_str().expect("elem") {
        "u8" => Array::U8(all(items, int)),
        "i8" => Array::I8(all(items, int)),
        "u16" => Array::U16(all(items, int)),
        "i16" => Array::I16(all(items, int)),
        "u32" => Array::U32(all(items, int)),
        "i32" => Array::I32(all(items, int)),
        "f32" => Array::F32(all(items, |j| float(j) as f32)),
        "bool" => Array::Bool(all(items, |j| j.as_bool().expect("bool"))),
        "string" => Array::String(all(items, |j| j.as_str().expect("str").to_string())),
        "u64" => Array::U64(all(items, int)),
        "i64" => Array::I64(all(items, int)),
        "f64" => Array::F64(all(items, float)),
        "array" => Array::Array(all(items, spec_array)),
        t => panic!("unknown elem type {t}"),
    }
}

/// One array element as JSON-comparable text (floats widened to f64 exactly).
pub fn array_elem_json(a: &Array, i: usize) -> J {
    match a {
        Array::U8(v) => J::from(v[i]),
        Array::I8(v) => J::from(v[i]),
        Array::U16(v) => J::from(v[i]),
        Array::I16(v) => J::from(v[i]),
        Array::U32(v) => J::from(v[i]),
        Array::I32(v) => J::from(v[i]),
        Array::F32(v) => J::from(f64::from(v[i])),
        Array::Bool(v) => J::from(v[i]),
        Array::String(v) => J::from(v[i].clone()),
        Array::U64(v) => J::from(v[i]),
        Array::I64(v) => J::from(v[i]),
        Array::F64(v) => J::from(v[i]),
        Array::Array(_) => panic!("nested arrays have no JSON element form here"),
    }
}

pub fn scalar_json(v: &Value) -> J {
    match v {
        Value::U8(x) => J::from(*x),
        Value::I8(x) => J::from(*x),
        Value::U16(x) => J::from(*x),
        Value::I16(x) => J::from(*x),
        Value::U32(x) => J::from(*x),
        Value::I32(x) => J::from(*x),
        Value::F32(x) => J::from(f64::from(*x)),
        Value::Bool(x) => J::from(*x),
        Value::String(x) => J::from(x.clone()),
        Value::U64(x) => J::from(*x),
        Value::I64(x) => J::from(*x),
        Value::F64(x) => J::from(*x),
        Value::Array(_) => panic!("not a scalar"),
    }
}

/// (sum of bytes, Σ byte[i]·(i+1)), both mod 2^64 — the checksums the script computes.
pub fn checksums(bytes: &[u8]) -> (u64, u64) {
    let mut sum = 0u64;
    let mut weighted = 0u64;
    for (i, &b) in bytes.iter().enumerate() {
        sum = sum.wrapping_add(u64::from(b));
        weighted = weighted.wrapping_add(u64::from(b).wrapping_mul(i as u64 + 1));
    }
    (sum, weighted)
}

/// splitmix64: a seeded, dependency-free generator for the fuzz loops.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0); the modulo bias is irrelevant here.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

/// Runs `f` and fails the test (naming `label`) if it panics.
pub fn no_panic<T>(label: &str, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => panic!("reader panicked on {label}"),
    }
}

/// Opens bytes and, when they parse, touches everything a caller could touch, so a bad
/// range or a lying size in an accepted file shows up as a failure here.
pub fn open_and_touch(bytes: &[u8]) -> Result<Gguf, GgufError> {
    let g = Gguf::from_bytes(bytes.to_vec())?;
    for t in g.tensors() {
        let data = g.tensor_data(t);
        assert_eq!(
            data.len() as u64,
            t.n_bytes,
            "tensor {} data length",
            t.name
        );
        assert_eq!(g.tensor(&t.name), Some(t));
        let _ = (t.n_elements(), t.rows(), t.row_len(), t.row_bytes(), t.ne());
    }
    for (k, v) in g.metadata().iter() {
        let _ = (v.type_desc(), v.encoded_len());
        let _ = (
            g.get_u32(k),
            g.get_u64(k),
            g.get_f32(k),
            g.get_bool(k),
            g.get_str(k),
        );
        let _ = (g.get_str_array(k), g.get_f32_array(k), g.get_i32_array(k));
    }
    let _ = g.architecture();
    Ok(g)
}

/// Little-endian byte builder for hand-made (often malformed) GGUF files.
#[derive(Default, Clone)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version, tensor count, kv count.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    /// key + u32 type tag + u32 value
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// name, dims, type id, offset
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Zero padding to a multiple of `a`, then `n` data bytes.
    pub fn pad_data(&mut self, a: usize, n: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(a) {
            self.0.push(0);
        }
        self.0.extend(std::iter::repeat_n(0xAB, n));
        self
    }
}

/// A small file with every value type, nested arrays and tensors of several types, made
/// by our writer; the seed of the synthetic fuzz runs. Returns the bytes and the data given
/// for each tensor.
pub fn synthetic_file(alignment: u32) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "synthetic").unwrap();
    w.set_alignment(alignment).unwrap();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let tensors: [(&str, &[u64], GgmlType); 6] = [
        ("a.f32", &[3, 2], GgmlType::F32),
        ("b.q4_k", &[256, 2], GgmlType::Q4_K),
        ("c.f16", &[5], GgmlType::F16),
        ("d.q8_0", &[32, 1, 2, 1], GgmlType::Q8_0),
        ("e.empty", &[0, 4], GgmlType::F32),
        ("f.i8", &[7], GgmlType::I8),
    ];
    let mut datas: Vec<Vec<u8>> = Vec::new();
    for (i, (name, dims, ty)) in tensors.iter().enumerate() {
        let n = w.add_tensor(*name, dims, *ty).unwrap();
        datas.push(
            (0..n)
                .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i as u8))
                .collect(),
        );
    }
    let mut out = w.start(Vec::new()).unwrap();
    for d in &datas {
        out.write_tensor(d).unwrap();
    }
    (out.finish().unwrap(), datas)
}

/// One key per value type and array shape, including empty and nested arrays.
pub fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(255)),
        ("v.i8", Value::I8(-128)),
        ("v.u16", Value::U16(65535)),
        ("v.i16", Value::I16(-32768)),
        ("v.u32", Value::U32(u32::MAX)),
        ("v.i32", Value::I32(i32::MIN)),
        ("v.f32", Value::F32(-0.1)),
        ("v.bool", Value::Bool(true)),
        ("v.string", Value::from("naïve ✓ \u{0}")),
        ("v.empty_string", Value::from("")),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::E)),
        ("a.u8", Value::from(vec![0u8, 7, 255])),
        ("a.i8", Value::from(vec![-1i8, 1])),
        ("a.u16", Value::from(vec![1u16, 65535])),
        ("a.i16", Value::from(vec![-2i16])),
        ("a.u32", Value::from(vec![3u32, 4_000_000_000])),
        ("a.i32", Value::from(vec![-5i32, 6])),
        (
            "a.f32",
            Value::from(vec![1.5f32, f32::MAX, f32::MIN_POSITIVE]),
        ),
        ("a.bool", Value::from(vec![true, false, false, true])),
        ("a.string", Value::from(vec!["▁the", "", "</s>"])),
        ("a.u64", Value::from(vec![u64::MAX, 0])),
        ("a.i64", Value::from(vec![i64::MAX, -9])),
        ("a.f64", Value::from(vec![-1e-300f64, 2.0])),
        ("a.empty_u32", Value::from(Vec::<u32>::new())),
        ("a.empty_nested", Value::Array(Array::Array(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::from(vec![1i32, 2]),
                Array::from(vec!["x".to_string()]),
                Array::Array(vec![
                    Array::from(vec![0.5f64]),
                    Array::from(Vec::<u8>::new()),
                ]),
                Array::from(Vec::<bool>::new()),
            ])),
        ),
    ]
}

/// Compares our tensor table and data with GGUFReader's.
pub fn compare_tensor_table(g: &Gguf, view: &J) {
    let want = view["tensors"].as_array().unwrap();
    assert_eq!(g.tensors().len(), want.len());
    for (t, w) in g.tensors().iter().zip(want) {
        let name = w["name"].as_str().unwrap();
        assert_eq!(t.name, name);
        assert_eq!(u64::from(t.ty.id()), w["type"].as_u64().unwrap(), "{name}");
        assert_eq!(t.ty.name(), w["type_name"].as_str().unwrap(), "{name}");
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims, dims, "{name}");
        assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{name}");
        assert_eq!(
            g.tensor_file_offset(t),
            w["file_offset"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(t.n_bytes, w["n_bytes"].as_u64().unwrap(), "{name}");
        assert_eq!(t.n_elements(), w["n_elements"].as_u64().unwrap(), "{name}");
        let (sum, weighted) = checksums(g.tensor_data(t));
        assert_eq!(sum, w["byte_sum"].as_u64().unwrap(), "{name} byte sum");
        assert_eq!(
            weighted,
            w["weighted_sum"].as_u64().unwrap(),
            "{name} weighted sum"
        );
    }
}
