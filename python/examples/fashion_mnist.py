"""An MLP on Fashion-MNIST, trained through tandem.torch with the job's training.algorithm.

Run by Tandem:  tandem train -f job.yaml          (allreduce: one group of two ranks)
                tandem train -f job-hybrid.yaml   (2 PS shards, 2 groups of 2)
from this folder; needs PyTorch, the tandem wheel (`make python-wheel`) and `make data`.

Each rank of each group reads its share of every batch; td.DistributedOptimizer runs the job's
algorithm (allreduce in the group, or the group with the parameter servers); a group that
restarts continues at td.start_step(); rank 0 evaluates and reports the group's progress.
"""

import gzip
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import tandem.torch as td


def load(folder, split):
    """One split of Fashion-MNIST's IDX files, normalised."""

    def idx(name):
        with gzip.open(
            os.path.join(folder, f"{split}-{name}-idx{3 if name == 'images' else 1}-ubyte.gz")
        ) as f:
            data = f.read()
        dims = data[3]
        shape = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
        return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)

    x = torch.from_numpy(idx("images").reshape(-1, 784).astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(idx("labels").astype(np.int64))


def main():
    td.init()
    rank, size = td.rank(), td.size()
    # Every rank of every group reads its own slice of each step's samples.
    world_rank, world = td.group() * size + rank, td.groups() * size
    steps = int(os.environ.get("TANDEM_STEPS", 200))
    eval_every = int(os.environ.get("TANDEM_EVAL_EVERY", 100))
    batch = int(os.environ.get("BATCH_SIZE", 64))
    data = os.path.join(os.environ.get("TANDEM_DATA_DIR", "data"), "fashion-mnist")

    train_x, train_y = load(data, "train")
    test_x, test_y = load(data, "t10k")
    torch.manual_seed(int(os.environ.get("TANDEM_SEED", 42)))
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    td.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = td.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )

    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(7))
    per_step = batch * world
    losses = []
    accuracy = None
    start = td.start_step()
    if rank == 0 and start > 0:
        print(f"group {td.group()} continues at step {start} from the parameter servers", flush=True)
    for step in range(start + 1, steps + 1):
        at = ((step - 1) * per_step) % (len(order) - per_step) + world_rank * batch
        index = order[at : at + batch]
        opt.zero_grad()
        loss = F.cross_entropy(model(train_x[index]), train_y[index])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps:
            accuracy = None
            if step == steps or (eval_every > 0 and step % eval_every == 0):
                with torch.no_grad():
                    accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
            td.report(step, loss=sum(losses) / len(losses), accuracy=accuracy, samples=step * batch * size)
            losses = []
    if rank == 0 and accuracy is not None:
        print(f"rank 0: test accuracy {accuracy:.4f} after {steps} steps ({td.algorithm()})", flush=True)


if __name__ == "__main__":
    main()
