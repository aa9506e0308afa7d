#!/usr/bin/env bash
# Starts Tandem's test control plane on loopback: etcd, kube-apiserver (client-certificate authentication,
# RBAC authorization), kube-controller-manager (garbage collection, namespace deletion, service accounts,
# workload controllers) and kwok (fake nodes, only those annotated kwok.x-k8s.io/node=fake).
#
# A CA, the serving certificate, an admin client certificate (group system:masters) and the service-account
# key pair are made fresh at every start. Every port is a free loopback port picked at start. State lives
# in $TANDEM_CLUSTER_DIR (default /tmp/tandem-cluster), outside the repository; cluster-down.sh stops the
# processes recorded there and removes it.
#
# Waits for /readyz and for the controller manager to create the default ServiceAccount, then prints as
# its last line:  export KUBECONFIG=<path>
# Exits non-zero, with the reason and the failing component's log tail, when anything does not come up.
#
# Environment: TANDEM_CLUSTER_DIR, TANDEM_CACHE, TANDEM_CLUSTER_KWOK=0 (do not start kwok),
#              TANDEM_CLUSTER_TIMEOUT (seconds to wait for readiness, default 120),
#              KCM_CONTROLLERS (the controller manager's --controllers).
# For a real node (scripts/node/node-up.sh): TANDEM_CLUSTER_ADDRESS (default 127.0.0.1), the address the
# apiserver binds, advertises (the endpoint of the `kubernetes` Service, which pods reach through
# kube-proxy) and the kubeconfig names; TANDEM_CLUSTER_SA_ADMISSION=1 keeps the ServiceAccount admission
# plugin on (pods get their ServiceAccount token mounted; off by default, since kwok's pods have none);
# TANDEM_CLUSTER_APISERVER_ARGS, extra kube-apiserver flags (split on spaces).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.sh
source "$here/versions.sh"
D="${TANDEM_CLUSTER_DIR:-/tmp/tandem-cluster}"
TIMEOUT="${TANDEM_CLUSTER_TIMEOUT:-120}"
START_KWOK="${TANDEM_CLUSTER_KWOK:-1}"
ADDRESS="${TANDEM_CLUSTER_ADDRESS:-127.0.0.1}"
read -r -a EXTRA_APISERVER_ARGS <<<"${TANDEM_CLUSTER_APISERVER_ARGS:-}"
DISABLE_ADMISSION=ServiceAccount
[ "${TANDEM_CLUSTER_SA_ADMISSION:-0}" != 1 ] || DISABLE_ADMISSION=""
start_time=$SECONDS

die() {
  echo "cluster-up: $*" >&2
  exit 1
}
log() { echo "cluster-up: $*" >&2; }

for b in etcd kube-apiserver kube-controller-manager kubectl; do
  [ -x "$K8S_BIN/$b" ] || die "$K8S_BIN/$b is missing; build the binaries first: make cluster-bins"
done
if [ "$START_KWOK" = 1 ]; then
  [ -x "$K8S_BIN/kwok" ] || die "$K8S_BIN/kwok is missing; build the binaries first: make cluster-bins"
fi
command -v openssl >/dev/null || die "openssl is not installed; run scripts/install-deps.sh"
command -v curl >/dev/null || die "curl is not installed; run scripts/install-deps.sh"

# A control plane recorded in $D that is still alive is reused rather than doubled.
if [ -e "$D" ] && [ ! -f "$D/.tandem-cluster" ]; then
  die "$D exists but was not made by cluster-up; remove it or set TANDEM_CLUSTER_DIR to another path"
fi
if [ -f "$D/kubeconfig" ] && [ -f "$D/pids" ]; then
  alive=1
  while read -r _ pid; do kill -0 "$pid" 2>/dev/null || alive=0; done <"$D/pids"
  if [ "$alive" = 1 ] && curl -sf --cacert "$D/pki/ca.crt" --cert "$D/pki/admin.crt" --key "$D/pki/admin.key" \
    "$(cat "$D/server")/readyz" >/dev/null; then
    log "already running (state in $D); stop it with: make cluster-down"
    echo "export KUBECONFIG=$D/kubeconfig"
    exit 0
  fi
