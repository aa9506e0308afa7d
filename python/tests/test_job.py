"""Scripts using tandem.torch as a job's workers.command, through the real `tandem train` (its
parameter servers, its supervision and restarts): the example of python/examples/ trains
Fashion-MNIST to its accuracy with every algorithm, a group that loses a rank restarts and
resumes from the parameter servers, a PS that refuses the rank's token says so, and the hybrid
runs with each process on its own network-namespace node."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, tandem_train

# 200 steps of the example's MLP reach about 0.83 on Fashion-MNIST's test set with every
# algorithm (allreduce 0.83, ps-sync 0.85, ps-async 0.85, hybrid 0.81-0.83, easgd 0.84 measured
# with this job on loopback; the plain DDP example of examples/pytorch/ measures the same); this
# is clearly below.
ACCURACY = 0.75

PS_JOB = """\
apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata:
  name: torch-{name}
spec:
  training:
    algorithm: {algorithm}
    steps: 200
    evalEverySteps: 100
{settings}
  parameterServers:
    replicas: 2
  workers:
    groups: 2
    groupSize: 2
    command: [python3, {script}]
  runPolicy:
    maxRestarts: 2
    backoffSeconds: 1
"""

# What the servers run in the gradient algorithms (a decaying schedule, so the groups' last
# weights settle), and algorithm easgd's exchange (the script's own SGD steps between).
SERVER_OPTIMIZER = "    optimizer: {kind: sgd, learningRate: 0.05, momentum: 0.9, schedule: {kind: cosine}}"
SETTINGS = {
    "ps-sync": SERVER_OPTIMIZER,
    "ps-async": SERVER_OPTIMIZER,
    "hybrid": SERVER_OPTIMIZER + "\n    staleness: 2",
    "easgd": "    easgd: {tau: 4, alpha: 0.5}",
}


def example(folder, *names):
    for name in ("fashion_mnist.py", *names):
        shutil.copy(REPO / "python/examples" / name, folder / name)


def ps_job(folder, algorithm, script="fashion_mnist.py", name=None):
    (folder / "job.yaml").write_text(
        PS_JOB.format(
            name=name or algorithm,
            algorithm=algorithm,
            settings=SETTINGS[algorithm],
            script=script,
        )
    )


def group_steps(run, group):
    return [e["group_step"] for e in run.events if e["event"] == "progress" and e["group"] == group]


def test_the_example_trains_a_group_to_accuracy_through_tandem_train(tmp_path):
    example(tmp_path, "job.yaml")
    run = tandem_train(tmp_path, "job.yaml")
    finished = run.finished()
    assert finished["steps"] == 200 and finished["restarts"] == 0, finished
    assert finished["test_accuracy"] >= ACCURACY, finished
    steps = group_steps(run, 0)
    assert len(steps) >= 10 and steps == sorted(set(steps)) and steps[-1] == 200, steps
    assert any(e.get("accuracy") is not None for e in run.events if e["event"] == "progress")
    assert "test accuracy" in run.logs["worker-0-0.0.log"]


@pytest.mark.parametrize("algorithm", ["ps-sync", "ps-async", "hybrid", "easgd"])
def test_every_ps_algorithm_trains_the_example_to_accuracy(tmp_path, algorithm):
    example(tmp_path)
    ps_job(tmp_path, algorithm)
    run = tandem_train(tmp_path, "job.yaml")
    finished = run.finished()
    assert finished["restarts"] == 0, finished
    assert finished["test_accuracy"] >= ACCURACY, (finished, run.explain())
    for group in (0, 1):
        steps = group_steps(run, group)
        assert steps and steps[-1] == 200 and steps == sorted(set(steps)), (group, steps)
    # Both groups trained through the servers to the end, each evaluating the weights it holds
    # last (in sync mode the same; in the others within the staleness or the elastic pull).
    for group in (0, 1):
        accuracies = [
            e["accuracy"]
            for e in run.events
            if e["event"] == "progress" and e["group"] == group and e["accuracy"]
        ]
        assert accuracies and accuracies[-1] >= ACCURACY - 0.05, (group, accuracies)


KILL_ONCE = """\
import os, signal
import tandem.torch as td
import fashion_mnist

report = td.report


