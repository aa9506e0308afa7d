#!/usr/bin/env bash
# `make node-up`: the test control plane (scripts/controlplane/cluster-up.sh) plus one real node on this
# machine: containerd with runc, a CNI bridge, kubelet, kube-scheduler, kube-proxy (iptables mode, so
# in-cluster clients reach the apiserver through the `kubernetes` Service), CoreDNS as a Deployment
# behind the kube-dns Service (pod and Service names resolve as on EKS), and Rancher's
# local-path-provisioner behind the default StorageClass `standard` (as on kind). The images of
# `make images` and the node's own (pause, CoreDNS, local-path) are imported into containerd; pods use
# them with imagePullPolicy IfNotPresent or Never: there is no registry.
#
# Network: the bridge $BRIDGE holds 10.89.0.1/24 (the node's address; pods get 10.89.0.10-250); the
# apiserver, the kubelet and the node ports listen on that address, everything else on loopback.
# Nothing is routed off this machine (no masquerade, no default route for pods beyond the host).
#
# Host changes are recorded first in $D/host (sysctls, cgroups, netns, iptables, nft tables) and undone
# by scripts/node/node-down.sh, which a failed start runs too. Prints `export KUBECONFIG=...` last.
#
# Environment: TANDEM_NODE_DIR (default /tmp/tandem-node), TANDEM_NODE_TIMEOUT (seconds, default 180).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../controlplane/versions.sh
source "$here/../controlplane/versions.sh"
# shellcheck source=node-env.sh
source "$here/node-env.sh"
TIMEOUT="${TANDEM_NODE_TIMEOUT:-180}"
start_time=$SECONDS
log() { echo "[node-up $(date -u +%H:%M:%S)] $*" >&2; }
die() {
  echo "node-up: $*" >&2
  exit 1
}

[ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet, bridges and iptables)"
for b in kube-apiserver kube-controller-manager kubectl etcd kubelet kube-scheduler kube-proxy coredns \
  local-path-provisioner; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing; build it first: make node-bins"
done
for b in containerd containerd-shim-runc-v2 runc ctr podman buildah iptables conntrack nft; do
  command -v "$b" >/dev/null || die "$b is not installed; run scripts/node/deps.sh"
done
[ -x /usr/lib/cni/bridge ] || die "the CNI plugins are not installed; run scripts/node/deps.sh"
TRAINER_IMAGE="docker.io/library/tandem-trainer:0.1"
OPERATOR_IMAGE="docker.io/library/tandem-operator:$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/tandem/Chart.yaml")"
PYTORCH_IMAGE="docker.io/library/tandem-pytorch-example:0.1"
for img in "$TRAINER_IMAGE" "$OPERATOR_IMAGE" "$PYTORCH_IMAGE"; do
  podman image exists "$img" || die "image $img is missing; build it first: make images"
done

if [ -f "$D/kubeconfig" ] && [ -f "$D/pids" ] && "$K8S_BIN/kubectl" --kubeconfig="$D/kubeconfig" \
  get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; then
  log "already running (state in $D); stop it with: make node-down"
  echo "export KUBECONFIG=$D/kubeconfig"
  exit 0
fi
if [ -e "$D" ]; then
  log "clearing a stopped node's state in $D"
  "$here/node-down.sh" >&2
fi
ip link show "$BRIDGE" >/dev/null 2>&1 && die "a link named $BRIDGE exists already; remove it or stop the node that made it"

mkdir -p "$D"/{host,logs,containerd,cni/net.d,cni/ipam,kubelet,kubelet-plugins,volumes,images}
touch "$D/.tandem-node"
: >"$D/pids"

# On any failure: show why, undo everything, keep the logs.
failed() {
  local comp="$1" msg="$2"
  echo "node-up: $msg" >&2
  if [ -f "$D/logs/$comp.log" ]; then
    echo "---- last lines of $D/logs/$comp.log ----" >&2
    tail -n 40 "$D/logs/$comp.log" >&2
    echo "----" >&2
  fi
  TANDEM_NODE_KEEP_LOGS=1 "$here/node-down.sh" >&2 || true
  exit 1
}
trap 'failed node-up "a step failed (line $LINENO)"' ERR

