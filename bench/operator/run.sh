#!/usr/bin/env bash
# The operator benchmark (issue 7): tandem-operator vs the Kubeflow MPI Operator, side by side, against one
# fresh control plane (scripts/controlplane/cluster-up.sh) with kwok fake nodes. Each operator in turn runs as
# a local process on N_JOBS equivalent jobs (Tandem: TrainingJob, backend mpi, 1 group of 2 workers + its
# launcher; MPI Operator: MPIJob, 1 launcher + 2 workers, launcherCreationPolicy WaitForWorkersReady) in a
# namespace of its own, which is deleted (and waited for) before the next. bench.py measures each run; at
# the end report.py prints the table with ratios and writes target/bench/operator/{operator.json,operator.png}.
#
# After the runs, both kinds are created with no operator running (bench.py --creates-alone): the API
# server's own cost per object, without the contention of an operator working on the jobs as they come.
#
# Usage: bench/operator/run.sh        (or: make bench-operator)
# Environment: N_JOBS (1000), N_NODES (50), OPERATORS ("tandem mpi"; " " measures creation alone only),
#   BENCH_TIMEOUT (seconds a run may take, 1800), CREATE_ROUNDS (alternating rounds of creation alone, 5; 0 skips it),
#   MPI_OPERATOR_QPS / MPI_OPERATOR_BURST (its client-side API rate limit; default 1000/2000, i.e. as
#   unthrottled as tandem-operator's kube-rs client, which has none; the MPI Operator's own defaults are 5/10),
#   MPI_OPERATOR_QUEUE_RATE / MPI_OPERATOR_QUEUE_BURST (the token bucket every enqueue of its work queue
#   passes; default 1000/10000, its own defaults are 10/100; its per-job exponential backoff stays as it is),
#   MPI_OPERATOR_VERSION, TANDEM_CACHE, KEEP_CLUSTER=1 (leave the control plane running afterwards).
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
N_JOBS="${N_JOBS:-1000}"
N_NODES="${N_NODES:-50}"
OPERATORS="${OPERATORS:-tandem mpi}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-1800}"
CREATE_ROUNDS="${CREATE_ROUNDS:-5}"
MPI_OPERATOR_QPS="${MPI_OPERATOR_QPS:-1000}"
MPI_OPERATOR_BURST="${MPI_OPERATOR_BURST:-2000}"
MPI_OPERATOR_QUEUE_RATE="${MPI_OPERATOR_QUEUE_RATE:-1000}"
MPI_OPERATOR_QUEUE_BURST="${MPI_OPERATOR_QUEUE_BURST:-10000}"
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster-bench}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
OUT="$root/target/bench/operator"
LOGS="$OUT/logs"
K8S_BIN="$(scripts/controlplane/bin-dir.sh)"
export PATH="$K8S_BIN:$PATH"

log() { echo "[bench-operator $(date -u +%H:%M:%S)] $*" >&2; }
die() {
  echo "bench-operator: $*" >&2
  exit 1
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# ---- builds -------------------------------------------------------------------------------------------
mkdir -p "$LOGS"
scripts/controlplane/build.sh all >/dev/null 2>"$LOGS/build.log" || {
  tail -n 20 "$LOGS/build.log" >&2
  die "building the control plane failed (scripts/controlplane/build.sh); see above"
}
MPI_BIN="$(bench/operator/build-mpi-operator.sh | tail -n 1)" || die "building the MPI Operator failed; see above"
MPI_CRD="$(dirname "$(dirname "$MPI_BIN")")/crd/mpijobs.yaml"
TANDEM_BIN="$CARGO_TARGET_DIR/release/tandem-operator"
case " $OPERATORS " in
  *" tandem "*)
    log "building tandem-operator (release, CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
    cargo build -q --release -p tandem-operator || die "cargo build --release -p tandem-operator failed; see above"
    ;;
esac

rm -f "$OUT"/run-*.json

