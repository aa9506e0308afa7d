#!/usr/bin/env bash
# Time to accuracy: each parallel SGD algorithm trains MNIST-5k with the same 4 worker processes,
# model, batch and data (examples/mnist-{ps-sync,ps-async,hybrid,easgd,allreduce}.yaml, and hybrid-4:
# the hybrid example over 4 groups of 1; see bench/manifests.py), evaluated every EVAL steps, through
# `tandem train` (release build); every `--output json` line is stamped with its wall time
# (bench/tta_run.py). Prints a table of time and samples to TARGET test accuracy with ratios, and the
# MXNET-MPI claim to compare with (MPI-ESGD converges more than 2x faster than the other methods).
#
# Usage: [ALGOS="ps-sync ps-async hybrid hybrid-4 easgd allreduce"] [MODEL=mlp|resnet20|vgg-dense]
#        [ROUNDS=1] [EVAL=20] [TARGET=0.90] [STEPS=…] [UNTIL_TARGET=1] [TIME_LIMIT=seconds]
#        [TANDEM=path/to/tandem] [TRAIN_ARGS="--node n1=10.77.0.1 …"] [OUT=out/bench/tta] bench/tta.sh
# MODEL replaces the examples' MLP (bench/manifests.py); STEPS their step counts. UNTIL_TARGET=1 stops
# a run once a report reaches TARGET, TIME_LIMIT once it has run that long (then "not reached").
# TRAIN_ARGS go to every `tandem train` (bench/cluster.sh places the processes on nodes with them).
# Writes out/bench/tta/{results.jsonl,table.md,tta.png,tta.svg,machine.txt} (git-ignored); with
# ROUNDS > 1 the algorithms alternate round by round and the table takes the median.
set -euo pipefail
cd "$(dirname "$0")/.."
ALGOS=${ALGOS:-"ps-sync ps-async hybrid hybrid-4 easgd allreduce"}
MODEL=${MODEL:-mlp}
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
  echo "model $MODEL; eval every $EVAL steps; target test accuracy $TARGET; rounds $ROUNDS"
  echo "steps ${STEPS:-as in the examples}; until target: ${UNTIL_TARGET:-0}; time limit ${TIME_LIMIT:-none}"
} | tee "$OUT/machine.txt" >&2

for round in $(seq 1 "$ROUNDS"); do
  for algo in $ALGOS; do
    # The example with the model, evaluated every EVAL steps so that the time to the target is
    # resolved finely.
    manifest="$OUT/manifests/mnist-$algo.yaml"
    python3 bench/manifests.py "$algo" --model "$MODEL" --eval "$EVAL" ${STEPS:+--steps "$STEPS"} > "$manifest"
    echo "== round $round: $algo ($MODEL)" >&2
    # A fresh run each time: tandem train refuses a folder holding an earlier run's checkpoints.
    rm -rf "$OUT/runs/$algo-$round"
    # shellcheck disable=SC2086 # TRAIN_ARGS is a list of arguments
    TARGET=$TARGET python3 bench/tta_run.py "$algo" "$round" "$RESULTS" "$OUT/runs/$algo-$round.log" -- \
      "$TANDEM" train --output json -f "$manifest" --output-dir "$OUT/runs/$algo-$round" \
      --data-dir data ${TRAIN_ARGS:-} || exit 1
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

PY=$(bench/plot-python.sh)
$PY bench/plot_tta.py "$RESULTS" "$OUT" "$TARGET" "$MODEL"
