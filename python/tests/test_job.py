"""A script using tandem.torch as a job's workers.command, through the real `tandem train`: the
example of python/examples/ trains Fashion-MNIST to its accuracy, with progress in the output."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# 200 steps of the example's MLP on one group of two ranks reach about 0.83 on Fashion-MNIST's
# test set (the plain DDP example of examples/pytorch/ measures the same); this is clearly below.
ACCURACY = 0.75


def tandem_binary() -> Path:
    """The `tandem` binary: $TANDEM_BIN, else the debug build in the cargo target folder."""
    if os.environ.get("TANDEM_BIN"):
        return Path(os.environ["TANDEM_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "tandem"


def data_dir() -> Path:
    return Path(os.environ.get("TANDEM_DATA_DIR", REPO / "data"))


def test_the_example_trains_a_group_to_accuracy_through_tandem_train(tmp_path):
    binary = tandem_binary()
    assert binary.exists(), f"{binary} is missing: `cargo build -p tandem-trainer` (make python-test does)"
    assert (data_dir() / "fashion-mnist/train-images-idx3-ubyte.gz").exists(), "run `make data`"
    for name in ("fashion_mnist.py", "job.yaml"):
        shutil.copy(REPO / "python/examples" / name, tmp_path / name)
    out = tmp_path / "out"
    # `python3` in the job's command is this interpreter, which has torch and the tandem wheel.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(
        [binary, "train", "--output", "json", "-f", tmp_path / "job.yaml"]
        + ["--output-dir", out, "--data-dir", data_dir()],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = "\n".join(p.read_text() for p in sorted((out / "logs").glob("*.log"))) if out.exists() else ""
    assert done.returncode == 0, f"stderr:\n{done.stderr}\nlogs:\n{logs}"
    events = [json.loads(line) for line in done.stdout.splitlines()]
    finished = events[-1]
    assert finished["event"] == "finished", events[-3:]
    assert finished["steps"] == 200 and finished["restarts"] == 0, finished
    assert finished["test_accuracy"] >= ACCURACY, finished
    steps = [e["group_step"] for e in events if e["event"] == "progress"]
    assert len(steps) >= 10 and steps == sorted(set(steps)) and steps[-1] == 200, steps
    assert any(e.get("accuracy") is not None for e in events if e["event"] == "progress")
    assert "test accuracy" in (out / "logs/worker-0-0.0.log").read_text()
