#!/usr/bin/env python3
"""Reference fixtures for neagari-formats' GGUF reader and writer, made with the `gguf`
Python package (llama.cpp's gguf-py), which no one in this project wrote.

Writes into crates/formats/tests/fixtures/:

  gemma3_270m_gguf.json   what gguf.GGUFReader reads from the Gemma 3 270M Q4_K_M file:
                          version, counts, alignment, data offset, every key with its type
                          ids and (for scalars) value, array lengths with first/last
                          elements, and the whole tensor table with a checksum of each
                          tensor's bytes.
  gguf_py_synthetic.bin   a small GGUF written by gguf.GGUFWriter with every metadata value
                          type, nested arrays, a custom alignment and tensors of several
                          ggml types (named .bin because the repo ignores *.gguf).
  gguf_py_synthetic.json  the values and tensors given to GGUFWriter (so the Rust writer can
                          rebuild the same file byte for byte), plus GGUFReader's view of it.

Usage: python3 scripts/gguf_reference.py [MODEL.gguf]
(MODEL defaults to $NEAGARI_TEST_MODEL; the model part is skipped when neither is set.)
Requires: pip install gguf numpy
"""

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFValueType as VT

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "formats" / "tests" / "fixtures"

MASK64 = (1 << 64) - 1


def checksums(raw: np.ndarray) -> tuple[int, int]:
    """(sum of bytes, sum of byte[i] * (i + 1)) both mod 2**64, over a uint8 array."""
    total = 0
    weighted = 0
    chunk = 1 << 22
    for start in range(0, raw.size, chunk):
        part = np.asarray(raw[start:start + chunk], dtype=np.uint64)
        idx = np.arange(start + 1, start + 1 + part.size, dtype=np.uint64)
        total = (total + int(part.sum(dtype=np.uint64))) & MASK64
        # uint64 products and sums wrap mod 2**64, which is the checksum's definition
        weighted = (weighted + int(np.dot(part, idx))) & MASK64
    return total, weighted


