#!/usr/bin/env bash
# Builds the Kubeflow MPI Operator (github.com/kubeflow/mpi-operator, cmd/mpi-operator) from the Go module
# proxy with the ordinary `go` client, for the operator benchmark (bench/operator/run.sh). Like the control
# plane's build (scripts/controlplane/build.sh) it goes through a small wrapper module, so that the operator's
# own go.mod (replace lines, tool requirements) does not have to be edited. The binary and the MPIJob CRD
# (kubeflow.org/v2beta1, manifests/base/kubeflow.org_mpijobs.yaml of the downloaded module) go to
#   ${TANDEM_CACHE:-$HOME/.cache/tandem}/mpi-operator/<version>/{bin/mpi-operator,crd/mpijobs.yaml}
# never into the repository; nothing is rebuilt when both are there.
#
# Usage: bench/operator/build-mpi-operator.sh      (prints the binary's path as its last line)
# Environment: MPI_OPERATOR_VERSION (default v0.8.0), TANDEM_CACHE, BUILD_P (go build -p, default 2).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/controlplane/versions.sh
source "$here/../../scripts/controlplane/versions.sh"
MPI_OPERATOR_VERSION="${MPI_OPERATOR_VERSION:-v0.8.0}"
HOME_DIR="$TANDEM_CACHE/mpi-operator/$MPI_OPERATOR_VERSION"
BIN="$HOME_DIR/bin/mpi-operator"
CRD="$HOME_DIR/crd/mpijobs.yaml"
log() { echo "[build-mpi-operator $(date -u +%H:%M:%S)] $*" >&2; }

if [ -x "$BIN" ] && [ -s "$CRD" ]; then
  log "mpi-operator $MPI_OPERATOR_VERSION: present"
  echo "$BIN"
  exit 0
fi

command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || {
  echo "build-mpi-operator: no 'go' on PATH; install Go >= 1.25 (on these machines: export PATH=/usr/local/go/bin:\$PATH)" >&2
  exit 1
}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS="-modcacherw -buildvcs=false"
start=$SECONDS
w="$HOME_DIR/src"
log "mpi-operator $MPI_OPERATOR_VERSION: building (wrapper module in $w)"
# A wrapper left half-made by a failed run is redone.
[ -f "$w/.complete" ] || rm -rf "$w"
mkdir -p "$w" "$HOME_DIR/bin" "$HOME_DIR/crd"
cd "$w"
if [ ! -f .complete ]; then
  go mod init local/tandem-mpi-operator-bin >/dev/null 2>&1
  # The operator's go.mod may replace modules (older releases pinned k8s.io/*); a main module's replace
  # lines do not apply to a dependency, so copy them into the wrapper.
  mod="$(go mod download -json "github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION" \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("GoMod") or ""); sys.exit(1 if d.get("Error") else 0)')" || {
    echo "build-mpi-operator: the Go module proxy did not serve github.com/kubeflow/mpi-operator@$MPI_OPERATOR_VERSION;" \
      "set MPI_OPERATOR_VERSION to a released version it serves (v0.6.0, v0.7.0 and v0.8.0 were)" >&2
    exit 1
  }
  python3 - "$mod" <<'PY' | while read -r r; do go mod edit -replace="$r"; done
import re, sys
text = open(sys.argv[1]).read()
lines = []
for block in re.findall(r"^replace\s*\((.*?)^\)", text, re.S | re.M):
    lines += block.splitlines()
lines += re.findall(r"^replace\s+([^(\n].*)$", text, re.M)
for l in lines:
    l = l.split("//")[0].strip()
    m = re.match(r"(\S+)(?:\s+(\S+))?\s*=>\s*(\S+)(?:\s+(\S+))?$", l)
    if not m or m.group(3).startswith("."):
        continue  # local-path replaces cannot be taken over
    old = m.group(1) + ("@" + m.group(2) if m.group(2) else "")
    new = m.group(3) + ("@" + m.group(4) if m.group(4) else "")
    print(f"{old}={new}")
PY
  go get -tool "github.com/kubeflow/mpi-operator/cmd/mpi-operator@$MPI_OPERATOR_VERSION"
  touch .complete
fi
go build -p "${BUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$BIN" github.com/kubeflow/mpi-operator/cmd/mpi-operator
src="$(go list -m -f '{{.Dir}}' github.com/kubeflow/mpi-operator)"
if [ -f "$src/manifests/base/kubeflow.org_mpijobs.yaml" ]; then
  cp "$src/manifests/base/kubeflow.org_mpijobs.yaml" "$CRD"
else
  echo "build-mpi-operator: no manifests/base/kubeflow.org_mpijobs.yaml in $src; the MPIJob CRD moved in this version" >&2
  exit 1
fi
chmod u+w "$CRD"
log "mpi-operator $MPI_OPERATOR_VERSION: built in $((SECONDS - start)) s"
echo "$BIN"