# ---- control plane ------------------------------------------------------------------------------------
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
    scripts/controlplane/cluster-down.sh >/dev/null 2>&1 || true
  else
    log "control plane left running: export KUBECONFIG=$TANDEM_CLUSTER_DIR/kubeconfig"
  fi
}
trap cleanup EXIT
# A fresh control plane: stop one left from an earlier run.
scripts/controlplane/cluster-down.sh >/dev/null 2>&1 || true
up="$(scripts/controlplane/cluster-up.sh)" || die "the control plane did not start (logs in $TANDEM_CLUSTER_DIR/logs)"
eval "$(printf '%s\n' "$up" | tail -n 1)"
export KUBECONFIG

kubectl apply --server-side -f crds/ >/dev/null || die "installing Tandem's CRDs (crds/) failed"
kubectl apply --server-side -f "$MPI_CRD" >/dev/null || die "installing the MPIJob CRD ($MPI_CRD) failed"
deadline=$((SECONDS + 60))
until kubectl get trainingjobs.tandem.dev,mpijobs.kubeflow.org -A >/dev/null 2>&1; do
  [ "$SECONDS" -lt "$deadline" ] || die "the CRDs were not served 60 s after they were installed"
  sleep 0.5
done

log "creating $N_NODES kwok nodes"
for i in $(seq 0 $((N_NODES - 1))); do
  printf -- '---\napiVersion: v1\nkind: Node\nmetadata:\n  name: bench-node-%03d\n' "$i"
  printf '  annotations: {kwok.x-k8s.io/node: fake}\n  labels: {type: kwok}\n'
  printf 'status:\n  allocatable: {cpu: "256", memory: 1Ti, pods: "500"}\n'
  printf '  capacity: {cpu: "256", memory: 1Ti, pods: "500"}\n'
done | kubectl apply -f - >/dev/null || die "creating the kwok nodes failed"
deadline=$((SECONDS + 120))
jp='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}'
until [ "$(kubectl get nodes -l type=kwok -o jsonpath="$jp" | grep -c True)" -ge "$N_NODES" ]; do
  [ "$SECONDS" -lt "$deadline" ] \
    || die "kwok did not mark the $N_NODES fake nodes Ready in 120 s (log: $TANDEM_CLUSTER_DIR/logs/kwok.log)"
  sleep 1
done

