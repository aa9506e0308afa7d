#!/usr/bin/env bash
# Allreduce busbw, side by side in one run: Tandem's `tcp` backend vs OpenMPI's MPI_Allreduce over TCP
# (`--mca btl tcp,self`, pml ob1: the same transport) vs OpenMPI's default transport (shared memory),
# 2 and 4 ranks, 4 KiB–256 MiB. The OpenMPI side is `tandem bench allreduce --backend mpi`, which calls
# MPI_Allreduce out of place through rsmpi (as osu_allreduce does).
#
# Usage: [RANKS="2 4"] [SIZES=4K,...,256M] [TANDEM=path/to/tandem] bench/allreduce.sh
# Writes out/bench/allreduce/{results.jsonl,table.md,allreduce.png} (git-ignored) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-"2 4"}
SIZES=${SIZES:-4K,16K,64K,256K,1M,4M,16M,64M,256M}
OUT=${OUT:-out/bench/allreduce}
mkdir -p "$OUT"
scripts/install-deps.sh
if [ -z "${TANDEM:-}" ]; then
  cargo build --release -q -p tandem-trainer
  TANDEM=target/release/tandem
fi
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"

run() { # label, then the command; tags every JSON line with the series label
  local label=$1; shift
  echo "== $label: $*" >&2
  "$@" | sed "s/^{/{\"series\":\"$label\",/" >> "$RESULTS"
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpus: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 "model name" /proc/cpuinfo || true
  # The ceiling every loopback transport copies against: one core's memcpy of a 256 MiB buffer.
  python3 - <<'PY'
import time
a = bytearray(256 << 20); b = bytearray(256 << 20); b[:] = a
best = min((lambda t0: (b.__setitem__(slice(None), a), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(5))
print(f"memcpy bandwidth (1 core, 256 MiB): {len(a) / best / 1e9:.2f} GB/s")
PY
} | tee "$OUT/machine.txt" >&2

for n in $RANKS; do
  # Interleave the three series per rank count so background load hits them alike.
  run "tandem-tcp" "$TANDEM" bench allreduce --backend tcp --ranks "$n" --bytes "$SIZES" --output json
  run "openmpi-tcp" env OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo \
    "$TANDEM" bench allreduce --backend mpi --ranks "$n" --bytes "$SIZES" --output json
  run "openmpi-shm" "$TANDEM" bench allreduce --backend mpi --ranks "$n" --bytes "$SIZES" --output json
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --quiet matplotlib || \
  echo "matplotlib unavailable: table only" >&2
python3 bench/plot_allreduce.py "$RESULTS" "$OUT"
