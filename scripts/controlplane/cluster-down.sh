#!/usr/bin/env bash
# Stops the test control plane that cluster-up.sh recorded in $TANDEM_CLUSTER_DIR (default
# /tmp/tandem-cluster) and removes its state. Only processes recorded there are signalled, and only when
# their command line is still one of the control-plane binaries. Safe to run when nothing is running.
# TANDEM_CLUSTER_KEEP_LOGS=1 keeps $TANDEM_CLUSTER_DIR/logs (cluster-up uses it after a failed start).
set -euo pipefail
D="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
[ -d "$D" ] || { echo "cluster-down: nothing to stop ($D does not exist)" >&2; exit 0; }
[ -f "$D/.tandem-cluster" ] || {
  echo "cluster-down: $D was not made by cluster-up (no .tandem-cluster marker); not touching it" >&2
  exit 1
}

ours() { # pid name: the pid still runs the binary recorded for it
  [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "/$2 "
}
pids=()
if [ -f "$D/pids" ]; then
  # Reverse start order: the clients before the apiserver, the apiserver before etcd.
  while read -r name pid; do
    if ours "$pid" "$name"; then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done < <(tac "$D/pids")
fi
for _ in $(seq 100); do
  left=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
  [ ${#left[@]} -gt 0 ] || break
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true; done

if [ "${TANDEM_CLUSTER_KEEP_LOGS:-0}" = 1 ] && [ -d "$D/logs" ]; then
  find "$D" -mindepth 1 -maxdepth 1 ! -name logs ! -name .tandem-cluster -exec rm -rf {} +
  echo "cluster-down: stopped; logs kept in $D/logs" >&2
else
  rm -rf "$D"
  echo "cluster-down: stopped and removed $D" >&2
fi