fi
if [ -e "$D" ]; then
  log "clearing the stopped control plane's state in $D"
  "$here/cluster-down.sh" 2>/dev/null
fi

mkdir -p "$D"/{pki,etcd,logs}
touch "$D/.tandem-cluster"
: >"$D/pids"
chmod 700 "$D"

# On failure: show why, stop what was started, keep the logs in $D/logs for a look.
failed() {
  local comp="$1" msg="$2"
  echo "cluster-up: $msg" >&2
  if [ -f "$D/logs/$comp.log" ]; then
    echo "---- last lines of $D/logs/$comp.log ----" >&2
    tail -n 30 "$D/logs/$comp.log" >&2
    echo "----" >&2
  fi
  TANDEM_CLUSTER_KEEP_LOGS=1 "$here/cluster-down.sh" >/dev/null 2>&1 || true
  exit 1
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# ---- certificates -------------------------------------------------------------------------------------
P="$D/pki"
ossl() { openssl "$@" >>"$D/logs/openssl.log" 2>&1 || failed openssl "openssl $1 failed"; }
ossl req -x509 -newkey rsa:2048 -nodes -keyout "$P/ca.key" -out "$P/ca.crt" -days 7 -subj "/CN=tandem-test-ca"
# In-cluster clients reach the apiserver as the `kubernetes` Service (its first address, 10.0.0.1).
sans="DNS:localhost,IP:127.0.0.1,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
sans="$sans,DNS:kubernetes.default.svc.cluster.local"
[ "$ADDRESS" = 127.0.0.1 ] || sans="$sans,IP:$ADDRESS"
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$sans" >"$P/serving.ext"
ossl req -newkey rsa:2048 -nodes -keyout "$P/apiserver.key" -out "$P/apiserver.csr" -subj "/CN=kube-apiserver"
ossl x509 -req -in "$P/apiserver.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 7 \
  -out "$P/apiserver.crt" -extfile "$P/serving.ext"
printf 'extendedKeyUsage=clientAuth\n' >"$P/client.ext"
ossl req -newkey rsa:2048 -nodes -keyout "$P/admin.key" -out "$P/admin.csr" -subj "/O=system:masters/CN=tandem-admin"
ossl x509 -req -in "$P/admin.csr" -CA "$P/ca.crt" -CAkey "$P/ca.key" -CAcreateserial -days 7 \
  -out "$P/admin.crt" -extfile "$P/client.ext"
ossl genrsa -out "$P/sa.key" 2048
ossl rsa -in "$P/sa.key" -pubout -out "$P/sa.pub"

# ---- processes ----------------------------------------------------------------------------------------
# start NAME CMD...: run detached in its own session (so make's shell ending does not stop it), log to logs/.
start() {
  local name="$1"
  shift
  setsid "$@" >"$D/logs/$name.log" 2>&1 </dev/null &
  echo "$name $!" >>"$D/pids"
}
alive() { kill -0 "$(awk -v n="$1" '$1 == n {print $2}' "$D/pids")" 2>/dev/null; }

ETCD_PORT="$(free_port)"
ETCD_PEER_PORT="$(free_port)"
API_PORT="$(free_port)"
ETCD_URL="http://127.0.0.1:$ETCD_PORT"
SERVER="https://$ADDRESS:$API_PORT"
echo "$SERVER" >"$D/server"

start etcd "$K8S_BIN/etcd" --name=tandem --data-dir="$D/etcd" \
  --listen-client-urls="$ETCD_URL" --advertise-client-urls="$ETCD_URL" \
  --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
  --initial-cluster="tandem=http://127.0.0.1:$ETCD_PEER_PORT" --unsafe-no-fsync=true --log-level=warn

start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers="$ETCD_URL" --bind-address="$ADDRESS" --advertise-address="$ADDRESS" --secure-port="$API_PORT" \
  --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --cert-dir="$P" \
  --client-ca-file="$P/ca.crt" --authorization-mode=RBAC --allow-privileged=true \
  --service-cluster-ip-range=10.0.0.0/24 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
  --disable-admission-plugins="$DISABLE_ADMISSION" "${EXTRA_APISERVER_ARGS[@]}" --v=1

cat >"$D/kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: tandem-test
  cluster:
    server: $SERVER
    certificate-authority-data: $(base64 -w0 <"$P/ca.crt")
users:
- name: tandem-admin
  user:
    client-certificate-data: $(base64 -w0 <"$P/admin.crt")
    client-key-data: $(base64 -w0 <"$P/admin.key")
contexts:
- name: tandem-test
  context:
    cluster: tandem-test
    user: tandem-admin
current-context: tandem-test
KCFG
chmod 600 "$D/kubeconfig"

deadline=$((SECONDS + TIMEOUT))
until curl -sf --cacert "$P/ca.crt" --cert "$P/admin.crt" --key "$P/admin.key" "$SERVER/readyz" >/dev/null 2>&1; do
  alive etcd || failed etcd "etcd exited during start"
  alive kube-apiserver || failed kube-apiserver "kube-apiserver exited during start"
  [ "$SECONDS" -lt "$deadline" ] || failed kube-apiserver "kube-apiserver not ready at $SERVER/readyz after ${TIMEOUT}s"
  sleep 0.5
done
log "kube-apiserver ready at $SERVER after $((SECONDS - start_time)) s"

start kube-controller-manager "$K8S_BIN/kube-controller-manager" --kubeconfig="$D/kubeconfig" \
  --leader-elect=false --bind-address=127.0.0.1 --secure-port=0 \
  --controllers="${KCM_CONTROLLERS:-garbage-collector-controller,namespace-controller,serviceaccount-controller,deployment-controller,replicaset-controller,statefulset-controller,job-controller}" \
  --root-ca-file="$P/ca.crt" --service-account-private-key-file="$P/sa.key" --use-service-account-credentials=false \
  --concurrent-gc-syncs=5 --v=1

if [ "$START_KWOK" = 1 ]; then
  # Stages from kwok's own tree at the pinned version: nodes come up and heartbeat, pods become Ready,
  # complete, are deleted, and can be failed on purpose with the chaos label.
  K="$K8S_HOME/kwok-kustomize/stage"
  stages=("$K/node/fast/node-initialize.yaml" "$K/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"
    "$K/pod/fast/pod-ready.yaml" "$K/pod/fast/pod-complete.yaml" "$K/pod/fast/pod-delete.yaml"
    "$K/pod/chaos/pod-container-running-failed.yaml")
  : >"$D/kwok-stages.yaml"
  for s in "${stages[@]}"; do
    [ -f "$s" ] || failed kwok "kwok stage file $s is missing; rebuild with: scripts/controlplane/build.sh kwok"
    { cat "$s"; echo "---"; } >>"$D/kwok-stages.yaml"
  done
  KWOK_PORT="$(free_port)"
  start kwok "$K8S_BIN/kwok" --kubeconfig="$D/kubeconfig" --config="$D/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --node-port="$KWOK_PORT" --server-address="127.0.0.1:$KWOK_PORT" \
    --cidr=10.244.0.0/16 --node-lease-duration-seconds=40
fi

# The controller manager is working once its service-account controller made the default SA.
until "$K8S_BIN/kubectl" --kubeconfig="$D/kubeconfig" -n default get serviceaccount default >/dev/null 2>&1; do
  alive kube-controller-manager || failed kube-controller-manager "kube-controller-manager exited during start"
  [ "$SECONDS" -lt "$deadline" ] \
    || failed kube-controller-manager "kube-controller-manager made no default ServiceAccount in ${TIMEOUT}s"
  sleep 0.5
done
if [ "$START_KWOK" = 1 ]; then
  sleep 1
  alive kwok || failed kwok "kwok exited during start"
fi
log "control plane ready in $((SECONDS - start_time)) s (state in $D, logs in $D/logs)"
log "kubectl and helm of this version: export PATH=$K8S_BIN:\$PATH"
echo "export KUBECONFIG=$D/kubeconfig"
