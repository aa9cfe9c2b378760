"""A Hadamard-rotated copy of the tiny qwen3 GGUF, declared with PrismML's keys.

Reads tests/fixtures/tiny/qwen3.gguf (scripts/make_tiny_llama_family.py) with gguf-py and
writes tests/fixtures/tiny/qwen3_hadamard.gguf: every attention / FFN matrix and the
output head stored as rows r' = H(s ⊙ r) (H the normalized Sylvester Hadamard of block 32,
built densely here with NumPy, applied per 32-column block; s a ±1 vector per input width),
the token embedding stored the same way and declared in `inverse_weight_names` (un-rotated
after lookup), plus the `prism.hadamard.*` keys (FORMATS.md §3.3). Since H is symmetric and
orthogonal, the rotated model computes the same function: crates/engine/tests/
hadamard_gguf.rs checks neagari's logits on it against the unrotated file and llama.cpp's
greedy tokens (tests/fixtures/tiny/reference.json).

Usage: python3 scripts/make_hadamard_gguf.py
"""

import os

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter, GGUFValueType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "fixtures", "tiny", "qwen3.gguf")
DST = os.path.join(ROOT, "tests", "fixtures", "tiny", "qwen3_hadamard.gguf")
BLOCK = 32
ROTATED = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def sylvester(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def rotate_rows(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    h = sylvester(BLOCK)
    x = (w.astype(np.float64) * s).reshape(w.shape[0], -1, BLOCK)
    return (x @ h.T).reshape(w.shape).astype(np.float32)


def main() -> None:
    r = GGUFReader(SRC)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(DST, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        if vt == GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), vt)
    rng = np.random.default_rng(5)
    widths = sorted({int(t.shape[0]) for t in r.tensors if len(t.shape) == 2})
    signs = {wd: np.where(rng.random(wd) < 0.5, -1.0, 1.0) for wd in widths}
    forward, inverse = [], []
    for t in r.tensors:
        data = np.array(t.data)
        base = t.name.rsplit(".", 1)[0].split(".")[-1]
        if t.name.endswith(".weight") and (base in ROTATED or t.name == "output.weight"):
            data = rotate_rows(data, signs[data.shape[1]])
            forward.append(t.name)
        elif t.name == "token_embd.weight":
            data = rotate_rows(data, signs[data.shape[1]])
            inverse.append(t.name)
        w.add_tensor(t.name, data)
    w.add_uint32("prism.hadamard.version", 1)
    w.add_uint32("prism.hadamard.block_size", BLOCK)
    w.add_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard")
    w.add_string("prism.hadamard.axis", "input-last-dimension")
    w.add_string("prism.hadamard.sign_mode", "explicit")
    w.add_array("prism.hadamard.sign_widths", widths)
    w.add_array("prism.hadamard.sign_values", [int(v) for wd in widths for v in signs[wd]])
    w.add_array("prism.hadamard.weight_names", forward)
    w.add_array("prism.hadamard.inverse_weight_names", inverse)
    w.add_bool("prism.hadamard.gdn_v_grouped", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {DST}: {len(forward)} forward-rotated, {len(inverse)} inverse, widths {widths}")


if __name__ == "__main__":
    main()
