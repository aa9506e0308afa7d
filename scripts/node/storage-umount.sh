#!/usr/bin/env bash
# Unmounts containers/storage's private bind mount of its overlay folder (podman and buildah make it
# on first use and leave it), but only when no container layer under it is still mounted.
set -euo pipefail
root="$(podman info --format '{{.Store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers/storage)"
dir="$root/overlay"
mounts="$(findmnt -rn -o TARGET | grep -c "^$dir/" || true)"
if [ "$mounts" = 0 ] && findmnt -rn "$dir" >/dev/null; then
  umount "$dir"
fi
