#!/usr/bin/env bash
# Builds the control plane for Tandem's cluster tests from the Go module proxy with the ordinary `go` client:
# kube-apiserver, kube-controller-manager and kubectl (k8s.io/kubernetes through a wrapper module that
# replaces its staging modules), etcd (through a wrapper module, because etcd's go.mod has replace lines),
# kwok and helm. Binaries go to ${TANDEM_CACHE:-$HOME/.cache/tandem}/k8s/v<k8s version>/bin, never into the
# repository; each is rebuilt only when it is missing or reports another version.
#
# `node` builds what the real node of scripts/node/ adds: kubelet, kube-scheduler and kube-proxy (same
# wrapper), CoreDNS (a wrapper module with a reduced plugin set) and Rancher's local-path-provisioner,
# and the schedulers the node tests meet: Kueue's manager and scheduler-plugins' kube-scheduler and
# controller (their CRDs are copied from the modules next to the binaries, under $K8S_HOME/crds/).
#
# Usage: scripts/controlplane/build.sh [all|k8s|etcd|kwok|helm|node|schedulers]...   (default: all)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.sh
source "$here/versions.sh"

# Go's usual install place, when it is not on PATH.
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || {
  echo "build.sh: no 'go' on PATH; install Go >= 1.26 (on these machines: export PATH=/usr/local/go/bin:\$PATH)" >&2
  exit 1
}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
# Two busy cores: a bounded parallelism keeps the link step's memory in check.
BUILD_P="${BUILD_P:-2}"
mkdir -p "$K8S_BIN"

log() { echo "[build.sh $(date -u +%H:%M:%S)] $*" >&2; }

# have BIN PATTERN: true when BIN exists and its version output matches PATTERN.
have() {
  local bin="$K8S_BIN/$1"
  [ -x "$bin" ] || return 1
  case "$1" in
    kubectl) "$bin" version --client 2>/dev/null | grep -q "$2" ;;
    helm) "$bin" version --short 2>/dev/null | grep -q "$2" ;;
    coredns) "$bin" -version 2>/dev/null | grep -q "$2" ;;
    local-path-provisioner) "$bin" --version 2>/dev/null | grep -q "$2" ;;
    # No version flag: the build writes the version it built beside the binary.
    kueue | scheduler-plugins-*) grep -qx "$2" "$bin.version" 2>/dev/null ;;
    *) "$bin" --version 2>/dev/null | grep -q "$2" ;;
  esac
}

