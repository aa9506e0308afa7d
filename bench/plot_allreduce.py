#!/usr/bin/env python3
"""Table and plot of allreduce benchmark records (one JSON object per line, as written by
bench/allreduce.sh: the fields of `tandem bench allreduce --output json` plus "series").

Usage: plot_allreduce.py RESULTS.jsonl OUTDIR  ->  OUTDIR/table.md, OUTDIR/allreduce.png
The table puts every series side by side per (ranks, bytes): busbw, time and the fraction of one
core's memcpy bandwidth (measured in the same run), then the ratios of each Tandem series to its
OpenMPI counterpart (tcp to tcp, shm and hier to shm). With several rounds of the same series the
median of each figure is shown. Reusable for any JSONL with series/ranks/bytes/busbw_gbps/latency_us.
"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchplot import pyplot, write_table

# (numerator, denominator) of the ratio columns, where both series are present.
RATIOS = [("tandem-tcp", "openmpi-tcp"), ("tandem-shm", "openmpi-shm"), ("tandem-hier", "openmpi-shm"),
          ("tandem-hier", "openmpi-tcp")]


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def median(records, key):
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def main():
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    records = [json.loads(l) for l in results.read_text().splitlines() if l.startswith("{")]
    series = list(dict.fromkeys(r["series"] for r in records))
    by = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[(r["ranks"], r["bytes"])][r["series"]].append(r)
    cell = {}
    for key, row in by.items():
        for s, rs in row.items():
            bw, lat, mc = median(rs, "busbw_gbps"), median(rs, "latency_us"), median(rs, "memcpy_gbps")
            cell[(key, s)] = (bw, lat, bw / mc if bw is not None and mc else None)
    ratios = [(a, b) for a, b in RATIOS if a in series and b in series]
    head = ["ranks", "bytes"]
    for s in series:
        head += [f"{s} busbw GB/s", f"{s} µs", f"{s} ÷memcpy"]
    head += [f"{a}/{b}" for a, b in ratios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v, spec: format(v, spec) if v is not None else "–"
    for key in sorted(by):
        cells = [str(key[0]), human(key[1])]
        for s in series:
            bw, lat, frac = cell.get((key, s), (None, None, None))
            cells += [fmt(bw, ".3f"), fmt(lat, ".1f"), fmt(frac, ".3f")]
        for a, b in ratios:
            x, y = cell.get((key, a)), cell.get((key, b))
            cells.append(f"{x[0] / y[0]:.2f}×" if x and y and x[0] and y[0] else "–")
        lines.append("| " + " | ".join(cells) + " |")
    rounds = max(len(rs) for row in by.values() for rs in row.values())
    note = f"\nMedians of {rounds} rounds.\n" if rounds > 1 else "\n"
    write_table(out, "\n".join(lines) + "\n" + note)
    plt = pyplot("plot_allreduce.py")
    if plt is None:
        return
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 5))
    all_ranks = sorted({r["ranks"] for r in records})
    for s in series:
        for ranks in all_ranks:
            pts = sorted((k[1], v) for (k, name), v in cell.items() if name == s and k[0] == ranks)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = "-" if ranks == max(all_ranks) else "--"
            bw.plot(xs, [p[1][0] for p in pts], style, marker="o", label=f"{s}, {ranks} ranks")
            lat.plot(xs, [p[1][1] for p in pts], style, marker="o", label=f"{s}, {ranks} ranks")
    for ax, label in ((bw, "busbw (GB/s) = algbw·2(n−1)/n"), (lat, "time per allreduce (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    lat.set_yscale("log")
    bw.legend(fontsize=7)
    fig.suptitle("allreduce on one machine: tandem tcp / shm / hierarchical vs OpenMPI tcp / shm")
    fig.tight_layout()
    fig.savefig(out / "allreduce.png", dpi=110)
    print(f"wrote {out / 'allreduce.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
