#!/usr/bin/env bash
# Installs the Debian packages that `make images` and `make node-up` need, only when something is
# missing: containerd, runc and the CNI plugins (the node), mmdebstrap (the base image), buildah,
# podman and skopeo (image builds without a Docker daemon), iptables and conntrack (kube-proxy).
# Nothing is started: Debian's policy-rc.d keeps the packages' services down, the scripts start
# and stop the daemons themselves.
set -euo pipefail
need=()
for pair in containerd:containerd runc:runc mmdebstrap:mmdebstrap buildah:buildah podman:podman \
  skopeo:skopeo iptables:iptables nft:nftables conntrack:conntrack socat:socat newuidmap:uidmap; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
if [ ${#need[@]} -gt 0 ]; then
  echo "node deps: installing Debian packages: ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  # No daemon may start from a package's maintainer script.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
