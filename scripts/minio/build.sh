#!/usr/bin/env bash
# Builds MinIO (github.com/minio/minio), the S3-compatible server that the trainer's object-storage
# tests start on loopback, from the Go module proxy with the ordinary `go` client, into
#   ${TANDEM_CACHE:-$HOME/.cache/tandem}/minio/<version>/bin/minio
# never into the repository; nothing is rebuilt when the binary is there. Its go.mod has no replace
# lines, so `go install` of the pinned version builds it as it is (MinIO's own install instruction).
#
# Usage: scripts/minio/build.sh      (prints the binary's path as its last line)
# Environment: MINIO_VERSION (scripts/minio/version.sh), TANDEM_CACHE, BUILD_P (go build -p, default 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=version.sh
source "$here/version.sh"
log() { echo "[minio/build.sh $(date -u +%H:%M:%S)] $*" >&2; }

if [ -x "$MINIO_BIN" ] && "$MINIO_BIN" --version >/dev/null 2>&1; then
  log "minio $MINIO_VERSION: present"
  echo "$MINIO_BIN"
  exit 0
fi

# Go's usual install place, when it is not on PATH.
command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || {
  echo "minio/build.sh: no 'go' on PATH; install Go >= 1.24 (on these machines: export PATH=/usr/local/go/bin:\$PATH)" >&2
  exit 1
}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
start=$SECONDS
log "minio $MINIO_VERSION: building"
mkdir -p "$MINIO_HOME/bin"
# The version stamp that `minio --version` prints (MinIO's release builds set the same variables).
# The pseudo-version's timestamp gives the copyright year.
year="$(printf '%s' "$MINIO_VERSION" | sed -n 's/^v0\.0\.0-\([0-9]\{4\}\).*/\1/p')"
ldflags="-s -w -X github.com/minio/minio/cmd.ReleaseTag=$MINIO_VERSION -X github.com/minio/minio/cmd.Version=$MINIO_VERSION"
[ -z "$year" ] || ldflags="$ldflags -X github.com/minio/minio/cmd.CopyrightYear=$year"
if ! GOBIN="$MINIO_HOME/bin" go install -p "${BUILD_P:-2}" -trimpath -ldflags "$ldflags" \
  "github.com/minio/minio@$MINIO_VERSION"; then
  echo "minio/build.sh: building github.com/minio/minio@$MINIO_VERSION failed (see above); set MINIO_VERSION" \
    "to a version the Go module proxy serves (\`go list -m -versions\` lists none: MinIO has pseudo-versions only)" >&2
  exit 1
fi
"$MINIO_BIN" --version | head -n 1 >&2
log "minio $MINIO_VERSION: built in $((SECONDS - start)) s"
echo "$MINIO_BIN"
