//! Writer → reader round trips, the writer against gguf-py's writer byte for byte, the
//! reader against gguf-py's view of the same file, and the typed getters.

mod common;

use common::*;
use neagari_formats::{Array, GgmlType, Gguf, GgufError, GgufWriter, Metadata, Value};

#[test]
fn every_value_type_round_trips() {
    for alignment in [1u32, 8, 32, 64, 4096] {
        let (bytes, datas) = synthetic_file(alignment);
        let g = Gguf::from_bytes(bytes.clone()).unwrap();
        assert_eq!(g.version(), 3);
        assert_eq!(g.alignment(), u64::from(alignment));
        assert_eq!(g.data_offset() % u64::from(alignment), 0);
        assert_eq!(g.file_size(), bytes.len() as u64);
        assert_eq!(g.architecture().unwrap(), "synthetic");

        let mut want = Metadata::new();
        want.insert("general.architecture", "synthetic").unwrap();
        want.insert("general.alignment", alignment).unwrap();
        for (k, v) in every_value() {
            want.insert(k, v).unwrap();
        }
        assert_eq!(g.metadata(), &want);
        let keys: Vec<&str> = g.metadata().keys().collect();
        let want_keys: Vec<&str> = want.keys().collect();
        assert_eq!(keys, want_keys, "key order");

        assert_eq!(g.tensors().len(), datas.len());
        let mut prev_end = 0;
        for (t, d) in g.tensors().iter().zip(&datas) {
            assert_eq!(g.tensor_data(t), &d[..], "{}", t.name);
            assert_eq!(t.offset % u64::from(alignment), 0);
            assert!(t.offset >= prev_end, "tensors overlap");
            prev_end = t.offset + t.n_bytes;
        }
        // The file ends with the last tensor's padding.
        let padded = prev_end.div_ceil(u64::from(alignment)) * u64::from(alignment);
        assert_eq!(g.file_size(), g.data_offset() + padded);
    }
}

#[test]
fn gguf_is_shareable_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Gguf>();
    shareable::<GgufError>();
}

#[test]
fn tensor_geometry_helpers() {
    let (bytes, _) = synthetic_file(32);
    let g = Gguf::from_bytes(bytes).unwrap();
    let q = g.tensor("b.q4_k").unwrap();
    assert_eq!(q.ty, GgmlType::Q4_K);
    assert_eq!(q.dims, vec![256, 2]);
    assert_eq!((q.row_len(), q.rows(), q.n_elements()), (256, 2, 512));
    assert_eq!(q.row_bytes(), 144);
    assert_eq!(q.n_bytes, 288);
    assert_eq!(q.ne(), [256, 2, 1, 1]);
    let d = g.tensor("d.q8_0").unwrap();
    assert_eq!((d.rows(), d.n_bytes), (2, 68));
    let e = g.tensor("e.empty").unwrap();
    assert_eq!((e.n_elements(), e.n_bytes), (0, 0));
    assert!(g.tensor_data(e).is_empty());
    assert!(g.tensor("nope").is_none());
    assert_eq!(g.tensor_bytes("c.f16").map(<[u8]>::len), Some(10));
}

