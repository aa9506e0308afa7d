# The pinned Prometheus of the real node's metrics test (sourced, not run). Prometheus's Go module
# numbers its releases v0.<major*100+minor>.<patch> (v0.316.0 is Prometheus 3.16.0). Debian's
# `prometheus` package is built without the Kubernetes service discovery that users' scrape
# configs rely on, so the test runs upstream's, built from the Go module proxy. Change it here and
# the next `make prometheus-bin` builds it into a fresh cache folder.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"

TANDEM_CACHE="${TANDEM_CACHE:-$HOME/.cache/tandem}"
PROMETHEUS_HOME="$TANDEM_CACHE/prometheus/$PROMETHEUS_VERSION"
PROMETHEUS_BIN="$PROMETHEUS_HOME/bin/prometheus"
