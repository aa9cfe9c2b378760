#!/usr/bin/env python3
"""Regenerate crates/quant/tests/fixtures/lowbit/<type>.json: reference data for the low-bit
formats (Q1_0, Q2_0, PQ2_0, TQ1_0, TQ2_0, PTQ1_0, IQ4_NL, IQ4_XS and the grid i-quants).

References, none written here:
  * the `gguf` Python package (gguf.quants.dequantize) for every dequantized value of the
    types it has (TQ1_0, TQ2_0, IQ*). gguf-py 0.19 knows Q1_0's id but has no codec for
    Q1_0 or Q2_0; for those the values come from
  * ggml itself (libggml-base / libggml-cpu shipped in llama-cpp-python 0.3.36, llama.cpp
    0c1e570, through ctypes): dequantize_row_<t>, the reference quantizers
    quantize_row_<t>_ref (Q1_0, Q2_0, TQ1_0, TQ2_0), ggml_quantize_chunk for the i-quants
    (blocks to decode, with a flat importance matrix where ggml requires one), the
    activation quantizers quantize_row_q8_0_ref / quantize_row_q8_K_ref, and the scalar dot
    products ggml_vec_dot_<t>_q8_{0,K}_generic. Where both gguf and ggml decode a type the
    script checks they agree bit for bit before writing anything.
  * PrismML's PQ2_0 (142) and PTQ1_0 (143) exist in no library here. PQ2_0 is Q2_0's codec
    at group 128, so a PQ2_0 block [d | qs[32]] decodes exactly as the two Q2_0 blocks
    [d | qs[0:16]], [d | qs[16:32]]: its values come from ggml's dequantize_row_q2_0 on
    that pair (and its dots from ggml's Q2_0 dot, equal up to f32 summation order).
    PTQ1_0 is TQ1_0's codec on 128 weights (../shared/reference/FORMATS.md §3.3); its values
    come from gguf-py's TQ1_0 decoder of the single bytes (each byte's five digits are the
    same in both), rearranged in the documented stage order {16, 8 bytes, then qh}.

    pip install gguf numpy llama-cpp-python==0.3.36
    python3 scripts/quant_reference_lowbit.py

f32 arrays are stored as the hex of their little-endian bytes (bit-exact comparison);
block bytes are hex too.
"""
import ctypes
import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates", "quant", "tests", "fixtures", "lowbit")

# name: (ggml id, weights per block, bytes per block, activation, has _ref quantizer,
#        gguf type or None, needs imatrix)
TYPES = {
    "Q1_0": (41, 128, 18, "Q8_0", True, None, False),
    "Q2_0": (42, 64, 18, "Q8_0", True, None, False),
    "TQ1_0": (34, 256, 54, "Q8_K", True, T.TQ1_0, False),
    "TQ2_0": (35, 256, 66, "Q8_K", True, T.TQ2_0, False),
    "IQ4_NL": (20, 32, 18, "Q8_0", False, T.IQ4_NL, False),
    "IQ4_XS": (23, 256, 136, "Q8_K", False, T.IQ4_XS, False),
    "IQ2_XXS": (16, 256, 66, "Q8_K", False, T.IQ2_XXS, True),
    "IQ2_XS": (17, 256, 74, "Q8_K", False, T.IQ2_XS, True),
    "IQ2_S": (22, 256, 82, "Q8_K", False, T.IQ2_S, False),
    "IQ3_XXS": (18, 256, 98, "Q8_K", False, T.IQ3_XXS, False),
    "IQ3_S": (21, 256, 110, "Q8_K", False, T.IQ3_S, False),
    "IQ1_S": (19, 256, 50, "Q8_K", False, T.IQ1_S, True),
    "IQ1_M": (29, 256, 56, "Q8_K", False, T.IQ1_M, True),
}
ACT_BYTES = {"Q8_0": (32, 34), "Q8_K": (256, 292)}


def load_ggml():
    import llama_cpp

    lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    cpu.ggml_cpu_init()
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return base, cpu


BASE, CPU = load_ggml()


def sym(name):
    """ggml's spelling in symbol names: q8_K, iq2_xs."""
    return name.lower() if not name.endswith("_K") else name[:-2].lower() + "_K"


