#!/usr/bin/env python3
"""Epoch time of every algorithm for several models (called by bench/cluster.sh for each link preset).

Usage: epochs.py TANDEM LINK OUTDIR [--node NAME=ADDR ...]

MXNET-MPI's claim is about epoch time (epochs 6x faster than the default parameter server), and the
papers make it for large models, whose gradients the links struggle to carry. For each model of
MODELS (default "mlp resnet20 vgg-dense") and each algorithm of EPOCH_ALGOS (else ALGOS, else
bench/manifests.py's ALGORITHMS; the ratios need ps-sync among them), this runs the algorithm's manifest (bench/manifests.py: the same processes, shape,
optimizer and batch as bench/tta.sh) with the model and its data set put in, for the model's number of steps, with
`tandem train --node …`, and measures its steady samples/s from the progress lines (start-up and
the final evaluation left out; bench/plan_check.py's measure). An epoch takes the data set's training samples over
that rate, so the ratio of two algorithms' epoch times is the inverse ratio of their samples/s.
EPOCH_ROUNDS (default 1) rounds, the runs in turn within each round; a figure is the median.

The models (bench/manifests.py): the MLP on MNIST-5k; ResNet-20 and VGG-A's two dense layers of 4096
on Fashion-MNIST (its 60,000 training images make an epoch).

Writes OUTDIR/epochs.jsonl and OUTDIR/epochs.md.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifests import ALGORITHMS, manifest  # noqa: E402
from plan_check import measure  # noqa: E402

# model (bench/manifests.py's MODELS) -> (data line, training samples per epoch, steps per run)
MODELS = {
    "mlp": ("{source: mnist5k, batchSize: 32}", 4000, 120),
    "resnet20": ("{source: fashion-mnist, batchSize: 32}", 60000, 50),
    "vgg-dense": ("{source: fashion-mnist, batchSize: 32}", 60000, 40),
}


def main():
    tandem, link, out = sys.argv[1:4]
    node_args = sys.argv[4:]
    models = os.environ.get("MODELS", "mlp resnet20 vgg-dense").split()
    algos = os.environ.get("EPOCH_ALGOS") or os.environ.get("ALGOS") or " ".join(ALGORITHMS)
    algos = algos.split()
    rounds = int(os.environ.get("EPOCH_ROUNDS", "1"))
    out = Path(out)
    (out / "epochs").mkdir(parents=True, exist_ok=True)
    runs = {(m, a): [] for m in models for a in algos}
    for r in range(rounds):
        for m in models:
            for a in algos:
                tag = f"{m}-{a}"
                path = out / "epochs" / f"{tag}.yaml"
                data, _, steps = MODELS[m]
                path.write_text(manifest(a, model=m, data=data, steps=steps))
                run = out / "epochs" / tag
                subprocess.run(["rm", "-rf", str(run)], check=True)
                print(f"   {link}: epochs round {r + 1}/{rounds} {tag}", file=sys.stderr)
                sps = measure(tandem, str(path), str(run), node_args, steps)
                if sps:
                    runs[(m, a)].append(sps)
    rows = []
    for m in models:
        base = runs[(m, "ps-sync")]
        base_sps = statistics.median(base) if base else None
        for a in algos:
            got = runs[(m, a)]
            sps = statistics.median(got) if got else None
            rows.append(dict(model=m, algorithm=a, link=link, samples_per_s=sps, rounds_sps=sorted(got),
                             epoch_s=(MODELS[m][1] / sps if sps else None),
                             vs_ps_sync=(sps / base_sps if sps and base_sps else None)))
    with open(out / "epochs.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    head = "| algorithm | " + " | ".join(f"{m} samples/s | {m} epoch s | {m} epoch ×ps-sync" for m in models) + " |"
    lines = [f"Epoch time at {link} (median of {rounds} round(s); 'epoch ×ps-sync': how many times faster an "
             "epoch is than ps-sync's, MXNET-MPI's 6× claim)", "", head,
             "|---|" + "---|" * (3 * len(models))]
    for a in algos:
        cells = []
        for m in models:
            row = next(x for x in rows if x["model"] == m and x["algorithm"] == a)
            if row["samples_per_s"]:
                ratio = f"{row['vs_ps_sync']:.2f}×" if row["vs_ps_sync"] else "–"
                cells += [f"{row['samples_per_s']:.0f}", f"{row['epoch_s']:.1f}", ratio]
            else:
                cells += ["failed", "–", "–"]
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    (out / "epochs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
