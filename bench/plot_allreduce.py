#!/usr/bin/env python3
"""Table and plot of allreduce benchmark records (one JSON object per line, as written by
bench/allreduce.sh: the fields of `tandem bench allreduce --output json` plus "series").

Usage: plot_allreduce.py RESULTS.jsonl OUTDIR  ->  OUTDIR/table.md, OUTDIR/allreduce.png
The table puts every series side by side per (ranks, bytes) with the ratio of the first series
(tandem-tcp) to each other one. Reusable for any JSONL with series/ranks/bytes/busbw_gbps/latency_us.
"""
import json
import sys
from collections import defaultdict
from pathlib import Path

from benchplot import pyplot, write_table


def human(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def main():
    results, out = Path(sys.argv[1]), Path(sys.argv[2])
    records = [json.loads(l) for l in results.read_text().splitlines() if l.startswith("{")]
    series = list(dict.fromkeys(r["series"] for r in records))
    by = defaultdict(dict)
    for r in records:
        by[(r["ranks"], r["bytes"])][r["series"]] = r
    base = series[0]
    head = ["ranks", "bytes"]
    for s in series:
        head += [f"{s} busbw GB/s", f"{s} µs"]
    for s in series[1:]:
        head += [f"{base}/{s} busbw"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (ranks, size) in sorted(by):
        row = by[(ranks, size)]
        cells = [str(ranks), human(size)]
        for s in series:
            r = row.get(s)
            cells += [f"{r['busbw_gbps']:.3f}", f"{r['latency_us']:.1f}"] if r else ["–", "–"]
        for s in series[1:]:
            a, b = row.get(base), row.get(s)
            cells.append(f"{a['busbw_gbps'] / b['busbw_gbps']:.2f}×" if a and b and b["busbw_gbps"] > 0 else "–")
        lines.append("| " + " | ".join(cells) + " |")
    write_table(out, "\n".join(lines) + "\n")
    plt = pyplot("plot_allreduce.py")
    if plt is None:
        return
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 5))
    for s in series:
        for ranks in sorted({r["ranks"] for r in records}):
            pts = sorted((r["bytes"], r) for r in records if r["series"] == s and r["ranks"] == ranks)
            if not pts:
                continue
            xs = [p[0] for p in pts]
            style = "-" if ranks == max(r["ranks"] for r in records) else "--"
            bw.plot(xs, [p[1]["busbw_gbps"] for p in pts], style, marker="o", label=f"{s}, {ranks} ranks")
            lat.plot(xs, [p[1]["latency_us"] for p in pts], style, marker="o", label=f"{s}, {ranks} ranks")
    for ax, label in ((bw, "busbw (GB/s) = algbw·2(n−1)/n"), (lat, "time per allreduce (µs)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    lat.set_yscale("log")
    bw.legend(fontsize=8)
    fig.suptitle("allreduce on one machine (loopback): tandem tcp vs OpenMPI")
    fig.tight_layout()
    fig.savefig(out / "allreduce.png", dpi=110)
    print(f"wrote {out / 'allreduce.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
