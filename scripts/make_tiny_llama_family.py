"""Tiny random-weight Llama-family GGUFs and llama.cpp's logits on them.

Writes tests/fixtures/tiny/{llama,qwen2,qwen3,llama_q8}.gguf with gguf-py's GGUFWriter
(seeded random weights, a minimal GPT-2-style byte-level BPE vocabulary so llama.cpp
accepts the file) and runs each through llama.cpp (llama-cpp-python 0.3.36, ctypes API via
scripts/llama_ref.py) on a fixed id sequence: the logits of every position from one batch,
and the greedy continuation decoded token by token. Results go to
tests/fixtures/tiny/reference.json plus one little-endian f32 file per model
([n_ids, n_vocab] row-major). Read by crates/engine/tests/llama_family_llama_cpp.rs.

What each file exercises:
  llama     GPT-J ("normal") RoPE pairing, separate output.weight, F32
  qwen2     q/k/v biases, NeoX RoPE, tied output (no output.weight), F32
  qwen3     per-head q/k RMSNorm, NeoX RoPE, head_dim 32 != hidden/heads 16, output.weight, F32
  llama_q8  as llama, every 2-D weight Q8_0 (tied output)

Usage: python3 scripts/make_tiny_llama_family.py
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "tiny")

N_LAYERS = 2
HIDDEN = 64
N_HEADS = 4
N_KV_HEADS = 2
FFN = 128
N_CTX_TRAIN = 256
EPS = 1e-6
N_IDS = 40
N_GREEDY = 16
MIN_GREEDY_MARGIN = 0.05


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (the published algorithm)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def vocab():
    """256 byte symbols, 42 two-symbol merges, 2 control tokens: 300 tokens."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    sp = b2u[ord(" ")]
    pairs = [
        "th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te",
        "of", "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou",
        "io", "le",
    ]
    merges = [f"{a} {b}" for a, b in pairs]
    tokens += pairs
    for c in "tawsobcmfphd":
        merges.append(f"{sp} {c}")
        tokens.append(sp + c)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    for s in ["<|endoftext|>", "<|im_start|>"]:
        tokens.append(s)
        types.append(gguf.TokenType.CONTROL)
    return tokens, types, merges


