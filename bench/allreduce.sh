#!/usr/bin/env bash
# Allreduce busbw, side by side in one run, 2 and 4 ranks, 4 KiB–256 MiB:
#   tandem-tcp   Tandem's built-in collectives over TCP between every rank (--shm off)
#   tandem-shm   the same ranks through shared memory (all on this machine, detected)
#   tandem-hier  4 ranks as 2 simulated hosts × 2: shared memory inside, TCP across (--hosts 2)
#   openmpi-tcp  MPI_Allreduce over TCP (`--mca btl tcp,self`, pml ob1: the same transport)
#   openmpi-shm  MPI_Allreduce with OpenMPI's default transport (vader shared memory)
# The OpenMPI side is `tandem bench allreduce --backend mpi` (MPI_Allreduce out of place through
# rsmpi, as osu_allreduce does). Every `tandem bench allreduce` call measures one core's memcpy
# bandwidth first (256 MiB), so each row carries the fraction of memcpy it reaches.
#
# Usage: [RANKS="2 4"] [SIZES=4K,...,256M] [ROUNDS=1] [TANDEM=path/to/tandem] bench/allreduce.sh
# On a quiet machine: /work/shared/tools/quiet-run -- make bench-allreduce (or any equivalent wait).
# Writes out/bench/allreduce/{results.jsonl,table.md,allreduce.svg,allreduce.png (with matplotlib)} (git-ignored) and prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${RANKS:-"2 4"}
SIZES=${SIZES:-4K,16K,64K,256K,1M,4M,16M,64M,256M}
ROUNDS=${ROUNDS:-1}
OUT=${OUT:-out/bench/allreduce}
mkdir -p "$OUT"
scripts/install-deps.sh
if [ -z "${TANDEM:-}" ]; then
  cargo build --release -q -p tandem-trainer
  TANDEM=target/release/tandem
fi
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
started=$(date +%s)

run() { # label, then the command; tags every JSON line with the series label
  local label=$1; shift
  echo "== $label: $*" >&2
  "$@" | sed "s/^{/{\"series\":\"$label\",/" >> "$RESULTS"
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpus: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg) (figures only count with a load near 0)"
  grep -m1 "model name" /proc/cpuinfo || true
} | tee "$OUT/machine.txt" >&2

bench() { "$TANDEM" bench allreduce --ranks "$1" --bytes "$SIZES" --output json "${@:2}"; }
for round in $(seq "$ROUNDS"); do
  for n in $RANKS; do
    # Interleave the series per rank count so background load hits them alike.
    run "tandem-tcp" bench "$n" --backend tcp --shm off
    run "openmpi-tcp" env OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo \
      "$TANDEM" bench allreduce --backend mpi --ranks "$n" --bytes "$SIZES" --output json
    run "tandem-shm" bench "$n" --backend tcp
    run "openmpi-shm" "$TANDEM" bench allreduce --backend mpi --ranks "$n" --bytes "$SIZES" --output json
    if [ "$n" -ge 4 ] && [ $((n % 2)) -eq 0 ]; then
      run "tandem-hier" bench "$n" --backend tcp --hosts 2
    fi
  done
done
{
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "measuring took $(( $(date +%s) - started )) s"
} | tee -a "$OUT/machine.txt" >&2

python3 -c "import matplotlib" 2>/dev/null || python3 -m pip install --quiet matplotlib || \
  echo "matplotlib unavailable: SVG plot only" >&2
python3 bench/plot_allreduce.py "$RESULTS" "$OUT"
