#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum` log by kernel
(name, grid, block): launches, total and mean time, DRAM bytes read and their rate. Reads
the CSV on stdin; `--by name` groups by kernel name alone."""
import csv
import sys
from collections import defaultdict

by_name = "--by" in sys.argv and sys.argv[sys.argv.index("--by") + 1] == "name"
rows = [r for r in csv.reader(line for line in sys.stdin if line.startswith('"'))]
head, rows = rows[0], rows[1:]
col = {n: i for i, n in enumerate(head)}
kern = defaultdict(dict)  # launch id -> metrics
meta = {}
for r in rows:
    i = r[col["ID"]]
    name = r[col["Kernel Name"]].split("(")[0]
    meta[i] = name if by_name else f'{name} {r[col["Grid Size"]]} {r[col["Block Size"]]}'
    v = float(r[col["Metric Value"]].replace(",", ""))
    unit = r[col["Metric Unit"]]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
             "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1.0)
    kern[i][r[col["Metric Name"]]] = v * scale
agg = defaultdict(lambda: [0, 0.0, 0.0])
for i, m in kern.items():
    a = agg[meta[i]]
    a[0] += 1
    a[1] += m.get("gpu__time_duration.sum", 0.0)
    a[2] += m.get("dram__bytes_read.sum", 0.0)
total = sum(a[1] for a in agg.values())
print(f"{len(kern)} launches, {total:.1f} us")
print(f"{'kernel':60} {'n':>5} {'total us':>9} {'%':>5} {'mean us':>8} {'MB/launch':>9} {'TB/s':>5}")
for k, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{k[:60]:60} {n:5} {t:9.1f} {100 * t / total:5.1f} {t / n:8.2f} {b / n / 1e6:9.2f} "
          f"{b / (t * 1e-6) / 1e12 if t else 0:5.2f}")
