"""One rank of bench-torch: the same MLP step with DDP (gloo) or with tandem.torch, timed.

Run by `tandem train` as a job's workers.command (bench/torch/run.py writes the jobs):

  python3 step.py ddp      torch.distributed over gloo (env://, as torchrun gives it), DDP
  python3 step.py tandem   tandem.torch's DistributedOptimizer: the job's training.algorithm

Every rank trains an MLP of BENCH_HIDDEN units on synthetic batches of BENCH_BATCH samples for
TANDEM_STEPS steps; rank 0 of each group writes its steady-state samples/s (the steps after the
first BENCH_WARMUP) and the mean time of a step's communication to $BENCH_OUT/group-<g>.json.
"""

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn


def env_int(name, default):
    return int(os.environ.get(name) or default)


def main():
    backend = sys.argv[1]
    steps = env_int("TANDEM_STEPS", 60)
    warmup = env_int("BENCH_WARMUP", 10)
    batch = env_int("BENCH_BATCH", 64)
    hidden = env_int("BENCH_HIDDEN", 1024)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if backend == "ddp":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, group = dist.get_rank(), 0
        model = nn.parallel.DistributedDataParallel(model)
        opt = sgd
    else:
        import tandem.torch as td

        td.init()
        rank, group = td.rank(), td.group()
        td.broadcast_parameters(model.state_dict())
        opt = td.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    generator = torch.Generator().manual_seed(1000 * group + rank)
    x = torch.randn(batch, 784, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    comm = 0.0
    start = None
    for step in range(steps):
        if step == warmup:
            start, comm = time.perf_counter(), 0.0
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        # DDP overlaps its allreduce with backward; tandem's exchange is the step's first part.
        began = time.perf_counter()
        opt.step()
        comm += time.perf_counter() - began
    elapsed = time.perf_counter() - start
    timed = steps - warmup
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        result = {
            "group": group,
            "samples_per_s": timed * batch * int(os.environ["WORLD_SIZE"]) / elapsed,
            "step_s": elapsed / timed,
            "optimizer_step_s": comm / timed,
            "params": params,
        }
        with open(os.path.join(os.environ["BENCH_OUT"], f"group-{group}.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
