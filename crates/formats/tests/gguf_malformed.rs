//! Malformed input: one hand-built file per error kind, then truncation and byte-flip
//! sweeps over small files from our writer and from gguf-py. Every outcome must be `Ok` or
//! a typed error; a panic fails the test.

mod common;

use common::*;
use neagari_formats::gguf::MAX_ARRAY_DEPTH;
use neagari_formats::{Gguf, GgufError, GgufHeader};

fn open(r: &Raw) -> Result<Gguf, GgufError> {
    no_panic("hand-built file", || open_and_touch(&r.0))
}

/// A valid minimal file: one F32 tensor of 4 elements.
fn minimal(version: u32) -> Raw {
    let mut r = Raw::header(version, 1, 1);
    r.str("general.architecture").u32(8).str("test");
    r.tensor("w", &[4], 0, 0).pad_data(32, 16);
    r
}

#[test]
fn minimal_v2_and_v3_parse() {
    for v in [2, 3] {
        let g = open(&minimal(v)).unwrap();
        assert_eq!(g.version(), v);
        assert_eq!(g.architecture().unwrap(), "test");
        assert_eq!(g.tensor_data(&g.tensors()[0]), &[0xAB; 16]);
    }
}

#[test]
fn header_errors() {
    let mut r = minimal(3);
    r.0[..4].copy_from_slice(b"GGML");
    assert!(matches!(open(&r), Err(GgufError::BadMagic(m)) if &m == b"GGML"));
    assert!(matches!(
        open(&minimal(1)),
        Err(GgufError::UnsupportedVersion(1))
    ));
    assert!(matches!(
        open(&minimal(4)),
        Err(GgufError::UnsupportedVersion(4))
    ));
    // A big-endian v3 file: the version bytes read little-endian as 0x03000000.
    assert!(matches!(
        open(&minimal(3u32.swap_bytes())),
        Err(GgufError::ByteSwapped(0x0300_0000))
    ));
    assert!(matches!(
        open(&Raw::default()),
        Err(GgufError::Truncated { what: "magic", .. })
    ));
    assert!(matches!(
        open(&Raw(b"GGUF\x03\0".to_vec())),
        Err(GgufError::Truncated {
            what: "version",
            ..
        })
    ));
    let empty = std::env::temp_dir().join(format!("neagari_empty_{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let r = no_panic("empty file", || Gguf::open(&empty));
    std::fs::remove_file(&empty).unwrap();
    assert!(
        matches!(
            r,
            Err(GgufError::Truncated {
                what: "magic",
                offset: 0,
                need: 4,
                have: 0
            })
        ),
        "{r:?}"
    );
    let e = Gguf::open("/nonexistent/neagari.gguf").unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }), "{e}");
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let r = Raw::header(3, 0, u64::MAX);
    assert!(matches!(
        open(&r),
        Err(GgufError::CountTooLarge {
            what: "metadata",
            count: u64::MAX,
            ..
        })
    ));
    let r = Raw::header(3, u64::MAX, 0);
    assert!(matches!(
        open(&r),
        Err(GgufError::CountTooLarge {
            what: "tensor info",
            ..
        })
    ));
    // Array of 2^62 u32: would need 16 EiB.
    let mut r = Raw::header(3, 0, 1);
    r.str("a").u32(9).u32(4).u64(1 << 62).u32(0);
    assert!(
        matches!(open(&r), Err(GgufError::CountTooLarge { what: "array element", count, .. }) if count == 1 << 62)
    );
    // Array of 2^40 strings (each at least 8 bytes).
    let mut r = Raw::header(3, 0, 1);
    r.str("a").u32(9).u32(8).u64(1 << 40);
    assert!(matches!(open(&r), Err(GgufError::CountTooLarge { .. })));
    // String length 2^63: refused as truncation, nothing allocated.
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 63).bytes(b"key").bytes(&[0; 16]);
    assert!(
        matches!(open(&r), Err(GgufError::Truncated { what: "metadata key", need, .. }) if need == 1 << 63)
    );
}

