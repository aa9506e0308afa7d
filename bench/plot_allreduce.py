#!/usr/bin/env python3
"""Table and plot of allreduce benchmark records (one JSON object per line, as written by
bench/allreduce.sh: the fields of `tandem bench allreduce --output json` plus "series").

Usage: plot_allreduce.py RESULTS.jsonl OUTDIR  ->  OUTDIR/table.md, OUTDIR/allreduce.svg (always,
drawn without dependencies) and OUTDIR/allreduce.png (when matplotlib is installed)
The table puts every series side by side per (ranks, bytes): busbw, time and the fraction of one
core's memcpy bandwidth (measured in the same run), then the ratios of each Tandem series to its
OpenMPI counterpart (tcp to tcp, shm and hier to shm). With several rounds of the same series the
median of each figure is shown. Reusable for any JSONL with series/ranks/bytes/busbw_gbps/latency_us.
"""
import json
import math
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

COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def svg_plot(path, cell, series, all_ranks):
    """busbw against message size, one line per (series, ranks), log-log, as plain SVG."""
    pts = {(s, n): sorted((k[1], v[0]) for (k, name), v in cell.items() if name == s and k[0] == n and v[0])
           for s in series for n in all_ranks}
    pts = {k: v for k, v in pts.items() if v}
    if not pts:
        return
    xs = [x for v in pts.values() for x, _ in v]
    ys = [y for v in pts.values() for _, y in v]
    x0, x1 = math.log2(min(xs)), math.log2(max(xs)) + 1e-9
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)) + 1e-9)
    W, H, L, R, T, B = 900, 520, 70, 260, 40, 50
    px = lambda x: L + (math.log2(x) - x0) / max(x1 - x0, 1e-9) * (W - L - R)
    py = lambda y: H - B - (math.log10(y) - y0) / max(y1 - y0, 1e-9) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{L}" y="22" font-size="14">allreduce busbw (GB/s, log) against message size: '
           f'Tandem vs OpenMPI, same run</text>']
    for e in range(y0, y1 + 1):
        y = py(10 ** e)
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                   f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{10 ** e:g}</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 18}" text-anchor="middle">{human(x).replace(" ", "")}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">message size</text>')
    for i, ((s, n), v) in enumerate(sorted(pts.items())):
        colour = COLOURS[series.index(s) % len(COLOURS)]
        dash = "" if n == max(all_ranks) else ' stroke-dasharray="6,4"'
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in v)
        out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in v]
        ly = T + 16 * i
        out.append(f'<line x1="{W - R + 15}" x2="{W - R + 45}" y1="{ly}" y2="{ly}" stroke="{colour}" '
                   f'stroke-width="2"{dash}/><text x="{W - R + 50}" y="{ly + 4}">{s}, {n} ranks</text>')
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")
    print(f"wrote {path}", file=sys.stderr)


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
    all_ranks = sorted({r["ranks"] for r in records})
    svg_plot(out / "allreduce.svg", cell, series, all_ranks)
    plt = pyplot("plot_allreduce.py")
    if plt is None:
        return
    fig, (bw, lat) = plt.subplots(1, 2, figsize=(13, 5))
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
