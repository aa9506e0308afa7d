"""Helpers of the `tandem` package's tests: a group of real rank processes on loopback, each started
with the launch contract that `tandem train` gives a user's command (a job config, a token file and
the TANDEM_* variables), running a script that imports tandem.torch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Seconds a group of test ranks may take before the test fails instead of hanging.
RANK_TIMEOUT = 120

# The start of a rank script that compares Tandem with torch.distributed's gloo DDP: the imports,
# a small model (the same weights on every rank) and each rank's own batches.
DDP_MODEL = """
import json, os
import torch
import torch.distributed as dist
import torch.nn.functional as F
import tandem.torch as td

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
        torch.nn.Linear(32, 5),
    )

def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 20, generator=g), torch.randint(0, 5, (16,), generator=g)

"""


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (bound to port 0, then released, as the local runner does)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Rank:
    """One finished rank: its exit code, output, and the JSON it wrote to $RESULT (or None)."""

    rank: int
    code: int
    output: str
    result: object


class Group:
    """The launch contract of one group of `size` ranks of a job, in folder `folder`."""

    def __init__(self, folder: Path, size: int, algorithm: str = "allreduce"):
        self.folder = folder
        self.size = size
        ports = free_ports(size)
        config = {
            "jobName": "pytest",
            "namespace": "local",
            "spec": {
                "training": {"algorithm": algorithm, "steps": 10},
                "workers": {"groups": 1, "groupSize": size},
            },
            "parameterServers": [],
            "groups": [{"index": 0, "peers": [{"host": "127.0.0.1", "port": p} for p in ports]}],
        }
        self.config = folder / "job.json"
        self.config.write_text(json.dumps(config))
        self.token = folder / "token"
        self.token.write_text("a-test-token\n")

    def env(self, rank: int) -> dict[str, str]:
        """The contract variables of `rank`, over this process's environment."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
        env.update(
            TANDEM_ROLE="worker",
            TANDEM_GROUP="0",
            TANDEM_RANK=str(rank),
            TANDEM_CONFIG=str(self.config),
            TANDEM_TOKEN_FILE=str(self.token),
            TANDEM_BIND="127.0.0.1",
            TANDEM_GROUPS="1",
            TANDEM_PEER_TIMEOUT="30",
            TANDEM_PROGRESS_FILE=str(self.folder / "progress.jsonl"),
            LOCAL_RANK=str(rank),
            RANK=str(rank),
            WORLD_SIZE=str(self.size),
        )
        return env

    def run(self, script: str, extra_env: dict[str, str] | None = None) -> list[Rank]:
        """Runs `script` (Python source, dedented) as every rank at once; returns each rank when
        all have exited. The script may write a JSON result to the file named by $RESULT."""
        path = self.folder / "rank.py"
        path.write_text(textwrap.dedent(script))
        procs = []
        for rank in range(self.size):
            env = self.env(rank)
            env["RESULT"] = str(self.folder / f"result-{rank}.json")
            env.update(extra_env or {})
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(path)],
                    env=env,
                    cwd=self.folder,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        ranks = []
        for rank, proc in enumerate(procs):
            try:
                output, _ = proc.communicate(timeout=RANK_TIMEOUT)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                pytest.fail(f"rank {rank} did not finish within {RANK_TIMEOUT} s")
            result_file = self.folder / f"result-{rank}.json"
            result = json.loads(result_file.read_text()) if result_file.exists() else None
            ranks.append(Rank(rank, proc.returncode, output, result))
        return ranks


def tandem_binary() -> Path:
    """The `tandem` binary: $TANDEM_BIN, else the debug build in the cargo target folder."""
    if os.environ.get("TANDEM_BIN"):
        return Path(os.environ["TANDEM_BIN"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return target / "debug" / "tandem"


def data_dir() -> Path:
    return Path(os.environ.get("TANDEM_DATA_DIR", REPO / "data"))


@dataclass
class Run:
    """A finished `tandem train`: its exit code, stderr, JSON events and the ranks' logs."""

    code: int
    stderr: str
    events: list[dict]
    logs: dict[str, str]

    def explain(self) -> str:
        logs = "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in self.logs.items())
        return f"exit {self.code}\nstderr:\n{self.stderr[-3000:]}\nlogs:\n{logs}"

    def finished(self) -> dict:
        assert self.code == 0 and self.events and self.events[-1]["event"] == "finished", self.explain()
        return self.events[-1]


def tandem_train(folder: Path, manifest: str, *args: str, timeout: int = 600) -> Run:
    """Runs `tandem train --output json` on `manifest` (a file in `folder`, beside the scripts it
    names) with `args`, `python3` resolving to this interpreter (which has torch and the wheel)."""
    binary = tandem_binary()
    assert binary.exists(), f"{binary} is missing: `cargo build -p tandem-trainer` (make python-test does)"
    assert (data_dir() / "fashion-mnist/train-images-idx3-ubyte.gz").exists(), "run `make data`"
    out = folder / "out"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    done = subprocess.run(
        [binary, "train", "--output", "json", "-f", folder / manifest]
        + ["--output-dir", out, "--data-dir", data_dir(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    logs = {p.name: p.read_text() for p in sorted((out / "logs").glob("*.log"))} if out.exists() else {}
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return Run(done.returncode, done.stderr, events, logs)


def all_succeeded(ranks: list[Rank]) -> None:
    for r in ranks:
        assert r.code == 0, f"rank {r.rank} exited {r.code}:\n{r.output}"


@pytest.fixture
def group_of(tmp_path):
    """`group_of(size, algorithm=...)`: a fresh group contract in the test's folder."""
    count = iter(range(100))

    def make(size: int, algorithm: str = "allreduce") -> Group:
        folder = tmp_path / f"group-{next(count)}"
        folder.mkdir()
        return Group(folder, size, algorithm)

    return make
