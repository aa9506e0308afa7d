#!/usr/bin/env bash
# Builds the base images of `make images` from Debian packages, with no registry: mmdebstrap makes a
# root filesystem tarball (cached under ${TANDEM_CACHE:-$HOME/.cache/tandem}/images, reused until
# this script or the suite changes), `podman import` makes it an image.
#
#   localhost/tandem-base:bookworm      minbase (apt, dpkg, bash): the trainer image's base, which
#                                       installs OpenMPI and OpenSSH on top with apt-get
#   localhost/tandem-base-cc:bookworm   libc6 and libgcc-s1 only (no shell, no apt): the operator's
#                                       base, like a distroless "cc" image
#
# Both drop documentation, man pages and locales, and point apt at this host's Debian mirror.
# Usage: scripts/node/base.sh [--print-tags]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=../controlplane/versions.sh
source "$here/../controlplane/versions.sh"
SUITE="${TANDEM_BASE_SUITE:-bookworm}"
BASE="localhost/tandem-base:$SUITE"
BASE_CC="localhost/tandem-base-cc:$SUITE"
if [ "${1:-}" = --print-tags ]; then
  echo "$BASE $BASE_CC"
  exit 0
fi
log() { echo "[base.sh $(date -u +%H:%M:%S)] $*" >&2; }

CACHE="$TANDEM_CACHE/images"
mkdir -p "$CACHE"
# The cache key: this script's content and the suite (a change of either rebuilds the tarballs).
key="$(sha256sum "$0" | cut -c1-12)"

# Host apt sources, so that the image's apt uses the same mirror as this machine.
sources=()
[ -f /etc/apt/sources.list ] && grep -q '^[[:space:]]*deb' /etc/apt/sources.list && sources+=(/etc/apt/sources.list)
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && sources+=("$f")
done
[ ${#sources[@]} -gt 0 ] || { echo "base.sh: this host has no apt sources to copy into the image" >&2; exit 1; }
copy_sources='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*; for f in '"${sources[*]}"'; do cp "$f" "$1"/etc/apt/sources.list.d/; done; [ ! -f "$1"/etc/apt/sources.list.d/sources.list ] || mv "$1"/etc/apt/sources.list.d/sources.list "$1"/etc/apt/sources.list.d/host.list'
slim=(
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/info/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
  --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"'
)
clean='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/* "$1"/tmp/*'

# make_tar NAME ARGS...: $CACHE/NAME-$SUITE-$key.tar unless present.
make_tar() {
  local name="$1" tar="$CACHE/$1-$SUITE-$key.tar"
  shift
  if [ -s "$tar" ]; then
    echo "$tar"
    return
  fi
  local start=$SECONDS
  log "mmdebstrap $name ($SUITE) -> $tar"
  rm -f "$CACHE/$name-$SUITE-"*.tar "$tar.part"
  mmdebstrap --quiet --mode=root --format=tar "$@" "$SUITE" "$tar.part" >&2
  mv "$tar.part" "$tar"
  log "$name: $(du -h "$tar" | cut -f1) in $((SECONDS - start)) s"
  echo "$tar"
}

# import TAG TAR: podman import unless the image exists with this tarball's key as a label.
import() {
  local tag="$1" tar="$2"
  if [ "$(podman image inspect --format '{{ index .Labels "dev.tandem.base-key" }}' "$tag" 2>/dev/null)" = "$key" ]; then
    log "$tag: present"
    return
  fi
  podman import --quiet --change "LABEL dev.tandem.base-key=$key" --change 'CMD ["/bin/bash"]' "$tar" "$tag" >/dev/null
  log "$tag: imported ($(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec))"
}

tar_base="$(make_tar tandem-base --variant=minbase "${slim[@]}" \
  --customize-hook="$copy_sources" --customize-hook="$clean")"
# extract: unpack only, no maintainer scripts; /etc/passwd is not needed (numeric uid), nsswitch
# and the CA bundle neither (the operator reads the API server's CA from its ServiceAccount).
tar_cc="$(make_tar tandem-base-cc --variant=extract --include=libc6,libgcc-s1,tzdata "${slim[@]}" \
  --customize-hook='mkdir -p "$1"/tmp && chmod 1777 "$1"/tmp' --customize-hook="$clean" \
  --customize-hook='rm -rf "$1"/var/cache/* "$1"/var/lib/dpkg "$1"/var/lib/apt "$1"/etc/apt')"
import "$BASE" "$tar_base"
import "$BASE_CC" "$tar_cc"
