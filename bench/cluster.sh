#!/usr/bin/env bash
# Cluster in a box (not a test): the papers' bandwidth-limited regime on this machine. NODES network
# namespaces ("nodes"), each with its own address and a veth link to one bridge; every link is
# rate-limited with tbf in both directions (the PS nodes' links like the others, so a PS hot spot
# shows). For each link preset it runs bench/tta.sh — every algorithm on the same workers, model and
# data — with `tandem train --node …`, which places each PS replica and each rank on its own node, for
# the MLP and then for each model of TTA_MODELS (ResNet-20 to 0.90 and VGG-A's dense layers to
# VGG_TARGET, each run stopped at its target or after TTA_LIMIT seconds), then tabulates epoch time
# and time to accuracy per algorithm, model and link rate beside the papers' claims
# (bench/plot_cluster.py) and plots accuracy against wall time.
#
# Then it measures epoch time (bench/epochs.py): every algorithm's example shape with the MLP, ResNet-20
# and VGG-A's dense layers, for MXNET-MPI's claim of epochs 6x faster than the default PS.
#
# Then it checks `tandem plan` (bench/plan_check.py): every shape the plan prices for PLAN_JOB on
# these nodes is run and measured, and the predicted step times and ranking are set beside the
# measured ones.
#
# With TORCH=1 it also runs bench-torch (bench/torch/run.py) on the nodes: a PyTorch script with DDP,
# tandem.torch allreduce, hybrid and pure PS (needs `make python-dev-install`; TORCH_ARGS go to
# bench/torch/run.py, e.g. "--batch 8"). Only that:
#   TORCH=1 TTA=0 EPOCHS=0 PLAN=0 LINKS=1gbit bench/cluster.sh
#
# Usage (root): [LINKS="1gbit 10gbit 25gbit"] [NODES=6] [ALGOS=…] [ROUNDS=1] [EVAL=20] [TARGET=0.90]
#               [TTA_MODELS="resnet20 vgg-dense"] [VGG_TARGET=0.85] [TTA_LIMIT=300]
#               [PLAN_JOB=examples/mnist-hybrid.yaml] [STEPS=120] [PLAN_ROUNDS=3] [TTA=1] [EPOCHS=1] [PLAN=1]
#               [MODELS="mlp resnet20 vgg-dense"] [EPOCH_ALGOS=…] [TORCH=0] bench/cluster.sh
# Writes out/bench/cluster/{<link>/…,<link>/tta-<model>/…,table.md,cluster.png,cluster.svg}. Everything it creates (the
# namespaces tcl-<n>, the bridge tclbr0) is removed when it ends, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
LINKS=${LINKS:-"1gbit 10gbit 25gbit"}
NODES=${NODES:-6}
OUT=${OUT:-out/bench/cluster}
BRIDGE=tclbr0
SUBNET=10.77.0

[ "$(id -u)" = 0 ] || { echo "bench/cluster.sh creates network namespaces: run it as root" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "needs iproute2 (ip, tc)" >&2; exit 2; }

cleanup() {
  for i in $(seq 1 "$NODES"); do ip netns del "tcl-$i" 2>/dev/null || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
cleanup

ip link add "$BRIDGE" type bridge
ip addr add "$SUBNET.254/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
NODE_ARGS=""
for i in $(seq 1 "$NODES"); do
  ip netns add "tcl-$i"
  ip link add "tclv$i" type veth peer name eth0 netns "tcl-$i"
  ip link set "tclv$i" master "$BRIDGE" up
  ip -n "tcl-$i" addr add "$SUBNET.$i/24" dev eth0
  ip -n "tcl-$i" link set eth0 up
  ip -n "tcl-$i" link set lo up
  NODE_ARGS+=" --node tcl-$i=$SUBNET.$i"
done

# tbf on both ends of every link: the node's eth0 limits what it sends, the bridge's end what it
# receives. The bucket holds 10 ms at the rate (at least 256 KiB: veths pass 64 KiB GSO frames).
limit() {
  local rate=$1 bits burst
  bits=$(python3 -c "import re,sys; n,u=re.fullmatch(r'(\d+)(k|m|g)bit','$rate').groups(); print(int(n)*{'k':10**3,'m':10**6,'g':10**9}[u])")
  burst=$(( bits / 8 / 100 )); [ "$burst" -ge 262144 ] || burst=262144
  for i in $(seq 1 "$NODES"); do
    ip netns exec "tcl-$i" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    tc qdisc replace dev "tclv$i" root tbf rate "$rate" burst "$burst" latency 50ms
  done
}

if [ -z "${TANDEM:-}" ]; then
  cargo build --release -q -p tandem-trainer --bin tandem
  TANDEM=target/release/tandem
fi
export TANDEM
mkdir -p "$OUT"
for link in $LINKS; do
  echo "== links at $link, $NODES nodes" >&2
  limit "$link"
  [ "${TTA:-1}" = 0 ] || OUT="$OUT/$link" TRAIN_ARGS="$NODE_ARGS" bench/tta.sh
  # The larger models on MNIST-5k too (its 1,000 test digits keep an evaluation short), each run stopped
  # at its target: ResNet-20 (compute-bound here) evaluated every 20 steps, VGG-A's dense layers
  # (20M values, bound by the links) every 10.
  if [ "${TTA:-1}" != 0 ]; then
    for model in ${TTA_MODELS:-resnet20 vgg-dense}; do
      case $model in
        vgg-dense) target=${VGG_TARGET:-0.85} eval=10 ;;
        *) target=${TARGET:-0.90} eval=20 ;;
      esac
      OUT="$OUT/$link/tta-$model" TRAIN_ARGS="$NODE_ARGS" MODEL=$model TARGET=$target EVAL=$eval STEPS=400 \
        UNTIL_TARGET=1 TIME_LIMIT=${TTA_LIMIT:-300} bench/tta.sh
    done
  fi
  # shellcheck disable=SC2086 # NODE_ARGS is a list of arguments
  [ "${EPOCHS:-1}" = 0 ] || python3 bench/epochs.py "$TANDEM" "$link" "$OUT/$link" $NODE_ARGS
  # shellcheck disable=SC2086
  [ "${PLAN:-1}" = 0 ] ||
    python3 bench/plan_check.py "$TANDEM" "${PLAN_JOB:-examples/mnist-hybrid.yaml}" "$link" "$NODES" "$OUT/$link" $NODE_ARGS
  if [ "${TORCH:-0}" = 1 ]; then
    mkdir -p "$OUT/$link"
    # shellcheck disable=SC2086
    python3 bench/torch/run.py --tandem "$TANDEM" --link "$link links" --out "$OUT/$link/torch.json" $NODE_ARGS ${TORCH_ARGS:-}
  fi
done
[ "${TTA:-1}" = 0 ] && [ "${EPOCHS:-1}" = 0 ] && [ "${PLAN:-1}" = 0 ] && exit 0
PY=$(bench/plot-python.sh)
$PY bench/plot_cluster.py "$OUT" "${TARGET:-0.90}" $LINKS
