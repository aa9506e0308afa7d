#!/usr/bin/env bash
# Prints the path of the pinned mdBook, installing it from crates.io into
# ${TANDEM_CACHE:-$HOME/.cache/tandem}/mdbook/<version>/bin when it is missing there (a new machine
# builds it once; later runs reuse it). Only the HTML renderer is built: no server, watcher or search.
set -euo pipefail
version=0.5.4
root="${TANDEM_CACHE:-$HOME/.cache/tandem}/mdbook/$version"
bin="$root/bin/mdbook"
if [ ! -x "$bin" ]; then
  echo "installing mdbook $version into $root (once; later runs reuse it)" >&2
  # Its own target folder, outside the repository, so the workspace's build is not touched.
  CARGO_TARGET_DIR="$root/build" cargo install mdbook --locked --version "$version" \
    --no-default-features --root "$root" >&2
  rm -rf "$root/build"
fi
echo "$bin"
