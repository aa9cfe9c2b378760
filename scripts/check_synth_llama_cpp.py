"""Checks that `neagari synth --like qwen3.6-27b` files are what llama.cpp expects: each type
is written as a 4-layer variant (same widths as the 64-layer file), read back with the `gguf`
package (arch, tensor count, the 2-D types and a few exact shapes) and loaded and run by
llama.cpp through llama-cpp-python (finite logits with a spread, not a constant).

    python3 scripts/check_synth_llama_cpp.py [path/to/neagari] [TYPE ...]

Defaults: target/debug/neagari; Q1_0 TQ2_0 Q4_K Q8_0. Needs `gguf`, `numpy` and
`llama-cpp-python` (0.3.36 here); a few GB of free disk in the temp directory.
"""

import os
import subprocess
import sys
import tempfile

import gguf
import numpy as np
from llama_cpp import Llama

# HF-order [out, in] of a few Qwen3.6-27B tensors (gguf lists ne, i.e. reversed).
SHAPES = {
    "token_embd.weight": [248320, 5120],
    "blk.0.attn_qkv.weight": [10240, 5120],
    "blk.0.attn_gate.weight": [6144, 5120],
    "blk.0.ssm_out.weight": [5120, 6144],
    "blk.0.ssm_conv1d.weight": [10240, 4],
    "blk.3.attn_q.weight": [12288, 5120],
    "blk.3.attn_k.weight": [1024, 5120],
    "blk.3.ffn_down.weight": [5120, 17408],
}


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else "target/debug/neagari"
    types = sys.argv[2:] or ["Q1_0", "TQ2_0", "Q4_K", "Q8_0"]
    with tempfile.TemporaryDirectory() as d:
        for ty in types:
            path = os.path.join(d, f"s_{ty}.gguf")
            subprocess.run(
                [exe, "synth", "--like", "qwen3.6-27b", "--layers", "4", "--type", ty,
                 "-o", path, "--seed", "3"],
                check=True,
            )
            r = gguf.GGUFReader(path)
            f = r.fields["general.architecture"]
            assert bytes(f.parts[f.data[0]]).decode() == "qwen35"
            assert len(r.tensors) == 56, len(r.tensors)
            by = {t.name: t for t in r.tensors}
            for name, shape in SHAPES.items():
                got = [int(x) for x in by[name].shape][::-1]
                assert got == shape, (name, got, shape)
            mats = {t.tensor_type.name for t in r.tensors if len(t.shape) == 2
                    and "conv1d" not in t.name}
            assert mats == {ty}, mats
            m = Llama(model_path=path, n_ctx=64, n_threads=2, n_batch=8,
                      verbose=False, logits_all=True)
            m.eval([1, 2, 3])
            lg = np.array(m.scores[:3, : m.n_vocab()])
            assert m.n_vocab() == 248320
            assert np.isfinite(lg).all()
            sd = lg.std(axis=1)
            assert (sd > 0.05).all(), sd
            print(f"{ty}: llama.cpp loads and runs it; logit sd per position {sd.round(3)}")
            del m
            os.remove(path)


if __name__ == "__main__":
    main()