def report_then_die(step, **progress):
    # Group 1's rank 1 dies at step 120 of its first attempt, as a killed pod would.
    first = os.environ.get("TANDEM_ATTEMPT", "0") == "0"
    if step >= 120 and first and os.environ["TANDEM_GROUP"] == "1" and os.environ["TANDEM_RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return report(step, **progress)


td.report = report_then_die
fashion_mnist.main()
"""


@pytest.mark.parametrize("algorithm", ["hybrid", "ps-sync"])
def test_a_killed_rank_restarts_its_group_which_resumes_from_the_servers(tmp_path, algorithm):
    example(tmp_path)
    (tmp_path / "kill_once.py").write_text(KILL_ONCE)
    ps_job(tmp_path, algorithm, script="kill_once.py")
    run = tandem_train(tmp_path, "job.yaml")
    finished = run.finished()
    assert finished["restarts"] == 1, finished
    assert finished["test_accuracy"] >= ACCURACY, (finished, run.explain())
    # Group 1 reported up to 110, died at 120, and its second attempt went on from the servers'
    # record of its steps, not from 0: its reports never start over. In sync mode that record is
    # the servers' clock, which counts rounds: group 0 trained on alone meanwhile, and a group
    # that joined a few rounds after the other ends beyond 200, so the clock may be past the end.
    steps = group_steps(run, 1)
    assert 110 in steps, steps
    assert min(steps[steps.index(110) + 1 :], default=200) >= 110, steps
    resumed = re.search(r"group 1 continues at step (\d+)", run.logs["worker-1-0.1.log"])
    assert resumed and int(resumed[1]) >= 110, run.explain()
    # Its rank 0 saw the peer lost and exited with the retryable code, not 1.
    assert "PeerLostError" in run.logs["worker-1-0.0.log"], run.explain()
    assert "worker-1-0.1.log" in run.logs, sorted(run.logs)


def test_a_killed_parameter_server_resumes_from_its_checkpoint_and_the_groups_go_on(tmp_path):
    example(tmp_path)
    ps_job(tmp_path, "hybrid")
    # Checkpoints every 50 steps (versions 100, 200, …, with two groups): the first is written
    # well before the kill at step 100, which the default 100 would race.
    job = tmp_path / "job.yaml"
    job.write_text(
        job.read_text().replace(
            "evalEverySteps: 100\n", "evalEverySteps: 100\n    checkpoint: {everySteps: 50}\n"
        )
    )
    run = tandem_train(tmp_path, "job.yaml", "--chaos", "kill:ps:0@100")
    finished = run.finished()
    restarts = [e for e in run.events if e["event"] == "restart"]
    assert [(r["role"], r.get("index")) for r in restarts if r["role"] == "ps"] == [("ps", 0)], restarts
    assert "resumed from checkpoint" in run.logs["ps-0.1.log"], run.explain()
    assert "ps-1.1.log" not in run.logs, "PS 1 kept running"
    # PS 0's half of the model went back to its last checkpoint (up to 50 steps before the kill)
    # while PS 1's did not: the run ends lower than an uninterrupted one (0.7466 measured once
    # beside other work), still far above chance (0.1).
    assert finished["test_accuracy"] >= ACCURACY - 0.05, (finished, run.explain())
    for group in (0, 1):
        steps = group_steps(run, group)
        assert steps[-1] == 200, (group, steps)


WRONG_TOKEN = """\
import os
import fashion_mnist

# Every rank of the group agrees on a token the parameter servers do not hold.
with open("wrong-token", "w") as f:
    f.write("not-the-jobs-token\\n")
os.environ["TANDEM_TOKEN_FILE"] = os.path.abspath("wrong-token")
fashion_mnist.main()
"""


def test_a_server_that_refuses_the_token_fails_the_job_saying_why(tmp_path):
    example(tmp_path)
    (tmp_path / "wrong_token.py").write_text(WRONG_TOKEN)
    ps_job(tmp_path, "ps-sync", script="wrong_token.py", name="wrong-token")
    run = tandem_train(tmp_path, "job.yaml")
    assert run.code != 0, run.explain()
    log = run.logs["worker-0-0.0.log"]
    assert "ParameterServerError" in log and "token" in log, log[-2000:]


class Nodes:
    """Network-namespace nodes as bench/cluster.sh builds them (a veth per node to one bridge that
    holds an address in their subnet), for one test; `tandem train --node` places a process on
    each. Needs root, as `make test` runs."""

    def __init__(self, count):
        tag = os.getpid() % 100_000
        self.bridge = f"tp{tag}"
        self.names = [f"tandem-py-{tag}-{i}" for i in range(count)]
        self.addrs = [f"10.214.{tag % 200}.{i + 1}" for i in range(count)]
        self.ip("link", "add", self.bridge, "type", "bridge")
        self.ip("addr", "add", f"10.214.{tag % 200}.254/24", "dev", self.bridge)
        self.ip("link", "set", self.bridge, "up")
        for i, (name, addr) in enumerate(zip(self.names, self.addrs, strict=True)):
            self.ip("netns", "add", name)
            self.ip("link", "add", self.veth(i), "type", "veth", "peer", "name", "eth0", "netns", name)
            self.ip("link", "set", self.veth(i), "master", self.bridge, "up")
            self.ip("-n", name, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.ip("-n", name, "link", "set", "eth0", "up")
            self.ip("-n", name, "link", "set", "lo", "up")

    @staticmethod
    def ip(*args):
        done = subprocess.run(["ip", *args], capture_output=True, text=True)
        assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr} (the tests run as root)"

    def veth(self, i):
        return f"{self.bridge}v{i}"

    def args(self):
        return [
            a for name, addr in zip(self.names, self.addrs, strict=True) for a in ("--node", f"{name}={addr}")
        ]

    def carried(self, i):
        """Bytes node `i`'s link has carried, both directions."""
        stats = Path("/sys/class/net") / self.veth(i) / "statistics"
        return sum(int((stats / c).read_text()) for c in ("rx_bytes", "tx_bytes"))

    def remove(self):
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def six_nodes():
    nodes = Nodes(6)
    yield nodes
    nodes.remove()


def test_the_hybrid_runs_a_process_per_node_and_the_groups_traffic_crosses_the_links(tmp_path, six_nodes):
    example(tmp_path)
    ps_job(tmp_path, "hybrid")
    before = [six_nodes.carried(i) for i in range(6)]
    run = tandem_train(tmp_path, "job.yaml", *six_nodes.args())
    finished = run.finished()
    assert finished["test_accuracy"] >= ACCURACY, (finished, run.explain())
    # The 2 PS replicas on the first two nodes, then the ranks of groups 0 and 1, one per node.
    config = (tmp_path / "out/job.json").read_text()
    assert all(addr in config for addr in six_nodes.addrs), config
    # Per step a rank of a group of two sends and receives half the gradient in the group's
    # reduce-scatter, its half to and from the servers, and half the weights in the allgather:
    # 12 bytes per value of the model. Shared memory between the group's ranks would leave only
    # the servers' 4, so more than 8 proves the group's own traffic crossed the links too.
    params = 784 * 128 + 128 + 128 * 10 + 10
    carried = [six_nodes.carried(i) - before[i] for i in range(6)]
    for node in range(2, 6):
        assert carried[node] > 8 * params * 200, (node, carried)
