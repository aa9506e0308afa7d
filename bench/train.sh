#!/usr/bin/env bash
# Training throughput on CPU, same models (MLP [256,128]; LeNet CNN 16/32 + dense 128), batch 64,
# same thread count, side by side and alternating in one run:
#   - tandem-engine: the tandem-kernels engine's step (kernels/src/bin/engine_step.rs): forward,
#     backward, SGD momentum over the flat vectors;
#   - pytorch: bench/train_torch.py;
#   - tandem-candle: the trainer's current candle step (bench/train.rs), the "before" figure
#     (skip with BENCH_CANDLE=0).
# Prints per model and thread count samples/s, the engine/PyTorch ratio, the engine's GFLOP/s and
# its fraction of this machine's GEMM peak at the model's shapes; JSON records go to
# out/bench/train.json.
#   bench/train.sh [steps] [threads, comma-separated]      e.g. bench/train.sh 200 1,2
# Figures only count on a quiet machine: /work/shared/tools/quiet-run -- bench/train.sh
# PyTorch is pip-installed into target/torch-venv on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
THREADS=${2:-1,2}
ROUNDS=${BENCH_ROUNDS:-2}
VENV=target/torch-venv
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "installing PyTorch into $VENV (once)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch
fi
# BENCH_PROFILE=dev skips the (slow) release build; candle, its GEMM and the engine's kernels are
# optimised in both.
if [ "${BENCH_PROFILE:-release}" = dev ]; then PROFILE_FLAG=(); DIR=target/debug; else PROFILE_FLAG=(--release); DIR=target/release; fi
cargo build -q "${PROFILE_FLAG[@]}" -p tandem-kernels --bin engine-step >&2
ENGINE=$DIR/engine-step
CANDLE=""
if [ "${BENCH_CANDLE:-1}" != 0 ]; then
  cargo build -q "${PROFILE_FLAG[@]}" -p tandem-trainer --bench train >&2
  CANDLE=$(ls -t $DIR/deps/train-* | grep -v '\.d$' | head -1)
fi
mkdir -p out/bench
: > out/bench/train.json
# Alternate the implementations, round after round, so that machine noise hits all alike.
for round in $(seq "$ROUNDS"); do
  for t in ${THREADS//,/ }; do
    "$ENGINE" "$STEPS" "$t" | tee -a out/bench/train.json
    OMP_NUM_THREADS=$t "$VENV/bin/python" bench/train_torch.py "$STEPS" "$t" | tee -a out/bench/train.json
    if [ -n "$CANDLE" ]; then
      RAYON_NUM_THREADS=$t "$CANDLE" "$STEPS" | sed 's/"impl":"tandem"/"impl":"tandem-candle"/' | tee -a out/bench/train.json
    fi
  done
done
python3 - out/bench/train.json <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
best = {}
extra = {}
for r in recs:
    k = (r["impl"], r["model"], r["threads"])
    if r["samples_per_second"] > best.get(k, 0):
        best[k] = r["samples_per_second"]
        if r["impl"] == "tandem-engine":
            extra[k[1:]] = r
threads = sorted({r["threads"] for r in recs})
print(f"\n{'model':5} {'thr':>3} {'engine/s':>10} {'pytorch/s':>10} {'candle/s':>9} {'engine÷torch':>13} "
      f"{'engine GFLOP/s':>15} {'torch GFLOP/s':>14} {'GEMM peak':>10} {'of peak':>8}")
summary = []
for m in ["mlp", "cnn"]:
    for t in threads:
        e, p = best.get(("tandem-engine", m, t)), best.get(("pytorch", m, t))
        c = best.get(("tandem-candle", m, t))
        if e is None or p is None:
            continue
        x = extra[(m, t)]
        gf = x["gflop_per_step"]
        torch_gflops = gf * p / x["batch"]
        print(f"{m:5} {t:3} {e:10.0f} {p:10.0f} {c if c else 0:9.0f} {e / p:12.2f}x "
              f"{x['gflops']:15.1f} {torch_gflops:14.1f} {x['gemm_peak_gflops']:10.1f} {x['fraction_of_peak']:7.0%}")
        summary.append({"model": m, "threads": t, "ratio_engine_vs_pytorch": e / p,
                        "ratio_candle_vs_pytorch": (c / p) if c else None,
                        "engine_gflops": x["gflops"], "fraction_of_peak": x["fraction_of_peak"]})
print(json.dumps({"bench": "train", "summary": summary}))
PY
