#!/usr/bin/env bash
# `make node-down`: stops the node of node-up.sh and puts the host back as node-up found it (the record
# in $D/host): pods deleted through the API first (so the kubelet tears down their networks and
# volumes), then kube-proxy (and its iptables rules), Kueue and the schedulers, kubelet, containerd and the
# control plane; then what is left: container tasks, mounts under $D, network namespaces and cgroups
# made since, sysctls, KUBE-* iptables chains and the nft tables they needed, the bridge, the folders
# made outside $D. Only processes recorded in $D/pids are signalled. Safe to run when nothing runs.
# TANDEM_NODE_KEEP_LOGS=1 keeps $D/logs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../controlplane/versions.sh
source "$here/../controlplane/versions.sh"
# shellcheck source=node-env.sh
source "$here/node-env.sh"
log() { echo "[node-down $(date -u +%H:%M:%S)] $*" >&2; }
[ -d "$D" ] || { log "nothing to stop ($D does not exist)"; exit 0; }
[ -f "$D/.tandem-node" ] || { echo "node-down: $D was not made by node-up (no .tandem-node marker); not touching it" >&2; exit 1; }

pid_of() { awk -v n="$1" '$1 == n {print $2}' "$D/pids" 2>/dev/null | tail -n 1; }
ours() { [ -n "$1" ] && [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q "$2"; }
stop() { # NAME PATTERN: TERM, then KILL after 10 s
  local pid
  pid="$(pid_of "$1")"
  ours "$pid" "$2" || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
  sleep 0.2
}

# 1. Pods, through the API, while the kubelet still runs.
if [ -f "$D/kubeconfig" ] && ours "$(pid_of kubelet)" kubelet; then
  k() { timeout 60 "$K8S_BIN/kubectl" --kubeconfig="$D/kubeconfig" --request-timeout=10s "$@"; }
  k delete deployments,statefulsets,jobs,replicasets --all --all-namespaces --wait=false >/dev/null 2>&1
  k delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1
  for _ in $(seq 60); do
    [ "$(command ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null | wc -l)" = 0 ] && break
    sleep 0.5
  done
fi

# 2. The node's processes, clients before servers.
stop kube-proxy "$K8S_BIN/kube-proxy"
[ ! -x "$K8S_BIN/kube-proxy" ] || "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1
stop kueue "$K8S_BIN/kueue"
stop scheduler-plugins-controller "$K8S_BIN/scheduler-plugins-controller"
stop scheduler-plugins-scheduler "$K8S_BIN/scheduler-plugins-scheduler"
stop kube-scheduler "$K8S_BIN/kube-scheduler"
stop kubelet "$K8S_BIN/kubelet"
if ours "$(pid_of containerd)" containerd; then
  c() { command ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
  for id in $(c tasks ls -q 2>/dev/null); do c tasks kill -s SIGKILL "$id" >/dev/null 2>&1; done
  sleep 0.5
  for id in $(c tasks ls -q 2>/dev/null); do c tasks delete -f "$id" >/dev/null 2>&1; done
  for id in $(c containers ls -q 2>/dev/null); do c containers delete "$id" >/dev/null 2>&1; done
fi
stop containerd "containerd --config $D/containerd/config.toml"
# Shims left by a killed containerd.
for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
if [ -d "$D/cluster" ]; then
  TANDEM_CLUSTER_DIR="$D/cluster" TANDEM_CLUSTER_KEEP_LOGS="${TANDEM_NODE_KEEP_LOGS:-0}" \
    "$here/../controlplane/cluster-down.sh" >/dev/null 2>&1
fi

# 3. Mounts under $D and the network namespaces made since node-up, deepest first.
findmnt -rn -o TARGET | grep -E "^$D/|^/run/containerd/" | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null
done
for ns in $(ls /run/netns 2>/dev/null); do
  grep -qx "$ns" "$D/host/netns" 2>/dev/null && continue
  case "$ns" in cni-*) ip netns delete "$ns" 2>/dev/null || { umount "/run/netns/$ns" 2>/dev/null; rm -f "/run/netns/$ns"; } ;; esac
done
if ! grep -qx /run/netns "$D/host/paths" 2>/dev/null && [ -d /run/netns ] && [ -z "$(ls -A /run/netns)" ]; then
  umount /run/netns 2>/dev/null
  rmdir /run/netns 2>/dev/null
fi

# 4. cgroups the kubelet and containerd made (kubepods and the like), leaves first.
if [ -f "$D/host/cgroups" ]; then
  for h in /sys/fs/cgroup/*/; do
    for top in $(find "$h" -mindepth 1 -maxdepth 1 -type d 2>/dev/null); do
      grep -qx "$top" "$D/host/cgroups" && continue
      find "$top" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
  done
fi

# 5. sysctls.
if [ -f "$D/host/sysctls" ]; then
  while read -r key value; do
    f="/proc/sys/${key//.//}"
    [ -w "$f" ] && [ "$(cat "$f")" != "$value" ] && echo "$value" >"$f" 2>/dev/null
  done <"$D/host/sysctls"
fi

# 6. iptables: every rule jumping to a KUBE-* chain, then the chains; nft tables left empty that
# were not there before.
for ipt in iptables ip6tables; do
  command -v "$ipt" >/dev/null || continue
  for t in filter nat mangle raw; do
    "$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A/-D/' \
      | while read -r rule; do eval "$ipt -t $t $rule" 2>/dev/null; done
    chains="$("$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Za-z0-9_-]*\)$/\1/p')"
    for ch in $chains; do "$ipt" -t "$t" -F "$ch" 2>/dev/null; done
    for ch in $chains; do "$ipt" -t "$t" -X "$ch" 2>/dev/null; done
  done
done
if command -v nft >/dev/null && [ -f "$D/host/nft-tables" ]; then
  nft list tables 2>/dev/null | while read -r _ family name; do
    grep -qx "table $family $name" "$D/host/nft-tables" && continue
    # Only a table that holds no rules any more.
    if ! nft list table "$family" "$name" 2>/dev/null | grep -qE '^\s+(ip|tcp|udp|meta|ct|counter|jump|goto|accept|drop|mark|fib|iif|oif)'; then
      nft delete table "$family" "$name" 2>/dev/null
    fi
  done
fi

# 7. The bridge, and folders made outside $D.
ip link delete "$BRIDGE" 2>/dev/null
for p in /run/containerd /var/lib/cni /usr/libexec/kubernetes /etc/cni /etc/kueue; do
  [ -e "$p" ] && ! grep -qx "$p" "$D/host/paths" 2>/dev/null && rm -rf "$p"
done

if [ "${TANDEM_NODE_KEEP_LOGS:-0}" = 1 ] && [ -d "$D/logs" ]; then
  find "$D" -mindepth 1 -maxdepth 1 ! -name logs ! -name .tandem-node -exec rm -rf {} + 2>/dev/null
  log "stopped; logs kept in $D/logs"
else
  rm -rf "$D"
  log "stopped; host restored and $D removed"
fi
exit 0
