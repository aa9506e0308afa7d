#!/usr/bin/env python3
"""Checks `tandem plan` against measurement (called by bench/cluster.sh for each link preset).

Usage: plan_check.py TANDEM MANIFEST LINK NODES OUTDIR [--node NAME=ADDR ...]

Asks `tandem plan -o json` for every candidate shape of MANIFEST on NODES nodes at LINK, then runs
each shape (the manifest with its algorithm, parameterServers and workers lines replaced; STEPS
steps, default 120) with `tandem train --node …`, and measures its steady samples/s from the
progress lines (from the second line to the one before the final step, so start-up and the final
evaluation are left out).
PLAN_ROUNDS (default 3) rounds, the shapes in turn within each round so that a slow spell of the machine
falls on all of them; a shape's figure is the median of its rounds, and the table shows their range.
Writes OUTDIR/plan.jsonl and OUTDIR/plan.md: per shape the predicted and measured step time, the
error, both rankings, and whether the plan's pick is within 10% of the best measured shape.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manifests import with_eval, with_steps  # noqa: E402

# Steps between a worker group's progress lines (trainer/src/worker/mod.rs, PROGRESS_EVERY).
PROGRESS_EVERY = 10


def shaped(text, shape):
    """The manifest with the shape's algorithm, PS replicas and workers (flow-style lines)."""
    indent = lambda m: m.group(1)
    text = re.sub(r"^( *)algorithm: *\S+", lambda m: f"{indent(m)}algorithm: {shape['algorithm']}", text, flags=re.M)
    ps = f"parameterServers: {{replicas: {shape['ps']}}}"
    if re.search(r"^ *parameterServers:", text, flags=re.M):
        text = re.sub(r"^( *)parameterServers:.*$", lambda m: indent(m) + ps, text, flags=re.M)
    else:
        text = re.sub(r"^( *)workers:", lambda m: f"{indent(m)}{ps}\n{indent(m)}workers:", text, count=1, flags=re.M)
    g, n = shape["groups"], shape["group_size"]
    workers = f"workers: {{groups: {g}, groupSize: {n}, minGroups: 1, maxGroups: {g}, backend: tcp}}"
    text = re.sub(r"^( *)workers:.*$", lambda m: indent(m) + workers, text, flags=re.M)
    text = re.sub(r"^( *)staleness:.*\n", "", text, flags=re.M)
    return text


def measure(tandem, manifest, out, node_args, steps):
    """Steady samples/s of one run: progress samples over wall time, from the second progress line
    (start-up left out) to the last one before the final step (whose line comes after the final
    evaluation: the run is stopped there, so the evaluation is neither timed nor waited for)."""
    # Evaluated only at the end: a progress line repeats the last evaluation's accuracy, so with the
    # default cadence (every 100 steps) no line after the first evaluation could be told apart.
    Path(manifest).write_text(with_eval(with_steps(Path(manifest).read_text(), steps), 0))
    points, reached = [], False
    last = steps - PROGRESS_EVERY
    cmd = [tandem, "train", "--output", "json", "-f", manifest, "--output-dir", out, "--data-dir", "data", *node_args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{out}.log", "w"), text=True) as p:
        for line in p.stdout:
            if line.startswith("{"):
                e = json.loads(line)
                if e.get("event") == "progress" and e.get("accuracy") is None:
                    points.append((time.monotonic(), e["samples"]))
                    if e["step"] >= last:
                        reached = True
                        p.terminate()
                        break
        p.wait()
    # A run that ended before the last timed step failed: it is not measured.
    if not reached or len(points) < 3 or points[-1][1] == points[1][1]:
        return None
    (t0, s0), (t1, s1) = points[1], points[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 else None


def main():
    tandem, manifest, link, nodes, out = sys.argv[1:6]
    node_args = sys.argv[6:]
    steps = int(os.environ.get("STEPS", "120"))
    out = Path(out)
    (out / "plan").mkdir(parents=True, exist_ok=True)
    plan = subprocess.run([tandem, "plan", "-f", manifest, "--link", link, "--nodes", nodes, "-o", "json",
                           "--data-dir", "data"], check=True, capture_output=True, text=True)
    shapes = [json.loads(l) for l in plan.stdout.splitlines() if l.startswith("{")]
    base = Path(manifest).read_text()
    rounds = int(os.environ.get("PLAN_ROUNDS", "3"))
    tags = [f"{s['ps']}ps-{s['groups']}x{s['group_size']}-{s['algorithm']}" for s in shapes]
    for s, tag in zip(shapes, tags):
        (out / "plan" / f"{tag}.yaml").write_text(shaped(base, s))
    runs = {tag: [] for tag in tags}
    for r in range(rounds):
        for tag in tags:
            run = out / "plan" / tag
            subprocess.run(["rm", "-rf", str(run)], check=True)
            print(f"   {link}: round {r + 1}/{rounds} {tag}", file=sys.stderr)
            sps = measure(tandem, str(out / "plan" / f"{tag}.yaml"), str(run), node_args, steps)
            if sps:
                runs[tag].append(sps)
    rows = []
    for s, tag in zip(shapes, tags):
        got = sorted(runs[tag])
        sps = statistics.median(got) if got else None
        batch = s["samples_per_s"] * s["step_s"]  # samples of one step of the whole job
        rows.append(dict(s, tag=tag, measured_sps=sps, measured_step_s=(batch / sps if sps else None),
                         rounds_sps=got, failed_rounds=rounds - len(got)))
    with open(out / "plan.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    measured = [r for r in rows if r["measured_sps"]]
    by_measured = sorted(measured, key=lambda r: -r["measured_sps"])
    rank = {r["tag"]: i + 1 for i, r in enumerate(by_measured)}
    lines = [f"links at {link}, {nodes} nodes",
             "", f"median of {rounds} rounds a shape (samples/s: slowest and fastest round)", "",
             "| shape | predicted step ms | measured step ms | error | predicted rank | measured rank | samples/s (min–max) |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        m = r["measured_step_s"]
        err = f"{(r['step_s'] - m) / m * 100:+.0f}%" if m else "–"
        spread = f"{r['rounds_sps'][0]:.0f}–{r['rounds_sps'][-1]:.0f}" if r["rounds_sps"] else "–"
        if r["failed_rounds"]:
            spread += f" ({r['failed_rounds']} failed)"
        lines.append(f"| {r['tag']} | {r['step_s'] * 1e3:.2f} | {m * 1e3:.2f} | {err} | {i + 1} | {rank.get(r['tag'], '–')} | {spread} |"
                     if m else f"| {r['tag']} | {r['step_s'] * 1e3:.2f} | failed | – | {i + 1} | – | – |")
    if by_measured:
        pick = rows[0]
        best = by_measured[0]
        within = pick["measured_sps"] and pick["measured_sps"] >= 0.9 * best["measured_sps"]
        lines += ["", f"plan's pick {pick['tag']}: measured {pick['measured_sps'] or 0:.0f} samples/s; best measured "
                  f"{best['tag']}: {best['measured_sps']:.0f} samples/s — "
                  + ("within 10%" if within else "NOT within 10%")]
    (out / "plan.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
