#!/usr/bin/env python3
"""Issue 5's low-bit speed bars in one invocation: decode tok/s of neagari against llama.cpp
on the same file per type, Q1_0 against Q4_K of the same model, and bytes per decoded token
over step time as a share of memory bandwidth.

Makes the bench models first where missing (bench/make_lowbit_bench_models.py: one
random-weight Llama of 270 M weights, requantized `pure` by llama.cpp to each type), then
per round runs every file once on each side in fresh processes, alternating which side goes
first (the machine is shared: compare ratios within one run, ANCHORS.md):
  llama.cpp: compare_llamacpp.py's worker (tg<N> = N timed single-token decodes after a
             warm-up, as llama-bench's tg test);
  neagari:   `<bin> bench -m FILE -p 0 -n N -r 1 -t T --json --no-bandwidth`.
Bandwidth: neagari's own read-bandwidth measurement (T threads streaming 512 MiB), taken
once before and once after the rounds, and the 29.3 GB/s (2 threads) anchor.

Usage:
  cargo build --release -p neagari
  python3 bench/lowbit_speed.py [--dir /tmp/neagari_lowbit_bench] [-t 2] [-r 3] [-n 64]
      [--types Q1_0,TQ2_0,...] [--markdown FILE]
Prints a markdown table (and appends it to --markdown FILE when given).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import compare_llamacpp as cl  # noqa: E402

# Types llama.cpp's CPU backend runs (PTQ1_0/PQ2_0 are PrismML's, not upstream).
TYPES = ["Q4_K", "Q1_0", "TQ1_0", "TQ2_0", "Q2_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS",
         "IQ3_S", "IQ1_S", "IQ1_M"]
ANCHOR_BW = 29.3e9  # bytes/s, 2 threads (../shared/reference/ANCHORS.md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/tmp/neagari_lowbit_bench")
    ap.add_argument("--neagari", default=str(ROOT / "target" / "release" / "neagari"))
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--markdown", help="append the table to this file")
    args = ap.parse_args()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    if not os.access(args.neagari, os.X_OK):
        sys.exit(f"no neagari binary at {args.neagari} (cargo build --release -p neagari)")

    files = {t: Path(args.dir) / f"bench_{t.lower()}.gguf" for t in types}
    missing = [t for t, f in files.items() if not f.exists()]
    if missing:
        print(f"making bench models: {', '.join(missing)}", flush=True)
        env = dict(os.environ, NEAGARI_BENCH_TYPES=",".join(missing))
        subprocess.run([sys.executable, str(HERE / "make_lowbit_bench_models.py"), args.dir],
                       check=True, env=env)

    def neagari_cmd(f: Path, bandwidth: bool = False) -> list[str]:
        cmd = [args.neagari, "bench", "-m", str(f), "-p", "0", "-n", str(args.n_gen),
               "-r", "1", "-t", str(args.threads), "--json"]
        return cmd if bandwidth else cmd + ["--no-bandwidth"]

    def llama_cmd(f: Path) -> list[str]:
        return [sys.executable, str(HERE / "compare_llamacpp.py"), "--llama-worker", "-m",
                str(f), "-t", str(args.threads), "-p", "0", "-n", str(args.n_gen)]

    def bandwidth() -> float | None:
        j, _, err = cl.run_child(neagari_cmd(files[types[0]], bandwidth=True), args.timeout)
        if j is None:
            print(f"bandwidth run failed: {err}", file=sys.stderr)
            return None
        return j.get("read_bandwidth_bytes_s")

    load0 = os.getloadavg()[0]
    bws = [bandwidth()]
    tg = {t: {"neagari": [], "llama.cpp": []} for t in types}
    bytes_tok: dict[str, int] = {}
    for r in range(args.rounds):
        for t in types:
            sides = [("neagari", neagari_cmd(files[t])), ("llama.cpp", llama_cmd(files[t]))]
            for name, cmd in sides if r % 2 == 0 else sides[::-1]:
                j, _, err = cl.run_child(cmd, args.timeout)
                if j is None or not isinstance(j.get("tg_tok_s"), (int, float)):
                    print(f"round {r + 1} {t} {name}: FAILED {err}", file=sys.stderr)
                    continue
                tg[t][name].append(float(j["tg_tok_s"]))
                if name == "neagari":
                    bytes_tok[t] = int(j["decode_bytes_per_token"])
                print(f"round {r + 1} {t:8} {name:9} tg{args.n_gen} {j['tg_tok_s']:7.1f} tok/s",
                      flush=True)
    bws.append(bandwidth())
    load1 = os.getloadavg()[0]
    bw = statistics.fmean([b for b in bws if b]) if any(bws) else None

    def mean(xs: list[float]) -> float | None:
        return statistics.fmean(xs) if xs else None

    lines = [
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {cl.git_rev()}, "
        f"{args.threads} threads, {args.rounds} rounds, tg{args.n_gen}, load avg "
        f"{load0:.1f}->{load1:.1f} on {os.cpu_count()} CPUs; neagari's measured read bandwidth "
        + (f"{bw / 1e9:.1f} GB/s" if bw else "n/a"),
        "",
        "| type | MiB read / token | llama.cpp tg t/s | neagari tg t/s | **ratio** | "
        "share of measured BW | share of 29.3 GB/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in types:
        n, l = tg[t]["neagari"], tg[t]["llama.cpp"]
        mn, ml = mean(n), mean(l)
        b = bytes_tok.get(t)
        ratio = f"**{mn / ml:.2f}×**" if mn and ml else "—"
        share = f"{b * mn / bw:.0%}" if b and mn and bw else "—"
        share_a = f"{b * mn / ANCHOR_BW:.0%}" if b and mn else "—"
        lines.append(f"| {t} | {b / 2**20:.1f} | {cl.fmt(l)} | {cl.fmt(n)} | {ratio} | {share} "
                     f"| {share_a} |" if b else f"| {t} | — | {cl.fmt(l)} | {cl.fmt(n)} | {ratio} "
                     f"| — | — |")
    q1, q4 = mean(tg.get("Q1_0", {}).get("neagari", [])), mean(tg.get("Q4_K", {}).get("neagari", []))
    if q1 and q4:
        lines += ["", f"neagari Q1_0 / Q4_K decode: **{q1 / q4:.2f}×** ({q1:.1f} vs {q4:.1f} tok/s)"]
    out = "\n".join(lines)
    print()
    print(out)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(out + "\n\n")


if __name__ == "__main__":
    main()
