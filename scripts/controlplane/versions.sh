# Pinned versions of the control-plane binaries for Tandem's cluster tests (sourced, not run).
# Change a version here and the next `make cluster-bins` builds it into a fresh cache folder.
# K8S_VERSION's minor must match the k8s-openapi feature in the root Cargo.toml (v1_34).
K8S_VERSION="${K8S_VERSION:-1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
HELM_VERSION="${HELM_VERSION:-3.22.0}"
# The real node (scripts/node): CoreDNS whose client-go matches K8S_VERSION's minor, and the storage
# class's provisioner.
COREDNS_VERSION="${COREDNS_VERSION:-1.14.0}"
LOCAL_PATH_VERSION="${LOCAL_PATH_VERSION:-0.0.30}"
# The schedulers the node tests meet (issue 41): Kueue's manager, and scheduler-plugins' kube-scheduler
# (with the coscheduling plugin) and controller, whose minor matches K8S_VERSION's.
KUEUE_VERSION="${KUEUE_VERSION:-0.17.0}"
SCHEDULER_PLUGINS_VERSION="${SCHEDULER_PLUGINS_VERSION:-0.34.7}"

TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
K8S_HOME="$TANDEM_CACHE/k8s/v$K8S_VERSION"
K8S_BIN="$K8S_HOME/bin"