#[test]
fn open_reads_the_same_as_from_bytes() {
    let (bytes, datas) = synthetic_file(64);
    let path = std::env::temp_dir().join(format!("neagari_formats_rt_{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let g = Gguf::open(&path);
    std::fs::remove_file(&path).unwrap();
    let g = g.unwrap();
    let h = Gguf::from_bytes(bytes).unwrap();
    assert_eq!(g.metadata(), h.metadata());
    assert_eq!(g.tensors(), h.tensors());
    for (t, d) in g.tensors().iter().zip(&datas) {
        assert_eq!(g.tensor_data(t), &d[..]);
    }
}

#[test]
fn chunked_streaming_equals_whole_tensors() {
    let (whole, datas) = synthetic_file(32);
    // Same declarations, data fed in uneven chunks.
    let mut w = GgufWriter::new();
    w.add("general.architecture", "synthetic").unwrap();
    w.set_alignment(32).unwrap();
    for (k, v) in every_value() {
        w.add(k, v).unwrap();
    }
    let g = Gguf::from_bytes(whole.clone()).unwrap();
    for t in g.tensors() {
        w.add_tensor(t.name.clone(), &t.dims, t.ty).unwrap();
    }
    let mut out = w.start(Vec::new()).unwrap();
    for d in &datas {
        for c in d.chunks(7) {
            out.write_chunk(c).unwrap();
        }
    }
    assert!(out.next_tensor().is_none());
    assert_eq!(out.finish().unwrap(), whole);
}

/// Rebuilds gguf-py's synthetic file from the description of what was given to
/// gguf.GGUFWriter and requires identical bytes.
#[test]
fn writer_matches_gguf_py_byte_for_byte() {
    let desc = fixture_json("gguf_py_synthetic.json");
    let reference = std::fs::read(fixture_path("gguf_py_synthetic.bin")).unwrap();
    let mut w = GgufWriter::new();
    for kv in desc["kvs"].as_array().unwrap() {
        w.add(kv["key"].as_str().unwrap(), spec_value(&kv["spec"]))
            .unwrap();
    }
    let tensors = desc["reader"]["tensors"].as_array().unwrap();
    for t in tensors {
        let dims: Vec<u64> = t["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let ty = GgmlType::from_id(t["type"].as_u64().unwrap() as u32).unwrap();
        let n = w
            .add_tensor(t["name"].as_str().unwrap(), &dims, ty)
            .unwrap();
        assert_eq!(n, t["n_bytes"].as_u64().unwrap());
    }
    let mut out = w.start(Vec::new()).unwrap();
    for t in desc["tensors"].as_array().unwrap() {
        out.write_tensor(&hex(t["data_hex"].as_str().unwrap()))
            .unwrap();
    }
    let ours = out.finish().unwrap();
    assert_eq!(ours.len(), reference.len());
    if let Some(i) = ours.iter().zip(&reference).position(|(a, b)| a != b) {
        panic!("first differing byte at offset {i}");
    }
}

/// Our reader on gguf-py's file: the values given to gguf-py and GGUFReader's table.
#[test]
fn reader_matches_gguf_py_on_its_file() {
    let desc = fixture_json("gguf_py_synthetic.json");
    let view = &desc["reader"];
    let g = Gguf::open(fixture_path("gguf_py_synthetic.bin")).unwrap();
    assert_eq!(u64::from(g.version()), view["version"].as_u64().unwrap());
    assert_eq!(g.alignment(), view["alignment"].as_u64().unwrap());
    assert_eq!(g.data_offset(), view["data_offset"].as_u64().unwrap());
    assert_eq!(g.file_size(), view["file_size"].as_u64().unwrap());

    let kvs = desc["kvs"].as_array().unwrap();
    assert_eq!(g.metadata().len(), kvs.len());
    for ((key, value), kv) in g.metadata().iter().zip(kvs) {
        assert_eq!(key, kv["key"].as_str().unwrap());
        assert_eq!(value, &spec_value(&kv["spec"]), "{key}");
    }
    for (field, (key, value)) in view["fields"]
        .as_array()
        .unwrap()
        .iter()
        .zip(g.metadata().iter())
    {
        assert_eq!(field["key"], key);
        assert_eq!(
            field["types"][0].as_u64(),
            Some(u64::from(value.value_type().id()))
        );
        if let Value::Array(a) = value {
            assert_eq!(
                field["types"][1].as_u64(),
                Some(u64::from(a.elem_type().id())),
                "{key}"
            );
        }
    }
    compare_tensor_table(&g, view);
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn integer_getters_accept_any_lossless_width() {
    let mut m = Metadata::new();
    m.insert("u8", 7u8).unwrap();
    m.insert("i32", 40i32).unwrap();
    m.insert("neg", -1i32).unwrap();
    m.insert("u64_small", 123u64).unwrap();
    m.insert("u64_big", 1u64 << 40).unwrap();
    m.insert("i64_min", i64::MIN).unwrap();
    m.insert("f32", 0.5f32).unwrap();
    m.insert("f64", 0.1f64).unwrap();
    m.insert("s", "text").unwrap();
    m.insert("b", true).unwrap();
    assert_eq!(m.get_u32("u8").unwrap(), 7);
    assert_eq!(m.get_u32("i32").unwrap(), 40);
    assert_eq!(m.get_u64("i32").unwrap(), 40);
    assert_eq!(m.get_u32("u64_small").unwrap(), 123);
    assert_eq!(m.get_u64("u64_big").unwrap(), 1 << 40);
    assert_eq!(m.get_i32("neg").unwrap(), -1);
    assert_eq!(m.get_i64("i64_min").unwrap(), i64::MIN);
    assert!(matches!(
        m.get_u32("neg"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        m.get_u64("i64_min"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        m.get_u32("u64_big"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(
        m.get_i32("u64_big"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert!(matches!(m.get_u32("f32"), Err(GgufError::WrongType { .. })));
    assert!(matches!(m.get_u32("b"), Err(GgufError::WrongType { .. })));
    assert!(matches!(m.get_u32("missing"), Err(GgufError::MissingKey(k)) if k == "missing"));
    assert_eq!(m.get_f32("f32").unwrap(), 0.5);
    assert_eq!(m.get_f32("f64").unwrap(), 0.1f64 as f32);
    assert_eq!(m.get_f64("f32").unwrap(), 0.5);
    assert!(matches!(m.get_f32("i32"), Err(GgufError::WrongType { .. })));
    assert_eq!(m.get_str("s").unwrap(), "text");
    assert!(matches!(m.get_str("u8"), Err(GgufError::WrongType { found, .. }) if found == "u8"));
    assert!(m.get_bool("b").unwrap());
    assert!(matches!(m.get_bool("u8"), Err(GgufError::WrongType { .. })));
}

#[test]
fn array_getters_borrow_or_convert() {
    let mut m = Metadata::new();
    m.insert("f32", vec![1.0f32, 2.5]).unwrap();
    m.insert("f64", vec![0.25f64]).unwrap();
    m.insert("i32", vec![-1i32, 3]).unwrap();
    m.insert("u32", vec![1u32, 2]).unwrap();
    m.insert("u32_big", vec![1u32, 1 << 31]).unwrap();
    m.insert("i16", vec![-3i16]).unwrap();
    m.insert("strs", vec!["a", "b"]).unwrap();
    m.insert("scalar", 1u32).unwrap();
    assert!(matches!(
        m.get_f32_array("f32").unwrap(),
        std::borrow::Cow::Borrowed(&[1.0, 2.5])
    ));
    assert_eq!(&*m.get_f32_array("f64").unwrap(), &[0.25]);
    assert!(matches!(
        m.get_i32_array("i32").unwrap(),
        std::borrow::Cow::Borrowed(&[-1, 3])
    ));
    assert_eq!(&*m.get_i32_array("u32").unwrap(), &[1, 2]);
    assert_eq!(&*m.get_i32_array("i16").unwrap(), &[-3]);
    assert!(
        matches!(m.get_i32_array("u32_big"), Err(GgufError::OutOfRange { value, .. }) if value == "2147483648")
    );
    assert!(matches!(
        m.get_u32_array("i32"),
        Err(GgufError::OutOfRange { .. })
    ));
    assert_eq!(&*m.get_u32_array("u32").unwrap(), &[1, 2]);
    assert_eq!(
        m.get_str_array("strs").unwrap(),
        &["a".to_string(), "b".to_string()]
    );
    let e = m.get_str_array("f32").unwrap_err();
    assert!(
        matches!(&e, GgufError::WrongType { found, .. } if found == "array[f32]"),
        "{e}"
    );
    assert!(matches!(
        m.get_f32_array("strs"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        m.get_i32_array("f32"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        m.get_f32_array("scalar"),
        Err(GgufError::WrongType { .. })
    ));
    assert!(matches!(
        m.get_str_array("missing"),
        Err(GgufError::MissingKey(_))
    ));
    assert_eq!(
        Value::Array(Array::Array(vec![Array::from(vec![1u8])])).type_desc(),
        "array[array[u8]]"
    );
}

#[test]
fn writer_refuses_what_the_reader_would() {
    let mut w = GgufWriter::new();
    w.add("k", 1u32).unwrap();
    assert!(matches!(w.add("k", 2u32), Err(GgufError::DuplicateKey(k)) if k == "k"));
    assert!(matches!(
        w.set_alignment(48),
        Err(GgufError::BadAlignment(48))
    ));
    assert!(matches!(
        w.set_alignment(0),
        Err(GgufError::BadAlignment(0))
    ));
    w.add_tensor("t", &[32], GgmlType::Q8_0).unwrap();
    assert!(matches!(
        w.add_tensor("t", &[32], GgmlType::Q8_0),
        Err(GgufError::DuplicateTensor(_))
    ));
    assert!(matches!(
        w.add_tensor("r", &[100], GgmlType::Q4_K),
        Err(GgufError::RaggedRow {
            ne0: 100,
            block: 256,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("d", &[1, 1, 1, 1, 1], GgmlType::F32),
        Err(GgufError::TooManyDims { .. })
    ));
    assert!(matches!(
        w.add_tensor("o", &[1 << 40, 1 << 40], GgmlType::F32),
        Err(GgufError::DimsOverflow { .. })
    ));
    let mut deep = Array::from(vec![1u8]);
    for _ in 0..neagari_formats::gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    assert!(matches!(
        w.add("deep", deep),
        Err(GgufError::NestingTooDeep { .. })
    ));
    w.add_tensor("u", &[4], GgmlType::F32).unwrap();

    let mut out = w.clone().start(Vec::new()).unwrap();
    assert!(matches!(
        out.write_tensor(&[0; 33]),
        Err(GgufError::DataSizeMismatch {
            expected: 34,
            got: 33,
            ..
        })
    ));
    out.write_tensor(&[0; 34]).unwrap();
    assert!(matches!(
        out.write_chunk(&[0; 17]),
        Err(GgufError::DataSizeMismatch { expected: 16, .. })
    ));
    out.write_chunk(&[0; 8]).unwrap();
    assert!(matches!(out.finish(), Err(GgufError::MissingData(t)) if t == "u"));

    let mut out = w.start(Vec::new()).unwrap();
    out.write_tensor(&[0; 34]).unwrap();
    out.write_tensor(&[0; 16]).unwrap();
    assert!(matches!(
        out.write_chunk(&[1]),
        Err(GgufError::TooMuchData { got: 1 })
    ));
    assert!(Gguf::from_bytes(out.finish().unwrap()).is_ok());
}

#[test]
fn reader_accepts_any_integer_alignment_type() {
    // ggml writes u32; a u64 or i32 holding the same power of two reads the same.
    for v in [Value::U64(64), Value::I32(64), Value::U16(64)] {
        let mut w = GgufWriter::new();
        w.add("general.alignment", v).unwrap();
        w.add_tensor("t", &[3], GgmlType::F32).unwrap();
        let mut out = w.start(Vec::new()).unwrap();
        out.write_tensor(&[1; 12]).unwrap();
        let g = Gguf::from_bytes(out.finish().unwrap()).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() % 64, 0);
        assert_eq!(g.file_size(), g.data_offset() + 64);
    }
}