#[test]
fn value_errors() {
    let mut r = Raw::header(3, 0, 1);
    r.u64(2).bytes(&[0xC3, 0x28]).u32(4).u32(0);
    assert!(matches!(
        open(&r),
        Err(GgufError::InvalidUtf8 {
            what: "metadata key",
            offset: 32
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("s").u32(8).u64(1).u8(0xFF);
    assert!(matches!(
        open(&r),
        Err(GgufError::InvalidUtf8 {
            what: "string value",
            ..
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("s").u32(9).u32(8).u64(2).str("ok").u64(1).u8(0x80);
    assert!(matches!(
        open(&r),
        Err(GgufError::InvalidUtf8 {
            what: "string array element",
            ..
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(7).u8(2);
    assert!(matches!(
        open(&r),
        Err(GgufError::InvalidBool {
            value: 2,
            offset: 37
        })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("b").u32(9).u32(7).u64(3).u8(1).u8(0).u8(7);
    assert!(matches!(
        open(&r),
        Err(GgufError::InvalidBool { value: 7, .. })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("x").u32(13).u32(0);
    assert!(matches!(
        open(&r),
        Err(GgufError::UnknownValueType { id: 13, offset: 33 })
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("x").u32(9).u32(99).u64(0);
    assert!(matches!(
        open(&r),
        Err(GgufError::UnknownValueType { id: 99, .. })
    ));
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    assert!(matches!(open(&r), Err(GgufError::DuplicateKey(k)) if k == "k"));
}

#[test]
fn nesting_depth_is_bounded() {
    // depth arrays of arrays around one empty u8 array.
    let nested = |depth: usize| {
        let mut r = Raw::header(3, 0, 1);
        r.str("n").u32(9);
        for _ in 0..depth - 1 {
            r.u32(9).u64(1);
        }
        r.u32(0).u64(0);
        r
    };
    let g = open(&nested(MAX_ARRAY_DEPTH)).unwrap();
    assert_eq!(
        g.get("n").unwrap().type_desc().matches("array").count(),
        MAX_ARRAY_DEPTH
    );
    assert!(matches!(
        open(&nested(MAX_ARRAY_DEPTH + 1)),
        Err(GgufError::NestingTooDeep { .. })
    ));
    // A hostile file nesting a million levels: refused, no stack overflow.
    assert!(matches!(
        open(&nested(1_000_000)),
        Err(GgufError::NestingTooDeep { .. })
    ));
}

#[test]
fn alignment_errors() {
    for (a, ok) in [
        (48u32, false),
        (0, false),
        (3, false),
        (1, true),
        (64, true),
    ] {
        let mut r = Raw::header(3, 1, 1);
        r.kv_u32("general.alignment", a);
        r.tensor("w", &[4], 0, 0).pad_data(64, 16);
        match open(&r) {
            Ok(g) => {
                assert!(ok, "alignment {a} accepted");
                assert_eq!(g.alignment(), u64::from(a));
            }
            Err(GgufError::BadAlignment(x)) => assert!(!ok && x == u64::from(a)),
            Err(e) => panic!("alignment {a}: {e}"),
        }
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    assert!(matches!(open(&r), Err(GgufError::WrongType { .. })));
}

/// One tensor info with the given fields, after an empty metadata section.
fn one_tensor(dims: &[u64], ty: u32, offset: u64, data: usize) -> Raw {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("blk.0.w", dims, ty, offset).pad_data(32, data);
    r
}

#[test]
fn tensor_info_errors() {
    let e = open(&one_tensor(&[1, 1, 1, 1, 1], 0, 0, 4)).unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 5, .. }), "{e}");
    let e = open(&one_tensor(&[1 << 32, 1 << 32], 0, 0, 4)).unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    let e = open(&one_tensor(&[1 << 63], 24, 0, 4)).unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}"); // ne > INT64_MAX
                                                                 // ne[0] = 0 makes the element count 0, but the row count still overflows.
    let e = open(&one_tensor(&[0, 1 << 40, 1 << 40], 0, 0, 4)).unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    // I64 elements: 2^61 elements fit i64 but their bytes (2^64) do not fit u64.
    let e = open(&one_tensor(&[1 << 61], 27, 0, 4)).unwrap_err();
    assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    // Id 4 was Q4_2, removed from ggml.
    let e = open(&one_tensor(&[32], 4, 0, 18)).unwrap_err();
    assert!(matches!(&e, GgufError::UnknownTensorType { id: 4, tensor } if tensor == "blk.0.w"));
    assert!(e.to_string().contains("type id 4"), "{e}");
    let e = open(&one_tensor(&[100, 2], 12, 0, 4096)).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::RaggedRow {
                ne0: 100,
                block: 256,
                ..
            }
        ),
        "{e}"
    );
    let e = open(&one_tensor(&[4], 0, 16, 64)).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 16,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    // 4 F32 need 16 bytes; 15 present.
    let e = open(&one_tensor(&[4], 0, 0, 15)).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = open(&one_tensor(&[4], 0, u64::MAX - 31, 16)).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[4], 0, 0)
        .tensor("t", &[4], 0, 32)
        .pad_data(32, 48);
    assert!(matches!(open(&r), Err(GgufError::DuplicateTensor(t)) if t == "t"));
    // Zero dimensions: a scalar of one element.
    let g = open(&one_tensor(&[], 0, 0, 4)).unwrap();
    assert_eq!(
        (g.tensors()[0].n_elements(), g.tensors()[0].n_bytes),
        (1, 4)
    );
}

#[test]
fn header_parse_of_a_prefix_checks_ranges_against_the_file_size() {
    let (bytes, _) = synthetic_file(32);
    let full = Gguf::from_bytes(bytes.clone()).unwrap();
    let prefix = &bytes[..full.data_offset() as usize];
    let h = GgufHeader::parse(prefix, bytes.len() as u64).unwrap();
    assert_eq!(h.tensors(), full.tensors());
    assert_eq!(h.metadata(), full.metadata());
    let e = GgufHeader::parse(prefix, prefix.len() as u64).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
}

/// Cuts a file at every byte: everything before the end of the last tensor's data must be
/// an error, and only a truncation-like one.
fn truncation_sweep(bytes: &[u8], label: &str) {
    let g = Gguf::from_bytes(bytes.to_vec()).unwrap();
    let data_end = g
        .tensors()
        .iter()
        .map(|t| g.tensor_file_offset(t) + t.n_bytes)
        .max()
        .unwrap_or(0);
    let data_end = data_end.max(g.tensor_info_offset());
    for cut in 0..=bytes.len() {
        let r = no_panic(&format!("{label} cut at {cut}"), || {
            open_and_touch(&bytes[..cut])
        });
        if (cut as u64) < data_end {
            match r {
                Err(GgufError::Truncated { .. })
                | Err(GgufError::CountTooLarge { .. })
                | Err(GgufError::TensorOutOfBounds { .. }) => {}
                Err(e) => panic!("{label} cut at {cut}: unexpected error {e}"),
                Ok(_) => panic!("{label} cut at {cut}: accepted"),
            }
        }
    }
}

/// Random byte corruption: `n` variants, each 1..=max_flips bytes xored with random values.
fn flip_sweep(bytes: &[u8], label: &str, seed: u64, n: usize, max_flips: u64) -> (usize, usize) {
    let mut rng = Rng(seed);
    let mut buf = bytes.to_vec();
    let (mut ok, mut err) = (0, 0);
    for i in 0..n {
        let flips: Vec<(usize, u8)> = (0..1 + rng.below(max_flips))
            .map(|_| (rng.below(bytes.len() as u64) as usize, rng.byte() | 1))
            .collect();
        for &(p, x) in &flips {
            buf[p] ^= x;
        }
        match no_panic(&format!("{label} variant {i} flips {flips:?}"), || {
            open_and_touch(&buf)
        }) {
            Ok(_) => ok += 1,
            Err(e) => {
                let _ = e.to_string(); // Display never panics either
                err += 1;
            }
        }
        buf.copy_from_slice(bytes);
    }
    (ok, err)
}

/// Every single byte xored with a few masks: exercises each field's validation in turn.
fn every_byte_sweep(bytes: &[u8], label: &str) {
    let mut buf = bytes.to_vec();
    for p in 0..bytes.len() {
        for x in [0x01u8, 0x80, 0xFF, 0x7E] {
            buf[p] ^= x;
            let _ = no_panic(&format!("{label} byte {p} ^ {x:#x}"), || {
                open_and_touch(&buf)
            });
            buf[p] = bytes[p];
        }
    }
}

#[test]
fn synthetic_truncations_never_panic() {
    for a in [1, 32, 64] {
        let (bytes, _) = synthetic_file(a);
        truncation_sweep(&bytes, &format!("synthetic align {a}"));
    }
    let py = std::fs::read(fixture_path("gguf_py_synthetic.bin")).unwrap();
    truncation_sweep(&py, "gguf-py synthetic");
}

#[test]
fn synthetic_byte_flips_never_panic() {
    let (bytes, _) = synthetic_file(32);
    every_byte_sweep(&bytes, "synthetic");
    let (ok, err) = flip_sweep(&bytes, "synthetic", 1, 3000, 8);
    // Flips in tensor data or padding leave a valid file; flips in the header mostly don't.
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
    let py = std::fs::read(fixture_path("gguf_py_synthetic.bin")).unwrap();
    every_byte_sweep(&py, "gguf-py synthetic");
    flip_sweep(&py, "gguf-py synthetic", 2, 2000, 8);
}
