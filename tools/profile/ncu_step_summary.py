#!/usr/bin/env python3
"""Sums an ncu --csv --page details speed-of-light capture of decode steps (tools/profile/gpu_profile.sh
step; or one of --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed): per kernel name and grid, launches, microseconds and mean DRAM throughput per step, a step
being one LM head (one soft-cap launch) of the capture; then the kernel time of a step in all.
Usage: ncu_step_summary.py CAPTURE.csv"""
import collections
import csv
import re
import sys


def launches(path):
    rows = collections.OrderedDict()
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    for r in csv.DictReader(lines):
        name = re.sub(r"^void |\(anonymous namespace\)::|unnamed>::", "", r["Kernel Name"]).split("(")[0]
        k = rows.setdefault(r["ID"], {"name": name, "grid": r["Grid Size"]})
        if r["Metric Name"] in ("Duration", "gpu__time_duration.sum"):
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
            k["us"] = float(r["Metric Value"].replace(",", "")) * scale
        elif r["Metric Name"] in ("DRAM Throughput", "dram__throughput.avg.pct_of_peak_sustained_elapsed"):
            k["dram"] = float(r["Metric Value"].replace(",", ""))
    return list(rows.values())


def main():
    ks = launches(sys.argv[1])
    n = sum(1 for k in ks if k["name"].startswith("softcap"))
    if n == 0:
        sys.exit("no decode step in the capture (no soft-cap launch)")
    total = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in ks:
        t = total[(k["name"], k["grid"])]
        t[0] += 1
        t[1] += k.get("us", 0.0)
        t[2] += k.get("dram", 0.0) * k.get("us", 0.0)
    print(f"{len(ks)} launches, {n} steps; per step:")
    print(f"{'kernel':48} {'grid':>16} {'launches':>8} {'us':>9} {'dram %':>7}")
    for (name, grid), (c, us, dram_us) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"{name[:48]:48} {grid:>16} {c / n:8.1f} {us / n:9.1f} {dram_us / us if us else 0:7.1f}")
    print(f"kernel time per step: {sum(t[1] for t in total.values()) / n / 1e3:.3f} ms")


if __name__ == "__main__":
    main()