# ---- one operator's run -------------------------------------------------------------------------------
run_tandem() {
  local port
  port="$(free_port)"
  RUST_LOG="${TANDEM_OPERATOR_LOG:-info,kube=warn}" "$TANDEM_BIN" --no-leader-election \
    --metrics-addr "127.0.0.1:$port" >"$LOGS/tandem-operator.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local deadline=$((SECONDS + 60))
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || die "tandem-operator exited at start; see $LOGS/tandem-operator.log"
    [ "$SECONDS" -lt "$deadline" ] || die "tandem-operator not ready in 60 s; see $LOGS/tandem-operator.log"
    sleep 0.5
  done
  python3 bench/operator/bench.py --kind tandem --ns bench-tandem --jobs "$N_JOBS" --nodes "$N_NODES" \
    --pid "$pid" --metrics-url "http://127.0.0.1:$port/metrics" --timeout "$BENCH_TIMEOUT" \
    --out "$OUT/run-tandem.json" || log "the tandem run did not complete; its partial figures are kept"
  curl -sf "http://127.0.0.1:$port/metrics" >"$LOGS/tandem-operator.metrics" || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

run_mpi() {
  local port
  port="$(free_port)"
  kubectl create namespace mpi-operator >/dev/null 2>&1 || true
  "$MPI_BIN" --kubeConfig "$KUBECONFIG" --monitoring-port "$port" --kube-api-qps "$MPI_OPERATOR_QPS" \
    --kube-api-burst "$MPI_OPERATOR_BURST" --controller-queue-rate-limit "$MPI_OPERATOR_QUEUE_RATE" \
    --controller-queue-burst "$MPI_OPERATOR_QUEUE_BURST" --lock-namespace mpi-operator >"$LOGS/mpi-operator.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  local deadline=$((SECONDS + 90))
  # It syncs its informers once it holds the leader Lease, then starts its workers.
  until grep -q -i 'started workers\|starting workers' "$LOGS/mpi-operator.log"; do
    kill -0 "$pid" 2>/dev/null || die "mpi-operator exited at start; see $LOGS/mpi-operator.log"
    [ "$SECONDS" -lt "$deadline" ] || die "mpi-operator did not start its workers in 90 s; see $LOGS/mpi-operator.log"
    sleep 0.5
  done
  python3 bench/operator/bench.py --kind mpi --ns bench-mpi --jobs "$N_JOBS" --nodes "$N_NODES" \
    --pid "$pid" --log "$LOGS/mpi-operator.log" --timeout "$BENCH_TIMEOUT" \
    --out "$OUT/run-mpi.json" || log "the mpi run did not complete; its partial figures are kept"
  curl -sf "http://127.0.0.1:$port/metrics" >"$LOGS/mpi-operator.metrics" || true
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

first=1
for op in $OPERATORS; do
  if [ "$first" = 0 ]; then
    # The previous run's namespace goes (its pods through kwok, its other objects through the garbage
    # collector) before the next run starts, so that the next operator does not share the API server with
    # that work.
    prev_ns="$prev"
    log "deleting namespace $prev_ns before the next run"
    kubectl delete namespace "$prev_ns" --wait=true --timeout=900s >/dev/null \
      || log "namespace $prev_ns not gone after 900 s; going on (the next run shares the API server with its deletion)"
  fi
  first=0
  log "run: $op, $N_JOBS jobs on $N_NODES kwok nodes (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  case "$op" in
    tandem) run_tandem; prev=bench-tandem ;;
    mpi) run_mpi; prev=bench-mpi ;;
    *) die "unknown operator '$op' in OPERATORS; use tandem and/or mpi" ;;
  esac
done

# ---- creation alone ------------------------------------------------------------------------------------
# Both kinds created with no operator running, CREATE_ROUNDS alternating rounds (deleted between rounds):
# the API server's own cost per object, which the runs above see mixed with their operator's work. It
# comes after the runs, so that its 2 × CREATE_ROUNDS × N_JOBS creates and deletes (a grown API-server heap,
# an etcd file not yet compacted) do not weigh on them.
rm -f "$OUT/creates.json"
if [ "$CREATE_ROUNDS" -gt 0 ]; then
  if [ -n "${prev:-}" ]; then
    log "deleting namespace $prev before measuring creation alone"
    kubectl delete namespace "$prev" --wait=true --timeout=900s >/dev/null \
      || log "namespace $prev not gone after 900 s; going on"
  fi
  log "creation alone: $N_JOBS TrainingJobs and $N_JOBS MPIJobs, $CREATE_ROUNDS rounds, no operator running"
  python3 bench/operator/bench.py --creates-alone --jobs "$N_JOBS" --rounds "$CREATE_ROUNDS" \
    --out "$OUT/creates.json" || die "measuring creation alone failed; see above"
fi

# ---- report -------------------------------------------------------------------------------------------
PY=python3
if ! python3 -c 'import matplotlib' 2>/dev/null; then
  VENV="$root/target/bench-venv"
  if ! "$VENV/bin/python" -c 'import matplotlib' 2>/dev/null; then
    log "installing matplotlib into $VENV (once)"
    if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install -q matplotlib; }; then
      log "matplotlib unavailable: table only"
    fi
  fi
  [ ! -x "$VENV/bin/python" ] || PY="$VENV/bin/python"
fi
"$PY" bench/operator/report.py "$OUT" --mpi-operator-version "$(basename "$(dirname "$(dirname "$MPI_BIN")")")" \
  --mpi-qps "API $MPI_OPERATOR_QPS/$MPI_OPERATOR_BURST, queue $MPI_OPERATOR_QUEUE_RATE/$MPI_OPERATOR_QUEUE_BURST"