# The wrapper module of k8s.io/kubernetes at $K8S_HOME/src/kubernetes: it replaces every staging module
# with its published version, so that `go build k8s.io/kubernetes/cmd/...` works outside k/k's tree.
# Prepared once (with its go.sum) and kept; one left half-made by a failed run is redone. Tools
# (`go get -tool`) are added to it as they are first needed.
k8s_wrapper() {
  local w="$K8S_HOME/src/kubernetes"
  [ -f "$w/.complete" ] || rm -rf "$w"
  mkdir -p "$w"
  cd "$w"
  if [ ! -f .complete ]; then
    # k/k's own go.mod (served as .mod) names the staging modules and its godebug line.
    local kmod
    kmod="$(go mod download -json "k8s.io/kubernetes@v$K8S_VERSION" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    go mod init local/tandem-k8s-bins
    local staging="v0.${K8S_VERSION#1.}" m n=0
    for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*|\1|p' "$kmod"); do
      go mod edit -replace="$m=$m@$staging"
      n=$((n + 1))
    done
    [ "$n" -gt 0 ] || { echo "build.sh: found no staging replaces in $kmod" >&2; rm -f go.mod; exit 1; }
    local gd
    gd="$(sed -n 's/^godebug[[:space:]]\+\([a-z0-9]*=[^[:space:]]*\).*/\1/p' "$kmod")"
    [ -z "$gd" ] || go mod edit -godebug="$gd"
    go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION"
    touch .complete
  fi
  local cmd missing=()
  for cmd in "$@"; do
    grep -q "^tool k8s.io/kubernetes/cmd/$cmd\$\|^[[:space:]]k8s.io/kubernetes/cmd/$cmd\$" go.mod \
      || missing+=("k8s.io/kubernetes/cmd/$cmd@v$K8S_VERSION")
  done
  [ ${#missing[@]} -eq 0 ] || go get -tool "${missing[@]}"
}

# k8s_build CMD...: go build k8s.io/kubernetes/cmd/CMD... into $K8S_BIN, version-stamped like
# hack/lib/version.sh, so tools and people read the real one.
k8s_build() {
  local minor="${K8S_VERSION#1.}" ldf="-s -w" kv cmd pkgs=()
  minor="${minor%%.*}"
  for kv in "gitVersion=v$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
    ldf="$ldf -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  for cmd in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd"); done
  go build -p "$BUILD_P" -trimpath -ldflags "$ldf" -o "$K8S_BIN/" "${pkgs[@]}"
}

build_k8s() {
  if have kube-apiserver "Kubernetes v$K8S_VERSION\$" && have kube-controller-manager "Kubernetes v$K8S_VERSION\$" \
    && have kubectl "v$K8S_VERSION"; then
    log "kubernetes v$K8S_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "kubernetes v$K8S_VERSION: building kube-apiserver, kube-controller-manager, kubectl (wrapper in $K8S_HOME/src/kubernetes)"
  k8s_wrapper
  k8s_build kube-apiserver kube-controller-manager kubectl
  "$K8S_BIN/kube-apiserver" --version
  log "kubernetes v$K8S_VERSION: built in $((SECONDS - start)) s"
}

# The node of `make node-up` (scripts/node): kubelet, kube-scheduler and kube-proxy from the same wrapper
# (so the apiserver's build cache serves most of it).
build_node() {
  if have kubelet "Kubernetes v$K8S_VERSION\$" && have kube-scheduler "Kubernetes v$K8S_VERSION\$" \
    && have kube-proxy "Kubernetes v$K8S_VERSION\$"; then
    log "kubelet, kube-scheduler, kube-proxy v$K8S_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "kubernetes v$K8S_VERSION: building kubelet, kube-scheduler, kube-proxy"
  k8s_wrapper kubelet kube-scheduler kube-proxy
  k8s_build kubelet kube-scheduler kube-proxy
  "$K8S_BIN/kubelet" --version
  log "kubelet, kube-scheduler, kube-proxy v$K8S_VERSION: built in $((SECONDS - start)) s"
}

# CoreDNS with the plugins of scripts/node/coredns/main.go, its client-go at the control plane's
# version (so most of it comes from the kubelet's build cache).
build_coredns() {
  if have coredns "CoreDNS-$COREDNS_VERSION\$"; then
    log "coredns v$COREDNS_VERSION: present"
    return
  fi
  local start=$SECONDS w="$K8S_HOME/src/coredns-v$COREDNS_VERSION"
  log "coredns v$COREDNS_VERSION: building (wrapper in $w)"
  [ -f "$w/.complete" ] || rm -rf "$w"
  mkdir -p "$w"
  cp "$here/../node/coredns/main.go" "$w/main.go"
  cd "$w"
  if [ ! -f .complete ]; then
    go mod init local/tandem-coredns
    go get "github.com/coredns/coredns@v$COREDNS_VERSION" "k8s.io/client-go@v0.${K8S_VERSION#1.}" \
      "k8s.io/api@v0.${K8S_VERSION#1.}" "k8s.io/apimachinery@v0.${K8S_VERSION#1.}"
    go mod tidy
    touch .complete
  fi
  go build -p "$BUILD_P" -trimpath -ldflags "-s -w" -o "$K8S_BIN/coredns" .
  "$K8S_BIN/coredns" -version | head -n 1
  log "coredns v$COREDNS_VERSION: built in $((SECONDS - start)) s"
}

# Rancher's local-path-provisioner: the storage class of the test node (what kind clusters use).
build_local_path() {
  if have local-path-provisioner "$LOCAL_PATH_VERSION"; then
    log "local-path-provisioner v$LOCAL_PATH_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "local-path-provisioner v$LOCAL_PATH_VERSION: building"
  GOBIN="$K8S_BIN" go install -p "$BUILD_P" -trimpath \
    -ldflags "-s -w -X main.VERSION=v$LOCAL_PATH_VERSION" \
    "github.com/rancher/local-path-provisioner@v$LOCAL_PATH_VERSION"
  log "local-path-provisioner v$LOCAL_PATH_VERSION: built in $((SECONDS - start)) s"
}

# Kueue's manager (`kueue`), and its CRDs from the same module into $K8S_HOME/crds/kueue.
build_kueue() {
  local crds="$K8S_HOME/crds/kueue"
  if have kueue "$KUEUE_VERSION" && [ -d "$crds" ]; then
    log "kueue v$KUEUE_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "kueue v$KUEUE_VERSION: building"
  GOBIN="$K8S_HOME/src/kueue-bin" go install -p "$BUILD_P" -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@v$KUEUE_VERSION"
  mv "$K8S_HOME/src/kueue-bin/kueue" "$K8S_BIN/kueue"
  echo "$KUEUE_VERSION" >"$K8S_BIN/kueue.version"
  rm -rf "$crds" && mkdir -p "$crds"
  cp "$(go env GOMODCACHE)/sigs.k8s.io/kueue@v$KUEUE_VERSION"/config/components/crd/bases/*.yaml "$crds/"
  chmod -R u+w "$crds"
  log "kueue v$KUEUE_VERSION: built in $((SECONDS - start)) s"
}

# scheduler-plugins' kube-scheduler (with the coscheduling plugin) and controller, as
# `scheduler-plugins-scheduler` and `scheduler-plugins-controller`, built inside a copy of the module
# (its go.mod replaces the staging modules), and its CRDs into $K8S_HOME/crds/scheduler-plugins.
build_scheduler_plugins() {
  local v="$SCHEDULER_PLUGINS_VERSION" crds="$K8S_HOME/crds/scheduler-plugins"
  if have scheduler-plugins-scheduler "$v" && have scheduler-plugins-controller "$v" && [ -d "$crds" ]; then
    log "scheduler-plugins v$v: present"
    return
  fi
  local start=$SECONDS w="$K8S_HOME/src/scheduler-plugins-v$v" dir kminor="${K8S_VERSION#1.}"
  kminor="${kminor%%.*}"
  log "scheduler-plugins v$v: building (copy of the module in $w)"
  if [ ! -f "$w/.complete" ]; then
    rm -rf "$w"
    dir="$(go mod download -json "sigs.k8s.io/scheduler-plugins@v$v" \
      | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
    cp -r "$dir" "$w"
    chmod -R u+w "$w"
    # Build it against the control plane's Kubernetes (not every staging module of the release's own
    # patch version is served, and the node should run one Kubernetes): same minor, by design.
    local kpatch="${K8S_VERSION#*.*.}"
    sed -i -E "s#^(.*k8s\.io/[A-Za-z0-9._-]+ v0\.$kminor)\.[0-9]+\$#\1.$kpatch#; s#^(.*k8s\.io/kubernetes v1\.$kminor)\.[0-9]+\$#\1.$kpatch#" "$w/go.mod"
    (cd "$w" && go mod tidy)
    touch "$w/.complete"
  fi
  cd "$w"
  # Stamped with the Kubernetes version it is built against: kube-scheduler checks its emulation
  # version against it. The plugins' own version goes beside each binary.
  local ldf="-s -w" kv
  for kv in "gitVersion=v$K8S_VERSION" gitMajor=1 "gitMinor=$kminor"; do
    ldf="$ldf -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  go build -p "$BUILD_P" -trimpath -ldflags "$ldf" -o "$K8S_BIN/scheduler-plugins-scheduler" ./cmd/scheduler
  go build -p "$BUILD_P" -trimpath -ldflags "$ldf" -o "$K8S_BIN/scheduler-plugins-controller" ./cmd/controller
  echo "$v" >"$K8S_BIN/scheduler-plugins-scheduler.version"
  echo "$v" >"$K8S_BIN/scheduler-plugins-controller.version"
  rm -rf "$crds" && mkdir -p "$crds"
  cp config/crd/bases/scheduling.x-k8s.io_podgroups.yaml config/crd/bases/scheduling.x-k8s.io_elasticquotas.yaml "$crds/"
  log "scheduler-plugins v$v: built in $((SECONDS - start)) s"
}

build_etcd() {
  if have etcd "etcd Version: $ETCD_VERSION\$"; then
    log "etcd v$ETCD_VERSION: present"
    return
  fi
  local start=$SECONDS w="$K8S_HOME/src/etcd-v$ETCD_VERSION"
  log "etcd v$ETCD_VERSION: building (wrapper in $w)"
  [ -f "$w/.complete" ] || rm -rf "$w"
  mkdir -p "$w"
  cd "$w"
  if [ ! -f .complete ]; then
    go mod init local/tandem-etcd-bin
    go get -tool "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
    touch .complete
  fi
  go build -p "$BUILD_P" -trimpath -ldflags "-s -w" -o "$K8S_BIN/etcd" go.etcd.io/etcd/server/v3
  "$K8S_BIN/etcd" --version
  log "etcd v$ETCD_VERSION: built in $((SECONDS - start)) s"
}

build_kwok() {
  if have kwok "v$KWOK_VERSION"; then
    log "kwok v$KWOK_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "kwok v$KWOK_VERSION: building"
  GOBIN="$K8S_BIN" go install -p "$BUILD_P" -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION"
  # kwok needs its stage definitions; keep the ones of this version next to the binary.
  local src
  src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize"
  rm -rf "$K8S_HOME/kwok-kustomize"
  cp -r "$src" "$K8S_HOME/kwok-kustomize"
  chmod -R u+w "$K8S_HOME/kwok-kustomize"
  log "kwok v$KWOK_VERSION: built in $((SECONDS - start)) s"
}

build_helm() {
  if have helm "v$HELM_VERSION"; then
    log "helm v$HELM_VERSION: present"
    return
  fi
  local start=$SECONDS
  log "helm v$HELM_VERSION: building"
  GOBIN="$K8S_BIN" go install -p "$BUILD_P" -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" \
    "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  "$K8S_BIN/helm" version --short
  log "helm v$HELM_VERSION: built in $((SECONDS - start)) s"
}

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(all)
for t in "${targets[@]}"; do
  case "$t" in
    all) (build_etcd) && (build_k8s) && (build_kwok) && (build_helm) ;;
    k8s) (build_k8s) ;;
    etcd) (build_etcd) ;;
    kwok) (build_kwok) ;;
    helm) (build_helm) ;;
    # The real node of `make node-up` (scripts/node/): not part of `all`, which the cluster tests need.
    node) (build_node) && (build_coredns) && (build_local_path) && (build_kueue) && (build_scheduler_plugins) ;;
    schedulers) (build_kueue) && (build_scheduler_plugins) ;;
    *) echo "build.sh: unknown target '$t'; use all, k8s, etcd, kwok, helm, node or schedulers" >&2; exit 2 ;;
  esac
done
log "binaries in $K8S_BIN"