def f32hex(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def ggml_quantize_ref(name, x, block, size):
    fn = getattr(BASE, f"quantize_row_{sym(name)}_ref")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = ctypes.create_string_buffer(len(x) // block * size)
    fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(len(x)))
    return out.raw


def ggml_quantize_chunk(name, x, n_per_row):
    tid, block, size, _, _, _, imat = TYPES[name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    nrows = len(x) // n_per_row
    out = ctypes.create_string_buffer(len(x) // block * size)
    w = np.ascontiguousarray(np.ones(n_per_row, dtype=np.float32)) if imat else None
    BASE.ggml_quantize_chunk(tid, x.ctypes.data, ctypes.addressof(out), 0, nrows, n_per_row,
                             w.ctypes.data if w is not None else None)
    return out.raw


def ggml_dequantize(name, raw, n):
    fn = getattr(BASE, f"dequantize_row_{sym(name)}")
    out = np.zeros(n, dtype=np.float32)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fn(buf, out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return out


def ggml_dot(name, act, wraw, araw, n):
    """ggml's portable scalar dot of one row pair (Q2_0 has only that one on x86)."""
    suffix = "" if name == "Q2_0" else "_generic"
    fn = getattr(CPU, f"ggml_vec_dot_{sym(name)}_{sym(act)}{suffix}")
    s = ctypes.c_float(0)
    wb = ctypes.create_string_buffer(wraw, len(wraw))
    ab = ctypes.create_string_buffer(araw, len(araw))
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), wb, ctypes.c_size_t(0), ab, ctypes.c_size_t(0), ctypes.c_int(1))
    return float(s.value)


def gguf_dequantize(qtype, raw, n, size):
    a = np.frombuffer(raw, dtype=np.uint8).reshape(-1, size)
    return quants.dequantize(a, qtype).reshape(-1).astype(np.float32)


def f16(v):
    return np.array([v], dtype="<f2").tobytes()


def weight_inputs(rng, n):
    """n values in stretches that exercise the quantizers' branches."""
    x = rng.standard_normal(n).astype(np.float32)
    q = n // 8
    x[q : 2 * q] = rng.random(q) * 0.7 + 0.05  # all positive
    x[2 * q : 3 * q] = -(rng.random(q) * 3 + 0.1)  # all negative
    x[3 * q : 4 * q] = 0.0  # zero
    x[4 * q : 5 * q] = rng.laplace(size=q) * 1e-3  # small, heavy tails
    x[5 * q : 6 * q] *= 40.0  # large
    x[6 * q + 3] = 0.5  # ties on rounding where the scale allows
    x[6 * q + 5] = -0.0
    return x


def random_blocks(name, rng, nblocks):
    """Random bytes with a sane f16 scale in every block (all codes reachable)."""
    _, _, size, _, _, _, _ = TYPES[name]
    raw = bytearray(rng.integers(0, 256, size=nblocks * size, dtype=np.uint8).tobytes())
    # Where the scale sits: first two bytes, except TQ1_0/TQ2_0 (last two).
    at = size - 2 if name in ("TQ1_0", "TQ2_0") else 0
    for b in range(nblocks):
        o = b * size + at
        raw[o : o + 2] = f16(rng.uniform(1e-4, 0.05) * rng.choice([-1, 1]))
    if name in ("TQ1_0",):
        # Canonical trit bytes only matter to the encoder; any byte decodes to digits 0..2.
        pass
    return bytes(raw)


def act_rows(rng, n, rows):
    a = rng.standard_normal((rows, n)).astype(np.float32)
    a[1] *= 100.0
    a[2, :256] = 0.0  # a zero activation block
    return a


def fixture(name, seed):
    tid, block, size, act, has_ref, gtype, _ = TYPES[name]
    rng = np.random.default_rng(seed)
    n = 1024
    x = weight_inputs(rng, n)
    if has_ref:
        raw = ggml_quantize_ref(name, x, block, size)
        chunk = ggml_quantize_chunk(name, x, n)
        assert raw == chunk, f"{name}: _ref and quantize_chunk disagree"
    else:
        raw = ggml_quantize_chunk(name, x, 256)
    deq = ggml_dequantize(name, raw, n)
    if gtype is not None:
        gdeq = gguf_dequantize(gtype, raw, n, size)
        assert np.array_equal(deq.view(np.uint32), gdeq.view(np.uint32)), name

    nr = n // block
    rn = nr * block
    rnd = random_blocks(name, rng, nr)
    rdeq = ggml_dequantize(name, rnd, rn)
    if gtype is not None:
        g = gguf_dequantize(gtype, rnd, rn, size)
        assert np.array_equal(rdeq.view(np.uint32), g.view(np.uint32)), name

    ablock, abytes = ACT_BYTES[act]
    acts = act_rows(rng, n, 3)
    act_raw = [ggml_quantize_ref(act, r, ablock, abytes) for r in acts]
    dots = [ggml_dot(name, act, raw, a, n) for a in act_raw]
    rdots = [ggml_dot(name, act, rnd, a[: rn // ablock * abytes], rn) for a in act_raw]
    return {
        "type": name,
        "comment": ("blocks: ggml quantize_row_*_ref(input)" if has_ref else "blocks: ggml_quantize_chunk(input)")
        + "; dequant: " + ("gguf.quants.dequantize == ggml dequantize_row_*" if gtype is not None else "ggml dequantize_row_*")
        + f"; dots: ggml_vec_dot_*_{act.lower()} generic",
        "quantizer_ref": has_ref,
        "input": f32hex(x),
        "blocks": raw.hex(),
        "dequant": f32hex(deq),
        "random_blocks": rnd.hex(),
        "random_dequant": f32hex(rdeq),
        "act": [a.hex() for a in act_raw],
        "dots": dots,
        "random_dots": rdots,
    }


def pq2_0_fixture(seed):
    """PQ2_0 through ggml's Q2_0 on the equivalent block pairs (see the module doc)."""
    rng = np.random.default_rng(seed)
    nb = 8
    raw = bytearray(rng.integers(0, 256, size=nb * 34, dtype=np.uint8).tobytes())
    pairs = bytearray()
    for b in range(nb):
        o = 34 * b
        raw[o : o + 2] = f16(rng.uniform(1e-4, 0.05) * rng.choice([-1, 1]))
        d = bytes(raw[o : o + 2])
        pairs += d + raw[o + 2 : o + 18] + d + raw[o + 18 : o + 34]
    n = nb * 128
    deq = ggml_dequantize("Q2_0", bytes(pairs), n)
    acts = act_rows(rng, n, 3)
    act_raw = [ggml_quantize_ref("Q8_0", r, 32, 34) for r in acts]
    dots = [ggml_dot("Q2_0", "Q8_0", bytes(pairs), a, n) for a in act_raw]
    return {
        "type": "PQ2_0",
        "comment": "values: ggml dequantize_row_q2_0 of the equivalent Q2_0 pairs; dots: ggml Q2_0 dot of the pairs (f32 order differs)",
        "random_blocks": bytes(raw).hex(),
        "random_dequant": f32hex(deq),
        "act": [a.hex() for a in act_raw],
        "dots_approx": dots,
    }


def ptq1_0_fixture(seed):
    """PTQ1_0 values from gguf-py's TQ1_0 digit decoder, in PTQ1_0's stage order."""
    rng = np.random.default_rng(seed)
    nb = 8
    raw = bytearray(rng.integers(0, 256, size=nb * 28, dtype=np.uint8).tobytes())
    vals = []
    for b in range(nb):
        o = 28 * b
        raw[o + 26 : o + 28] = f16(rng.uniform(1e-4, 0.05) * rng.choice([-1, 1]))
        d = np.frombuffer(bytes(raw[o + 26 : o + 28]), dtype="<f2").astype(np.float32)[0]
        qs, qh = bytes(raw[o : o + 24]), bytes(raw[o + 24 : o + 26])
        # digits[byte][n] through gguf: a TQ1_0 block whose 16-byte stage holds 16 bytes
        # decodes weights 160 + 16n + m = digit n of byte m of that stage.
        def digits(bs):
            blk = bytearray(54)
            blk[32 : 32 + len(bs)] = bs
            blk[52:54] = f16(1.0)
            v = quants.dequantize(np.frombuffer(bytes(blk), dtype=np.uint8).reshape(1, 54), T.TQ1_0).reshape(-1)
            return [[int(v[160 + 16 * k + m]) + 1 for k in range(5)] for m in range(len(bs))]

        t = []
        for at, s in ((0, 16), (16, 8)):
            dg = digits(qs[at : at + s])
            t += [dg[m][k] for k in range(5) for m in range(s)]
        dh = digits(qh)
        t += [dh[h][k] for k in range(4) for h in range(2)]
        vals += [np.float32(ti - 1) * d for ti in t]
    return {
        "type": "PTQ1_0",
        "comment": "values: gguf-py TQ1_0 digit decoding of each byte, in PTQ1_0's documented stage order",
        "random_blocks": bytes(raw).hex(),
        "random_dequant": f32hex(np.array(vals, dtype=np.float32)),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, name in enumerate(TYPES):
        f = fixture(name, 500 + i)
        with open(os.path.join(OUT, f"{name.lower()}.json"), "w") as fh:
            json.dump(f, fh, indent=1)
        print("wrote", name)
    for name, f in (("pq2_0", pq2_0_fixture(600)), ("ptq1_0", ptq1_0_fixture(601))):
        with open(os.path.join(OUT, f"{name}.json"), "w") as fh:
            json.dump(f, fh, indent=1)
        print("wrote", name)


if __name__ == "__main__":
    main()
