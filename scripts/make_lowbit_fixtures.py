#!/usr/bin/env python3
"""Tiny random-weight Llama GGUFs in the low-bit formats, quantized by llama.cpp itself, and
llama.cpp's logits on them.

Writes tests/fixtures/lowbit/llama_<type>.gguf: one F32 tiny Llama (scripts/
make_tiny_llama_family.py's writer and vocabulary, but hidden 256 / FFN 256 / head_dim 64 so
every row is a whole number of 256-weight blocks) requantized with llama.cpp's
llama_model_quantize (llama-cpp-python 0.3.36 = llama.cpp 0c1e570), `pure` so that every
2-D tensor, embeddings and output head included, gets the target type (IQ2_XS needs an
importance matrix: a flat one, all ones). Then llama.cpp runs each file on a fixed id
sequence: every position's logits from one batch and the greedy continuation decoded token by
token. Results in tests/fixtures/lowbit/reference.json plus one little-endian f32 file per
model ([n_ids, n_vocab] row-major). Read by crates/engine/tests/lowbit_llama_cpp.rs.

Usage: python3 scripts/make_lowbit_fixtures.py
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import sys
import tempfile

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_llama_family as mt  # noqa: E402
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402

import llama_cpp as L  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "lowbit")

# llama_ftype per target (include/llama.h).
FTYPES = {
    "Q1_0": 40,
    "Q2_0": 41,
    "TQ1_0": 36,
    "TQ2_0": 37,
    "IQ4_NL": 25,
    "IQ4_XS": 30,
    "IQ2_XS": 20,
}
NEEDS_IMATRIX = {"IQ2_XS"}
N_IDS = 40
N_GREEDY = 16
MIN_GREEDY_MARGIN = 0.05


def quantize(src: str, dst: str, name: str):
    p = L.llama_model_quantize_default_params()
    p.nthread = 2
    p.ftype = FTYPES[name]
    p.pure = True
    keep = []
    if name in NEEDS_IMATRIX:
        r = gguf.GGUFReader(src)
        entries = []
        for t in r.tensors:
            if len(t.shape) == 2:
                ones = (ctypes.c_float * int(t.shape[0]))(*([1.0] * int(t.shape[0])))
                keep.append(ones)
                entries.append((t.name.encode(), ones, int(t.shape[0])))
        arr = (L.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (n, d, s) in enumerate(entries):
            arr[i].name = n
            arr[i].data = ctypes.cast(d, ctypes.POINTER(ctypes.c_float))
            arr[i].size = s
        arr[len(entries)].name = None
        keep.append(arr)
        p.imatrix = ctypes.cast(arr, ctypes.POINTER(L.llama_model_imatrix_data))
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {name} failed ({rc})")


def dequantize_any(data, qtype):
    """gguf-py's dequantize, or ggml's dequantize_row_* for the types gguf-py lacks."""
    if qtype.name in ("Q1_0", "Q2_0"):
        import quant_reference_lowbit as qr

        _, block, size, *_ = qr.TYPES[qtype.name]
        raw = np.ascontiguousarray(data).tobytes()
        n = len(raw) // size * block
        return qr.ggml_dequantize(qtype.name, raw, n).reshape(data.shape[0], -1)
    return gguf.quants.dequantize(data, qtype)


def tensor_types(path: str) -> dict:
    r = gguf.GGUFReader(path)
    return {t.name: t.tensor_type.name for t in r.tensors}


def main():
    os.makedirs(OUT, exist_ok=True)
    quiet_logs()
    mt.dequantize = dequantize_any
    mt.HIDDEN, mt.FFN, mt.N_HEADS, mt.N_KV_HEADS, mt.N_LAYERS = 256, 256, 4, 2, 2
    settings = Settings(n_ctx=mt.N_CTX_TRAIN, n_batch=mt.N_CTX_TRAIN, n_ubatch=mt.N_CTX_TRAIN,
                        n_threads=2, flash_attn="disabled", type_kv=1)
    out = {
        "generator": "scripts/make_lowbit_fixtures.py",
        "llama_cpp_python": L.__version__,
        "gguf_py": importlib.metadata.version("gguf"),
        "settings": settings.as_json(),
        "models": [],
    }
    ids_rng = np.random.default_rng(4321)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "llama_f32.gguf")
        n_vocab = mt.write_model(src, "llama", head_dim=64, biases=False, qk_norm=False,
                                 tied=False, q8=False, seed=11, freq_base=10000.0)
        for name in FTYPES:
            fname = f"llama_{name.lower()}.gguf"
            path = os.path.join(OUT, fname)
            quantize(src, path, name)
            try:
                types = tensor_types(path)
            except ValueError:  # gguf-py 0.19 cannot even list a file with Q2_0 (id 42)
                types = None
            ref = LlamaRef(path, settings)
            assert ref.n_vocab == n_vocab
            for attempt in range(50):
                ids = [int(x) for x in ids_rng.integers(0, n_vocab - 2, size=N_IDS)]
                ref.clear()
                logits = ref.decode(ids, 0, lambda i: True)
                greedy, margins = [], []
                last = logits[-1]
                for k in range(N_GREEDY):
                    t = int(np.argmax(last))
                    greedy.append(t)
                    margins.append(mt.margin(last))
                    last = ref.decode([t], N_IDS + k, lambda i: True)[0]
                if min(margins) >= MIN_GREEDY_MARGIN:
                    break
            else:
                raise RuntimeError(f"{name}: no id sequence with wide greedy margins")
            ref.close()
            lf = f"llama_{name.lower()}_logits.f32"
            logits.astype("<f4").tofile(os.path.join(OUT, lf))
            # Distance of an independent float64 pass over the same dequantized weights
            # with unquantized activations and f32 softmax weights: a loose yardstick for
            # how far activation and softmax rounding can move the logits.
            if types is not None:
                np_f32 = mt.numpy_forward(path, "llama", ids, q8_acts=False, f16_softmax=False)
                d_np = float(np.abs(np_f32 - logits).max())
            else:
                d_np = None
            out["models"].append({
                "name": name,
                "file": fname,
                "tensor_types": sorted(set(types.values())) if types else None,
                "n_vocab": n_vocab,
                "head_dim": 64,
                "ids": ids,
                "logits_file": lf,
                "logits_shape": [N_IDS, n_vocab],
                "logit_abs_max": float(np.abs(logits).max()),
                "numpy_unquantized_acts_max_delta": d_np,
                "greedy": greedy,
                "greedy_margins": [round(x, 5) for x in margins],
            })
            print(f"{name}: types {sorted(set(types.values())) if types else '?'}, size {os.path.getsize(path)} B, "
                  f"|logit| max {np.abs(logits).max():.3f}, numpy Δ {d_np}, "
                  f"greedy {greedy[:6]}..., min margin {min(margins):.3f}")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
