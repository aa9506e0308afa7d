#!/usr/bin/env bash
# Prints the path of the pinned Prometheus binary (the real node's metrics test reads it from
# $TANDEM_PROMETHEUS, which mk/e2e.mk sets from this). It may not exist yet: `make prometheus-bin`.
set -euo pipefail
# shellcheck source=version.sh
source "$(cd "$(dirname "$0")" && pwd)/version.sh"
echo "$PROMETHEUS_BIN"
