#!/usr/bin/env python3
"""Regenerate crates/engine/tests/fixtures/sampler_chains.json.

Reference: llama.cpp's sampler chain through llama-cpp-python 0.3.36's low-level API
(penalties -> top-k -> top-p -> min-p -> temperature -> dist, the order of common/sampling.cpp).
For each case the fixture holds the logits, the accepted-token history, the configuration and
the candidates that survive the chain with the probabilities `dist` assigns them.

Usage:
    pip install llama-cpp-python==0.3.36
    python3 scripts/sampler_reference.py
"""

import ctypes
import json
import os
import random
import struct

import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "engine", "tests", "fixtures", "sampler_chains.json")


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def run_chain(logits, history, cfg):
    n = len(logits)
    samplers = []
    pen = llama_cpp.llama_sampler_init_penalties(
        n, cfg["repeat_last_n"], cfg["repeat_penalty"], cfg["frequency_penalty"],
        cfg["presence_penalty"],
    )
    for t in history:
        llama_cpp.llama_sampler_accept(pen, t)
    samplers.append(pen)
    samplers.append(llama_cpp.llama_sampler_init_top_k(cfg["top_k"]))
    samplers.append(llama_cpp.llama_sampler_init_top_p(cfg["top_p"], 0))
    samplers.append(llama_cpp.llama_sampler_init_min_p(cfg["min_p"], 0))
    samplers.append(llama_cpp.llama_sampler_init_temp(cfg["temperature"]))
    samplers.append(llama_cpp.llama_sampler_init_dist(1234))

    data = (llama_cpp.llama_token_data * n)()
    for i, l in enumerate(logits):
        data[i].id = i
        data[i].logit = f32(l)
        data[i].p = 0.0
    arr = llama_cpp.llama_token_data_array(data=data, size=n, selected=-1, sorted=False)
    for s in samplers:
        llama_cpp.llama_sampler_apply(s, ctypes.byref(arr))
        llama_cpp.llama_sampler_free(s)
    out = [(int(arr.data[i].id), float(arr.data[i].p)) for i in range(arr.size)]
    out.sort(key=lambda c: (-c[1], c[0]))
    return out


def main():
    rng = random.Random(20250307)
    base = {
        "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
        "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0,
    }
    variants = [
        {},
        {"top_k": 0},
        {"top_k": 1},
        {"top_k": 300, "top_p": 0.5},
        {"top_k": 0, "top_p": 0.9, "min_p": 0.0},
        {"top_k": 0, "top_p": 1.0, "min_p": 0.2},
        {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0},
        {"temperature": 1.5, "top_p": 0.99},
        {"temperature": 0.3},
        {"temperature": 0.0},
        {"repeat_penalty": 1.3, "repeat_last_n": 16},
        {"repeat_penalty": 1.3, "repeat_last_n": 16, "temperature": 0.0},
        {"frequency_penalty": 0.5, "presence_penalty": 0.3, "repeat_last_n": 32, "top_k": 0},
        {"repeat_penalty": 2.0, "frequency_penalty": 0.2, "presence_penalty": 0.4,
         "repeat_last_n": 8, "top_k": 20, "top_p": 0.8, "min_p": 0.1},
    ]
    cases = []
    for n_vocab, scale in ((64, 2.0), (512, 3.0), (2048, 1.5)):
        for v in variants:
            cfg = {**base, **v}
            # Five decimals keep the fixture small; Rust reads the same decimal as f64 and
            # rounds it to the same f32. Distinct values, so no selection depends on tie order.
            logits = []
            seen = set()
            while len(logits) < n_vocab:
                x = round(rng.gauss(0.0, scale), 5)
                if f32(x) not in seen:
                    seen.add(f32(x))
                    logits.append(x)
            # history concentrated on likely tokens so penalties change the outcome
            top = sorted(range(n_vocab), key=lambda i: -logits[i])[:12]
            history = [rng.choice(top) if rng.random() < 0.7 else rng.randrange(n_vocab)
                       for _ in range(40)]
            cands = run_chain(logits, history, cfg)
            cases.append({
                "config": cfg, "logits": logits, "history": history,
                "candidates": [[i, float(f"{p:.9g}")] for i, p in cands],
            })
    doc = {
        "generated_by": "scripts/sampler_reference.py",
        "llama_cpp_python": llama_cpp.__version__,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"{OUT}: {len(cases)} cases")


if __name__ == "__main__":
    main()
