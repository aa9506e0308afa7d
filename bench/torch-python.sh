#!/usr/bin/env bash
# Prints target/torch-venv's Python, first pip-installing the given packages into it (default: torch)
# when one of them cannot be imported. bench/train.sh and bench/data.sh run PyTorch through it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=target/torch-venv
[ $# -gt 0 ] || set -- torch
if ! "$VENV/bin/python" -c "import $(IFS=,; echo "$*")" 2>/dev/null; then
  echo "installing $* into $VENV (once)" >&2
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "$@" >&2
fi
echo "$PWD/$VENV/bin/python"
