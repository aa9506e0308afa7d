#!/usr/bin/env python3
"""One operator's run of the 1,000-job benchmark (bench/operator/run.sh calls it; standard library only).

Against the control plane of $TANDEM_CLUSTER_DIR (its kubeconfig's admin client certificate), in a fresh
namespace: creates N equivalent jobs (Tandem TrainingJobs, backend mpi, one group of 2 workers, or Kubeflow
MPIJobs, 1 launcher + 2 workers, launcher created once the workers are Ready), watches the namespace's pods,
and records
  - the time from the first create until every expected pod (3 a job) exists, and until every one has
    reached Running (kwok marks bound pods Running; the MPI Operator's launcher pods, owned by a batch Job,
    are then completed by kwok, so Succeeded counts as having reached Running),
  - the operator's reconciles in that window (Tandem: the count of its reconcile-duration histogram on
    /metrics; MPI Operator: its "Finished syncing job" log lines, one per sync),
  - the operator's peak RSS (VmHWM of /proc/<pid>/status) and CPU seconds (utime+stime),
  - the API server's requests by verb and resource in that window (apiserver_request_total deltas; every
    client's, the operator's being most of them),
and writes them as one JSON object. Pods are placed round-robin on the kwok nodes through nodeName in the
pod templates (the control plane runs no scheduler), the same placement for both operators.

With --creates-alone it measures creation only, with no operator running: both kinds in alternating rounds
(created, timed, deleted again), the client's wall time and the API server's CPU seconds, medians.

Usage: bench.py --kind tandem|mpi --ns NS --jobs N --nodes N --pid PID [--metrics-url URL] [--log FILE]
                --out FILE [--timeout S]
       bench.py --creates-alone --jobs N [--rounds R] --out FILE
"""

import argparse
import http.client
import json
import os
import re
import ssl
import statistics
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

CLUSTER = os.environ.get("TANDEM_CLUSTER_DIR", "/tmp/tandem-cluster")
HZ = os.sysconf("SC_CLK_TCK")


def die(msg):
    print(f"bench.py: {msg}", file=sys.stderr)
    sys.exit(1)


class Api:
    """A tiny Kubernetes client: one keep-alive HTTPS connection per thread, admin client certificate."""

    def __init__(self):
        server = open(os.path.join(CLUSTER, "server")).read().strip()
        m = re.match(r"https://([^:/]+):(\d+)", server)
        if not m:
            die(f"cannot read the API server address from {CLUSTER}/server")
        self.host, self.port = m.group(1), int(m.group(2))
        pki = os.path.join(CLUSTER, "pki")
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
        self.local = threading.local()

    def conn(self, timeout=60):
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def request(self, method, path, body=None, ok=(200, 201)):
        for attempt in range(5):
            c = getattr(self.local, "c", None)
            if c is None:
                c = self.local.c = self.conn()
            try:
                data = json.dumps(body).encode() if body is not None else None
                c.request(method, path, body=data, headers={"Content-Type": "application/json"})
                r = c.getresponse()
                payload = r.read()
            except (OSError, http.client.HTTPException):
                self.local.c = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status == 429 or r.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status not in ok:
                die(f"{method} {path} answered {r.status}: {payload[:400].decode(errors='replace')}")
            return json.loads(payload) if payload else None
        die(f"{method} {path} failed 5 times; is the control plane up? (state in {CLUSTER})")

    def raw(self, path):
        c = self.conn()
        c.request("GET", path)
        r = c.getresponse()
        return r.read().decode()


# ---- jobs -------------------------------------------------------------------------------------------------
def tandem_job(name, node):
    tmpl = {"spec": {"nodeName": node}}
    return {
        "apiVersion": "tandem.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "labels": {"bench": "operator"}},
        "spec": {
            "model": {"kind": "mlp", "hidden": [16]},
            "data": {"source": "mnist5k", "batchSize": 32},
            "training": {"algorithm": "allreduce", "optimizer": {"kind": "sgd", "learningRate": 0.1}, "steps": 10},
            "workers": {"groups": 1, "groupSize": 2, "minGroups": 1, "maxGroups": 1, "backend": "mpi",
                        "template": tmpl},
        },
    }


