#!/usr/bin/env bash
# Builds Prometheus (github.com/prometheus/prometheus/cmd/prometheus), which the real node's metrics
# test runs on this host against the TrainingJobs' pods, from the Go module proxy with the ordinary
# `go` client, into
#   ${TANDEM_CACHE:-$HOME/.cache/tandem}/prometheus/<version>/bin/prometheus
# never into the repository; nothing is rebuilt when the binary is there. Its go.mod has no replace
# lines, so `go install` of the pinned version builds it as it is (without the web UI's compiled
# assets, which the test does not use).
#
# Usage: scripts/prometheus/build.sh      (prints the binary's path as its last line)
# Environment: PROMETHEUS_VERSION (scripts/prometheus/version.sh), TANDEM_CACHE, BUILD_P (go build -p, default 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=version.sh
source "$here/version.sh"
log() { echo "[prometheus/build.sh $(date -u +%H:%M:%S)] $*" >&2; }

if [ -x "$PROMETHEUS_BIN" ] && "$PROMETHEUS_BIN" --version >/dev/null 2>&1; then
  log "prometheus $PROMETHEUS_VERSION: present"
  echo "$PROMETHEUS_BIN"
  exit 0
fi

command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || {
  echo "prometheus/build.sh: no 'go' on PATH; install Go >= 1.25 (on these machines: export PATH=/usr/local/go/bin:\$PATH)" >&2
  exit 1
}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
start=$SECONDS
log "prometheus $PROMETHEUS_VERSION: building"
mkdir -p "$PROMETHEUS_HOME/bin"
if ! GOBIN="$PROMETHEUS_HOME/bin" go install -p "${BUILD_P:-2}" -trimpath -ldflags "-s -w" \
  "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"; then
  echo "prometheus/build.sh: building github.com/prometheus/prometheus@$PROMETHEUS_VERSION failed (see above);" \
    "set PROMETHEUS_VERSION to one the Go module proxy serves (go list -m -versions github.com/prometheus/prometheus)" >&2
  exit 1
fi
log "prometheus $PROMETHEUS_VERSION: built in $((SECONDS - start)) s"
echo "$PROMETHEUS_BIN"