def write_model(path: str, arch: str, *, head_dim: int, biases: bool, qk_norm: bool,
                tied: bool, q8: bool, seed: int, freq_base: float):
    rng = np.random.default_rng(seed)
    tokens, types, merges = vocab()
    n_vocab = len(tokens)
    q_dim, kv_dim = N_HEADS * head_dim, N_KV_HEADS * head_dim

    w = GGUFWriter(path, arch)
    w.add_custom_alignment(32)
    w.add_name(f"tiny-{arch}")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV_HEADS)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(freq_base)
    if head_dim != HIDDEN // N_HEADS:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_vocab - 2)
    w.add_eos_token_id(n_vocab - 2)
    w.add_add_bos_token(False)

    def mat(name, rows, cols, std):
        a = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if q8:
            # Byte rows [rows, cols/32·34]; the writer recovers the element shape.
            w.add_tensor(name, quantize(a, GGMLQuantizationType.Q8_0),
                         raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    def vec(name, n, std):
        w.add_tensor(name, (rng.standard_normal(n) * std).astype(np.float32))

    # Scales: embeddings ~0.5 so the (tied) logits spread over a few units and greedy
    # margins are wide; q/k ~0.15 so attention scores are O(1) and positions matter;
    # v/o/FFN large enough that the blocks move the residual away from the token's own
    # embedding (else a tied head just repeats the last token).
    mat("token_embd.weight", n_vocab, HIDDEN, 0.5)
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", HIDDEN)
        mat(p + "attn_q.weight", q_dim, HIDDEN, 0.15)
        mat(p + "attn_k.weight", kv_dim, HIDDEN, 0.15)
        mat(p + "attn_v.weight", kv_dim, HIDDEN, 0.3)
        if biases:
            vec(p + "attn_q.bias", q_dim, 0.2)
            vec(p + "attn_k.bias", kv_dim, 0.2)
            vec(p + "attn_v.bias", kv_dim, 0.1)
        if qk_norm:
            norm(p + "attn_q_norm.weight", head_dim)
            norm(p + "attn_k_norm.weight", head_dim)
        mat(p + "attn_output.weight", HIDDEN, q_dim, 0.4)
        norm(p + "ffn_norm.weight", HIDDEN)
        mat(p + "ffn_gate.weight", FFN, HIDDEN, 0.3)
        mat(p + "ffn_up.weight", FFN, HIDDEN, 0.3)
        mat(p + "ffn_down.weight", HIDDEN, FFN, 0.4)
    norm("output_norm.weight", HIDDEN)
    if not tied:
        mat("output.weight", n_vocab, HIDDEN, 0.5)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_vocab


MODELS = [
    dict(name="llama", arch="llama", head_dim=16, biases=False, qk_norm=False, tied=False,
         q8=False, seed=1, freq_base=10000.0),
    dict(name="qwen2", arch="qwen2", head_dim=16, biases=True, qk_norm=False, tied=True,
         q8=False, seed=2, freq_base=1000000.0),
    dict(name="qwen3", arch="qwen3", head_dim=32, biases=False, qk_norm=True, tied=False,
         q8=False, seed=3, freq_base=1000000.0),
    dict(name="llama_q8", arch="llama", head_dim=16, biases=False, qk_norm=False, tied=True,
         q8=True, seed=4, freq_base=10000.0),
]


def numpy_forward(path: str, arch: str, ids: list[int], *, q8_acts: bool,
                  f16_softmax: bool) -> np.ndarray:
    """An independent float64 forward pass over the GGUF's (dequantized) weights.

    Mirrors llama.cpp's CPU roundings on request: q, K and V rounded to f16 (f16 KV cache;
    q is converted to f16 for the K·q product), the softmax weights rounded to f16 (the
    non-flash path multiplies them with the f16 V), and for Q8_0 weights every matmul input
    quantized to Q8_0 blocks (amax/127 scale stored as f16). Returns [len(ids), n_vocab].
    """
    r = gguf.GGUFReader(path)
    t = {}
    for ti in r.tensors:
        a = dequantize(ti.data, ti.tensor_type).astype(np.float64)
        t[ti.name] = a.reshape([int(x) for x in reversed(ti.shape)])

    def meta(key):
        f = r.fields[f"{arch}.{key}"]
        return f.parts[f.data[0]][0]

    n_heads, n_kv = int(meta("attention.head_count")), int(meta("attention.head_count_kv"))
    eps, base = float(meta("attention.layer_norm_rms_epsilon")), float(meta("rope.freq_base"))
    hd = t["blk.0.attn_q.weight"].shape[0] // n_heads
    n = len(ids)
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731

    def act(x):
        if not q8_acts:
            return x
        b = x.astype(np.float32).reshape(-1, 32)
        d = np.abs(b).max(-1, keepdims=True) / 127
        q = np.round(b * np.where(d > 0, 1 / np.where(d > 0, d, 1), 0))
        return (q * f16(d)).reshape(x.shape)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x):  # [n, heads, hd]
        th = np.arange(n)[:, None] * base ** (-np.arange(0, hd, 2) / hd)
        c, s = np.cos(th)[:, None, :], np.sin(th)[:, None, :]
        if arch == "llama":  # GPT-J pairing: (2i, 2i+1)
            a, b = x[..., 0::2], x[..., 1::2]
        else:  # NeoX pairing: (i, i + hd/2)
            a, b = x[..., : hd // 2], x[..., hd // 2 :]
        ra, rb = a * c - b * s, a * s + b * c
        y = np.empty_like(x)
        if arch == "llama":
            y[..., 0::2], y[..., 1::2] = ra, rb
        else:
            y[..., : hd // 2], y[..., hd // 2 :] = ra, rb
        return y

    mask = np.tril(np.ones((n, n))) > 0
    x = t["token_embd.weight"][ids]  # [n, H]
    for i in range(len([k for k in t if k.endswith("attn_norm.weight")])):
        p = f"blk.{i}."
        h = act(rms(x, t[p + "attn_norm.weight"]))
        q, k, v = (h @ t[p + f"attn_{w}.weight"].T for w in "qkv")
        if p + "attn_q.bias" in t:
            q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
        q, k, v = q.reshape(n, n_heads, hd), k.reshape(n, n_kv, hd), v.reshape(n, n_kv, hd)
        if p + "attn_q_norm.weight" in t:
            q, k = rms(q, t[p + "attn_q_norm.weight"]), rms(k, t[p + "attn_k_norm.weight"])
        q, k, v = f16(rope(q)), f16(rope(k)), f16(v)
        o = np.empty((n, n_heads, hd))
        for j in range(n_heads):
            g = j // (n_heads // n_kv)
            sc = np.where(mask, q[:, j] @ k[:, g].T / np.sqrt(hd), -np.inf)
            pr = np.exp(sc - sc.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            o[:, j] = (f16(pr) if f16_softmax else pr) @ v[:, g]
        x = x + act(o.reshape(n, -1)) @ t[p + "attn_output.weight"].T
        h = act(rms(x, t[p + "ffn_norm.weight"]))
        gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        x = x + act(gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    head = t.get("output.weight", t["token_embd.weight"])
    return act(rms(x, t["output_norm.weight"])) @ head.T


def margin(row: np.ndarray) -> float:
    top2 = np.sort(row)[-2:]
    return float(top2[1] - top2[0])


def main():
    os.makedirs(OUT, exist_ok=True)
    quiet_logs()
    settings = Settings(n_ctx=N_CTX_TRAIN, n_batch=N_CTX_TRAIN, n_ubatch=N_CTX_TRAIN,
                        n_threads=2, flash_attn="disabled", type_kv=1)
    ids_rng = np.random.default_rng(1234)
    out = {
        "generator": "scripts/make_tiny_llama_family.py",
        "llama_cpp_python": __import__("llama_cpp").__version__,
        "gguf_py": importlib.metadata.version("gguf"),
        "settings": settings.as_json(),
        "models": [],
    }
    for m in MODELS:
        m = dict(m)
        name = m.pop("name")
        path = os.path.join(OUT, f"{name}.gguf")
        n_vocab = write_model(path, **m)
        ref = LlamaRef(path, settings)
        assert ref.n_vocab == n_vocab
        # Random weights give near-ties now and then; draw id sequences until every greedy
        # step is decided by a margin far above the engines' rounding differences, so the
        # test can demand an identical continuation.
        for attempt in range(50):
            ids = [int(x) for x in ids_rng.integers(0, n_vocab - 2, size=N_IDS)]
            ref.clear()
            logits = ref.decode(ids, 0, lambda i: True)  # [N_IDS, n_vocab], one batch
            greedy, margins = [], []
            last = logits[-1]
            for k in range(N_GREEDY):
                t = int(np.argmax(last))
                greedy.append(t)
                margins.append(margin(last))
                last = ref.decode([t], N_IDS + k, lambda i: True)[0]
            if min(margins) >= MIN_GREEDY_MARGIN:
                break
        else:
            raise RuntimeError(f"{name}: no id sequence with greedy margins >= {MIN_GREEDY_MARGIN}")
        ref.close()
        lf = f"{name}_logits.f32"
        logits.astype("<f4").tofile(os.path.join(OUT, lf))
        pos_margins = [margin(r) for r in logits]
        # Cross-check llama.cpp with an independent forward pass that makes its roundings,
        # and measure how far the same pass lands when the softmax weights stay f32 (as
        # neagari keeps them): the distance an exact engine of that kind should show.
        np_same = numpy_forward(path, m["arch"], ids, q8_acts=m["q8"], f16_softmax=True)
        np_f32sm = numpy_forward(path, m["arch"], ids, q8_acts=m["q8"], f16_softmax=False)
        d_same = float(np.abs(np_same - logits).max())
        d_f32sm = float(np.abs(np_f32sm - logits).max())
        assert d_same < 1e-2 * np.abs(logits).max(), f"{name}: numpy vs llama.cpp {d_same}"
        out["models"].append({
            "name": name,
            "file": f"{name}.gguf",
            "arch": m["arch"],
            "head_dim": m["head_dim"],
            "tied_output": m["tied"],
            "weights": "q8_0" if m["q8"] else "f32",
            "n_vocab": n_vocab,
            "ids": ids,
            "id_draws": attempt + 1,
            "logits_file": lf,
            "logits_shape": [N_IDS, n_vocab],
            "logit_abs_max": float(np.abs(logits).max()),
            "logit_rms": float(np.sqrt((logits.astype(np.float64) ** 2).mean())),
            "min_position_margin": min(pos_margins),
            "numpy_same_roundings_max_delta": d_same,
            "numpy_f32_softmax_max_delta": d_f32sm,
            "greedy": greedy,
            "greedy_margins": [round(x, 5) for x in margins],
        })
        print(f"{name}: vocab {n_vocab}, |logit| max {np.abs(logits).max():.3f}, "
              f"min pos margin {min(pos_margins):.4f}, greedy {greedy}, "
              f"min greedy margin {min(margins):.4f}, numpy Δ {d_same:.2e} "
              f"(f32 softmax {d_f32sm:.2e}), size {os.path.getsize(path)} B")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
