#!/usr/bin/env python3
"""Regenerate crates/quant/tests/fixtures/<type>.json: reference data for the simple formats.

References, none written here:
  * the `gguf` Python package (gguf.quants.quantize / dequantize) for F32, F16, BF16, Q4_0,
    Q4_1, Q5_0, Q5_1, Q8_0 — quantized bytes and dequantized values;
  * ggml itself (libggml-base / libggml-cpu shipped in llama-cpp-python, called through
    ctypes) for what gguf lacks: the Q8_1 quantizer (quantize_row_q8_1_ref), the activation
    quantizers, and the weight·activation dot products (ggml_vec_dot_<w>_<a>). The ggml
    `_ref` weight quantizers are also run and compared with gguf's; the result is recorded
    as `ggml_ref_equal` so the Rust test knows whether one byte string serves both.

    pip install gguf numpy llama-cpp-python
    python3 scripts/quant_reference.py

Every float is stored as its u32 bit pattern so the Rust tests can compare bit for bit.
"""
import ctypes
import json
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

K = 256  # values per row (8 blocks of 32)
ROWS = 4
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "quant", "tests", "fixtures")


def load_ggml():
    import llama_cpp

    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    return base, cpu


BASE, CPU = load_ggml()
BLOCK = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q8_1": 36}
ACT = {"Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1", "Q8_0": "Q8_0"}


def ggml_quantize(name, x):
    """ggml's quantize_row_<name>_ref over each row of x (float32[rows, k])."""
    fn = getattr(BASE, f"quantize_row_{name.lower()}_ref")
    rows = []
    for r in x:
        r = np.ascontiguousarray(r, dtype=np.float32)
        out = ctypes.create_string_buffer(len(r) // 32 * BLOCK[name])
        fn(r.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(len(r)))
        rows.append(out.raw)
    return b"".join(rows)


def ggml_dot(wname, aname, wbytes, abytes, n):
    """ggml_vec_dot_<w>_<a> (the build's SIMD path) for one row pair; returns the f32."""
    fn = getattr(CPU, f"ggml_vec_dot_{wname.lower()}_{aname.lower()}")
    s = ctypes.c_float(0)
    w = ctypes.create_string_buffer(wbytes, len(wbytes))
    a = ctypes.create_string_buffer(abytes, len(abytes))
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), w, ctypes.c_size_t(0), a, ctypes.c_size_t(0), ctypes.c_int(1))
    return s.value


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).ravel().tolist()


def f32_bits_scalar(v):
    return int(np.array([v], dtype=np.float32).view(np.uint32)[0])


def weight_rows(rng):
    """float32[ROWS, K]: plain normal, per-block scales over 8 decades, awkward blocks."""
    x = np.empty((ROWS, K), dtype=np.float32)
    x[0] = rng.standard_normal(K)
    x[1] = rng.standard_normal(K) * np.repeat(10.0 ** rng.uniform(-4, 3, K // 32), 32)
    b = rng.standard_normal((8, 32)).astype(np.float32)
    b[0] = 0.0  # all zero: d = 0
    b[1] = 0.7  # constant: max == min
    b[2] = -np.abs(b[2])  # all negative
    b[3] *= 1e-3
    b[3][5] = 40.0  # one outlier
    b[4] *= 1e-6  # scale in f16's subnormal range
    b[5][3], b[5][20] = -2.5, 2.5  # two values of largest magnitude: the first one wins
    b[6] = (np.arange(32) % 16 - 8) * 0.25  # on the quant grid
    b[7] *= 1e4
    x[2] = b.ravel()
    x[3] = rng.uniform(-1, 3, K)
    return x


def float_rows(rng):
    """Like weight_rows, plus values that exercise f16/bf16 rounding, overflow and NaN."""
    x = weight_rows(rng)
    special = np.array(
        [np.nan, np.inf, -np.inf, -0.0, 65504.0, 65520.0, 1e6, 6e-8, 3e-8, 1e-40,
         1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, -3.0e38, 3.4e38],
        dtype=np.float32,
    )
    x[2][: len(special)] = special
    # A signalling NaN (payload below the bf16 cut) to check NaN quieting.
    x.view(np.uint32)[2][len(special)] = 0x7F800001
    return x


def act_rows(rng):
    a = np.empty((ROWS, K), dtype=np.float32)
    a[0] = rng.standard_normal(K)
    a[1] = rng.standard_normal(K) * np.repeat(10.0 ** rng.uniform(-3, 2, K // 32), 32)
    a[2] = rng.uniform(-1, 1, K)
    a[2][:32] = 0.0  # a zero activation block
    a[3] = np.round(rng.standard_normal(K) * 4) / 2  # many exact .5 ties after scaling
    return a


def main():
    os.makedirs(OUT, exist_ok=True)
    for seed, name in enumerate(["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]):
        rng = np.random.default_rng(1000 + seed)
        qtype = T[name]
        x = float_rows(rng) if name in ("F32", "F16", "BF16") else weight_rows(rng)
        with np.errstate(all="ignore"):
            q = quants.quantize(x, qtype)
            dq = quants.dequantize(q, qtype)
        fx = {"type": name, "k": K, "rows": ROWS, "x": bits(x), "q": q.tobytes().hex(), "dq": bits(dq)}
        if name in ACT:
            ref = ggml_quantize(name, x)
            fx["ggml_ref_equal"] = ref == q.tobytes()
            if not fx["ggml_ref_equal"]:
                fx["ggml_ref_q"] = ref.hex()
            aname = ACT[name]
            a = act_rows(rng)
            aq = ggml_quantize(aname, a)
            wb, ab = BLOCK[name] * K // 32, BLOCK[aname] * K // 32
            dots = [ggml_dot(name, aname, q.tobytes()[r * wb:(r + 1) * wb], aq[r * ab:(r + 1) * ab], K) for r in range(ROWS)]
            fx["act"] = {"type": aname, "x": bits(a), "q": aq.hex(), "dot": [f32_bits_scalar(d) for d in dots]}
            print(f"{name}: ggml _ref quantizer equals gguf: {fx['ggml_ref_equal']}")
        write(name, fx)

    # Q8_1 has no gguf quantizer; its reference is ggml's quantize_row_q8_1_ref.
    rng = np.random.default_rng(2000)
    a = np.concatenate([act_rows(rng), weight_rows(rng)])
    write("Q8_1", {"type": "Q8_1", "k": K, "rows": 2 * ROWS, "x": bits(a), "q": ggml_quantize("Q8_1", a).hex()})


def write(name, fx):
    path = os.path.join(OUT, f"{name.lower()}.json")
    with open(path, "w") as f:
        json.dump(fx, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