# ---- what the host looks like before -------------------------------------------------------------------
for s in "${SYSCTLS[@]}"; do
  f="/proc/sys/${s//.//}"
  [ -e "$f" ] && echo "$s $(cat "$f")" >>"$D/host/sysctls"
done
for h in /sys/fs/cgroup/*/; do
  [ -d "$h" ] && find "$h" -mindepth 1 -maxdepth 1 -type d -printf '%p\n'
done >"$D/host/cgroups" 2>/dev/null || true
ls /run/netns 2>/dev/null >"$D/host/netns" || true
findmnt -rn -o TARGET >"$D/host/mounts"
nft list tables 2>/dev/null >"$D/host/nft-tables" || true
for p in /run/containerd /var/lib/cni /usr/libexec/kubernetes /run/netns /etc/cni /etc/kueue; do
  [ -e "$p" ] && echo "$p"
done >"$D/host/paths"

# ---- network: the bridge, forwarding, bridged traffic through iptables ---------------------------------
ip link add "$BRIDGE" type bridge
ip addr add "$NODE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
modprobe br_netfilter 2>/dev/null || true
sysctl -qw net.ipv4.ip_forward=1
[ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || sysctl -qw net.bridge.bridge-nf-call-iptables=1
cat >"$D/cni/net.d/10-tandem.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "tandem",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$D/cni/ipam",
        "ranges": [[{"subnet": "$POD_SUBNET", "rangeStart": "${NODE_IP%.*}.10", "rangeEnd": "${NODE_IP%.*}.250", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF

# ---- control plane on the bridge address ---------------------------------------------------------------
log "control plane (apiserver on $NODE_IP)"
TANDEM_CLUSTER_DIR="$D/cluster" TANDEM_CLUSTER_KWOK=0 TANDEM_CLUSTER_ADDRESS="$NODE_IP" TANDEM_CLUSTER_SA_ADMISSION=1 \
  KCM_CONTROLLERS='*,-node-ipam-controller,-node-route-controller,-service-lb-controller,-cloud-node-lifecycle-controller' \
  TANDEM_CLUSTER_APISERVER_ARGS="--kubelet-preferred-address-types=InternalIP --kubelet-client-certificate=$D/cluster/pki/admin.crt --kubelet-client-key=$D/cluster/pki/admin.key" \
  "$repo/scripts/controlplane/cluster-up.sh" >"$D/logs/cluster-up.out" 2>"$D/logs/cluster-up.log" \
  || failed cluster-up "the control plane did not start"
cp "$D/cluster/kubeconfig" "$D/kubeconfig"
chmod 600 "$D/kubeconfig"
export KUBECONFIG="$D/kubeconfig"
k() { "$K8S_BIN/kubectl" "$@"; }

start() { # NAME CMD...: detached in its own session, log to logs/NAME.log, pid recorded
  local name="$1"
  shift
  setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$D/pids"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { kill -0 "$(awk -v n="$1" '$1 == n {print $2}' "$D/pids")" 2>/dev/null; }

# ---- containerd ----------------------------------------------------------------------------------------
cat >"$D/containerd/config.toml" <<EOF
version = 2
root = "$D/containerd/root"
state = "$D/containerd/state"
oom_score = 0
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$D/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Root here lacks CAP_SYS_RESOURCE: negative OOM scores (kubelet's for the pause container) fail.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$D/cni/net.d"
EOF
log "containerd"
start containerd containerd --config "$D/containerd/config.toml"
ctr() { command ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
deadline=$((SECONDS + 30))
until ctr version >/dev/null 2>&1; do
  alive containerd || failed containerd "containerd exited during start"
  [ "$SECONDS" -lt "$deadline" ] || failed containerd "containerd did not answer on $CONTAINERD_SOCK in 30 s"
  sleep 0.2
done

# ---- images --------------------------------------------------------------------------------------------
t=$SECONDS
"$here/node-images.sh" >&2
import() { # IMAGE: podman's copy into containerd's k8s.io namespace
  podman save --quiet --format docker-archive -o "$D/images/image.tar" "$1"
  ctr images import "$D/images/image.tar" >/dev/null
  rm -f "$D/images/image.tar"
}
for img in "$PAUSE_IMAGE" "$COREDNS_IMAGE" "$LOCAL_PATH_IMAGE" "$HELPER_IMAGE" "$TRAINER_IMAGE" "$OPERATOR_IMAGE" "$PYTORCH_IMAGE"; do
  import "$img"
done
"$here/storage-umount.sh"
log "images imported in $((SECONDS - t)) s"

# ---- kubelet -------------------------------------------------------------------------------------------
: >"$D/resolv.conf" # pods resolve through CoreDNS only; nothing is forwarded off the machine
cat >"$D/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $D/cluster/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# Root here lacks CAP_SYS_RESOURCE: no negative OOM score for the kubelet itself.
oomScoreAdj: 0
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $D/resolv.conf
registerNode: true
rotateCertificates: false
serializeImagePulls: false
# Images cannot be pulled again here: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: "1%", imagefs.available: "1%"}
volumePluginDir: $D/kubelet-plugins
maxPods: 110
EOF
log "kubelet, kube-scheduler, kube-proxy"
start kubelet "$K8S_BIN/kubelet" --config="$D/kubelet/config.yaml" --kubeconfig="$D/kubeconfig" \
  --root-dir="$D/kubelet/root" --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" --v=1
sched_port="$(free_port)"
start kube-scheduler "$K8S_BIN/kube-scheduler" --kubeconfig="$D/kubeconfig" \
  --authentication-kubeconfig="$D/kubeconfig" --authorization-kubeconfig="$D/kubeconfig" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port="$sched_port" --v=1
cat >"$D/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $D/kubeconfig}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
clusterCIDR: $POD_SUBNET
healthzBindAddress: 127.0.0.1:$(free_port)
metricsBindAddress: 127.0.0.1:$(free_port)
nodePortAddresses: ["$NODE_IP/32"]
# Leave the host's conntrack limits and timeouts alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: false, masqueradeAll: false}
EOF
start kube-proxy "$K8S_BIN/kube-proxy" --config="$D/kube-proxy.yaml" --v=1

deadline=$((SECONDS + TIMEOUT))
until k get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; do
  for c in kubelet kube-scheduler kube-proxy containerd; do alive "$c" || failed "$c" "$c exited during start"; done
  [ "$SECONDS" -lt "$deadline" ] || failed kubelet "node $NODE_NAME not Ready after ${TIMEOUT}s"
  sleep 0.5
done
log "node $NODE_NAME Ready after $((SECONDS - start_time)) s"

# ---- cluster add-ons: DNS and storage ------------------------------------------------------------------
sed -e "s|@DNS_IP@|$DNS_IP|g" -e "s|@COREDNS_IMAGE@|$COREDNS_IMAGE|g" -e "s|@LOCAL_PATH_IMAGE@|$LOCAL_PATH_IMAGE|g" \
  -e "s|@HELPER_IMAGE@|$HELPER_IMAGE|g" -e "s|@VOLUMES@|$D/volumes|g" "$here/addons.yaml" >"$D/addons.yaml"
k apply --server-side -f "$D/addons.yaml" >"$D/logs/addons.log"
for d in kube-system/coredns local-path-storage/local-path-provisioner; do
  if ! k -n "${d%/*}" rollout status "deployment/${d#*/}" --timeout="$((deadline - SECONDS > 10 ? deadline - SECONDS : 10))s" \
    >>"$D/logs/addons.log" 2>&1; then
    k -n "${d%/*}" describe pods >>"$D/logs/addons.log" 2>&1 || true
    failed addons "deployment $d did not become available"
  fi