def mpi_job(name, node):
    def spec(role, cmd):
        return {"spec": {"nodeName": node, "containers": [
            {"name": role, "image": "mpioperator/mpi-pi:openmpi", "command": cmd}]}}

    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": name, "labels": {"bench": "operator"}},
        "spec": {
            "slotsPerWorker": 1,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "None"},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": spec("launcher", ["mpirun", "-n", "2", "/home/mpiuser/pi"])},
                "Worker": {"replicas": 2, "template": spec("worker", ["/usr/sbin/sshd", "-De"])},
            },
        },
    }


KINDS = {
    "tandem": ("/apis/tandem.dev/v1alpha1/namespaces/{ns}/trainingjobs", tandem_job),
    "mpi": ("/apis/kubeflow.org/v2beta1/namespaces/{ns}/mpijobs", mpi_job),
}


# ---- measurements -----------------------------------------------------------------------------------------
def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmHWM", "VmRSS"):
                    out[k] = int(v.split()[0]) * 1024
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            out["cpu_s"] = (int(fields[11]) + int(fields[12])) / HZ
    except OSError:
        pass
    return out


def reconciles(kind, metrics_url, log):
    if kind == "tandem":
        text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
        n = 0.0
        for line in text.splitlines():
            if line.startswith("tandem_operator_reconcile_duration_seconds_count"):
                n += float(line.split()[-1])
        return int(n)
    with open(log, errors="replace") as f:
        return sum(1 for line in f if "Finished syncing job" in line)


def apiserver_metrics(api):
    """From the API server's /metrics: requests by verb and resource; the sum and count of the
    server-side latency of creates (POST) by resource; and the time spent evaluating CRD CEL rules."""
    counts, creates, cel = {}, {}, {}
    for line in api.raw("/metrics").splitlines():
        if line.startswith("apiserver_cel_evaluation_duration_seconds_"):
            name, value = line.split()[0], float(line.split()[-1])
            for part in ("sum", "count"):
                if name == f"apiserver_cel_evaluation_duration_seconds_{part}":
                    cel[part] = value
            continue
        if not line.startswith(("apiserver_request_total{", "apiserver_request_duration_seconds_sum{",
                                "apiserver_request_duration_seconds_count{")):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("resource") in ("", None) or labels.get("verb") in ("WATCH", "CONNECT"):
            continue
        value = float(line.split()[-1])
        if line.startswith("apiserver_request_total{"):
            key = f'{labels["verb"]} {labels["resource"]}'
            counts[key] = counts.get(key, 0) + value
        elif labels["verb"] == "POST" and not labels.get("subresource"):
            part = "sum" if line.startswith("apiserver_request_duration_seconds_sum") else "count"
            creates.setdefault(labels["resource"], {"sum": 0.0, "count": 0.0})[part] += value
    return counts, creates, cel


class PodWatch(threading.Thread):
    """Lists then watches the namespace's pods; remembers when each was first seen and first Running."""

    def __init__(self, api, ns):
        super().__init__(daemon=True)
        self.api, self.ns = api, ns
        self.seen, self.running = {}, {}
        self.lock = threading.Lock()
        self.stop = False
        self.error = None

    def note(self, pod, now):
        name = pod["metadata"]["name"]
        phase = pod.get("status", {}).get("phase")
        with self.lock:
            self.seen.setdefault(name, now)
            if phase in ("Running", "Succeeded"):
                self.running.setdefault(name, now)

    def run(self):
        try:
            base = f"/api/v1/namespaces/{self.ns}/pods"
            lst = self.api.request("GET", base)
            rv = lst["metadata"]["resourceVersion"]
            now = time.monotonic()
            for p in lst["items"]:
                self.note(p, now)
            while not self.stop:
                c = self.api.conn(timeout=120)
                c.request("GET", f"{base}?watch=1&allowWatchBookmarks=true&timeoutSeconds=60&resourceVersion={rv}")
                r = c.getresponse()
                if r.status != 200:
                    raise RuntimeError(f"pod watch answered {r.status}: {r.read()[:300]!r}")
                for raw in r:
                    if self.stop:
                        break
                    ev = json.loads(raw)
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        raise RuntimeError(f"pod watch error: {obj}")
                    rv = obj["metadata"]["resourceVersion"]
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.note(obj, time.monotonic())
                c.close()
        except Exception as e:  # reported by the main thread
            self.error = e

    def counts(self):
        with self.lock:
            return len(self.seen), len(self.running)


