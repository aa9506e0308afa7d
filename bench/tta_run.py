#!/usr/bin/env python3
"""One run of bench/tta.sh: `tandem train --output json` with each line stamped with its wall time.

Usage: tta_run.py ALGORITHM ROUND RESULTS.jsonl LOG -- TANDEM train … --output json …

Appends {"algorithm", "round", "t0", "t", "line"} to RESULTS for every JSON line of the run (t0: the
launch). With UNTIL_TARGET=1 the run is stopped once a report's test accuracy reaches TARGET, and
with TIME_LIMIT (seconds) once it has run that long; a stopped run ends with the line
{"event": "stopped", "reason": "target" | "time limit"}. Exits 1 when the run neither finished nor
was stopped (its log says why).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time


def main():
    algorithm, rnd, results, log = sys.argv[1:5]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    target = float(os.environ.get("TARGET", "0.90"))
    until_target = os.environ.get("UNTIL_TARGET", "0") == "1"
    limit = float(os.environ.get("TIME_LIMIT", "0")) or None
    t0 = time.time()
    ended = None

    def record(f, line):
        f.write(json.dumps({"algorithm": algorithm, "round": int(rnd), "t0": t0, "t": time.time(), "line": line}) + "\n")
        f.flush()

    with open(results, "a") as f, open(log, "w") as err:
        # Stopped like bench/plan_check.py's runs: SIGTERM to `tandem train`, which stops the processes
        # it started; its own process group, so that a run that does not end is killed whole.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True)
        timed_out = threading.Event()

        def time_up():
            timed_out.set()
            p.terminate()

        timer = threading.Timer(limit, time_up) if limit else None
        if timer:
            timer.start()
        for text in p.stdout:
            if not text.startswith("{"):
                continue
            line = json.loads(text)
            record(f, line)
            if line.get("event") == "finished":
                ended = "finished"
            elif until_target and (line.get("accuracy") or 0.0) >= target:
                p.terminate()
                ended = "target"
                break
        if timer:
            timer.cancel()
        if ended is None and timed_out.is_set():
            ended = "time limit"
        if ended in ("target", "time limit"):
            record(f, {"event": "stopped", "reason": ended})
        p.stdout.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if ended is None:
        print(f"{algorithm} failed; see {log}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
