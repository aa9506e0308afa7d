#!/usr/bin/env bash
# Builds the control plane for Tandem's cluster tests from the Go module proxy with the ordinary `go` client:
# kube-apiserver, kube-controller-manager and kubectl (k8s.io/kubernetes through a wrapper module that
# replaces its staging modules), etcd (through a wrapper module, because etcd's go.mod has replace lines),
# kwok and helm. Binaries go to ${TANDEM_CACHE:-$HOME/.cache/tandem}/k8s/v<k8s version>/bin, never into the
# repository; each is rebuilt only when it is missing or reports another version.
#
# Usage: scripts/controlplane/build.sh [all|k8s|etcd|kwok|helm]...   (default: all)
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
    *) "$bin" --version 2>/dev/null | grep -q "$2" ;;
  esac
}

build_k8s() {
  if have kube-apiserver "Kubernetes v$K8S_VERSION\$" && have kube-controller-manager "Kubernetes v$K8S_VERSION\$" \
    && have kubectl "v$K8S_VERSION"; then
    log "kubernetes v$K8S_VERSION: present"
    return
  fi
  local start=$SECONDS w="$K8S_HOME/src/kubernetes"
  log "kubernetes v$K8S_VERSION: building kube-apiserver, kube-controller-manager, kubectl (wrapper in $w)"
  # The wrapper is kept (with its go.sum) for rebuilds; one left half-made by a failed run is redone.
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
  # Stamp the version like hack/lib/version.sh, so tools and people read the real one.
  local minor="${K8S_VERSION#1.}" ldf="-s -w" kv
  minor="${minor%%.*}"
  for kv in "gitVersion=v$K8S_VERSION" gitMajor=1 "gitMinor=$minor" gitTreeState=clean; do
    ldf="$ldf -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  go build -p "$BUILD_P" -trimpath -ldflags "$ldf" -o "$K8S_BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl
  "$K8S_BIN/kube-apiserver" --version
  log "kubernetes v$K8S_VERSION: built in $((SECONDS - start)) s"
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
    *) echo "build.sh: unknown target '$t'; use all, k8s, etcd, kwok or helm" >&2; exit 2 ;;
  esac
done
log "binaries in $K8S_BIN"
