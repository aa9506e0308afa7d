#!/usr/bin/env bash
# Time to accuracy: each parallel SGD algorithm trains MNIST-5k with the same 4 worker processes,
# model, batch and data (examples/mnist-{ps-sync,ps-async,hybrid,easgd,allreduce}.yaml, evaluated
# every EVAL steps) through `tandem train` (release build); every `--output json` line is stamped
# with its wall time. Prints a table of time and samples to TARGET test accuracy with ratios, and the
# MXNET-MPI claim to compare with (MPI-ESGD converges more than 2x faster than the other methods).
#
# Usage: [ALGOS="ps-sync ps-async hybrid easgd allreduce"] [ROUNDS=1] [EVAL=20] [TARGET=0.90]
#        [TANDEM=path/to/tandem] [TRAIN_ARGS="--node n1=10.77.0.1 …"] [OUT=out/bench/tta] bench/tta.sh
# TRAIN_ARGS go to every `tandem train` (bench/cluster.sh places the processes on nodes with them).
# Writes out/bench/tta/{results.jsonl,table.md,tta.png,tta.svg,machine.txt} (git-ignored); with
# ROUNDS > 1 the algorithms alternate round by round and the table takes the median.
set -euo pipefail
cd "$(dirname "$0")/.."
ALGOS=${ALGOS:-"ps-sync ps-async hybrid easgd allreduce"}
ROUNDS=${ROUNDS:-1}
EVAL=${EVAL:-20}
TARGET=${TARGET:-0.90}
OUT=${OUT:-out/bench/tta}
mkdir -p "$OUT/manifests" "$OUT/runs"
[ -f data/mnist_5k.csv.gz ] || scripts/fetch-data.sh
if [ -z "${TANDEM:-}" ]; then
  cargo build --release -q -p tandem-trainer --bin tandem
  TANDEM=target/release/tandem
fi
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpus: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 "model name" /proc/cpuinfo || true
  echo "eval every $EVAL steps; target test accuracy $TARGET; rounds $ROUNDS"
} | tee "$OUT/machine.txt" >&2

for round in $(seq 1 "$ROUNDS"); do
  for algo in $ALGOS; do
    # The example, evaluated every EVAL steps so that the time to the target is resolved finely.
    manifest="$OUT/manifests/mnist-$algo.yaml"
    sed -E '/^ *evalEverySteps:/d; s/^( *)training:$/\1training:\n\1  evalEverySteps: '"$EVAL"'/' \
      "examples/mnist-$algo.yaml" > "$manifest"
    echo "== round $round: $algo" >&2
    # A fresh run each time: tandem train refuses a folder holding an earlier run's checkpoints.
    rm -rf "$OUT/runs/$algo-$round"
    t0=$EPOCHREALTIME
    "$TANDEM" train --output json -f "$manifest" --output-dir "$OUT/runs/$algo-$round" \
      --data-dir data ${TRAIN_ARGS:-} 2> "$OUT/runs/$algo-$round.log" |
      while IFS= read -r line; do
        [[ $line == \{* ]] || continue
        printf '{"algorithm":"%s","round":%s,"t0":%s,"t":%s,"line":%s}\n' \
          "$algo" "$round" "$t0" "$EPOCHREALTIME" "$line"
      done >> "$RESULTS" || true
    tail -1 "$RESULTS" | grep -q '"event":"finished"' ||
      { echo "$algo failed; see $OUT/runs/$algo-$round.log" >&2; exit 1; }
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

PY=$(bench/plot-python.sh)
$PY bench/plot_tta.py "$RESULTS" "$OUT" "$TARGET"
