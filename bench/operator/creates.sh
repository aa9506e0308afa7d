#!/usr/bin/env bash
# What a TrainingJob create costs the API server, and where: creation alone (bench.py --creates-alone:
# ROUNDS alternating rounds of N_JOBS TrainingJobs and N_JOBS MPIJobs, no operator running, medians) for
# the CRD as installed (crds/: the spec's rules compiled into one), as written (each rule where the
# types state it: `xtask crdgen --as-written`) and without its CEL rules, against kube-apiserver as
# released and, with PATCHED=1, against the same kube-apiserver built with
# bench/operator/patches/apiextensions-properties-once.patch (the CEL adaptor of the structural schema
# builds each object's map of property schemas once, instead of copying it on every field access of
# every rule). Each server is a fresh control plane; results in target/bench/operator/creates-*.json.
#
# Usage: bench/operator/creates.sh        (or: make bench-creates)
# Environment: N_JOBS (1000), ROUNDS (5), PATCHED (0; 1 adds the patched kube-apiserver), TANDEM_CACHE.
set -euo pipefail
cd "$(dirname "$0")/../.."
root="$PWD"
N_JOBS="${N_JOBS:-1000}"
ROUNDS="${ROUNDS:-5}"
PATCHED="${PATCHED:-0}"
# shellcheck source=scripts/controlplane/versions.sh
source scripts/controlplane/versions.sh
export PATH="$K8S_BIN:$PATH" # kubectl; both servers' control planes have the same one
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster-creates}"
OUT="$root/target/bench/operator"
mkdir -p "$OUT"

log() { echo "[bench-creates $(date -u +%H:%M:%S)] $*" >&2; }
die() {
  echo "bench-creates: $*" >&2
  exit 1
}

# ---- builds -------------------------------------------------------------------------------------------
scripts/controlplane/build.sh all >/dev/null 2>"$OUT/creates-build.log" || {
  tail -n 20 "$OUT/creates-build.log" >&2
  die "building the control plane failed (scripts/controlplane/build.sh); see above"
}
MPI_BIN="$(bench/operator/build-mpi-operator.sh | tail -n 1)" || die "building the MPI Operator failed; see above"
MPI_CRD="$(dirname "$(dirname "$MPI_BIN")")/crd/mpijobs.yaml"

