#!/usr/bin/env python3
"""The manifests the cluster benchmarks run: an algorithm's example with a model put in.

Usage: manifests.py ALGORITHM [--model MODEL] [--data DATA] [--steps N] [--eval N]  ->  the manifest on stdout

ALGORITHM is one of ALGORITHMS: an example of examples/mnist-<algorithm>.yaml (all train on the same
4 worker processes), or `hybrid-4`, MXNET-MPI's hybrid over 4 groups instead of the example's 2: the
hybrid example (2 PS shards, staleness 2) with the 4 processes as 4 groups of 1 and the learning rate
of the ps-async example, which tunes it for 4 asynchronous groups of 1 (the hybrid example's, tuned
for 2 groups of 2, the MLP ended a 600-step run at 1gbit at 0.63 test accuracy). MODEL is a key of
MODELS (default: the example's MLP). bench/tta.sh and bench/epochs.py build their manifests here, so
the shapes, optimizers and batches are the same in both.
"""
import argparse
import re
from pathlib import Path

ALGORITHMS = ["ps-sync", "ps-async", "hybrid", "hybrid-4", "easgd", "allreduce"]

# name -> the model line of the manifest
MODELS = {
    # the examples' MLP [784 -> 256 -> 128 -> 10] (235k values, 0.9 MB)
    "mlp": "{kind: mlp, hidden: [256, 128]}",
    # ResNet-20 (CIFAR-style, batch norm; 0.27M values, compute-heavy)
    "resnet20": "{kind: resnet, depth: 20}",
    # VGG-A's classifier shape, two dense layers of 4096 (20M values, 80 MB: the communication-heavy
    # layers PCL-DNN's analysis is about)
    "vgg-dense": "{kind: mlp, hidden: [4096, 4096]}",
}


def _set(text, key, value):
    """`text` with the flow-style line `key: …` replaced by `key: value`, at its indentation."""
    return re.sub(rf"^( *){key}:.*$", lambda m: f"{m.group(1)}{key}: {value}", text, count=1, flags=re.M)


def _get(text, key):
    """The value of the flow-style line `key: …` of `text`."""
    return re.search(rf"^ *{key}: *(.*)$", text, flags=re.M).group(1)


def algorithm_text(example):
    """The text of examples/mnist-<example>.yaml."""
    return Path(__file__).resolve().parent.parent.joinpath("examples", f"mnist-{example}.yaml").read_text()


def with_steps(text, steps):
    """`text` running `steps` steps (its `steps:` or `epochs:` line replaced)."""
    return re.sub(r"^( *)(steps|epochs):.*$", lambda m: f"{m.group(1)}steps: {steps}", text, count=1, flags=re.M)


def with_eval(text, every):
    """`text` evaluated every `every` steps (0: only at the end), whatever it said before."""
    text = re.sub(r"^ *evalEverySteps:.*\n", "", text, flags=re.M)
    return re.sub(r"^( *)training:$", lambda m: f"{m.group(0)}\n{m.group(1)}  evalEverySteps: {every}", text,
                  count=1, flags=re.M)


def manifest(algorithm, model=None, data=None, steps=None, eval_every=None):
    """The example of `algorithm` with `model` (a MODELS key) and `data` (a `data:` value) put in,
    `steps` steps, evaluated every `eval_every` steps (None: only at the end), without checkpoints."""
    if algorithm not in ALGORITHMS:
        raise SystemExit(f"manifests.py: unknown algorithm {algorithm!r}; one of {', '.join(ALGORITHMS)}")
    example = "hybrid" if algorithm == "hybrid-4" else algorithm
    text = algorithm_text(example)
    if algorithm == "hybrid-4":
        text = _set(text, "name", "mnist-hybrid-4")
        text = _set(text, "workers", "{groups: 4, groupSize: 1, minGroups: 1, maxGroups: 4, backend: tcp}")
        text = _set(text, "optimizer", _get(algorithm_text("ps-async"), "optimizer"))
    if model is not None:
        text = _set(text, "model", MODELS[model])
    if data is not None:
        text = _set(text, "data", data)
    text = re.sub(r"^ *(evalEverySteps|checkpoint):.*\n", "", text, flags=re.M)
    if steps is not None:
        text = with_steps(text, steps)
    return text if eval_every is None else with_eval(text, eval_every)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("algorithm", choices=ALGORITHMS)
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--data")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--eval", type=int, dest="eval_every")
    a = ap.parse_args()
    print(manifest(a.algorithm, a.model, a.data, a.steps, a.eval_every), end="")


if __name__ == "__main__":
    main()
