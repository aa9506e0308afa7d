#!/usr/bin/env bash
# `make e2e-node`: the end-to-end tests in real containers. Starts a node of its own (scripts/node/
# node-up.sh: control plane, containerd, kubelet, kube-proxy, CoreDNS, local-path storage, the images
# of `make images` imported), checks the README's `kubectl apply` install (deploy/operator.yaml) and
# removes it, installs the chart with `helm install` as the README says (the operator runs as a pod
# with in-cluster credentials and the chart's RBAC), then runs e2e/tests/node.rs against it. The node
# is stopped and the host restored however it ends (trap). Prints the wall time of each stage.
#
# Environment: TANDEM_NODE_DIR (default /tmp/tandem-e2e-node), CARGO, TEST_FEATURES (set by make),
# E2E_THREADS (tests at once, default 2), E2E_KEEP=1 (keep the logs after
# a success too), E2E_TEST_ARGS (extra `cargo test` arguments, e.g. a test name).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
export TANDEM_NODE_DIR="${TANDEM_NODE_DIR:-/tmp/tandem-e2e-node}"
CARGO="${CARGO:-cargo}"
K8S_BIN="$(scripts/controlplane/bin-dir.sh)"
export PATH="$K8S_BIN:$PATH"
log() { echo "e2e-node: $*" >&2; }
stage() { log "$1: $(( SECONDS - stage_start )) s"; stage_start=$SECONDS; }
stage_start=$SECONDS

# The whole workspace with the features of `make test`'s other builds (empty flags that only add test
# targets), so nothing compiles twice.
# E2E_CARGO_ARGS overrides the selection (e.g. `-p tandem-e2e --features e2e` builds only what the test needs).
FEATURES="${TEST_FEATURES:-tandem-testkit/cluster-tests,tandem-operator/cluster-tests},tandem-e2e/e2e"
read -r -a SELECT <<<"${E2E_CARGO_ARGS:---workspace --features $FEATURES}"
"$CARGO" test -q "${SELECT[@]}" --no-run
stage "test build"

WORK="$(mktemp -d /tmp/tandem-e2e-node.XXXXXX)"
status=1
cleanup() {
  if [ "$status" != 0 ] && [ -f "$TANDEM_NODE_DIR/kubeconfig" ]; then
    {
      kubectl get pods -A -o wide
      kubectl -n tandem-system logs deployment/tandem-operator --tail=200
      kubectl get events -A --sort-by=.lastTimestamp | tail -n 60
    } >"$WORK/cluster-state.txt" 2>&1 || true
    cp -r "$TANDEM_NODE_DIR/logs" "$WORK/node-logs" 2>/dev/null || true
  fi
  scripts/node/node-down.sh >/dev/null 2>&1 || true
  if [ "$status" = 0 ] && [ "${E2E_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
  else
    log "logs kept in $WORK (cluster-state.txt, node-logs/)"
  fi
  log "wall time $((SECONDS - start)) s"
}
trap cleanup EXIT

up="$(scripts/node/node-up.sh)" || { log "the node did not start"; exit 1; }
eval "$(printf '%s\n' "$up" | tail -n 1)"
stage "node-up"

# The README's `kubectl apply` install: CRDs, the rendered chart; the operator must become ready.
kubectl apply --server-side -f crds/ >/dev/null
# (kubectl wait fails outright while the new CRD has no status yet: retry until it is Established.)
for _ in $(seq 60); do
  kubectl wait --for condition=established --timeout=5s -f crds/ >/dev/null 2>&1 && break
  sleep 1
done
kubectl wait --for condition=established --timeout=5s -f crds/ >/dev/null
kubectl apply --server-side -f deploy/operator.yaml >/dev/null
kubectl -n tandem-system rollout status deployment/tandem-operator --timeout=120s >&2
kubectl delete -f deploy/operator.yaml --wait=true --timeout=120s >/dev/null
stage "kubectl apply install"

# The README's Helm install, with the image `make images` built (the chart's default name and tag).
# With Kueue on (node-up.sh runs Kueue's manager), as a cluster that queues its jobs would install it.
helm install tandem charts/tandem --namespace tandem-system --create-namespace --set kueue.enabled=true \
  --wait --timeout 180s >/dev/null
kubectl -n tandem-system rollout status deployment/tandem-operator --timeout=120s >&2
stage "helm install"

log "running the tests (cluster state and node logs are kept on failure)"
# shellcheck disable=SC2086
if TANDEM_NODE_CONTAINERD="$TANDEM_NODE_DIR/containerd/containerd.sock" TANDEM_E2E_WORK="$WORK" \
  "$CARGO" test "${SELECT[@]}" --test node -- --test-threads="${E2E_THREADS:-2}" ${E2E_TEST_ARGS:-}; then
  status=0
fi
stage "tests"
helm uninstall tandem --namespace tandem-system --wait >/dev/null || status=1
exit "$status"
