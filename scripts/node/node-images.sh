#!/usr/bin/env bash
# The test node's own images, built here since no registry is reachable (each only when missing or
# its binary changed): the pod sandbox's pause (a static C program, scripts/node/pause), CoreDNS
# and local-path-provisioner (the static Go binaries of `scripts/controlplane/build.sh node`), each
# alone FROM scratch and run as a non-root uid.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../controlplane/versions.sh
source "$here/../controlplane/versions.sh"
# shellcheck source=node-env.sh
source "$here/node-env.sh"
log() { echo "[node-images $(date -u +%H:%M:%S)] $*" >&2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# image TAG BINARY ENTRYPOINT-JSON: FROM scratch with BINARY at /BINARY-NAME, unless TAG carries its hash.
image() {
  local tag="$1" bin="$2" entry="$3" sum name
  sum="$(sha256sum "$bin" | cut -c1-16)"
  if [ "$(podman image inspect --format '{{ index .Labels "dev.tandem.binary" }}' "$tag" 2>/dev/null)" = "$sum" ]; then
    return
  fi
  name="$(basename "$bin")"
  rm -rf "$work/ctx" && mkdir -p "$work/ctx" && cp "$bin" "$work/ctx/$name"
  printf 'FROM scratch\nCOPY %s /%s\nLABEL dev.tandem.binary=%s\nUSER 65532:65532\nENTRYPOINT %s\n' \
    "$name" "$name" "$sum" "$entry" >"$work/ctx/Containerfile"
  buildah bud --quiet --isolation=chroot --network=host --pull=never -f "$work/ctx/Containerfile" -t "$tag" "$work/ctx" >/dev/null
  log "$tag built ($(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec --suffix=B))"
}

cc -static -Os -s -o "$work/pause" "$here/pause/pause.c"
image "$PAUSE_IMAGE" "$work/pause" '["/pause"]'
image "$COREDNS_IMAGE" "$K8S_BIN/coredns" '["/coredns"]'
image "$LOCAL_PATH_IMAGE" "$K8S_BIN/local-path-provisioner" '["/local-path-provisioner"]'
