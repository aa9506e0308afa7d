#!/usr/bin/env bash
# `make images`: builds the tandem-trainer and tandem-operator images from docker/ on this machine, with
# no Docker daemon and no registry: the base images come from Debian packages (scripts/node/base.sh),
# the binaries from the host's cargo (release profile; much faster than a cold Rust stage inside the
# build, and the Dockerfiles' TANDEM_BIN=prebuilt stage takes them), and buildah builds the
# Dockerfiles unchanged (`docker build` builds the same files from source).
#
# Tags are the defaults of the CRD (spec.image: tandem-trainer:0.1) and of the chart (image:
# tandem-operator:<appVersion>), under docker.io/library/ as a container runtime normalizes them;
# the third image is examples/pytorch/'s (tandem-pytorch-example:0.1, on the trainer's Debian base).
# Prints each image's size at the end.
#
# Environment: CARGO (default cargo), CARGO_TARGET_DIR, TANDEM_IMAGE_PROFILE (cargo profile of the
# binaries: release, the default, or dev, which `make test` uses because its tests built the dev
# binaries already: same code, dependencies optimised, ours at opt-level 1), TANDEM_IMAGES_SKIP_CARGO=1
# (use the binaries already in target/image-bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
here=scripts/node
start=$SECONDS
log() { echo "[images.sh $(date -u +%H:%M:%S)] $*" >&2; }

TRAINER_TAG="${TANDEM_TRAINER_IMAGE:-docker.io/library/tandem-trainer:0.1}"
app_version="$(sed -n 's/^appVersion:[[:space:]]*"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/tandem/Chart.yaml)"
OPERATOR_TAG="${TANDEM_OPERATOR_IMAGE:-docker.io/library/tandem-operator:$app_version}"
# examples/pytorch/ as an image (its job.yaml's workers.image), for the end-to-end tests.
PYTORCH_TAG="docker.io/library/tandem-pytorch-example:0.1"

"$here/deps.sh"
scripts/fetch-data.sh
t=$SECONDS
read -r BASE BASE_CC < <("$here/base.sh" --print-tags)
"$here/base.sh"
log "base images ready in $((SECONDS - t)) s"

t=$SECONDS
CARGO="${CARGO:-cargo}"
TARGET="${CARGO_TARGET_DIR:-target}"
PROFILE="${TANDEM_IMAGE_PROFILE:-release}"
case "$PROFILE" in
  release) out=release ;;
  dev) out=debug ;;
  *) echo "images.sh: TANDEM_IMAGE_PROFILE must be release or dev, not '$PROFILE'" >&2; exit 2 ;;
esac
if [ "${TANDEM_IMAGES_SKIP_CARGO:-0}" != 1 ]; then
  log "cargo build --profile $PROFILE: tandem, tandem-operator"
  if [ "$PROFILE" = dev ] && [ -n "${TEST_FEATURES:-}" ]; then
    # Under `make test`: the binaries of its workspace test build, with the same features (no rebuild).
    "$CARGO" build --locked --workspace --features "$TEST_FEATURES,tandem-e2e/e2e" --bins
  else
    "$CARGO" build --profile "$PROFILE" --locked -p tandem-trainer --bin tandem -p tandem-operator --bin tandem-operator
  fi
  mkdir -p target/image-bin
  # Debug line tables stay in the cargo output; the images get stripped copies.
  for bin in tandem tandem-operator; do
    strip -o "target/image-bin/$bin.part" "$TARGET/$out/$bin"
    mv "target/image-bin/$bin.part" "target/image-bin/$bin"
  done
  log "binaries built in $((SECONDS - t)) s"
  # The tandem wheel (python/) for the PyTorch example's image, by the venv's maturin (`make
  # python-env`): the release profile, or under `make test` the dev profile, whose dependencies the
  # test build compiled already.
  t=$SECONDS
  maturin="${TANDEM_CACHE:-$HOME/.cache/tandem}/python-venv/bin/maturin"
  [ -x "$maturin" ] || { echo "images.sh: $maturin is missing: run make python-env" >&2; exit 1; }
  rm -rf target/image-bin/wheels
  if [ "$PROFILE" = release ]; then wheel_profile=--release; else wheel_profile=; fi
  (cd python && "$maturin" build --quiet $wheel_profile --out ../target/image-bin/wheels) >&2
  log "wheel built in $((SECONDS - t)) s"
fi

# buildah: chroot isolation and the host network for RUN (apt-get), so no CNI network or bridge is
# made on the host; the local bases are never pulled.
bud() {
  local file="$1" tag="$2" base="$3" t=$SECONDS
  buildah bud --quiet --isolation=chroot --network=host --pull=never --layers \
    --build-arg "BASE=$base" --build-arg TANDEM_BIN=prebuilt \
    -f "$file" -t "$tag" . >/dev/null
  log "$tag built in $((SECONDS - t)) s"
}
# buildah keeps a working container for a stage that is only a FROM (the `bin` alias): remove the
# ones this build made (also when it fails), and the storage driver's private mount of its own folder
# once nothing in it is mounted, so that no mount is left behind.
before="$(buildah containers --quiet --noheading | sort)"
tidy() {
  comm -13 <(echo "$before") <(buildah containers --quiet --noheading | sort) | xargs -r buildah rm >/dev/null
  "$here/storage-umount.sh"
}
trap tidy EXIT
bud docker/trainer.Dockerfile "$TRAINER_TAG" "$BASE"
bud docker/operator.Dockerfile "$OPERATOR_TAG" "$BASE_CC"
bud docker/pytorch-example.Dockerfile "$PYTORCH_TAG" "$BASE"

size() { podman image inspect --format '{{.Size}}' "$1" | numfmt --to=iec --suffix=B; }
log "images built in $((SECONDS - start)) s:"
printf '  %-48s %s\n' "$TRAINER_TAG" "$(size "$TRAINER_TAG")" "$OPERATOR_TAG" "$(size "$OPERATOR_TAG")" \
  "$PYTORCH_TAG" "$(size "$PYTORCH_TAG")" >&2
