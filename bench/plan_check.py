#!/usr/bin/env python3
"""Checks `tandem plan` against measurement (called by bench/cluster.sh for each link preset).

Usage: plan_check.py TANDEM MANIFEST LINK NODES OUTDIR [--node NAME=ADDR ...]

Asks `tandem plan -o json` for every candidate shape of MANIFEST on NODES nodes at LINK, then runs
each shape (the manifest with its algorithm, parameterServers and workers lines replaced; STEPS
steps, default 120) with `tandem train --node …`, and measures its steady samples/s from the
progress lines (the second half of the run, so start-up and the final evaluation are left out).
Writes OUTDIR/plan.jsonl and OUTDIR/plan.md: per shape the predicted and measured step time, the
error, both rankings, and whether the plan's pick is within 10% of the best measured shape.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


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
    """Steady samples/s of one run: progress samples over wall time in the run's second half."""
    text = re.sub(r"^( *)steps: *\d+", lambda m: f"{m.group(1)}steps: {steps}", Path(manifest).read_text(), flags=re.M)
    text = re.sub(r"^( *)epochs:.*\n", "", text, flags=re.M)
    Path(manifest).write_text(text)
    points = []
    cmd = [tandem, "train", "--output", "json", "-f", manifest, "--output-dir", out, "--data-dir", "data", *node_args]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(f"{out}.log", "w"), text=True) as p:
        for line in p.stdout:
            if line.startswith("{"):
                e = json.loads(line)
                if e.get("event") == "progress":
                    points.append((time.monotonic(), e["samples"]))
    if p.returncode != 0 or len(points) < 4:
        return None
    half = points[len(points) // 2:]
    (t0, s0), (t1, s1) = half[0], half[-1]
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
    rows = []
    for s in shapes:
        tag = f"{s['ps']}ps-{s['groups']}x{s['group_size']}-{s['algorithm']}"
        m = out / "plan" / f"{tag}.yaml"
        m.write_text(shaped(base, s))
        run = out / "plan" / tag
        subprocess.run(["rm", "-rf", str(run)], check=True)
        print(f"   {link}: {tag}", file=sys.stderr)
        sps = measure(tandem, str(m), str(run), node_args, steps)
        batch = s["samples_per_s"] * s["step_s"]  # samples of one step of the whole job
        rows.append(dict(s, tag=tag, measured_sps=sps, measured_step_s=(batch / sps if sps else None)))
    with open(out / "plan.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    measured = [r for r in rows if r["measured_sps"]]
    by_measured = sorted(measured, key=lambda r: -r["measured_sps"])
    rank = {r["tag"]: i + 1 for i, r in enumerate(by_measured)}
    lines = [f"links at {link}, {nodes} nodes",
             "", "| shape | predicted step ms | measured step ms | error | predicted rank | measured rank |",
             "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        m = r["measured_step_s"]
        err = f"{(r['step_s'] - m) / m * 100:+.0f}%" if m else "–"
        lines.append(f"| {r['tag']} | {r['step_s'] * 1e3:.2f} | {m * 1e3:.2f} | {err} | {i + 1} | {rank.get(r['tag'], '–')} |"
                     if m else f"| {r['tag']} | {r['step_s'] * 1e3:.2f} | failed | – | {i + 1} | – |")
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
