#!/usr/bin/env python3
"""Table and plot of the cluster-in-a-box benchmark (bench/cluster.sh).

Usage: plot_cluster.py OUTDIR TARGET LINK...  ->  OUTDIR/table.md, OUTDIR/cluster.png, OUTDIR/cluster.svg

OUTDIR/<link>/ holds bench/tta.sh's results for one link rate. Per algorithm and link: samples/s over
the whole job (an epoch's time is the data set over it), the epoch speed-up over the default PS
(ps-sync; MXNET-MPI reports 6× for its MPI algorithms), and time to TARGET test accuracy with its
ratio to MPI-ESGD's (MXNET-MPI: MPI-ESGD converges more than 2× faster than the other methods).
"""
import statistics
import sys
from pathlib import Path

from benchplot import pyplot, write_table
from plot_tta import ORDER, curve, first_at, load, manifest


def summarise(out, target):
    """{algorithm: {"sps", "tta", "points"}} of one link's runs (medians over rounds)."""
    if not (out / "results.jsonl").exists():
        return {}
    runs = load(out / "results.jsonl")
    rows = {}
    for a in sorted({a for a, _ in runs}, key=lambda a: ORDER.index(a) if a in ORDER else 99):
        batch, size = manifest(out, a)
        sps, tta, points = [], [], None
        for (alg, _), records in sorted(runs.items()):
            if alg != a:
                continue
            pts, finished = curve(records, batch, size)
            points = points or pts
            if finished:
                sps.append(finished["samples_per_second"])
            hit = first_at(pts, target)
            if hit:
                tta.append(hit[0])
        rows[a] = {
            "sps": statistics.median(sps) if sps else None,
            "tta": statistics.median(tta) if tta else None,
            "points": points or [],
        }
    return rows


def main():
    out, target, links = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    table = {link: summarise(out / link, target) for link in links}
    algorithms = [a for a in ORDER if any(a in rows for rows in table.values())]
    head = ["algorithm"]
    for link in links:
        head += [f"{link} samples/s", "epoch ×ps-sync", f"s to {target:.2f}", "÷ easgd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(x, spec):
        return format(x, spec) if x is not None else "–"

    for a in algorithms:
        cells = [a]
        for link in links:
            r, base, easgd = table[link].get(a, {}), table[link].get("ps-sync", {}), table[link].get("easgd", {})
            sps, tta = r.get("sps"), r.get("tta")
            speedup = sps / base["sps"] if sps and base.get("sps") else None
            vs_easgd = tta / easgd["tta"] if tta and easgd.get("tta") else None
            cells += [fmt(sps, ".0f"), fmt(speedup, ".2f") + ("×" if speedup else ""),
                      fmt(tta, ".1f") if tta is not None else "not reached",
                      fmt(vs_easgd, ".2f") + ("×" if vs_easgd else "")]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [
        "",
        "Papers: MXNET-MPI reports epochs 6× faster than the default PS (here: the 'epoch ×ps-sync' column, "
        "samples/s over ps-sync's) and MPI-ESGD converging more than 2× faster than the other methods "
        "(here: '÷ easgd', each algorithm's time to the target over MPI-ESGD's; > 2 means the claim holds "
        "against it).",
    ]
    for link in links:
        epochs = out / link / "epochs.md"
        if epochs.exists():
            notes += ["", epochs.read_text()]
    for link in links:
        plan = out / link / "plan.md"
        if plan.exists():
            notes += ["", "`tandem plan` against measurement, " + plan.read_text()]
    write_table(out, "\n".join(lines + notes) + "\n")
    plt = pyplot("plot_cluster.py")
    if plt is None:
        return
    fig, axes = plt.subplots(1, len(links), figsize=(5.5 * len(links), 4.5), squeeze=False)
    for ax, link in zip(axes[0], links):
        for a in algorithms:
            pts = table[link].get(a, {}).get("points", [])
            if pts:
                ax.plot([p[0] for p in pts], [p[2] for p in pts], label=a, lw=1.2)
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_title(f"links at {link}")
        ax.set_xlabel("wall time since launch (s)")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(max(0.0, target - 0.3), 1.0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Cluster in a box: one process per node, rate-limited links (MNIST-5k, MLP [256, 128])")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"cluster.{ext}", dpi=120)
    print(f"figures: {out / 'cluster.png'} {out / 'cluster.svg'}")


if __name__ == "__main__":
    main()