done
# ---- schedulers users run beside the default one (issue 41) ---------------------------------------------
# scheduler-plugins' kube-scheduler as a second scheduler, `scheduler-plugins-scheduler`, with the
# coscheduling plugin (gangs of `scheduling.x-k8s.io` PodGroups), and its controller (PodGroup status),
# as that project's "second scheduler" install runs them; and Kueue's manager (kueue-up.sh). Their CRDs
# come from the same modules (build.sh copies them to $K8S_HOME/crds). TANDEM_NODE_SCHEDULERS=0 skips them.
if [ "${TANDEM_NODE_SCHEDULERS:-1}" = 1 ]; then
  for b in scheduler-plugins-scheduler scheduler-plugins-controller kueue; do
    [ -x "$K8S_BIN/$b" ] || failed schedulers "$K8S_BIN/$b is missing; build it first: make node-bins"
  done
  k apply --server-side -f "$K8S_HOME/crds/scheduler-plugins" >"$D/logs/schedulers.log"
  k wait --for condition=established --timeout=60s -f "$K8S_HOME/crds/scheduler-plugins" >>"$D/logs/schedulers.log"
  cat >"$D/scheduler-plugins.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection: {leaderElect: false}
clientConnection: {kubeconfig: $D/kubeconfig}
profiles:
- schedulerName: scheduler-plugins-scheduler
  plugins:
    multiPoint:
      enabled: [{name: Coscheduling}]
    queueSort:
      enabled: [{name: Coscheduling}]
      disabled: [{name: "*"}]
  pluginConfig:
  - name: Coscheduling
    args: {permitWaitingTimeSeconds: 10}
