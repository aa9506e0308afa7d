"""A plain PyTorch DDP script, run unchanged by Tandem: an MLP on Fashion-MNIST over gloo.

Nothing here imports Tandem. The script reads what torchrun would give it (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, through init_process_group's env://) and, where Tandem gives them, its
checkpoint folder, its progress file and the job's length:

  TANDEM_CHECKPOINT_DIR   checkpoints go here every TANDEM_CHECKPOINT_EVERY steps; a restarted
                          group resumes from the newest one
  TANDEM_PROGRESS_FILE    one JSON line per report: {"step": …, "loss": …, "accuracy": …}
  TANDEM_STEPS            steps to train (training.steps)
  TANDEM_DATA_DIR         folder holding fashion-mnist/ (`make data`)

On SIGTERM (a pod's eviction or preemption, `tandem train`'s Ctrl-C) every rank stops at the
next step boundary, rank 0 writes a checkpoint, and all exit 143: "checkpointed, resume me".

Run it alone:     torchrun --nproc-per-node 2 train.py
Run it by Tandem: tandem train -f job.yaml
"""

import gzip
import json
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# Tandem's documented exit code for "stopped on SIGTERM after a checkpoint; restart me".
EXIT_PREEMPTED = 143


def env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def read_idx(path):
    """An IDX file (gzip-compressed) as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, split):
    images = read_idx(os.path.join(folder, f"{split}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{split}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    x = (x - 0.2860) / 0.3530
    return x, torch.from_numpy(labels.astype(np.int64))


class Mlp(nn.Module):
    def __init__(self, hidden=128):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def newest_checkpoint(folder):
    if not folder or not os.path.isdir(folder):
        return None
    steps = [
        int(n[5:-3])
        for n in os.listdir(folder)
        if n.startswith("step-") and n.endswith(".pt")
    ]
    return os.path.join(folder, f"step-{max(steps):08d}.pt") if steps else None


def save_checkpoint(folder, step, model, optimizer, keep=2):
    """Writes step-<n>.pt atomically (temp file, then rename) and keeps the newest `keep`."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"step-{step:08d}.pt")
    tmp = path + ".tmp"
    torch.save(
        {
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        },
        tmp,
    )
    os.replace(tmp, path)
    old = sorted(
        n for n in os.listdir(folder) if n.startswith("step-") and n.endswith(".pt")
    )
    for name in old[:-keep]:
        os.remove(os.path.join(folder, name))
    return path


def report(path, **fields):
    """Appends one progress line for Tandem (any process may; one line per write)."""
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(fields) + "\n")


def evaluate(model, x, y):
    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    model.train()
    return accuracy


def main():
    dist.init_process_group(
        "gloo"
    )  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = env_int("TANDEM_STEPS", 300)
    checkpoint_every = env_int("TANDEM_CHECKPOINT_EVERY", 50)
    eval_every = env_int("TANDEM_EVAL_EVERY", 100)
    report_every = env_int("REPORT_EVERY", 10)
    batch = env_int("BATCH_SIZE", 64)
    seed = env_int("TANDEM_SEED", 42)
    checkpoints = os.environ.get("TANDEM_CHECKPOINT_DIR", "checkpoints")
    progress = os.environ.get("TANDEM_PROGRESS_FILE") if rank == 0 else None
    data = os.path.join(os.environ.get("TANDEM_DATA_DIR", "data"), "fashion-mnist")

    stop = {"asked": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))

    torch.manual_seed(seed)
    train_x, train_y = load(data, "train")
    test_x, test_y = load(data, "t10k") if rank == 0 else (None, None)
    model = nn.parallel.DistributedDataParallel(Mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start = 0
    resume = newest_checkpoint(checkpoints)
    if resume:
        state = torch.load(resume)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        print(f"rank {rank}: resumed from {resume} at step {start}", flush=True)

    # Each step reads a fixed slice of a per-epoch permutation: a resumed run sees the same data.
    per_epoch = len(train_x) // (batch * world)
    losses = []
    step = start
    started = time.time()
    order_of = {}
    while step < steps:
        epoch, within = divmod(step, per_epoch)
        if epoch not in order_of:
            generator = torch.Generator().manual_seed(seed + epoch)
            order_of = {epoch: torch.randperm(len(train_x), generator=generator)}
        order = order_of[epoch]
        at = (within * world + rank) * batch
        index = order[at : at + batch]
        loss = F.cross_entropy(model(train_x[index]), train_y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        losses.append(loss.item())

        # Every rank learns at the same step whether any was asked to stop.
        flag = torch.tensor([1.0 if stop["asked"] else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            if rank == 0:
                path = save_checkpoint(checkpoints, step, model.module, optimizer)
                print(
                    f"rank 0: SIGTERM: checkpointed step {step} to {path}", flush=True
                )
            dist.barrier()
            print(
                f"rank {rank}: stopping at step {step} with exit code {EXIT_PREEMPTED}",
                flush=True,
            )
            dist.destroy_process_group()
            sys.exit(EXIT_PREEMPTED)

        if rank == 0 and checkpoint_every > 0 and step % checkpoint_every == 0:
            save_checkpoint(checkpoints, step, model.module, optimizer)
        if step % report_every == 0 or step == steps:
            line = {
                "step": step,
                "loss": sum(losses) / len(losses),
                "samples": (step - start) * batch * world,
            }
            if rank == 0 and (
                step == steps or (eval_every > 0 and step % eval_every == 0)
            ):
                line["accuracy"] = evaluate(model.module, test_x, test_y)
            report(progress, **line)
            losses = []

    if rank == 0:
        accuracy = evaluate(model.module, test_x, test_y)
        print(
            f"rank 0: test accuracy {accuracy:.4f} after {steps} steps, {time.time() - started:.1f} s",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
