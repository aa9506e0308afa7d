#!/usr/bin/env bash
# Training throughput on CPU, same models, same batch, same thread count, side by side and
# alternating in one run:
#   - tandem-engine: the tandem-kernels engine's step (kernels/src/bin/engine_step.rs): forward,
#     backward, SGD momentum over the flat vectors;
#   - pytorch: bench/train_torch.py, the same models in plain PyTorch (bench/torch_models.py);
#   - tandem-trainer: the trainer's own step through its Model trait as `tandem train` runs it
#     (bench/train.rs: batch assembly, the engine's forward/backward on the trainer's flat buffers,
#     the trainer's optimizer), and tandem-candle, the same step on the candle backend (the
#     "before" figure), for the MLP and the CNN only (skip with BENCH_TRAINER=0).
# The trainer-vs-PyTorch comparison alone: bench/train.sh mlp,cnn 1,2
# Models (engine-step's list): mlp (784→256→128→10, batch 64), cnn (LeNet 16/32 + dense 128, batch
# 64), resnet20 (CIFAR ResNet-20 on 1×28×28, batch 128), resnet18 and vgga (3×224×224, 1,000
# classes, batch 8), gpt (4 layers, 4 heads, width 128, context 128, vocabulary 65, batch 16).
# Prints per model and thread count samples/s (tokens/s for the GPT), the engine/PyTorch ratio,
# GFLOP/s of both and the engine's fraction of this machine's GEMM peak at the model's shapes; JSON
# records go to out/bench/train.json, the ratios' chart to out/bench/train.svg.
#   bench/train.sh [models, comma-separated | all] [threads, comma-separated]
#   e.g. bench/train.sh all 1,2        bench/train.sh resnet18,gpt 2
# Environment: BENCH_SECONDS (timed seconds per model and run, default 5), BENCH_ROUNDS (default
# 2), BENCH_TRAINER (1), BENCH_PROFILE (release; dev skips the slow release build).
# Figures only count on a quiet machine: /work/shared/tools/quiet-run -- bench/train.sh
# PyTorch is pip-installed into target/torch-venv on first use (bench/torch-python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=mlp,cnn,resnet20,resnet18,vgga,gpt
MODELS=${1:-all}
[ "$MODELS" = all ] && MODELS=$ALL
THREADS=${2:-1,2}
SECONDS_PER=${BENCH_SECONDS:-5}
ROUNDS=${BENCH_ROUNDS:-2}
for m in ${MODELS//,/ }; do
  case ",$ALL," in
    *",$m,"*) ;;
    *) echo "bench/train.sh: unknown model '$m'; the models are $ALL (or all)" >&2; exit 2 ;;
  esac
