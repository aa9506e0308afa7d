#!/usr/bin/env bash
# Prints a Python that has matplotlib: python3 if it has it, else target/bench-venv's, made once.
# Without either (no PyPI), prints python3 and the plots are skipped (the tables are still written).
cd "$(dirname "$0")/.."
if python3 -c "import matplotlib" 2>/dev/null; then echo python3; exit 0; fi
if ! target/bench-venv/bin/python -c "import matplotlib" 2>/dev/null; then
  echo "installing matplotlib into target/bench-venv (once)" >&2
  { python3 -m venv target/bench-venv && target/bench-venv/bin/pip install -q matplotlib; } >&2 ||
    { echo "matplotlib unavailable: tables only" >&2; echo python3; exit 0; }
fi
echo "$PWD/target/bench-venv/bin/python"
