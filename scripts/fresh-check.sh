#!/usr/bin/env bash
# fresh-check: does `make demo` work on a new machine of this kind? (`make fresh-check`; not a test)
#
# Builds a clean Debian bookworm root with `mmdebstrap --variant=minbase` from this machine's own apt
# sources, gives it only what a new machine of this kind comes with — the Rust toolchain (~/.rustup,
# ~/.cargo/bin), Go (/usr/local/go), the CPython with pip that `python3` resolves to (bind-mounted,
# read-only), gcc, g++, make, cmake and git (Debian packages), the CA bundle and the registry settings
# (apt, pip, Go, certificate variables) — clones the committed HEAD of this repository into it and runs
# the given make goals there (default `demo`) with empty caches: no data/, no cargo registry, no target/,
# no ~/.cache/tandem. It prints each stage's wall time and, for the demo, the final test accuracy.
#
# It removes nothing from the host and keeps all its state in one folder outside the repository
# (FRESH_DIR, default /var/tmp/tandem-fresh.XXXXXX), unmounted and deleted at the end however it ends
# (FRESH_KEEP=1 keeps the folder for a look). Needs root (mmdebstrap, chroot, bind mounts).
#
#   scripts/fresh-check.sh [make goal ...]      e.g. scripts/fresh-check.sh demo
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
goals=("$@")
[ ${#goals[@]} -gt 0 ] || goals=(demo)

[ "$(id -u)" -eq 0 ] || { echo "fresh-check: needs root (mmdebstrap, chroot and bind mounts)" >&2; exit 2; }
if ! command -v mmdebstrap >/dev/null; then
  echo "fresh-check: installing mmdebstrap" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 mmdebstrap >/dev/null
fi
[ -z "$(git status --porcelain --untracked-files=no)" ] ||
  echo "fresh-check: note: uncommitted changes are not checked; the clone is of HEAD $(git rev-parse --short HEAD)" >&2

state=$(mktemp -d "${FRESH_DIR:-/var/tmp}/tandem-fresh.XXXXXX")
root="$state/root"
mounts=()
cleanup() {
  local rc=$?
  # Unmount in reverse order; a lazy unmount never leaves the host with a busy mount.
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -l "${mounts[$i]}" 2>/dev/null || true
  done
  if [ "${FRESH_KEEP:-0}" = 1 ]; then
    echo "fresh-check: state kept in $state" >&2
  else
    # Only after every mount is gone: never delete through a bind mount into the host.
    if ! grep -q " $state/" /proc/mounts; then rm -rf "$state"; fi
  fi
  exit $rc
}
trap cleanup EXIT INT TERM

stage_start=$SECONDS
stage() { echo "fresh-check: [$((SECONDS - stage_start)) s] $*" >&2; }

# --- 1. A minimal Debian root from this machine's apt sources -----------------------------------------
sources=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
  [ -s "$f" ] && sources+=("$f")
done
aptopts=()
for f in /etc/apt/apt.conf.d/*; do
  # The machine's own settings for reaching its mirror (not Docker's image clean-up hooks).
  case "$(basename "$f")" in docker-*) continue ;; esac
  grep -q '^Acquire::' "$f" 2>/dev/null && aptopts+=("--aptopt=$f")
done
# The Python that `python3` resolves to, and the Debian packages of the libraries it loads.
py_prefix=$(python3 -c 'import sys; print(sys.base_prefix)')
py_libs=$(find "$py_prefix" -name '*.so*' -type f 2>/dev/null; command -v python3)
owner() { # the Debian package of a library file, looked up under /usr and without it (merged /usr)
  local f=$1
  dpkg -S "$f" 2>/dev/null || dpkg -S "${f#/usr}" 2>/dev/null || dpkg -S "/usr$f" 2>/dev/null || true
}
py_pkgs=$( { for f in $py_libs; do ldd "$(readlink -f "$f")" 2>/dev/null || true; done; } |
  awk '/=> \//{print $3}' | sort -u | grep -v "^$py_prefix" |
  while read -r lib; do owner "$lib"; owner "$(readlink -f "$lib")"; done |
  cut -d: -f1 | sort -u | tr '\n' ',')
stage "mmdebstrap --variant=minbase bookworm (packages: git gcc g++ make cmake + the CPython's libraries)"
mmdebstrap --quiet --variant=minbase "${aptopts[@]}" \
  --include="ca-certificates,git,gcc,g++,make,cmake,${py_pkgs%,}" \
  bookworm "$root" "${sources[@]}"
stage "root ready ($(du -sh "$root" | cut -f1))"

# --- 2. What a new machine of this kind comes with, read-only ------------------------------------------
inside() { # refuses any path that is not below the fresh root: nothing here may touch the host's own
  case "$1" in "$state"/root/?*) ;; *) echo "fresh-check: refusing to mount on $1 (not inside $state/root)" >&2; exit 1 ;; esac
}
bind() { # bind SRC DST [ro]
  local src=$1 dst="$root$2"
  inside "$dst"
  if [ -d "$src" ]; then mkdir -p "$dst"; else mkdir -p "$(dirname "$dst")"; touch "$dst"; fi
  mount --bind "$src" "$dst"
  mounts+=("$dst")
  # Nothing mounted below it may propagate back to the host (a shared / would).
  mount --make-rslave "$dst"
  [ "${3:-}" = ro ] && mount -o remount,bind,ro "$dst"
  return 0
}
[ -n "$state" ] && [ -d "$root/etc" ] || { echo "fresh-check: the fresh root $root was not made" >&2; exit 1; }
inside "$root/proc"; mount -t proc proc "$root/proc"; mounts+=("$root/proc")
bind /sys /sys ro
bind /dev /dev
bind /dev/pts /dev/pts
inside "$root/dev/shm"; mount -t tmpfs -o mode=1777 shm "$root/dev/shm"; mounts+=("$root/dev/shm")
bind "$HOME/.rustup" /root/.rustup ro
bind "$HOME/.cargo/bin" /root/.cargo/bin ro
bind /usr/local/go /usr/local/go ro
bind "$py_prefix" "$py_prefix" ro
bind /etc/ssl/certs /etc/ssl/certs ro
cp /etc/resolv.conf "$root/etc/resolv.conf"
for f in /etc/pip.conf /etc/hosts "$HOME/.config/go/env" "$HOME/.gitconfig"; do
  [ -f "$f" ] && mkdir -p "$root$(dirname "$f")" && cp "$f" "$root$f"
done
for f in /etc/apt/apt.conf.d/*; do
  case "$(basename "$f")" in docker-*) ;; *) grep -q '^Acquire::' "$f" 2>/dev/null && cp "$f" "$root/etc/apt/apt.conf.d/" ;; esac
done
# The repository, committed HEAD only, as a new user's `git clone` would see it.
bind "$repo" /src ro

# The environment a new machine's shell has: its PATH and the certificate and registry settings.
envs=(HOME=/root USER=root LANG=C.UTF-8 TERM=dumb
      PATH="$py_prefix/bin:/usr/local/go/bin:/root/go/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
while IFS='=' read -r name value; do
  case "$name" in
    SSL_*|PIP_*|CURL_CA_BUNDLE|REQUESTS_CA_BUNDLE|GIT_SSL_CAINFO|NODE_EXTRA_CA_CERTS|RUSTUP_*|GOFLAGS|GOPROXY|GOSUMDB|GONOSUMDB|GOPRIVATE)
      envs+=("$name=$value") ;;
  esac
done < <(env)

# --- 3. Clone and run, with empty caches ----------------------------------------------------------------
stage "git clone and make ${goals[*]} inside the fresh root"
log="$state/make.log"
set +e
chroot "$root" /usr/bin/env -i "${envs[@]}" /bin/bash -c '
  set -euo pipefail
  git config --global --add safe.directory /src
  git clone -q /src /root/tandem
  cd /root/tandem
  echo "fresh-check: HEAD $(git rev-parse --short HEAD); caches: ~/.cache $(ls -A ~/.cache 2>/dev/null | wc -l) entries, cargo registry $(ls -A ~/.cargo/registry 2>/dev/null | wc -l) entries"
  make "$@"
' fresh-check "${goals[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
stage "make ${goals[*]} exited $rc"
acc=$(grep -o -E 'test accuracy[^0-9]*[0-9.]+' "$log" | tail -n 1 || true)
if [ "$rc" -eq 0 ]; then
  echo "fresh-check: PASSED in $((SECONDS - stage_start)) s — make ${goals[*]} on a fresh bookworm root${acc:+; final $acc}"
else
  echo "fresh-check: FAILED (make ${goals[*]} exited $rc after $((SECONDS - stage_start)) s); the log's tail is above" >&2
fi
exit "$rc"