done
for t in ${THREADS//,/ }; do
  if ! [[ "$t" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/train.sh: threads must be whole numbers ≥ 1, comma-separated; got '$THREADS'" >&2
    exit 2
  fi
done
PYTHON=$(bench/torch-python.sh torch)
# BENCH_PROFILE=dev skips the (slow) release build; candle, its GEMM and the engine's kernels are
# optimised in both.
if [ "${BENCH_PROFILE:-release}" = dev ]; then PROFILE_FLAG=(); DIR=target/debug; else PROFILE_FLAG=(--release); DIR=target/release; fi
cargo build -q "${PROFILE_FLAG[@]}" -p tandem-kernels --bin engine-step >&2
ENGINE=$DIR/engine-step
TRAINER=""
if [ "${BENCH_TRAINER:-${BENCH_CANDLE:-1}}" != 0 ] && [[ ",$MODELS," =~ ,(mlp|cnn), ]]; then
  cargo build -q "${PROFILE_FLAG[@]}" -p tandem-trainer --bench train >&2
  TRAINER=$(ls -t $DIR/deps/train-* | grep -v '\.d$' | head -1)
fi
mkdir -p out/bench
: > out/bench/train.json
# Alternate the implementations model by model, round after round, so that machine noise hits
# all alike.
for round in $(seq "$ROUNDS"); do
  for t in ${THREADS//,/ }; do
    for m in ${MODELS//,/ }; do
      echo "round $round/$ROUNDS, $t thread(s), $m" >&2
      "$ENGINE" --models "$m" --threads "$t" --seconds "$SECONDS_PER" | tee -a out/bench/train.json
      OMP_NUM_THREADS=$t "$PYTHON" bench/train_torch.py --models "$m" --threads "$t" \
        --seconds "$SECONDS_PER" | tee -a out/bench/train.json
    done
    if [ -n "$TRAINER" ]; then
      TANDEM_THREADS=$t RAYON_NUM_THREADS=$t "$TRAINER" 200 | tee -a out/bench/train.json
    fi
  done
done
python3 - out/bench/train.json "$MODELS" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
models = sys.argv[2].split(",")
best, extra = {}, {}
for r in recs:
    k = (r["impl"], r["model"], r["threads"])
    if r["samples_per_second"] > best.get(k, 0):
        best[k] = r["samples_per_second"]
        extra[k] = r
threads = sorted({r["threads"] for r in recs})
print(f"\n{'model':8} {'thr':>3} {'batch':>5} {'engine/s':>10} {'pytorch/s':>10} {'trainer/s':>10} {'candle/s':>9} "
      f"{'engine÷torch':>13} {'trainer÷torch':>14} "
      f"{'engine GFLOP/s':>15} {'torch GFLOP/s':>14} {'GEMM peak':>10} {'of peak':>8}")
summary = []
for m in models:
    for t in threads:
        e, p = best.get(("tandem-engine", m, t)), best.get(("pytorch", m, t))
        c = best.get(("tandem-candle", m, t))
        tr = best.get(("tandem-trainer", m, t))
        if e is None or p is None:
            continue
        x = extra[("tandem-engine", m, t)]
        gf = x["gflop_per_step"]
        torch_gflops = gf * p / x["batch"]
        print(f"{m:8} {t:3} {x['batch']:5} {e:10.1f} {p:10.1f} {tr if tr else 0:10.1f} {c if c else 0:9.0f} "
              f"{e / p:12.2f}x {(tr / p) if tr else 0:13.2f}x "
              f"{x['gflops']:15.1f} {torch_gflops:14.1f} {x['gemm_peak_gflops']:10.1f} {x['fraction_of_peak']:7.0%}")
        row = {"model": m, "threads": t, "batch": x["batch"], "engine_samples_per_second": e,
               "pytorch_samples_per_second": p, "ratio_engine_vs_pytorch": e / p,
               "trainer_samples_per_second": tr, "ratio_trainer_vs_pytorch": (tr / p) if tr else None,
               "ratio_candle_vs_pytorch": (c / p) if c else None,
               "engine_gflops": x["gflops"], "pytorch_gflops": torch_gflops,
               "gemm_peak_gflops": x["gemm_peak_gflops"], "fraction_of_peak": x["fraction_of_peak"]}
        if "tokens_per_second" in x:
            row["engine_tokens_per_second"] = x["tokens_per_second"]
            row["pytorch_tokens_per_second"] = extra[("pytorch", m, t)]["tokens_per_second"]
        summary.append(row)
print("(GFLOP/s: the engine's count of the step's multiply-adds, ×2, over each one's step time;"
      " best of the rounds)")
print(json.dumps({"bench": "train", "summary": summary}))

# out/bench/train.svg: engine ÷ PyTorch per model, one bar per thread count, log scale (1 = parity).
import math
rows = [r for r in summary]
if rows:
    W, H, left, top, bottom = 760, 340, 60, 40, 70
    lo, hi = math.log10(0.1), math.log10(10)
    y = lambda v: top + (hi - math.log10(min(max(v, 0.1), 10))) / (hi - lo) * (H - top - bottom)
    colors = ["#4477aa", "#ee6677", "#228833", "#ccbb44"]
    group = (W - left - 20) / len(models)
    bar = group * 0.8 / max(len(threads), 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">training step: tandem-engine ÷ PyTorch (CPU, samples/s; above 1: engine faster)</text>']
    for v in [0.1, 0.25, 0.5, 1, 2, 4, 10]:
        out.append(f'<line x1="{left}" x2="{W - 20}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{"#000" if v == 1 else "#ddd"}"/>'
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:g}×</text>')
    for i, m in enumerate(models):
        x0 = left + i * group + group * 0.1
        for j, t in enumerate(threads):
            r = next((r for r in rows if r["model"] == m and r["threads"] == t), None)
            if r is None:
                continue
            v = r["ratio_engine_vs_pytorch"]
            y1, y2 = sorted((y(v), y(1)))
            out.append(f'<rect x="{x0 + j * bar:.1f}" y="{y1:.1f}" width="{bar * 0.9:.1f}" height="{max(y2 - y1, 1):.1f}" fill="{colors[j % 4]}">'
                       f'<title>{m}, {t} thread(s): {v:.2f}×</title></rect>')
        out.append(f'<text x="{x0 + group * 0.4:.1f}" y="{H - bottom + 18}" text-anchor="middle">{m}</text>')
    for j, t in enumerate(threads):
        out.append(f'<rect x="{left + j * 110}" y="{H - 28}" width="12" height="12" fill="{colors[j % 4]}"/>'
                   f'<text x="{left + j * 110 + 16}" y="{H - 18}">{t} thread(s)</text>')
    out.append("</svg>")
    with open("out/bench/train.svg", "w") as f:
        f.write("\n".join(out))
    print("plot: out/bench/train.svg")
PY
