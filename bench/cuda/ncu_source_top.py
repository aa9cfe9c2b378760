#!/usr/bin/env python3
"""Where a kernel's warps wait, from `ncu -i R --page source --csv --print-source sass`
(stdin or a file argument): the stall reasons over the whole kernel, the opcodes that
collect the samples, and the TOP (default 40) instructions by samples with their leading
reasons and execution counts. `--top N` sets how many."""
import csv
import sys
from collections import defaultdict

args = sys.argv[1:]
top = 40
if "--top" in args:
    i = args.index("--top")
    top = int(args[i + 1])
    del args[i : i + 2]
src = open(args[0]) if args else sys.stdin
rows = list(csv.reader(line for line in src if line.startswith('"')))
# One table a kernel: a "Kernel Name" line, then the header, then its instructions.
tables, cur = [], None
for r in rows:
    if r and r[0] == "Kernel Name":
        cur = {"name": r[1], "head": None, "rows": []}
        tables.append(cur)
    elif cur is not None and cur["head"] is None:
        cur["head"] = r
    elif cur is not None:
        cur["rows"].append(r)
if not tables:  # a file without the kernel-name line
    tables = [{"name": "?", "head": rows[0], "rows": rows[1:]}]


def num(s):
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return 0.0


for t in tables:
    col = {n: i for i, n in enumerate(t["head"])}
    samp = col.get("Warp Stall Sampling (All Samples)")
    execd = col.get("Instructions Executed")
    # The all-samples reasons (ncu also gives each a "(Not Issued)" twin).
    stalls = [n for n in t["head"] if n.startswith("stall_") and "Not Issued" not in n]
    total = sum(num(r[samp]) for r in t["rows"]) or 1.0
    print(f"== {t['name']}: {int(total)} samples, {len(t['rows'])} instructions")
    reason = defaultdict(float)
    for r in t["rows"]:
        for s in stalls:
            reason[s] += num(r[col[s]])
    print("stall reasons: " + ", ".join(f"{s[6:]} {100 * v / total:.1f}%"
                                        for s, v in sorted(reason.items(), key=lambda kv: -kv[1])
                                        if v > 0.005 * total))
    ops = defaultdict(lambda: [0.0, 0.0])
    for r in t["rows"]:
        op = r[col["Source"]].split()
        op = [w for w in op if not w.startswith("@")]
        key = op[0].split(".")[0] if op else "?"
        ops[key][0] += num(r[samp])
        ops[key][1] += num(r[execd]) if execd is not None else 0.0
    print("by opcode (samples %, warp instructions executed):")
    for k, (s, e) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:16]:
        print(f"  {k:<12} {100 * s / total:5.1f}%  {int(e)}")
    print(f"top {top} instructions:")
    order = sorted(range(len(t["rows"])), key=lambda i: -num(t["rows"][i][samp]))
    for i in order[:top]:
        r = t["rows"][i]
        lead = sorted(((num(r[col[s]]), s[6:]) for s in stalls), reverse=True)[:3]
        why = " ".join(f"{n}:{int(v)}" for v, n in lead if v > 0)
        ex = int(num(r[execd])) if execd is not None else 0
        print(f"  #{i:<5} {100 * num(r[samp]) / total:5.1f}% exec {ex:>8}  {r[col['Source']].strip()[:60]:<60} {why}")
