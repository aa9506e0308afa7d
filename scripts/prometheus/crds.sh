#!/usr/bin/env bash
# Prints the folder of prometheus-operator's CRDs (PodMonitor, ServiceMonitor, …) at a pinned
# release, fetched as its Go module through the Go module proxy the first time (about 4 MB, cached
# in the Go module cache). The chart's tests validate its monitors against them.
set -euo pipefail
VERSION=v0.85.0
dir="$(GOFLAGS=-modcacherw GOTOOLCHAIN=local go mod download -json \
  "github.com/prometheus-operator/prometheus-operator@$VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[ -n "$dir" ] && [ -d "$dir/example/prometheus-operator-crd" ] || {
  echo "cannot fetch prometheus-operator $VERSION's CRDs through the Go module proxy" >&2
  exit 1
}
echo "$dir/example/prometheus-operator-crd"
