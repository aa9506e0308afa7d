#!/usr/bin/env python3
"""Table and plot of the time-to-accuracy benchmark (bench/tta.sh).

Usage: plot_tta.py RESULTS.jsonl OUTDIR [TARGET] [MODEL]  ->  OUTDIR/table.md, OUTDIR/tta.png, OUTDIR/tta.svg

Each record is {"algorithm", "round", "t0", "t", "line"}: one `tandem train --output json` line
and its wall time. A progress line carries the reporting group's test accuracy at its own step
(`group_step`); the samples so far are the sum over groups of their latest step times the batch and
the group size (or the line's `samples`, when the runner gives it). Time to TARGET is the first
report at or above it, measured from the launch of `tandem train` (process start-up included). A run
stopped at the target or at its time limit (bench/tta_run.py) has no final accuracy.
"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from benchplot import pyplot, write_table

ORDER = ["ps-sync", "ps-async", "hybrid", "hybrid-4", "easgd", "allreduce"]

# MODEL (bench/manifests.py's names) -> how the plots name it
MODEL_NAMES = {"mlp": "MLP [256, 128]", "resnet20": "ResNet-20", "vgg-dense": "VGG-A's dense layers [4096, 4096]"}


def load(path):
    runs = defaultdict(list)  # (algorithm, round) -> records
    for text in Path(path).read_text().splitlines():
        if text.startswith("{"):
            r = json.loads(text)
            runs[(r["algorithm"], r["round"])].append(r)
    return runs


def manifest(out, algorithm):
    """(batch, group size) from the manifest the run used (flow-style YAML, read without a parser)."""
    batch, size = 32, 1
    text = (Path(out) / "manifests" / f"mnist-{algorithm}.yaml").read_text()
    for line in text.splitlines():
        if "batchSize:" in line:
            batch = int(line.split("batchSize:")[1].split(",")[0].split("}")[0])
        if "groupSize:" in line:
            size = int(line.split("groupSize:")[1].split(",")[0].split("}")[0])
    return batch, size


def curve(records, batch, size):
    """[(seconds, samples, accuracy)] of every progress report, and the finished line."""
    points, steps, finished = [], {}, None
    for r in records:
        line, t = r["line"], r["t"] - r["t0"]
        if line.get("event") == "progress":
            steps[line["group"]] = line["group_step"]
            samples = line.get("samples") or sum(steps.values()) * batch * size
            if line.get("accuracy") is not None:
                points.append((t, samples, line["accuracy"]))
        elif line.get("event") == "finished":
            finished = dict(line, t=t)
    return points, finished


def first_at(points, target):
    return next(((t, s) for t, s, a in points if a >= target), None)


def main():
    results, out = sys.argv[1], Path(sys.argv[2])
    target = float(sys.argv[3]) if len(sys.argv) > 3 else 0.90
    model = MODEL_NAMES.get(sys.argv[4], sys.argv[4]) if len(sys.argv) > 4 else MODEL_NAMES["mlp"]
    runs = load(results)
    algorithms = sorted({a for a, _ in runs}, key=lambda a: ORDER.index(a) if a in ORDER else 99)
    rows, curves = {}, {}
    for a in algorithms:
        batch, size = manifest(out, a)
        hits, finals, walls = [], [], []
        for (alg, rnd), records in sorted(runs.items()):
            if alg != a:
                continue
            points, finished = curve(records, batch, size)
            curves.setdefault(a, points)  # the first round is plotted
            hit = first_at(points, target)
            if hit:
                hits.append(hit)
            if finished:
                finals.append(finished["test_accuracy"])
                walls.append(finished["wall_seconds"])
        rows[a] = {
            "seconds": statistics.median(h[0] for h in hits) if hits else None,
            "samples": statistics.median(h[1] for h in hits) if hits else None,
            "reached": f"{len(hits)}/{len([r for r in runs if r[0] == a])}",
            "final": statistics.median(finals) if finals else None,
            "wall": statistics.median(walls) if walls else None,
        }
    timed = {a: r for a, r in rows.items() if r["seconds"] is not None}
    fastest = min(timed, key=lambda a: timed[a]["seconds"]) if timed else None
    base = rows.get("ps-sync", {}).get("seconds")

    def ratio(x, y):
        return f"{x / y:.2f}×" if x and y else "–"

    head = ["algorithm", f"s to {target:.2f}", f"samples to {target:.2f}", "reached",
            f"÷ fastest ({fastest})", "÷ ps-sync", "final acc", "job wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a, r in rows.items():
        lines.append("| " + " | ".join([
            a,
            f"{r['seconds']:.1f}" if r["seconds"] is not None else "not reached",
            f"{r['samples']:.0f}" if r["samples"] is not None else "–",
            r["reached"],
            ratio(r["seconds"], timed[fastest]["seconds"] if fastest else None),
            ratio(r["seconds"], base),
            f"{r['final']:.4f}" if r["final"] is not None else "–",
            f"{r['wall']:.1f}" if r["wall"] is not None else "–",
        ]) + " |")
    claim = "MXNET-MPI claim: MPI-ESGD converges more than 2× faster than the other methods."
    e = rows.get("easgd", {}).get("seconds")
    others = {a: r["seconds"] for a, r in timed.items() if a != "easgd"}
    if e and others:
        best_other = min(others, key=others.get)
        speedups = ", ".join(f"{others[a] / e:.2f}× vs {a}" for a in others)
        verdict = "holds" if all(v / e > 2 for v in others.values()) else "does not hold"
        claim += (f"\nHere: easgd reaches {target:.2f} in {e:.1f} s; {speedups} "
                  f"(best other: {best_other}). The claim {verdict} on this setup.")
    write_table(out, "\n".join(lines) + "\n\n" + claim + "\n")
    plt = pyplot("plot_tta.py")
    if plt is None:
        return
    fig, (by_time, by_samples) = plt.subplots(1, 2, figsize=(13, 5))
    for a in algorithms:
        pts = curves.get(a, [])
        if not pts:
            continue
        (line,) = by_time.plot([p[0] for p in pts], [p[2] for p in pts], label=a, lw=1.2)
        by_samples.plot([p[1] for p in pts], [p[2] for p in pts], label=a, lw=1.2, color=line.get_color())
        hit = first_at(pts, target)
        if hit:
            by_time.plot([hit[0]], [target], "o", color=line.get_color())
            by_samples.plot([hit[1]], [target], "o", color=line.get_color())
    for ax, xlabel in ((by_time, "wall time since launch (s)"), (by_samples, "training samples (all workers)")):
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (reporting group)")
        ax.set_ylim(max(0.0, target - 0.3), 1.0)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(f"MNIST-5k, {model}, 4 worker processes, batch 32 each: time to {target:.2f}")
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"tta.{ext}", dpi=120)
    print(f"figures: {out / 'tta.png'} {out / 'tta.svg'}")


if __name__ == "__main__":
    main()
