#!/usr/bin/env bash
# Training throughput, Tandem (candle, CPU) vs PyTorch (CPU), same models, batch 64, same thread count,
# side by side in one run. Prints a table with the ratio and the JSON records (out/bench/train.json).
#   bench/train.sh [steps] [threads]
# PyTorch is pip-installed into target/torch-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
THREADS=${2:-$(nproc)}
VENV=target/torch-venv
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing PyTorch into $VENV (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch
fi
# BENCH_PROFILE=dev skips the (slow, LTO) release build; candle and its GEMM are optimised in both.
if [ "${BENCH_PROFILE:-release}" = dev ]; then
  cargo build -q -p tandem-trainer --bench train >&2
  BIN=$(ls -t target/debug/deps/train-* | grep -v '\.d$' | head -1)
else
  cargo build -q --release -p tandem-trainer --bench train >&2
  BIN=$(ls -t target/release/deps/train-* | grep -v '\.d$' | head -1)
fi
mkdir -p out/bench
: > out/bench/train.json
# Alternate the two, twice, so that machine noise hits both alike.
for round in 1 2; do
  RAYON_NUM_THREADS=$THREADS "$BIN" "$STEPS" | tee -a out/bench/train.json
  OMP_NUM_THREADS=$THREADS "$VENV/bin/python" bench/train_torch.py "$STEPS" "$THREADS" | tee -a out/bench/train.json
done
python3 - out/bench/train.json <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
for r in recs:
    k = (r["impl"], r["model"])
    best[k] = max(best.get(k, 0), r["samples_per_second"])
print(f"\n{'model':6} {'tandem samples/s':>17} {'pytorch samples/s':>18} {'ratio':>7}")
for m in ["mlp", "cnn"]:
    a, b = best[("tandem", m)], best[("pytorch", m)]
    print(f"{m:6} {a:17.0f} {b:18.0f} {a / b:6.2f}x")
print(json.dumps({"bench": "train", "threads": recs[0]["threads"],
                  "ratio": {m: best[("tandem", m)] / best[("pytorch", m)] for m in ["mlp", "cnn"]}}))
PY
