#!/usr/bin/env bash
# `make e2e`: builds tandem, tandem-operator and tandem-node, starts a control plane of its own, installs
# the CRDs, runs the operator and the node agent as local processes and runs the e2e tests against them.
# Everything it started is stopped however it ends (trap). Prints the wall time at the end.
#
# Environment: TANDEM_CLUSTER_DIR (default /tmp/tandem-e2e-cluster), CARGO, CARGO_TARGET_DIR,
# TEST_FEATURES (set by make), E2E_KEEP=1 keeps
# the logs folder after a success too, E2E_TEST_ARGS (extra `cargo test` arguments, e.g. a test name).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
export TANDEM_CLUSTER_DIR="${TANDEM_CLUSTER_DIR:-/tmp/tandem-e2e-cluster}"
CARGO="${CARGO:-cargo}"
TARGET="${CARGO_TARGET_DIR:-target}"
K8S_BIN="$(scripts/controlplane/bin-dir.sh)"
log() { echo "e2e: $*" >&2; }

# The whole workspace with the features of `make test`'s other builds (empty flags that only add test
# targets), so nothing is compiled twice: this builds tandem, tandem-operator, tandem-node and the tests.
FEATURES="${TEST_FEATURES:-tandem-testkit/cluster-tests,tandem-operator/cluster-tests},tandem-e2e/e2e"
log "building tandem, tandem-operator, tandem-node and the e2e tests (dev profile, workspace features $FEATURES)"
"$CARGO" test -q --workspace --features "$FEATURES" --no-run

WORK="$(mktemp -d /tmp/tandem-e2e.XXXXXX)"
pids=()
status=1
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  scripts/controlplane/cluster-down.sh >/dev/null 2>&1 || true
  if [ "$status" = 0 ] && [ "${E2E_KEEP:-0}" != 1 ]; then
    rm -rf "$WORK"
  else
    log "logs kept in $WORK (operator.log, node.log, node/pods/<pod uid>/tandem.log)"
  fi
  log "wall time $((SECONDS - start)) s"
}
trap cleanup EXIT

up="$(TANDEM_CLUSTER_KWOK=0 scripts/controlplane/cluster-up.sh)" || { log "the control plane did not start"; exit 1; }
eval "$(printf '%s\n' "$up" | tail -n 1)"
export PATH="$K8S_BIN:$PATH"
kubectl apply --server-side -f crds/ >/dev/null
kubectl wait --for condition=established --timeout=60s -f crds/ >/dev/null

metrics_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$TARGET/debug/tandem-operator" --no-leader-election --log-format text --metrics-addr "127.0.0.1:$metrics_port" \
  >"$WORK/operator.log" 2>&1 &
pids+=($!)
"$TARGET/debug/tandem-node" --node-name tandem-e2e-node --state-dir "$WORK/node" --workdir "$PWD" \
  --selector app.kubernetes.io/managed-by=tandem-operator --command "tandem=$(cd "$TARGET" && pwd)/debug/tandem" \
  >"$WORK/node.log" 2>&1 &
pids+=($!)
kubectl wait --for condition=Ready --timeout=60s node/tandem-e2e-node >/dev/null

log "running the e2e tests (operator log: $WORK/operator.log, node log: $WORK/node.log)"
# shellcheck disable=SC2086
if TANDEM_E2E_STATE="$WORK/node" TANDEM_E2E_WORK="$WORK" "$CARGO" test --workspace --features "$FEATURES" --test e2e \
  -- ${E2E_TEST_ARGS:-}; then
  status=0
else
  log "e2e tests failed; last lines of the operator and node logs:"
  tail -n 20 "$WORK/operator.log" "$WORK/node.log" >&2 || true
fi
exit "$status"
