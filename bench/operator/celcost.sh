#!/usr/bin/env bash
# The CEL rules of crds/ as kube-apiserver runs them (bench/operator/celcost/main.go, built against
# the control plane's k8s.io/apiextensions-apiserver from the Go module proxy into the cache): each
# rule's estimated cost and its time on the benchmark's TrainingJob, then all rules together.
# Usage: bench/operator/celcost.sh [iterations]     (or: make bench-cel)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
# shellcheck source=scripts/controlplane/versions.sh
source "$root/scripts/controlplane/versions.sh"
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || { echo "celcost: no 'go' on PATH; install Go >= 1.24" >&2; exit 1; }
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
BIN="$TANDEM_CACHE/celcost/celcost"
mkdir -p "$(dirname "$BIN")"
(cd "$here/celcost" && go build -o "$BIN" .) || { echo "celcost: go build failed; see above" >&2; exit 1; }
object="$(mktemp)"
trap 'rm -f "$object"' EXIT
python3 -c 'import json, sys; sys.path.insert(0, sys.argv[1]); import bench; print(json.dumps(bench.tandem_job("bench-0000", "bench-node-000")))' \
  "$here" >"$object"
"$BIN" "$root/crds/tandem.dev_trainingjobs.yaml" "$object" "${1:-4000}"
