"""bench-torch: one PyTorch training step, 4 worker processes, four ways, side by side in one run.

  ddp            torch.distributed DDP over gloo, one group of 4 (the anchor)
  tandem-ar      tandem.torch, algorithm allreduce, one group of 4
  tandem-hybrid  tandem.torch, algorithm hybrid (sync), 2 PS shards + 2 groups of 2
  tandem-ps      tandem.torch, algorithm ps-sync, 2 PS shards + 4 groups of 1 (pure PS)

Each runs bench/torch/step.py under `tandem train` (the release binary) with `python3` from the
venv that holds PyTorch and the tandem wheel; rounds alternate the four, and the table gives
each one's median samples/s, its ratio to DDP, and the median time of the optimizer's step
(where tandem.torch communicates). Prints the CPU model; figures go to out/bench/torch.json.

With --node NAME=ADDR (as bench/cluster.sh gives them; TORCH=1 there runs this at each link preset)
every PS replica and rank runs on its own network-namespace node, so the gradients and weights
cross rate-limited links instead of loopback.

  python3 bench/torch/run.py [--rounds 3] [--steps 80] [--hidden 1024] [--batch 64]
                             [--node NAME=ADDR ...] [--link LABEL] [--out FILE]
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFIGS = {
    "ddp": ("allreduce", 0, 1, 4, "ddp", ""),
    "tandem-ar": ("allreduce", 0, 1, 4, "tandem", ""),
    "tandem-hybrid": (
        "hybrid",
        2,
        2,
        2,
        "tandem",
        "    staleness: 0\n    optimizer: {kind: sgd, learningRate: 0.01, momentum: 0.9}\n",
    ),
    "tandem-ps": (
        "ps-sync",
        2,
        4,
        1,
        "tandem",
        "    optimizer: {kind: sgd, learningRate: 0.01, momentum: 0.9}\n",
    ),
}

JOB = """\
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata:
  name: bench-{name}
spec:
  training:
    algorithm: {algorithm}
    steps: {steps}
{settings}  parameterServers:
    replicas: {ps}
  workers:
    groups: {groups}
    groupSize: {size}
    command: [python3, step.py, {backend}]
    env:
      - {{name: BENCH_OUT, value: "{out}"}}
      - {{name: BENCH_HIDDEN, value: "{hidden}"}}
      - {{name: BENCH_BATCH, value: "{batch}"}}
      - {{name: OMP_NUM_THREADS, value: "1"}}
"""


def cpu_model():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def run_once(name, args, work, tandem, python_bin):
    algorithm, ps, groups, size, backend, settings = CONFIGS[name]
    folder = work / name
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "results").mkdir(parents=True)
    shutil.copy(REPO / "bench/torch/step.py", folder / "step.py")
    (folder / "job.yaml").write_text(
        JOB.format(
            name=name,
            algorithm=algorithm,
            steps=args.steps,
            settings=settings,
            ps=ps,
            groups=groups,
            size=size,
            backend=backend,
            out=folder / "results",
            hidden=args.hidden,
            batch=args.batch,
        )
    )
    env = dict(os.environ, PATH=f"{python_bin.parent}:{os.environ['PATH']}")
    done = subprocess.run(
        [tandem, "train", "-f", folder / "job.yaml", "--output-dir", folder / "out"]
        + [a for node in args.node for a in ("--node", node)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        sys.exit(
            f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}\nlogs in {folder / 'out/logs'}"
        )
    groups_done = [json.loads(p.read_text()) for p in sorted((folder / "results").glob("group-*.json"))]
    if len(groups_done) != groups:
        sys.exit(f"{name}: {len(groups_done)} of {groups} groups wrote results")
    return {
        "samples_per_s": sum(g["samples_per_s"] for g in groups_done),
        "optimizer_step_s": statistics.mean(g["optimizer_step_s"] for g in groups_done),
        "params": groups_done[0]["params"],
    }


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tandem", default=str(REPO / "target/release/tandem"))
    parser.add_argument("--python", default=str(Path.home() / ".cache/tandem/python-venv/bin/python3"))
    parser.add_argument("--node", action="append", default=[], help="NAME=ADDR, passed to tandem train")
    parser.add_argument("--link", default="loopback", help="what the processes talk over, for the table")
    parser.add_argument("--out", default=str(REPO / "out/bench/torch.json"))
    args = parser.parse_args()
    work = Path(args.out).resolve().parent / "torch-runs"
    work.mkdir(parents=True, exist_ok=True)
    runs = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name in CONFIGS:
            got = run_once(name, args, work, args.tandem, Path(args.python))
            runs[name].append(got)
            print(
                f"round {round_ + 1}/{args.rounds} {name}: {got['samples_per_s']:.0f} samples/s",
                file=sys.stderr,
            )
    cpu = cpu_model()
    params = runs["ddp"][0]["params"]
    print(
        f"bench-torch: MLP of {params} parameters, batch {args.batch} per rank, 4 worker processes, "
        f"median of {args.rounds} rounds, over {args.link}; CPU: {cpu}, {os.cpu_count()} cores"
    )
    print(f"{'setup':<15} {'samples/s':>10} {'vs DDP':>7} {'optimizer step':>15}")
    anchor = statistics.median(r["samples_per_s"] for r in runs["ddp"])
    table = {}
    for name, got in runs.items():
        rate = statistics.median(r["samples_per_s"] for r in got)
        step = statistics.median(r["optimizer_step_s"] for r in got)
        table[name] = {"samples_per_s": rate, "vs_ddp": rate / anchor, "optimizer_step_ms": step * 1e3}
        print(f"{name:<15} {rate:>10.0f} {rate / anchor:>6.2f}x {step * 1e3:>12.2f} ms")
    hybrid, pure = table["tandem-hybrid"]["samples_per_s"], table["tandem-ps"]["samples_per_s"]
    print(f"hybrid / pure PS: {hybrid / pure:.2f}x")
    Path(args.out).write_text(
        json.dumps(
            {"cpu": cpu, "link": args.link, "params": params, "args": vars(args), "table": table}, indent=1
        )
    )


if __name__ == "__main__":
    main()