def plain(x):
    """numpy scalar → JSON-able Python value (floats exact: f32 widens to f64 losslessly)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (np.integer, int)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return float(x)
    return x


def field_view(field) -> dict:
    types = [int(t) for t in field.types]
    out = {"key": field.name, "types": types, "offset": int(field.offset)}
    if types[0] == VT.ARRAY and types[1] == VT.ARRAY:
        # GGUFReader flattens nested arrays and decodes them with one element type, which
        # is wrong for mixed nesting: record only the flattened leaf count.
        out["leaves"] = len(field.data)
    elif types[0] == VT.ARRAY:
        n = len(field.data)
        out["len"] = n
        if n:
            head = list(range(min(n, 8)))
            tail = list(range(max(n - 3, len(head)), n))
            out["head"] = [plain(field.contents(i)) for i in head]
            out["tail"] = [plain(field.contents(i)) for i in tail]
    else:
        out["value"] = plain(field.contents())
    return out


def tensor_view(reader, t) -> dict:
    raw = reader.data[t.data_offset:t.data_offset + t.n_bytes]
    total, weighted = checksums(raw)
    return {
        "name": t.name,
        "type": int(t.tensor_type),
        "type_name": t.tensor_type.name,
        "dims": [int(d) for d in t.shape],  # gguf-py keeps ggml ne order here
        "offset": int(t.data_offset) - int(reader.data_offset),
        "file_offset": int(t.data_offset),
        "n_bytes": int(t.n_bytes),
        "n_elements": int(t.n_elements),
        "byte_sum": total,
        "weighted_sum": weighted,
    }


def reader_view(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    fields = [f for f in r.fields.values() if not f.name.startswith("GGUF.")]
    return {
        "version": plain(r.fields["GGUF.version"].contents()),
        "tensor_count": plain(r.fields["GGUF.tensor_count"].contents()),
        "kv_count": plain(r.fields["GGUF.kv_count"].contents()),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "file_size": path.stat().st_size,
        "fields": [field_view(f) for f in fields],
        "tensors": [tensor_view(r, t) for t in r.tensors],
    }


def dump_model(model: Path) -> None:
    view = reader_view(model)
    view["source"] = model.name
    out = FIXTURES / "gemma3_270m_gguf.json"
    out.write_text(json.dumps(view, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({len(view['fields'])} keys, {len(view['tensors'])} tensors)")


# --- synthetic file ---------------------------------------------------------------------

# Metadata given to GGUFWriter, as (key, spec). A spec is {"type": name, "value": v} for a
# scalar, {"type": "array", "elem": name, "items": [...]} for an array whose items are plain
# values, or whose items are specs when elem is "array". f32 values are chosen exactly
# representable so the JSON value is the stored value.
KVS = [
    ("synthetic.u8", {"type": "u8", "value": 200}),
    ("synthetic.i8", {"type": "i8", "value": -100}),
    ("synthetic.u16", {"type": "u16", "value": 60000}),
    ("synthetic.i16", {"type": "i16", "value": -30000}),
    ("synthetic.u32", {"type": "u32", "value": 4000000000}),
    ("synthetic.i32", {"type": "i32", "value": -2000000000}),
    ("synthetic.f32", {"type": "f32", "value": -1.15625}),
    ("synthetic.bool_true", {"type": "bool", "value": True}),
    ("synthetic.bool_false", {"type": "bool", "value": False}),
    ("synthetic.string", {"type": "string", "value": "héllo, wörld ✓ 🦀"}),
    ("synthetic.u64", {"type": "u64", "value": (1 << 63) + 5}),
    ("synthetic.i64", {"type": "i64", "value": -(1 << 62) - 3}),
    ("synthetic.f64", {"type": "f64", "value": math.pi}),
    ("synthetic.arr.u8", {"type": "array", "elem": "u8", "items": [0, 1, 255]}),
    ("synthetic.arr.i8", {"type": "array", "elem": "i8", "items": [-128, 0, 127]}),
    ("synthetic.arr.u16", {"type": "array", "elem": "u16", "items": [0, 65535]}),
    ("synthetic.arr.i16", {"type": "array", "elem": "i16", "items": [-32768, 32767, 5]}),
    ("synthetic.arr.u32", {"type": "array", "elem": "u32", "items": [1, 4294967295]}),
    ("synthetic.arr.i32", {"type": "array", "elem": "i32", "items": [-7, 0, 2147483647]}),
    ("synthetic.arr.f32", {"type": "array", "elem": "f32", "items": [0.5, -2.25, 1e-6]}),
    ("synthetic.arr.bool", {"type": "array", "elem": "bool", "items": [True, False, True]}),
    ("synthetic.arr.string", {"type": "array", "elem": "string", "items": ["a", "", "ü▁x"]}),
    ("synthetic.arr.u64", {"type": "array", "elem": "u64", "items": [0, (1 << 64) - 1]}),
    ("synthetic.arr.i64", {"type": "array", "elem": "i64", "items": [-(1 << 63), 42]}),
    ("synthetic.arr.f64", {"type": "array", "elem": "f64", "items": [1e300, -0.1]}),
    # gguf-py infers inner element types: int → i32, float → f32, str → string
    ("synthetic.nested.i32", {"type": "array", "elem": "array", "items": [
        {"type": "array", "elem": "i32", "items": [1, 2, 3]},
        {"type": "array", "elem": "i32", "items": [-4]},
    ]}),
    ("synthetic.nested.mixed", {"type": "array", "elem": "array", "items": [
        {"type": "array", "elem": "string", "items": ["x", "yz"]},
        {"type": "array", "elem": "f32", "items": [0.25]},
        {"type": "array", "elem": "array", "items": [
            {"type": "array", "elem": "i32", "items": [9, 8]},
        ]},
    ]}),
    ("tokenizer.ggml.bos_token_id", {"type": "u32", "value": 2}),
]

VT_OF = {
    "u8": VT.UINT8, "i8": VT.INT8, "u16": VT.UINT16, "i16": VT.INT16, "u32": VT.UINT32,
    "i32": VT.INT32, "f32": VT.FLOAT32, "bool": VT.BOOL, "string": VT.STRING,
    "array": VT.ARRAY, "u64": VT.UINT64, "i64": VT.INT64, "f64": VT.FLOAT64,
}


def py_items(spec):
    """A nested-array spec as the plain lists gguf-py packs (inner types inferred)."""
    if spec["elem"] == "array":
        return [py_items(s) for s in spec["items"]]
    return list(spec["items"])


def write_synthetic() -> None:
    rng = np.random.default_rng(20240601)
    path = FIXTURES / "gguf_py_synthetic.bin"
    w = gguf.GGUFWriter(path, "synthetic")  # writes general.architecture first
    w.add_custom_alignment(64)               # general.alignment = 64 (u32)
    kvs = [
        ("general.architecture", {"type": "string", "value": "synthetic"}),
        ("general.alignment", {"type": "u32", "value": 64}),
    ] + KVS
    for key, spec in KVS:
        vt = VT_OF[spec["type"]]
        if vt == VT.ARRAY:
            w.add_key_value(key, py_items(spec), vt, sub_type=VT_OF[spec["elem"]])
        else:
            w.add_key_value(key, spec["value"], vt)

    # (name, numpy array or raw bytes, raw ggml type or None); raw quantized tensors are
    # given as uint8 with a byte shape that gguf-py converts to an element shape.
    tensors = [
        ("t.f32", np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 8, None),
        ("t.f16", rng.standard_normal(5).astype(np.float16), None),  # 10 bytes: padding
        ("t.q8_0", rng.integers(0, 256, (3, 2 * 34), dtype=np.uint8), gguf.GGMLQuantizationType.Q8_0),
        ("t.q4_k", rng.integers(0, 256, (2, 144), dtype=np.uint8), gguf.GGMLQuantizationType.Q4_K),
        ("t.i32", rng.integers(-1000, 1000, 7, dtype=np.int32), None),
        ("t.4d", rng.standard_normal((1, 2, 1, 3)).astype(np.float32), None),
        ("t.q6_k", rng.integers(0, 256, (1, 210), dtype=np.uint8), gguf.GGMLQuantizationType.Q6_K),
    ]
    for name, arr, raw in tensors:
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    view = reader_view(path)
    assert [f["key"] for f in view["fields"]] == [k for k, _ in kvs], "key order changed"
    desc = {
        "kvs": [{"key": k, "spec": s} for k, s in kvs],
        "tensors": [
            {"name": name, "data_hex": np.ascontiguousarray(arr).tobytes().hex()}
            for name, arr, _ in tensors
        ],
        "reader": view,
    }
    out = FIXTURES / "gguf_py_synthetic.json"
    out.write_text(json.dumps(desc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path} ({path.stat().st_size} bytes) and {out}")


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    write_synthetic()
    model = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("NEAGARI_TEST_MODEL")
    if model:
        dump_model(Path(model))
    else:
        print("no model given (argument or NEAGARI_TEST_MODEL): skipped the model fixture")


if __name__ == "__main__":
    main()
