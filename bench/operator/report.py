#!/usr/bin/env python3
"""Side-by-side table of the operator benchmark (bench/operator/run.sh), with ratios Tandem / MPI Operator.

Reads OUT/run-tandem.json and OUT/run-mpi.json (bench.py's records, where run.sh ran the operators) and
OUT/creates.json (creation with no operator running, where run.sh measured it), prints the tables, writes
OUT/operator.json (both records without the per-pod times, and the ratios) and, where matplotlib is there,
OUT/operator.png (pods existing and Running over time, and operator RSS, for both operators).

Usage: report.py OUT [--mpi-operator-version V] [--mpi-qps QPS/BURST]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchplot import pyplot  # noqa: E402  (bench/, one folder up)


def mib(b):
    return None if b is None else b / 2**20


def fmt(v, unit=""):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}{unit}" if abs(v) >= 10 else f"{v:.2f}{unit}"
    return f"{v}{unit}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mpi-operator-version", default="?")
    ap.add_argument("--mpi-qps", default="?")
    a = ap.parse_args()
    runs = {}
    for kind in ("tandem", "mpi"):
        p = os.path.join(a.out, f"run-{kind}.json")
        if os.path.exists(p):
            runs[kind] = json.load(open(p))
    creates_path = os.path.join(a.out, "creates.json")
    if not runs and not os.path.exists(creates_path):
        sys.exit(f"report.py: no run-*.json and no creates.json in {a.out}; did bench/operator/run.sh run?")

    rows = [
        ("jobs", lambda r: r["jobs"], ""),
        ("pods expected", lambda r: r["expected_pods"], ""),
        ("jobs created by the client (s)", lambda r: r["create_s"], ""),
        ("job create at the API server (ms)", lambda r: r.get("server_create_ms"), ""),
        ("CEL evaluation, all objects (s)", lambda r: r.get("cel_evaluation_s"), ""),
        ("all pods exist (s)", lambda r: r["all_pods_exist_s"], ""),
        ("all worker pods exist (s)", lambda r: r.get("all_workers_exist_s"), ""),
        ("all launcher pods exist (s)", lambda r: r.get("all_launchers_exist_s"), ""),
        ("all pods Running (s)", lambda r: r["all_pods_running_s"], ""),
        ("pods created / s", lambda r: r["expected_pods"] / r["all_pods_exist_s"] if r["all_pods_exist_s"] else None, ""),
        ("reconciles", lambda r: r["reconciles"], ""),
        ("reconciles / s", lambda r: r["reconciles_per_s"], ""),
        ("peak RSS (MiB)", lambda r: mib(r["peak_rss_bytes"]), ""),
        ("RSS before the jobs (MiB)", lambda r: mib(r["idle_rss_bytes"]), ""),
        ("operator CPU (s)", lambda r: r["cpu_s"], ""),
        ("API requests (all clients)", lambda r: r["apiserver_requests_total"], ""),
    ]
    ratios = {}
    if runs:
        t, m = runs.get("tandem"), runs.get("mpi")
        print(f"\nOperator benchmark: {next(iter(runs.values()))['jobs']} jobs on {next(iter(runs.values()))['nodes']} "
              f"kwok nodes (MPI Operator {a.mpi_operator_version}, rate limits (rate/burst) {a.mpi_qps})")
        print(f"{'':32} {'Tandem':>12} {'MPI Operator':>13} {'Tandem/MPI':>11}")
        for label, f, unit in rows:
            tv = f(t) if t else None
            mv = f(m) if m else None
            ratio = tv / mv if isinstance(tv, (int, float)) and isinstance(mv, (int, float)) and mv else None
            if ratio is not None:
                ratios[label] = ratio
            print(f"{label:32} {fmt(tv):>12} {fmt(mv):>13} {fmt(ratio, 'x'):>11}")
        for kind, r in runs.items():
            if not r["complete"]:
                print(f"NOTE: the {kind} run did not complete: {r['pods_seen']} pods seen, {r['pods_running']} Running")
            print(f"load average at the end of the {kind} run: {' '.join(r['loadavg'])}")
            top = list(r["apiserver_requests"].items())[:8]
            print(f"  API requests during the {kind} run, top: " + ", ".join(f"{k} {v}" for k, v in top))

    # Creation alone: both kinds created with no operator running (bench.py --creates-alone), so that the
    # ratio is the API server's own cost per object (schema, defaulting, CEL rules, storage), not the
    # contention of an operator working on the jobs being created.
    creates = None
    if os.path.exists(creates_path):
        creates = json.load(open(creates_path))
        tc, mc = creates["tandem"], creates["mpi"]
        n = len(tc["rounds"])
        print(f"\nCreation alone, no operator running ({creates['jobs']} objects, median of {n} alternating rounds)")
        print(f"{'':32} {'TrainingJob':>12} {'MPIJob':>13} {'Tandem/MPI':>11}")
        for label, key in (("created by the client (s)", "create_s"), ("API server CPU (s)", "apiserver_cpu_s")):
            ratio = tc[key] / mc[key] if mc[key] else None
            ratios[f"creation alone: {label}"] = ratio
            print(f"{label:32} {fmt(tc[key]):>12} {fmt(mc[key]):>13} {fmt(ratio, 'x'):>11}")

    summary = {"bench": "operator", "creates_alone": creates, "mpi_operator_version": a.mpi_operator_version, "mpi_operator_qps_burst": a.mpi_qps,
               "ratio_tandem_over_mpi": ratios,
               "runs": {k: {x: v for x, v in r.items() if x not in ("pod_seen_times", "pod_running_times")}
                        for k, r in runs.items()}}
    with open(os.path.join(a.out, "operator.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({"bench": "operator", "ratio_tandem_over_mpi": ratios}))

    plt = pyplot("report.py") if runs else None  # creation alone (OPERATORS=" ") has no curves to plot
    if plt is None:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = {"tandem": "Tandem", "mpi": "MPI Operator"}
    colors = {"tandem": "tab:blue", "mpi": "tab:red"}
    for kind, r in runs.items():
        for key, style, what in (("pod_seen_times", "-", "exist"), ("pod_running_times", ":", "Running")):
            ts = r[key]
            ax1.plot(ts, range(1, len(ts) + 1), style, color=colors[kind], label=f"{names[kind]}: pods {what}")
        tl = r["timeline"]
        ax2.plot([p["t"] for p in tl], [mib(p["rss"] or 0) for p in tl], color=colors[kind], label=names[kind])
    ax1.set_xlabel("seconds since the first create")
    ax1.set_ylabel("pods")
    ax1.set_title(f"{next(iter(runs.values()))['jobs']} jobs, 3 pods each")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("seconds since the first create")
    ax2.set_ylabel("operator RSS (MiB)")
    ax2.set_title("operator memory")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(a.out, "operator.png"), dpi=100)
    print(f"wrote {a.out}/operator.json and {a.out}/operator.png")


if __name__ == "__main__":
    main()
