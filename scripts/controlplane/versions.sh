# Pinned versions of the control-plane binaries for Tandem's cluster tests (sourced, not run).
# Change a version here and the next `make cluster-bins` builds it into a fresh cache folder.
# K8S_VERSION's minor must match the k8s-openapi feature in the root Cargo.toml (v1_34).
K8S_VERSION="${K8S_VERSION:-1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
HELM_VERSION="${HELM_VERSION:-3.22.0}"

TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
K8S_HOME="$TANDEM_CACHE/k8s/v$K8S_VERSION"
K8S_BIN="$K8S_HOME/bin"
