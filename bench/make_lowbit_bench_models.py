#!/usr/bin/env python3
"""Decode-benchmark models for the low-bit formats: one random-weight Llama (hidden 2048,
FFN 5632, 6 layers, 16 heads / 4 KV heads of 128, the 300-token vocabulary of
scripts/make_tiny_llama_family.py so the output head does not dominate), written as F16,
then requantized by llama.cpp's llama_model_quantize (`pure`: every 2-D tensor gets the
type) to Q4_K, Q1_0, TQ2_0, Q2_K, IQ2_XS, and the other i-quants and TQ1_0 (a flat
importance matrix where llama.cpp needs one). All
dimensions are multiples of 256, so every type applies to every tensor. Random weights
decode at the speed of trained ones (the kernels do not look at values).

Usage: python3 bench/make_lowbit_bench_models.py [OUT_DIR]   (default /tmp/neagari_lowbit_bench)
Then:  python3 bench/compare_llamacpp.py -m OUT_DIR/bench_q1_0.gguf --neagari target/release/neagari ...
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_tiny_llama_family as mt  # noqa: E402
import make_lowbit_fixtures as mf  # noqa: E402
from llama_ref import quiet_logs  # noqa: E402

# ggml type name -> llama_ftype whose `pure` default type it is (llama-quant.cpp: the
# IQ2_S type comes from ftype IQ2_M, IQ3_S from ftype IQ3_S).
TYPES = {
    "Q4_K": 14, "Q1_0": 40, "TQ2_0": 37, "Q2_K": 10, "IQ2_XS": 20,
    "TQ1_0": 36, "IQ2_XXS": 19, "IQ2_S": 29, "IQ3_XXS": 23, "IQ3_S": 26, "IQ1_S": 24,
    "IQ1_M": 31,
}
# llama.cpp refuses these without an importance matrix; a flat one stands in.
NEEDS_IMATRIX = {"IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ3_XXS", "IQ1_S", "IQ1_M"}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/neagari_lowbit_bench"
    os.makedirs(out, exist_ok=True)
    quiet_logs()
    mt.HIDDEN, mt.FFN, mt.N_HEADS, mt.N_KV_HEADS, mt.N_LAYERS = 2048, 5632, 16, 4, 6
    mt.N_CTX_TRAIN = 2048
    src = os.path.join(out, "bench_f16.gguf")
    if not os.path.exists(src):
        import numpy as np
        from gguf import GGUFWriter

        # Same writer as the tiny fixtures, but F16 tensors (halves the source file).
        orig_add = GGUFWriter.add_tensor

        def add_f16(self, name, tensor, *a, **k):
            if tensor.dtype == np.float32 and tensor.ndim == 2:
                tensor = tensor.astype(np.float16)
            return orig_add(self, name, tensor, *a, **k)

        GGUFWriter.add_tensor = add_f16
        mt.write_model(src, "llama", head_dim=128, biases=False, qk_norm=False, tied=False,
                       q8=False, seed=5, freq_base=10000.0)
        GGUFWriter.add_tensor = orig_add
    mf.FTYPES.update(TYPES)
    mf.NEEDS_IMATRIX.update(NEEDS_IMATRIX)
    only = os.environ.get("NEAGARI_BENCH_TYPES")
    for name in TYPES:
        if only and name not in only.split(","):
            continue
        dst = os.path.join(out, f"bench_{name.lower()}.gguf")
        if not os.path.exists(dst):
            # Through a temporary name, so an interrupted run leaves no partial file that
            # a later run would take for a finished one.
            mf.quantize(src, dst + ".part", name)
            os.replace(dst + ".part", dst)
        print(name, dst, os.path.getsize(dst) // (1 << 20), "MiB")


if __name__ == "__main__":
    main()