def apiserver_pid():
    """The control plane's kube-apiserver, from the pids file cluster-up.sh writes."""
    with open(os.path.join(CLUSTER, "pids")) as f:
        for line in f:
            name, _, pid = line.strip().partition(" ")
            if name == "kube-apiserver":
                return int(pid)
    die(f"no kube-apiserver in {CLUSTER}/pids")


def creates_alone(a):
    """Creation with no operator running: each kind in turn creates --jobs objects in a namespace of its
    own (the same client, threads and objects as a run), the client's wall time and the API server's CPU
    seconds are taken, and the objects are deleted again (deletecollection, waited for) so that every
    round starts from the same stored state. Rounds alternate the kinds; the medians are reported."""
    api = Api()
    pid = apiserver_pid()
    rounds = {kind: [] for kind in KINDS}
    for r in range(a.rounds):
        for kind in (KINDS if r % 2 == 0 else list(KINDS)[::-1]):
            ns = f"creates-{kind}"
            api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": ns}}, ok=(201, 409))
            path, make = KINDS[kind]
            path = path.format(ns=ns)
            cpu0, t0 = proc_status(pid)["cpu_s"], time.monotonic()
            with ThreadPoolExecutor(a.create_threads) as ex:
                list(ex.map(lambda i: api.request("POST", path, make(f"bench-{i:04d}", "bench-node-000")),
                            range(a.jobs)))
            wall, cpu = time.monotonic() - t0, proc_status(pid)["cpu_s"] - cpu0
            rounds[kind].append({"create_s": wall, "apiserver_cpu_s": cpu})
            print(f"bench.py [creates, round {r + 1}/{a.rounds}] {kind}: {a.jobs} in {wall:.2f} s, "
                  f"API server {cpu:.2f} CPU-s", file=sys.stderr)
            api.request("DELETE", path)
            deadline = time.monotonic() + 300
            while api.request("GET", f"{path}?limit=1")["items"]:
                if time.monotonic() > deadline:
                    die(f"the {kind} objects of {ns} were not deleted in 300 s")
                time.sleep(0.5)

    result = {kind: {"rounds": rs, "create_s": statistics.median(x["create_s"] for x in rs),
                     "apiserver_cpu_s": statistics.median(x["apiserver_cpu_s"] for x in rs)}
              for kind, rs in rounds.items()}
    result["jobs"] = a.jobs
    with open(a.out, "w") as f:
        json.dump(result, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=KINDS)
    ap.add_argument("--ns")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--pid", type=int)
    ap.add_argument("--metrics-url")
    ap.add_argument("--log")
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--create-threads", type=int, default=4)
    ap.add_argument("--creates-alone", action="store_true",
                    help="measure creation with no operator, both kinds, --rounds alternating rounds")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if a.creates_alone:
        creates_alone(a)
        return
    if a.kind is None or a.ns is None or a.pid is None:
        die("a run needs --kind, --ns and --pid (the operator's process)")
    if a.kind == "tandem" and not a.metrics_url:
        die("--metrics-url is needed for tandem")
    if a.kind == "mpi" and not a.log:
        die("--log (the mpi-operator's log) is needed for mpi")

    api = Api()
    api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": a.ns}})
    watch = PodWatch(api, a.ns)
    watch.start()
    time.sleep(1)

    expected = 3 * a.jobs
    path, make = KINDS[a.kind]
    path = path.format(ns=a.ns)
    rec0 = reconciles(a.kind, a.metrics_url, a.log)
    req0, creates0, cel0 = apiserver_metrics(api)
    idle = proc_status(a.pid)
    t0 = time.monotonic()

    def create(i):
        api.request("POST", path, make(f"bench-{i:04d}", f"bench-node-{i % a.nodes:03d}"))

    created_at = [None]

    def create_all():
        with ThreadPoolExecutor(a.create_threads) as ex:
            list(ex.map(create, range(a.jobs)))
        created_at[0] = time.monotonic() - t0

    creator = threading.Thread(target=create_all, daemon=True)
    creator.start()

    timeline = []
    t_exist = t_running = None
    while True:
        time.sleep(0.5)
        now = time.monotonic() - t0
        if watch.error:
            die(str(watch.error))
        if not watch.is_alive():
            die("the pod watch ended")
        seen, running = watch.counts()
        ps = proc_status(a.pid)
        if not ps:
            die(f"the operator (pid {a.pid}) exited during the run; see its log")
        timeline.append({"t": round(now, 2), "pods": seen, "running": running,
                         "rss": ps.get("VmRSS"), "cpu_s": ps.get("cpu_s")})
        if t_exist is None and seen >= expected:
            t_exist = now
        if t_exist is not None and running >= expected:
            t_running = now
            break
        if now > a.timeout:
            print(f"bench.py: timeout after {a.timeout:.0f} s with {seen}/{expected} pods, {running} Running",
                  file=sys.stderr)
            break
        if len(timeline) % 20 == 0:
            print(f"bench.py [{a.kind}] t={now:6.1f}s pods={seen}/{expected} running={running} "
                  f"rss={ps.get('VmRSS', 0) / 2**20:.0f}MiB", file=sys.stderr)
    end = time.monotonic() - t0
    creator.join(timeout=5)
    watch.stop = True
    rec1 = reconciles(a.kind, a.metrics_url, a.log)
    req1, creates1, cel1 = apiserver_metrics(api)
    final = proc_status(a.pid)
    with watch.lock:
        seen_t = sorted(v - t0 for v in watch.seen.values())
        run_t = sorted(v - t0 for v in watch.running.values())
        workers_t = [v - t0 for k, v in watch.seen.items() if "launcher" not in k]
        launchers_t = [v - t0 for k, v in watch.seen.items() if "launcher" in k]
    req = {k: int(req1.get(k, 0) - req0.get(k, 0)) for k in req1 if req1.get(k, 0) - req0.get(k, 0) > 0}
    # The jobs' own creates: their mean latency inside the API server (decode, defaulting, schema
    # and CEL validation, admission, managed fields, the etcd write), under the load of that window.
    resource = path.rsplit("/", 1)[1]
    c0, c1 = creates0.get(resource, {"sum": 0.0, "count": 0.0}), creates1.get(resource, {"sum": 0.0, "count": 0.0})
    n_creates = c1["count"] - c0["count"]
    create_ms = 1000 * (c1["sum"] - c0["sum"]) / n_creates if n_creates else None
    cel_s = cel1.get("sum", 0.0) - cel0.get("sum", 0.0)
    cel_n = cel1.get("count", 0.0) - cel0.get("count", 0.0)
    n_rec = rec1 - rec0
    result = {
        "operator": a.kind,
        "jobs": a.jobs,
        "nodes": a.nodes,
        "expected_pods": expected,
        "pods_seen": len(seen_t),
        "pods_running": len(run_t),
        "complete": t_running is not None,
        "create_s": created_at[0],
        "all_pods_exist_s": t_exist,
        "all_pods_running_s": t_running,
        # Workers are made by both operators directly; the MPI Operator's launcher pods by the batch Job
        # controller of kube-controller-manager, from the launcher Job the operator creates.
        "all_workers_exist_s": max(workers_t) if len(workers_t) >= 2 * a.jobs else None,
        "all_launchers_exist_s": max(launchers_t) if len(launchers_t) >= a.jobs else None,
        "server_create_ms": create_ms,
        "cel_evaluation_s": cel_s,
        "cel_evaluations": int(cel_n),
        "window_s": end,
        "reconciles": n_rec,
        "reconciles_per_s": n_rec / end if end > 0 else None,
        "reconcile_source": "tandem_operator_reconcile_duration_seconds_count" if a.kind == "tandem"
        else "'Finished syncing job' log lines",
        "peak_rss_bytes": final.get("VmHWM"),
        "idle_rss_bytes": idle.get("VmRSS"),
        "cpu_s": (final.get("cpu_s", 0) - idle.get("cpu_s", 0)),
        "apiserver_requests": dict(sorted(req.items(), key=lambda kv: -kv[1])),
        "apiserver_requests_total": sum(req.values()),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "pod_seen_times": [round(t, 3) for t in seen_t],
        "pod_running_times": [round(t, 3) for t in run_t],
        "timeline": timeline,
    }
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(f"bench.py [{a.kind}] jobs={a.jobs} exist={t_exist} running={t_running} reconciles={n_rec} "
          f"peak_rss={final.get('VmHWM', 0) / 2**20:.1f}MiB cpu={result['cpu_s']:.1f}s", file=sys.stderr)
    if t_running is None:
        sys.exit(2)


if __name__ == "__main__":
    main()
