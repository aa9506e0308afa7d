#!/usr/bin/env bash
# Prints the folder holding the pinned control-plane binaries (kube-apiserver, kubectl, helm, kwok, ...),
# e.g. for PATH="$(scripts/controlplane/bin-dir.sh):$PATH". It may not exist yet: `make cluster-bins`.
set -euo pipefail
# shellcheck source=versions.sh
source "$(cd "$(dirname "$0")" && pwd)/versions.sh"
echo "$K8S_BIN"
