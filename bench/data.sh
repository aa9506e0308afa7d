#!/usr/bin/env bash
# Input pipeline throughput on CPU: decoded and augmented images per second of Tandem's image
# pipeline (`tandem data bench`: the ImageFolder source with its decoding threads, as a training
# step reads it) against PyTorch's DataLoader with torchvision's ImageFolder and transforms
# (bench/data_torch.py), on the same JPEG files with the same transforms (RandomResizedCrop to
# 96×96, horizontal flip, per-channel normalisation), batches of 64, at 1 and 2 threads (decoding
# threads; DataLoader worker processes of one thread each), side by side and alternating round
# after round so that machine noise hits both alike. Prints the table with the Tandem ÷ PyTorch
# ratio, and Tandem's memory while streaming a set many times larger than its queue; JSON records
# go to out/bench/data.json.
#   bench/data.sh [threads, comma-separated]      e.g. bench/data.sh 1,2
# Environment: BENCH_SECONDS (timed seconds per run, default 5), BENCH_ROUNDS (default 3),
# BENCH_IMAGES (training images written, default 2000), BENCH_SIZE (their side, default 160),
# BENCH_PROFILE (release; dev skips the release build, see below).
# Figures only count on a quiet machine: /work/shared/tools/quiet-run -- bench/data.sh
# PyTorch and torchvision are pip-installed into target/torch-venv on first use (bench/torch-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-1,2}
SECONDS_PER=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-3}
IMAGES=${BENCH_IMAGES:-2000}
SIZE=${BENCH_SIZE:-160}
for t in ${THREADS//,/ }; do
  if ! [[ "$t" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/data.sh: threads must be whole numbers ≥ 1, comma-separated; got '$THREADS'" >&2
    exit 2
  fi
done
PYTHON=$(bench/torch-python.sh torch torchvision)
# BENCH_PROFILE=dev skips the (slow) release build, but its image decoders are built at opt-level 1:
# its figures understate Tandem and only check the script.
if [ "${BENCH_PROFILE:-release}" = dev ]; then PROFILE_FLAG=(); DIR=target/debug; else PROFILE_FLAG=(--release); DIR=target/release; fi
cargo build -q "${PROFILE_FLAG[@]}" -p tandem-trainer --bin tandem >&2
FOLDER=target/bench-data/images-$IMAGES-$SIZE
if [ ! -f "$FOLDER/.done" ]; then
  echo "writing $IMAGES JPEG images of ${SIZE}×$SIZE into $FOLDER (once)" >&2
  rm -rf "$FOLDER"
  "$PYTHON" bench/data_images.py "$FOLDER" --train "$IMAGES" --size "$SIZE"
  touch "$FOLDER/.done"
fi
AUGMENT='{"randomResizedCrop": {"scale": [0.08, 1.0], "ratio": [0.75, 1.3333333333333333]}, "horizontalFlip": true}'
NORMALIZE='{"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}'
mkdir -p out/bench
: > out/bench/data.json
for round in $(seq "$ROUNDS"); do
  for t in ${THREADS//,/ }; do
    echo "round $round/$ROUNDS, $t thread(s)" >&2
    "$DIR/tandem" data bench "$FOLDER" --threads "$t" --batch 64 --seconds "$SECONDS_PER" \
      --image-size 96,96 --augment "$AUGMENT" --normalize "$NORMALIZE" | tee -a out/bench/data.json
    "$PYTHON" bench/data_torch.py "$FOLDER/train" --workers "$t" --batch 64 \
      --seconds "$SECONDS_PER" --size 96 | tee -a out/bench/data.json
  done
done
python3 - out/bench/data.json "${BENCH_PROFILE:-release}" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
best = {}
for r in recs:
    k = (r["impl"], r["threads"])
    best[k] = max(best.get(k, 0.0), r["images_per_second"])
print()
print(f"decoded + augmented images/s (RandomResizedCrop 96, flip, normalise; JPEG; batch 64; best of rounds; {sys.argv[2]} build)")
print(f"{'threads':>7} {'tandem':>10} {'pytorch':>10} {'tandem/pytorch':>15}")
for t in sorted({k[1] for k in best}):
    a, b = best.get(("tandem", t), 0.0), best.get(("pytorch", t), 0.0)
    print(f"{t:>7} {a:>10.0f} {b:>10.0f} {a / b if b else float('nan'):>14.2f}x")
tandem = [r for r in recs if r["impl"] == "tandem"]
if tandem:
    r = max(tandem, key=lambda r: r["peak_rss_mib"])
    print()
    print(
        f"tandem memory while streaming {r['samples_in_set']} images ({r['decoded_set_mib']:.0f} MiB decoded, "
        f"{r['images'] // max(r['samples_in_set'], 1)}+ passes; a batch is {r['batch_mib']:.1f} MiB): "
        f"RSS {r['rss_mib_after_first_batch']:.0f} MiB after the first batch, {r['rss_mib_at_end']:.0f} MiB at the end, "
        f"peak {r['peak_rss_mib']:.0f} MiB"
    )
PY
