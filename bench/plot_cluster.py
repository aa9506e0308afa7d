#!/usr/bin/env python3
"""Table and plot of the cluster-in-a-box benchmark (bench/cluster.sh).

Usage: plot_cluster.py OUTDIR TARGET LINK...  ->  OUTDIR/table.md, OUTDIR/cluster.png, OUTDIR/cluster.svg

OUTDIR/<link>/ holds bench/tta.sh's results for one link rate with the MLP, OUTDIR/<link>/tta-<model>/
those of each other model (with their own targets). Per algorithm and link: samples/s over
the whole job (an epoch's time is the data set over it), the epoch speed-up over the default PS
(ps-sync; MXNET-MPI reports 6× for its MPI algorithms), and time to TARGET test accuracy with its
ratio to MPI-ESGD's (MXNET-MPI: MPI-ESGD converges more than 2× faster than the other methods); for
each other model, time and samples to its target with the ratio to MPI-ESGD's.
"""
import re
import statistics
import sys
from pathlib import Path

from benchplot import pyplot, write_table
from plot_tta import MODEL_NAMES, ORDER, curve, first_at, load, manifest


def summarise(out, target):
    """{algorithm: {"sps", "tta", "points"}} of one link's runs (medians over rounds)."""
    if not (out / "results.jsonl").exists():
        return {}
    runs = load(out / "results.jsonl")
    rows = {}
    for a in sorted({a for a, _ in runs}, key=lambda a: ORDER.index(a) if a in ORDER else 99):
        batch, size = manifest(out, a)
        sps, tta, samples, points = [], [], [], None
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
                samples.append(hit[1])
        rows[a] = {
            "sps": statistics.median(sps) if sps else None,
            "tta": statistics.median(tta) if tta else None,
            "samples": statistics.median(samples) if samples else None,
            "points": points or [],
        }
    return rows


def target_of(out, default):
    """The target accuracy bench/tta.sh recorded in OUT/machine.txt."""
    found = re.search(r"target test accuracy ([0-9.]+)", (out / "machine.txt").read_text()) \
        if (out / "machine.txt").exists() else None
    return float(found.group(1)) if found else default


def model_table(out, model, links, default_target):
    """The time-to-accuracy table of `model` (OUT/<link>/tta-<model>/) and its target and rows per link."""
    dirs = {link: out / link / f"tta-{model}" for link in links}
    target = next((target_of(d, default_target) for d in dirs.values() if d.exists()), default_target)
    table = {link: summarise(d, target) for link, d in dirs.items()}
    algorithms = [a for a in ORDER if any(a in rows for rows in table.values())]
    head = ["algorithm"]
    for link in links:
        head += [f"{link} s to {target:.2f}", "samples", "÷ easgd"]
    lines = [f"Time to {target:.2f} test accuracy, {MODEL_NAMES.get(model, model)} on MNIST-5k (each run stopped "
             "at the target or at its time limit: 'not reached')", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in algorithms:
        cells = [a]
        for link in links:
            r, easgd = table[link].get(a, {}), table[link].get("easgd", {})
            tta = r.get("tta")
            vs_easgd = tta / easgd["tta"] if tta and easgd.get("tta") else None
            cells += [f"{tta:.1f}" if tta is not None else ("not reached" if r else "–"),
                      f"{r['samples']:.0f}" if r.get("samples") is not None else "–",
                      f"{vs_easgd:.2f}×" if vs_easgd else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines, target, table


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
    models = sorted({d.name.removeprefix("tta-") for link in links for d in (out / link).glob("tta-*")})
    panels = [("mlp", target, table)]
    for m in models:
        lines_m, target_m, table_m = model_table(out, m, links, target)
        notes += [""] + lines_m
        panels.append((m, target_m, table_m))
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
    fig, axes = plt.subplots(len(panels), len(links), figsize=(5.5 * len(links), 4.2 * len(panels)), squeeze=False)
    for row, (model, target_m, table_m) in zip(axes, panels):
        for ax, link in zip(row, links):
            for a in ORDER:
                pts = table_m[link].get(a, {}).get("points", [])
                if pts:
                    ax.plot([p[0] for p in pts], [p[2] for p in pts], label=a, lw=1.2)
            ax.axhline(target_m, color="grey", ls="--", lw=0.8)
            ax.set_title(f"{MODEL_NAMES.get(model, model)}, links at {link}", fontsize=10)
            ax.set_xlabel("wall time since launch (s)")
            ax.set_ylabel("test accuracy")
            ax.set_ylim(max(0.0, target_m - 0.3), 1.0)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle("Cluster in a box: one process per node, rate-limited links, MNIST-5k, 4 worker processes")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"cluster.{ext}", dpi=120)
    print(f"figures: {out / 'cluster.png'} {out / 'cluster.svg'}")


if __name__ == "__main__":
    main()