EOF
  start scheduler-plugins-scheduler "$K8S_BIN/scheduler-plugins-scheduler" --config="$D/scheduler-plugins.yaml" \
    --authentication-kubeconfig="$D/kubeconfig" --authorization-kubeconfig="$D/kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$(free_port)" --v=1
  KUBECONFIG="$D/kubeconfig" start scheduler-plugins-controller "$K8S_BIN/scheduler-plugins-controller" \
    --metricsAddr="127.0.0.1:$(free_port)" --probeAddr="127.0.0.1:$(free_port)"
  # Kueue's manager, configured as its Deployment is but on this host: its CRDs (the base ones, no
  # conversion webhook), no webhook registered with the API server (the operator writes complete
  # Workloads; the manager still serves its webhook port, on loopback, with a self-signed
  # certificate), no visibility API, metrics off. It reads its metrics certificate from a fixed
  # path, /etc/kueue/metrics/certs, which node-down removes.
  k apply --server-side -f "$K8S_HOME/crds/kueue" >>"$D/logs/schedulers.log"
  k wait --for condition=established --timeout=60s -f "$K8S_HOME/crds/kueue" >>"$D/logs/schedulers.log"
  k create namespace kueue-system >>"$D/logs/schedulers.log"
  mkdir -p "$D/kueue/certs" /etc/kueue/metrics/certs
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 -subj /CN=kueue \
    -keyout "$D/kueue/certs/tls.key" -out "$D/kueue/certs/tls.crt" 2>>"$D/logs/schedulers.log"
  cp "$D/kueue/certs/tls.key" "$D/kueue/certs/tls.crt" /etc/kueue/metrics/certs/
  kueue_health="$(free_port)"
  cat >"$D/kueue/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:$kueue_health"}
metrics: {bindAddress: "0"}
webhook: {port: $(free_port), host: 127.0.0.1, certDir: $D/kueue/certs}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
integrations: {frameworks: [batch/job], externalFrameworks: [TrainingJob.v1alpha1.tandem.dev]}
featureGates: {VisibilityOnDemand: false}
EOF
  KUBECONFIG="$D/kubeconfig" start kueue "$K8S_BIN/kueue" --config="$D/kueue/config.yaml"
  until curl -sf "http://127.0.0.1:$kueue_health/readyz" >/dev/null; do
    alive kueue || failed kueue "Kueue's manager exited during start"
    [ "$SECONDS" -lt "$deadline" ] || failed kueue "Kueue's manager not ready after ${TIMEOUT}s"
    sleep 0.5
  done
  for c in scheduler-plugins-scheduler scheduler-plugins-controller; do
    alive "$c" || failed "$c" "$c exited during start"
  done
  log "scheduler-plugins' scheduler and controller, and Kueue, running"
fi
trap - ERR
log "node ready in $((SECONDS - start_time)) s (state in $D, logs in $D/logs; kubectl and helm: export PATH=$K8S_BIN:\$PATH)"
echo "export KUBECONFIG=$D/kubeconfig"
