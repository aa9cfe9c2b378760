#!/usr/bin/env python3
"""MLX affine packs against GGUF files of the same model: decode tok/s of neagari on each,
and mlx-lm's own decode speed on this CPU for the MLX packs (the peer).

One random-weight Llama (hidden 2048, FFN 5632, 6 layers, 16 heads / 4 KV heads of 128, the
384-token BPE vocabulary of scripts/make_mlx_fixtures.py, so the head does not dominate;
270 M weights) is built with mlx-lm's own model class and written as

  hf_bf16/            the bf16 HF checkpoint (mlx_lm.utils.save_model)
  mlx_q1_g128/        mlx-lm's quantizer, 1 bit, group 128 (scale = max − min, bias = min)
  mlx_q1_g128_sym/    the same codes with Bonsai's symmetric pair: bias = −scale/2 (each
                      weight ±scale/2; PrismML's 1-bit MLX packs store scale 2s, bias −s)
  mlx_q4_g64/         mlx-lm's quantizer, 4 bits, group 64 (mlx-lm's default)
  f16.gguf            the same weights as an F16 GGUF (q/k rows permuted as
                      convert_hf_to_gguf.py permutes llama's), then by `neagari quantize --pure`
  q1_0.gguf, q4_k.gguf

and every file is decoded by `neagari bench -t THREADS -p 0 -n N --json`, files alternating
per round (the machine is shared: compare figures of the same run only). mlx-lm decodes each
MLX pack greedily for --mlx-n tokens after a one-token prompt (first round only: mlx's CPU
quantized matmul is slow on these packs, ~0.1 tok/s).

Usage: python3 bench/mlx_vs_gguf.py [--out DIR] [--neagari target/release/neagari]
           [--alt OTHER_BINARY] [--rounds 3] [-n 64] [-t 1] [--no-mlx] [--mlx-n 4]
           [--only NAME,NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))

HIDDEN, FFN, N_LAYERS, N_HEADS, N_KV, HEAD_DIM = 2048, 5632, 6, 16, 4, 128


def config(vocab: int) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "num_hidden_layers": N_LAYERS,
        "intermediate_size": FFN,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def build_models(out: str) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model

    import make_mlx_fixtures as mf

    tok = mf.make_tokenizer()
    vocab = tok.get_vocab_size()
    cfg = config(vocab)

    def fresh():
        mx.random.seed(5)
        m = llama.Model(llama.ModelArgs.from_dict(cfg))
        new = []
        for k, v in tree_flatten(m.parameters()):
            if k.endswith("norm.weight"):
                v = 1.0 + 0.1 * mx.random.normal(v.shape)
            else:
                v = mx.random.normal(v.shape) * (1.0 / np.sqrt(v.shape[-1]))
            new.append((k, v.astype(mx.bfloat16)))
        m.update(tree_unflatten(new))
        mx.eval(m.parameters())
        return m

    d = os.path.join(out, "hf_bf16")
    if not os.path.exists(os.path.join(d, "config.json")):
        m = fresh()
        write_pack(d, m, cfg, tok)
        write_gguf(os.path.join(out, "f16.gguf"), m, cfg, tok)
    for name, bits, group in [("mlx_q1_g128", 1, 128), ("mlx_q4_g64", 4, 64)]:
        d = os.path.join(out, name)
        if os.path.exists(os.path.join(d, "config.json")):
            continue
        m, qcfg = quantize_model(fresh(), dict(cfg), group, bits)
        write_pack(d, m, qcfg, tok)
        if bits == 1:
            # Bonsai's form of the same codes: bias = −scale/2 exactly (a halved f16/bf16
            # is exact), so each weight is ±scale/2.
            params = tree_flatten(m.parameters())
            new = []
            for k, v in params:
                if k.endswith(".biases"):
                    s = dict(params)[k[: -len("biases")] + "scales"]
                    v = (-(s.astype(mx.float32)) / 2).astype(v.dtype)
                new.append((k, v))
            m.update(tree_unflatten(new))
            mx.eval(m.parameters())
            write_pack(os.path.join(out, name + "_sym"), m, qcfg, tok)


def write_pack(d: str, m, cfg: dict, tok) -> None:
    from mlx_lm.utils import save_config, save_model

    os.makedirs(d, exist_ok=True)
    save_model(d, m)
    save_config(dict(cfg), os.path.join(d, "config.json"))
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False}, f)


def write_gguf(path: str, m, cfg: dict, tok) -> None:
    """The bf16 weights as an F16 llama GGUF with the pack's BPE vocabulary."""
    import mlx.core as mx
    from gguf import GGUFWriter
    from mlx.utils import tree_flatten

    w = GGUFWriter(path, "llama")
    w.add_name("mlx-vs-gguf bench")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(HIDDEN)
    w.add_block_count(N_LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_KV)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    tj = json.loads(tok.to_str())
    v = tj["model"]["vocab"]
    tokens = [t for t, _ in sorted(v.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in tj["added_tokens"]}
    merges = [" ".join(x) if isinstance(x, list) else x for x in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in special else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(v["<|im_end|>"])
    w.add_add_bos_token(False)

    def permute(a, n_head):
        # convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate-half rows to GGUF's
        # interleaved pairs.
        return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for k, t in tree_flatten(m.parameters()):
        a = np.array(t.astype(mx.float32))
        if k in names:
            g = names[k]
        else:
            _, _, i, *rest = k.split(".")
            mod = ".".join(rest[:-1])
            g = f"blk.{i}.{per[mod]}.weight"
            if mod == "self_attn.q_proj":
                a = permute(a, N_HEADS)
            elif mod == "self_attn.k_proj":
                a = permute(a, N_KV)
        w.add_tensor(g, a.astype(np.float16) if a.ndim == 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize_ggufs(out: str, neagari: str) -> None:
    for ty in ["Q1_0", "Q4_K"]:
        dst = os.path.join(out, f"{ty.lower()}.gguf")
        if not os.path.exists(dst):
            subprocess.run([neagari, "quantize", os.path.join(out, "f16.gguf"), dst,
                            "--type", ty, "--pure"], check=True)


def neagari_tg(neagari: str, model: str, n: int, threads: int) -> dict:
    r = subprocess.run([neagari, "bench", "-m", model, "-t", str(threads), "-p", "0", "-n",
                        str(n), "-r", "3", "--json", "--no-bandwidth", "--device", "cpu"],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


MLX_PEER = r"""
import sys, time, json
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
model, _ = load(sys.argv[1])
n = int(sys.argv[2])
rates = []
for r in range(int(sys.argv[3])):
    cache = make_prompt_cache(model)
    y = mx.array([[1]])
    out = model(y, cache=cache); mx.eval(out)
    t = time.perf_counter()
    for i in range(n):
        tok = mx.argmax(out[:, -1, :], axis=-1)
        out = model(tok[:, None], cache=cache)
        mx.eval(out)
    rates.append(n / (time.perf_counter() - t))
print(json.dumps({"tg": rates}))
"""


def mlx_tg(model: str, n: int, reps: int = 1) -> list[float]:
    r = subprocess.run([sys.executable, "-c", MLX_PEER, model, str(n), str(reps)], check=True,
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["tg"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/neagari_mlx_bench")
    ap.add_argument("--neagari", default=os.path.join(HERE, "..", "target", "release", "neagari"))
    ap.add_argument("--alt", help="a second neagari binary, run alternately (before/after)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", type=int, default=1)
    ap.add_argument("--no-mlx", action="store_true")
    ap.add_argument("--mlx-n", type=int, default=4,
                    help="tokens per mlx-lm run (its CPU decode of these packs is slow), first round only")
    ap.add_argument("--only", help="comma-separated subset of the models")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    build_models(a.out)
    quantize_ggufs(a.out, a.neagari)
    models = ["mlx_q1_g128_sym", "mlx_q1_g128", "q1_0.gguf", "mlx_q4_g64", "q4_k.gguf"]
    if a.only:
        models = [m for m in models if m in a.only.split(",")]
    bins = {"neagari": a.neagari}
    if a.alt:
        bins["alt"] = a.alt
    res: dict[tuple[str, str], list[float]] = {}
    mib = {}
    for rnd in range(a.rounds):
        for m in models:
            for tag, b in bins.items():
                j = neagari_tg(b, os.path.join(a.out, m), a.n, a.t)
                res.setdefault((tag, m), []).append(j["tg_tok_s"])
                mib[m] = j["decode_bytes_per_token"] / 2**20
            if not a.no_mlx and m.startswith("mlx") and rnd == 0:
                res.setdefault(("mlx-lm", m), []).extend(mlx_tg(os.path.join(a.out, m), a.mlx_n))
        print(f"round {rnd + 1}/{a.rounds} done ({time.strftime('%H:%M:%S')}, "
              f"load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    tags = list(bins) + ([] if a.no_mlx else ["mlx-lm"])
    print(f"decode tok/s, -t {a.t}, n = {a.n}, mean ± sd over rounds × reps "
          f"(load {os.getloadavg()[0]:.1f})")
    print("| model | MiB/token | " + " | ".join(tags) + " |")
    print("|---|---:|" + "---:|" * len(tags))
    mean = {}
    for m in models:
        cells = []
        for t in tags:
            v = res.get((t, m))
            if v:
                mean[(t, m)] = statistics.mean(v)
                sd = statistics.stdev(v) if len(v) > 1 else 0.0
                cells.append(f"{mean[(t, m)]:.1f} ± {sd:.1f}")
            else:
                cells.append("—")
        print(f"| {m} | {mib[m]:.1f} | " + " | ".join(cells) + " |")
    for t in bins:
        g = lambda m: mean.get((t, m), float("nan"))  # noqa: E731
        print(f"{t}: mlx_q1_g128_sym / q1_0.gguf = {g('mlx_q1_g128_sym') / g('q1_0.gguf'):.2f}, "
              f"mlx_q1_g128 / q1_0.gguf = {g('mlx_q1_g128') / g('q1_0.gguf'):.2f}, "
              f"mlx_q1_g128_sym / q4_k.gguf = {g('mlx_q1_g128_sym') / g('q4_k.gguf'):.2f}, "
              f"mlx_q4_g64 / q4_k.gguf = {g('mlx_q4_g64') / g('q4_k.gguf'):.2f}")
    if a.alt:
        for m in models:
            print(f"{m}: alt / neagari = {mean[('alt', m)] / mean[('neagari', m)]:.2f}")


if __name__ == "__main__":
    main()
