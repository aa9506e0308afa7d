#!/usr/bin/env bash
# Prints the path of the pinned MinIO server binary (the object-storage tests read it from
# $TANDEM_MINIO, which mk/objectstore.mk sets from this). It may not exist yet: `make minio-bin`.
set -euo pipefail
# shellcheck source=version.sh
source "$(cd "$(dirname "$0")" && pwd)/version.sh"
echo "$MINIO_BIN"