servers=(released)
if [ "$PATCHED" = 1 ]; then
  # A cache beside the real one whose bin/ links every binary but kube-apiserver, built from a copy of
  # the k8s wrapper module that replaces k8s.io/apiextensions-apiserver by a patched copy of it.
  PATCHED_CACHE="$TANDEM_CACHE/k8s-properties-once"
  pbin="$PATCHED_CACHE/k8s/v$K8S_VERSION/bin"
  if [ ! -x "$pbin/kube-apiserver" ]; then
    log "building kube-apiserver v$K8S_VERSION with $(basename bench/operator/patches/*.patch)"
    command -v go >/dev/null || PATH="/usr/local/go/bin:$PATH"
    src="$PATCHED_CACHE/src"
    rm -rf "$src" && mkdir -p "$src" "$pbin"
    cp -r "$K8S_HOME/src/kubernetes" "$src/kubernetes"
    ext="$(cd "$src/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/apiextensions-apiserver)"
    cp -r "$ext" "$src/apiextensions-apiserver" && chmod -R u+w "$src/apiextensions-apiserver"
    patch -s -d "$src/apiextensions-apiserver" -p1 <bench/operator/patches/apiextensions-properties-once.patch
    (cd "$src/kubernetes" && go mod edit -replace="k8s.io/apiextensions-apiserver=$src/apiextensions-apiserver" \
      && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-mod=mod -modcacherw -buildvcs=false" \
        go build -p 2 -trimpath -ldflags "-s -w" -o "$pbin/kube-apiserver.new" k8s.io/kubernetes/cmd/kube-apiserver) \
      || die "building the patched kube-apiserver failed; see above"
    mv "$pbin/kube-apiserver.new" "$pbin/kube-apiserver"
  fi
  for b in "$K8S_BIN"/*; do
    [ "$(basename "$b")" = kube-apiserver ] || ln -sfn "$b" "$pbin/"
  done
  servers+=(patched)
fi

# ---- the CRD's variants -------------------------------------------------------------------------------
installed="$root/crds/tandem.dev_trainingjobs.yaml"
written="$OUT/crd-as-written.yaml"
norules="$OUT/crd-no-rules.yaml"
cargo run -q -p xtask -- crdgen --as-written >"$written" || die "rendering the CRD as written failed; see above"
python3 - "$installed" "$norules" <<'PY'
import sys
import yaml

crd = yaml.safe_load(open(sys.argv[1]))


def strip(node):
    if isinstance(node, dict):
        node.pop("x-kubernetes-validations", None)
        for v in node.values():
            strip(v)
    elif isinstance(node, list):
        for v in node:
            strip(v)


strip(crd)
yaml.safe_dump(crd, open(sys.argv[2], "w"))
PY

# ---- runs ---------------------------------------------------------------------------------------------
trap 'scripts/controlplane/cluster-down.sh >/dev/null 2>&1 || true' EXIT
for server in "${servers[@]}"; do
  cache="$TANDEM_CACHE"
  [ "$server" = released ] || cache="$PATCHED_CACHE"
  scripts/controlplane/cluster-down.sh >/dev/null 2>&1 || true
  up="$(TANDEM_CLUSTER_KWOK=0 TANDEM_CACHE="$cache" scripts/controlplane/cluster-up.sh)" \
    || die "the control plane did not start (logs in $TANDEM_CLUSTER_DIR/logs)"
  eval "$(printf '%s\n' "$up" | tail -n 1)"
  export KUBECONFIG
  kubectl apply --server-side -f "$MPI_CRD" >/dev/null \
    || die "installing the MPIJob CRD failed"
  for variant in installed as-written no-rules; do
    case "$variant" in
      installed) crd="$installed" ;;
      as-written) crd="$written" ;;
      *) crd="$norules" ;;
    esac
    kubectl apply --server-side --force-conflicts -f "$crd" >/dev/null \
      || die "installing the TrainingJob CRD ($variant) failed"
    sleep 5 # the new schema reaches every handler
    log "kube-apiserver $server, CRD $variant: $ROUNDS rounds of $N_JOBS creates of each kind"
    python3 bench/operator/bench.py --creates-alone --jobs "$N_JOBS" --rounds "$ROUNDS" \
      --out "$OUT/creates-$server-$variant.json" || die "measuring creation failed; see above"
  done
done

# ---- report -------------------------------------------------------------------------------------------
python3 - "$OUT" "$N_JOBS" "$ROUNDS" "${servers[@]}" <<'PY'
import json
import sys

out, jobs, rounds, servers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print(f"\nCreation alone: {jobs} TrainingJobs against {jobs} MPIJobs, median of {rounds} alternating rounds;")
print("seconds until the client had created them all, and the API server's CPU seconds meanwhile")
print(f"{'kube-apiserver':15} {'TrainingJob CRD':16} {'client: TJ':>10} {'MPIJob':>7} {'TJ/MPI':>7}"
      f"   {'CPU: TJ':>7} {'MPIJob':>7} {'TJ/MPI':>7}")
summary = {}
for server in servers:
    for variant in ("installed", "as-written", "no-rules"):
        d = json.load(open(f"{out}/creates-{server}-{variant}.json"))
        t, m = d["tandem"], d["mpi"]
        rc, rcpu = t["create_s"] / m["create_s"], t["apiserver_cpu_s"] / m["apiserver_cpu_s"]
        summary[f"{server}/{variant}"] = {"created_by_the_client": rc, "apiserver_cpu": rcpu}
        print(f"{server:15} {variant:16} {t['create_s']:10.2f} {m['create_s']:7.2f} {rc:6.2f}x"
              f"   {t['apiserver_cpu_s']:7.2f} {m['apiserver_cpu_s']:7.2f} {rcpu:6.2f}x")
print(json.dumps({"bench": "creates", "ratio_tandem_over_mpi": summary}))
PY
