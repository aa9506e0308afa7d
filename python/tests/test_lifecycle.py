"""A rank's life in a job: asked to stop (SIGTERM: preemption, eviction, a drain), it finishes its
step, saves and exits with the code Tandem retries; one that never asks keeps the default."""

import signal
import subprocess
import sys
import textwrap
import time

STOPS_AT_A_STEP_BOUNDARY = """
import json, os, sys, time
import tandem.torch as td

td.init()
step = 0
td.should_stop()  # installs the handler
open(os.environ["READY"], "w").close()
while not td.should_stop():
    step += 1
    time.sleep(0.01)
json.dump({"step": step}, open(os.environ["RESULT"], "w"))
sys.exit(td.EXIT_PREEMPTED)
"""


def start(group, script, ready):
    path = group.folder / "rank.py"
    path.write_text(textwrap.dedent(script))
    env = group.env(0)
    env.update(READY=str(ready), RESULT=str(group.folder / "result.json"))
    return subprocess.Popen(
        [sys.executable, str(path)],
        env=env,
        cwd=group.folder,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def wait_for(path, proc):
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the rank never got ready"
        time.sleep(0.05)


def test_sigterm_makes_should_stop_true_and_the_rank_exits_preempted(group_of):
    group = group_of(1)
    ready = group.folder / "ready"
    proc = start(group, STOPS_AT_A_STEP_BOUNDARY, ready)
    wait_for(ready, proc)
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, output
    assert (group.folder / "result.json").read_text().startswith('{"step": '), output


def test_a_script_that_never_asks_keeps_the_default_sigterm(group_of):
    group = group_of(1)
    ready = group.folder / "ready"
    proc = start(
        group,
        """
        import os, time
        import tandem.torch as td

        td.init()
        open(os.environ["READY"], "w").close()
        time.sleep(60)
        """,
        ready,
    )
    wait_for(ready, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM
