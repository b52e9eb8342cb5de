#!/usr/bin/env python3
"""Sums an ncu --csv --page details speed-of-light capture of whole decode steps (tools/gpu_profile.sh
step): the launches are cut into steps at each embedding kernel; for the complete steps, per
kernel name and grid: launches per step, microseconds per step, mean DRAM throughput; then the
step's kernel time in all. Usage: ncu_step_summary.py CAPTURE.csv"""
import collections
import csv
import sys


def launches(path):
    rows = collections.OrderedDict()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        k = rows.setdefault(r["ID"], {"name": r["Kernel Name"].split("(")[0].split("<")[0], "grid": r["Grid Size"]})
        if r["Metric Name"] == "Duration":
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
            k["us"] = float(r["Metric Value"].replace(",", "")) * scale
        elif r["Metric Name"] == "DRAM Throughput":
            k["dram"] = float(r["Metric Value"].replace(",", ""))
    return list(rows.values())


def main():
    ks = launches(sys.argv[1])
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("embed")]
    if len(starts) < 2:
        sys.exit("fewer than one whole step in the capture (no two embedding launches)")
    steps = [ks[a:b] for a, b in zip(starts, starts[1:])]
    total = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for s in steps:
        for k in s:
            t = total[(k["name"], k["grid"])]
            t[0] += 1
            t[1] += k.get("us", 0.0)
            t[2] += k.get("dram", 0.0) * k.get("us", 0.0)
    n = len(steps)
    print(f"{n} whole steps; per step:")
    print(f"{'kernel':40} {'grid':>16} {'launches':>8} {'us':>9} {'dram %':>7}")
    for (name, grid), (c, us, dram_us) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:40]:40} {grid:>16} {c / n:8.1f} {us / n:9.1f} {dram_us / us if us else 0:7.1f}")
    print(f"kernel time per step: {sum(t[1] for t in total.values()) / n / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
