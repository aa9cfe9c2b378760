//! The real Gemma 3 270M Q4_K_M file (NEAGARI_TEST_MODEL) against what the `gguf` Python
//! package reads from it (fixture made by scripts/gguf_reference.py), then truncated and
//! corrupted copies of it. Skips with a note when the model is absent.

mod common;

use common::*;
use neagari_formats::{Gguf, GgufError, GgufHeader, Value};
use serde_json::Value as J;

const FIXTURE: &str = "gemma3_270m_gguf.json";

fn model() -> Option<(Gguf, J)> {
    let path = test_model()?;
    let g = Gguf::open(&path).expect("model opens");
    let view = fixture_json(FIXTURE);
    assert_eq!(
        g.file_size(),
        view["file_size"].as_u64().unwrap(),
        "fixture is for another file"
    );
    Some((g, view))
}

#[test]
fn matches_gguf_py_reader() {
    let Some((g, view)) = model() else { return };
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(u64::from(g.version()), view["version"].as_u64().unwrap());
    assert_eq!(
        g.tensors().len() as u64,
        view["tensor_count"].as_u64().unwrap()
    );
    assert_eq!(
        g.metadata().len() as u64,
        view["kv_count"].as_u64().unwrap()
    );
    assert_eq!(g.alignment(), view["alignment"].as_u64().unwrap());
    assert_eq!(g.data_offset(), view["data_offset"].as_u64().unwrap());

    let fields = view["fields"].as_array().unwrap();
    let keys: Vec<&str> = g.metadata().keys().collect();
    let want: Vec<&str> = fields.iter().map(|f| f["key"].as_str().unwrap()).collect();
    assert_eq!(keys, want, "key set and order");

    for f in fields {
        let key = f["key"].as_str().unwrap();
        let v = g.get(key).unwrap();
        let types: Vec<u64> = f["types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(u64::from(v.value_type().id()), types[0], "{key} type");
        match v {
            Value::Array(a) => {
                assert_eq!(
                    u64::from(a.elem_type().id()),
                    types[1],
                    "{key} element type"
                );
                assert_eq!(a.len() as u64, f["len"].as_u64().unwrap(), "{key} length");
                let head = f["head"].as_array().unwrap();
                for (i, want) in head.iter().enumerate() {
                    assert_eq!(&array_elem_json(a, i), want, "{key}[{i}]");
                }
                let tail = f["tail"].as_array().unwrap();
                for (k, want) in tail.iter().enumerate() {
                    let i = a.len() - tail.len() + k;
                    assert_eq!(&array_elem_json(a, i), want, "{key}[{i}]");
                }
            }
            v => assert_eq!(scalar_json(v), f["value"], "{key} value"),
        }
    }

    // Typed getters on the keys a model loader reads.
    let scalar = |k: &str| fields.iter().find(|f| f["key"] == k).unwrap()["value"].clone();
    assert_eq!(
        u64::from(g.get_u32("gemma3.block_count").unwrap()),
        scalar("gemma3.block_count").as_u64().unwrap()
    );
    assert_eq!(
        g.get_u64("gemma3.context_length").unwrap(),
        scalar("gemma3.context_length").as_u64().unwrap()
    );
    assert_eq!(
        f64::from(
            g.get_f32("gemma3.attention.layer_norm_rms_epsilon")
                .unwrap()
        ),
        scalar("gemma3.attention.layer_norm_rms_epsilon")
            .as_f64()
            .unwrap()
    );
    assert_eq!(
        g.get_bool("tokenizer.ggml.add_bos_token").unwrap(),
        scalar("tokenizer.ggml.add_bos_token").as_bool().unwrap()
    );
    assert_eq!(
        g.get_str("tokenizer.ggml.model").unwrap(),
        scalar("tokenizer.ggml.model").as_str().unwrap()
    );
    let tokens = g.get_str_array("tokenizer.ggml.tokens").unwrap();
    let scores = g.get_f32_array("tokenizer.ggml.scores").unwrap();
    let types = g.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(tokens.len(), scores.len());
    assert_eq!(tokens.len(), types.len());
    assert_eq!(tokens[2], "<bos>");
    assert!(matches!(
        g.get_str("gemma3.block_count"),
        Err(GgufError::WrongType { .. })
    ));

    compare_tensor_table(&g, &view);
    // tensor_data is a view into the map, not a copy.
    for t in g.tensors() {
        let at = g.tensor_file_offset(t) as usize;
        assert_eq!(
            g.tensor_data(t).as_ptr(),
            g.bytes()[at..].as_ptr(),
            "{}",
            t.name
        );
    }
    // The tensors tile the data section in order, each at an aligned offset.
    let mut end = 0;
    for t in g.tensors() {
        assert!(
            t.offset >= end && t.offset % g.alignment() == 0,
            "{}",
            t.name
        );
        end = t.offset + t.n_bytes;
    }
}

fn is_truncation(r: &Result<GgufHeader, GgufError>) -> bool {
    matches!(
        r,
        Err(GgufError::Truncated { .. }
            | GgufError::CountTooLarge { .. }
            | GgufError::TensorOutOfBounds { .. })
    )
}

/// Byte offsets where the header's structure changes, from gguf-py's field offsets and the
/// tensor table: every field start, key end, type tag end, array count end.
fn boundaries(g: &Gguf, view: &J) -> Vec<u64> {
    let mut cuts: Vec<u64> = (0..=24).collect();
    for f in view["fields"].as_array().unwrap() {
        let o = f["offset"].as_u64().unwrap();
        let klen = f["key"].as_str().unwrap().len() as u64;
        let value = o + 8 + klen + 4;
        cuts.extend([o, o + 4, o + 8, o + 8 + klen, value, value + 4]);
        // Cuts past the token list each re-parse 262k strings: finer steps only before it.
        if o < 1024 {
            cuts.extend([value + 1, value + 8, value + 12]);
        }
        if f["types"][0] == 9 {
            cuts.extend([value + 13, value + 16, value + 20, value + 24]);
        }
    }
    // Tensor infos: sizes from GGUFReader's table, laid out from our tensor_info_offset; that
    // they end where the data section begins (after padding) checks that offset too.
    let mut at = g.tensor_info_offset();
    let tensors = view["tensors"].as_array().unwrap();
    for (i, t) in tensors.iter().enumerate() {
        let nlen = t["name"].as_str().unwrap().len() as u64;
        let nd = t["dims"].as_array().unwrap().len() as u64;
        let size = 8 + nlen + 4 + 8 * nd + 4 + 8;
        if i < 3 || i + 3 >= tensors.len() {
            let mut p = at;
            cuts.extend([p, p + 8, p + 8 + nlen]);
            p += 8 + nlen + 4;
            cuts.push(p);
            for _ in 0..nd {
                p += 8;
                cuts.push(p);
            }
            cuts.extend([p + 4, p + 12, p + 11]);
        } else if i % 16 == 0 {
            cuts.push(at);
        }
        at += size;
    }
    let a = g.alignment();
    assert_eq!(
        at.div_ceil(a) * a,
        g.data_offset(),
        "tensor-info table ends before the data"
    );
    cuts.extend([at - 1, at, g.data_offset()]);
    cuts
}

#[test]
fn truncated_copies_never_panic() {
    let Some((g, view)) = model() else { return };
    let bytes = g.bytes();
    let last_end = g
        .tensors()
        .iter()
        .map(|t| g.tensor_file_offset(t) + t.n_bytes)
        .max()
        .unwrap();

    let mut cuts = boundaries(&g, &view);
    let mut rng = Rng(0x6775_6666);
    let span = g.data_offset() + 64;
    cuts.extend((0..200).map(|_| rng.below(span)));
    cuts.extend((0..12).map(|_| g.data_offset() + rng.below(g.file_size() - g.data_offset())));
    cuts.extend([last_end - 1, last_end, g.file_size() - 1]);
    cuts.sort_unstable();
    cuts.dedup();

    for &cut in &cuts {
        let cut = cut.min(g.file_size());
        let prefix = &bytes[..cut as usize];
        // A prefix whose file size is its own length is exactly a truncated file.
        let r = no_panic(&format!("model cut at {cut}"), || {
            GgufHeader::parse(prefix, cut)
        });
        if cut < last_end {
            assert!(is_truncation(&r), "cut at {cut}: {:?}", r.map(|_| ()));
        } else {
            assert!(
                r.is_ok(),
                "cut at {cut} after the last tensor: {:?}",
                r.map(|_| ())
            );
        }
    }

    // The same through the owning constructors: in-memory copies and files on disk.
    for cut in [
        30,
        1000,
        g.tensor_info_offset() + 100,
        g.data_offset() + 5000,
    ] {
        let r = no_panic("from_bytes copy", || {
            Gguf::from_bytes(bytes[..cut as usize].to_vec())
        });
        assert!(r.is_err(), "from_bytes cut at {cut} accepted");
    }
    let dir = std::env::temp_dir();
    for cut in [500u64, g.tensor_info_offset() + 17] {
        let path = dir.join(format!("neagari_trunc_{}_{cut}.gguf", std::process::id()));
        std::fs::write(&path, &bytes[..cut as usize]).unwrap();
        let r = no_panic("open truncated file", || Gguf::open(&path));
        std::fs::remove_file(&path).unwrap();
        assert!(
            matches!(
                r,
                Err(GgufError::Truncated { .. } | GgufError::CountTooLarge { .. })
            ),
            "{r:?}"
        );
    }
}

#[test]
fn corrupted_headers_never_panic() {
    let Some((g, _)) = model() else { return };
    let header = &g.bytes()[..g.data_offset() as usize];
    let mut buf = header.to_vec();
    let mut rng = Rng(0xF11F);
    let (info_start, end) = (g.tensor_info_offset(), g.data_offset());
    let (mut ok, mut err) = (0, 0);
    for i in 0..300 {
        // Thirds: the fixed header and small keys, the tensor-info table, anywhere.
        let pick = |rng: &mut Rng| match i % 3 {
            0 => rng.below(1024),
            1 => info_start + rng.below(end - info_start),
            _ => rng.below(end),
        } as usize;
        let flips: Vec<(usize, u8)> = (0..1 + rng.below(3))
            .map(|_| (pick(&mut rng), rng.byte() | 1))
            .collect();
        for &(p, x) in &flips {
            buf[p] ^= x;
        }
        let r = no_panic(&format!("model flips {flips:?}"), || {
            GgufHeader::parse(&buf, g.file_size())
        });
        match r {
            Ok(h) => {
                ok += 1;
                for t in h.tensors() {
                    assert!(h.tensor_file_offset(t) + t.n_bytes <= h.file_size());
                }
            }
            Err(e) => {
                let _ = e.to_string();
                err += 1;
            }
        }
        for &(p, _) in &flips {
            buf[p] = header[p];
        }
    }
    eprintln!("corrupted model headers: {ok} accepted, {err} refused");
    assert!(err > 0);
}
