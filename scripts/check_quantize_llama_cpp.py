"""Do files written by `neagari quantize` load and run in llama.cpp?

For every case in tests/fixtures/quantize/reference.json (made by
scripts/make_quantize_reference.py), runs `neagari quantize` on the same input with the
same options, then with llama-cpp-python 0.3.36:
  * loads the file (llama.cpp validates every tensor's type, shape and data range);
  * checks each tensor's type and bytes against the reference (gguf-py reads the file too);
  * where llama.cpp's logits on its own output are stored, runs our file on the same ids
    and requires the logits to be identical (same tensor bytes, same engine).
Not a fixture maker: it prints a verdict per case and exits non-zero on any mismatch.

Usage: cargo build -p neagari && python3 scripts/check_quantize_llama_cpp.py [path/to/neagari]
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "quantize")


def main():
    exe = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "target", "debug", "neagari")
    ref = json.load(open(os.path.join(FIX, "reference.json")))
    quiet_logs()
    s = ref["settings"]
    settings = Settings(n_ctx=s["n_ctx"], n_batch=s["n_batch"], n_ubatch=s["n_ubatch"],
                        n_threads=2, flash_attn=s["flash_attn"], type_kv=1)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in ref["cases"]:
            out = os.path.join(tmp, case["name"] + ".gguf")
            cmd = [exe, "quantize", os.path.join(FIX, case["input"]), out, "--type", case["ftype"]]
            if "keep_output" in case["options"]:
                cmd += ["--keep-output", case["options"]["keep_output"]]
            if case["options"].get("pure"):
                cmd += ["--pure"]
            subprocess.run(cmd, check=True, capture_output=True)
            r = gguf.GGUFReader(out)
            same = all(
                t.name == w["name"] and t.tensor_type.name == w["type"]
                and hashlib.sha256(bytes(t.data.tobytes())).hexdigest() == w["sha256"]
                for t, w in zip(r.tensors, case["tensors"])
            ) and len(r.tensors) == len(case["tensors"])
            lref = LlamaRef(out, settings)  # raises if llama.cpp cannot load it
            verdict = f"loads in llama.cpp, tensors {'equal' if same else 'DIFFER'}"
            ok = same
            if "logits_file" in case:
                got = lref.decode(ref["ids"], 0, lambda i: True)
                want = np.fromfile(os.path.join(FIX, case["logits_file"]), dtype="<f4")
                d = float(np.abs(got.reshape(-1) - want).max())
                verdict += f", logits max |Δ| {d:.1e} vs llama.cpp's own file"
                ok = ok and d == 0.0
            lref.close()
            bad += not ok
            print(f"{case['name']}: {verdict}{'' if ok else '  <-- FAIL'}")
    print("all good" if bad == 0 else f"{bad} case(s) failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
