"""Tensor collectives and the DistributedOptimizer of tandem.torch, against real PyTorch: ranks are
real processes on loopback, started with the launch contract."""

import json

import pytest

from conftest import DDP_MODEL, all_succeeded, free_ports


def test_allreduce_and_broadcast_work_in_place_on_the_tensors_memory(group_of):
    ranks = group_of(3).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        r, n = td.rank(), td.size()
        t = torch.arange(10, dtype=torch.float32) + 100 * r
        address = t.data_ptr()
        assert td.allreduce_(t) is t and t.data_ptr() == address
        mean = t.tolist()
        s = torch.full((1000,), float(r + 1))
        td.allreduce_(s, average=False)
        # A view's memory is its own part of the base tensor.
        base = torch.zeros(4, 5)
        base[1].fill_(float(r))
        td.allreduce_(base[1], average=False)
        # Broadcast copies bytes: any dtype, any length, any offset.
        ints = torch.tensor([2**40 + r, -7 * r], dtype=torch.int64)
        td.broadcast_(ints, root_rank=1)
        odd = torch.arange(7, dtype=torch.uint8) + r
        odd_view = odd[1:]  # 6 bytes at an odd address
        td.broadcast_(odd_view, root_rank=2)
        empty = torch.zeros(0)
        td.allreduce_(empty)
        td.barrier()
        json.dump(
            {
                "mean": mean, "sum": s[:3].tolist(), "row": base.tolist(),
                "ints": ints.tolist(), "odd": odd.tolist(),
                "who": [td.rank(), td.size(), td.local_rank(), td.group(), td.groups()],
            },
            open(os.environ["RESULT"], "w"),
        )
        """
    )
    all_succeeded(ranks)
    for r in ranks:
        got = r.result
        assert got["mean"] == [100.0 + i for i in range(10)], got
        assert got["sum"] == [6.0, 6.0, 6.0]
        assert got["row"][1] == [3.0] * 5 and got["row"][0] == [0.0] * 5
        assert got["ints"] == [2**40 + 1, -7]
        assert got["odd"] == [r.rank] + [i + 2 for i in range(1, 7)]
        assert got["who"] == [r.rank, 3, r.rank, 0, 1]


def test_broadcast_parameters_gives_every_rank_the_roots_state(group_of):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        torch.manual_seed(td.rank())
        model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4))
        model(torch.randn(8, 5))  # moves the running statistics and num_batches_tracked
        if td.rank() == 1:
            model[1].num_batches_tracked += 41
        td.broadcast_parameters(model.state_dict(), root_rank=1)
        state = {k: v.tolist() for k, v in model.state_dict().items()}
        json.dump(state, open(os.environ["RESULT"], "w"))
        """
    )
    all_succeeded(ranks)
    assert ranks[0].result == ranks[1].result
    assert ranks[0].result["1.num_batches_tracked"] == 42


# One script, two ways: the same model, batches and optimizer trained by td.DistributedOptimizer
# over Tandem's collectives and by torch.distributed's gloo DDP; every weight is compared after
# each step, and every gradient where the rank holds the whole average (after synchronize(), or
# when the optimizer is not sharded). $OPTIMIZER picks SGD with momentum, or Adam with weight decay
# over two parameter groups (whose stretches the ranks' blocks cut at other places); $SHARD is
# DistributedOptimizer's shard argument; $SYNCHRONIZE calls synchronize() before every step.
DDP_COMPARISON = (
    DDP_MODEL
    + """
STEPS = 3
SHARD = json.loads(os.environ["SHARD"])
SYNCHRONIZE = os.environ["SYNCHRONIZE"] == "1"

def optimizer(net):
    if os.environ["OPTIMIZER"] == "sgd":
        return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    params = list(net.parameters())
    return torch.optim.Adam(
        [{"params": params[:2], "lr": 0.02}, {"params": params[2:], "weight_decay": 0.0}],
        lr=0.01, weight_decay=0.1,
    )

td.init()
rank = td.rank()
ours = model()
td.broadcast_parameters(ours.state_dict(), root_rank=0)
opt = td.DistributedOptimizer(optimizer(ours), named_parameters=ours.named_parameters(), shard=SHARD)
assert isinstance(opt, type(optimizer(ours)))
theirs_model = model()
dist.init_process_group("gloo", rank=rank, world_size=td.size())
theirs = torch.nn.parallel.DistributedDataParallel(theirs_model)
theirs_opt = optimizer(theirs_model)

# Rank-local gradients of the first batch: the ranks' batches differ, so these differ from the
# averaged ones, and equality with DDP proves the average was taken.
local = model()
x, y = batch(rank, 0)
F.cross_entropy(local(x), y).backward()

worst = {"grad": 0.0, "weight": 0.0, "state": 0.0}
compared = {"grad": 0, "weight": 0}
differs = 0.0
for step in range(STEPS):
    x, y = batch(rank, step)
    theirs_opt.zero_grad()
    F.cross_entropy(theirs(x), y).backward()
    theirs_opt.step()
    opt.zero_grad()
    F.cross_entropy(ours(x), y).backward()
    if SYNCHRONIZE:
        opt.synchronize()
    opt.step()
    # The whole average stays in .grad unless a sharded step's reduce-scatter left only the block.
    whole = SYNCHRONIZE or not opt._tandem_shard
    for (name, a), b in zip(ours.named_parameters(), theirs_model.parameters()):
        assert a.grad is not None and b.grad is not None, name
        if whole:
            worst["grad"] = max(worst["grad"], (a.grad - b.grad).abs().max().item())
            compared["grad"] += 1
        worst["weight"] = max(worst["weight"], (a - b).abs().max().item())
        compared["weight"] += 1
    if step == 0 and whole:
        pairs = zip(local.parameters(), ours.parameters())
        differs = max((p.grad - q.grad).abs().max().item() for p, q in pairs)

# The whole optimizer state, gathered from the blocks, is DDP's; each rank kept only its block.
state, their_state = opt.state_dict(), theirs_opt.state_dict()
assert sorted(state["state"]) == sorted(their_state["state"]), state["state"].keys()
for pid, entry in their_state["state"].items():
    for key, value in entry.items():
        if isinstance(value, torch.Tensor):
            diff = (state["state"][pid][key].float() - value.float()).abs().max().item()
            worst["state"] = max(worst["state"], diff)
        else:
            assert state["state"][pid][key] == value, (pid, key)
assert [g["lr"] for g in state["param_groups"]] == [g["lr"] for g in their_state["param_groups"]]

def elements(o):
    tensors = [v for e in o.state.values() for v in e.values() if isinstance(v, torch.Tensor)]
    return sum(v.numel() for v in tensors if v.dim())

kept, held = elements(opt), elements(theirs_opt)
json.dump(
    {"worst": worst, "compared": compared, "local_differs": differs, "sharded": opt._tandem_shard,
     "kept": kept, "held": held, "block": list(getattr(opt, "_tandem_block", (0, 0)))},
    open(os.environ["RESULT"], "w"),
)
dist.destroy_process_group()
"""
)


@pytest.mark.parametrize(
    ("optimizer", "shard", "synchronize", "size"),
    [("sgd", None, True, 2), ("sgd", False, False, 2), ("adam", None, False, 3)],
    ids=["sgd-sharded-synchronized", "sgd-whole", "adam-two-groups-sharded-3-ranks"],
)
def test_distributed_optimizer_steps_like_gloo_ddp(group_of, optimizer, shard, synchronize, size):
    (port,) = free_ports(1)
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OPTIMIZER": optimizer,
        "SHARD": json.dumps(shard),
        "SYNCHRONIZE": "1" if synchronize else "0",
    }
    ranks = group_of(size).run(DDP_COMPARISON, env)
    all_succeeded(ranks)
    blocks = []
    for r in ranks:
        got = r.result
        assert got["sharded"] == (shard is not False), got
        assert got["worst"]["weight"] < 1e-6 and got["worst"]["state"] < 1e-6, (r.rank, got)
        assert got["compared"]["weight"] == 3 * 6
        if synchronize or shard is False:
            assert got["compared"]["grad"] == 3 * 6 and got["worst"]["grad"] < 1e-6, (r.rank, got)
            assert got["local_differs"] > 1e-3, got
        if got["sharded"]:
            # Its block of each state buffer (SGD: momentum; Adam: two moments), no more.
            start, end = got["block"]
            buffers = 1 if optimizer == "sgd" else 2
            assert got["kept"] == buffers * (end - start), got
            assert got["held"] == buffers * 1893, got
            blocks.append((start, end))
        else:
            assert got["kept"] == got["held"], got
    if blocks:
        assert blocks[0][0] == 0 and blocks[-1][1] == 1893
        assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False)), blocks


@pytest.mark.parametrize("shard", [None, False], ids=["sharded", "whole"])
def test_gradients_are_views_of_one_buffer_and_synchronize_allows_clipping(group_of, shard):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        shard = json.loads(os.environ["SHARD"])
        opt = td.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0), shard=shard)
        flat = opt._tandem_flat
        views = all(
            p.grad.data_ptr() == flat.data_ptr() + 4 * offset
            for p, offset in zip(model.parameters(), (0, 6))
        )
        # Rank r's gradient is r + 1 everywhere: the average is 1.5.
        model(torch.zeros(1, 3)).sum().backward()  # bias gradient 1, weight gradient 0
        with torch.no_grad():
            for p in model.parameters():
                p.grad.fill_(td.rank() + 1.0)
        opt.synchronize()
        averaged = model.bias.grad.tolist()
        torch.nn.utils.clip_grad_value_(model.parameters(), 1.0)
        before = model.bias.detach().clone()
        opt.step()  # no second average: the clipped gradient 1.0 is applied
        applied = (before - model.bias.detach()).tolist()
        # zero_grad(set_to_none=True) keeps the views; a replaced .grad is copied back in.
        opt.zero_grad(set_to_none=True)
        kept = model.weight.grad is not None and model.weight.grad.data_ptr() == flat.data_ptr()
        model.bias.grad = torch.full((2,), 2.0 * td.rank())
        opt.step()
        bias_grad = model.bias.grad.tolist()
        json.dump(
            {"views": views, "averaged": averaged, "applied": applied, "kept": kept,
             "bias_grad": bias_grad, "is_view": model.bias.grad.data_ptr() == flat.data_ptr() + 24},
            open(os.environ["RESULT"], "w"),
        )
        """,
        {"SHARD": json.dumps(shard)},
    )
    all_succeeded(ranks)
    for r in ranks:
        got = r.result
        assert got["views"] and got["kept"] and got["is_view"], got
        assert got["averaged"] == [1.5, 1.5]
        assert got["applied"] == pytest.approx([1.0, 1.0])
        # Sharded, the step's reduce-scatter averages a rank's own block alone: of 8 elements,
        # rank 1's block (4..8) holds the bias.
        if shard is False or r.rank == 1:
            assert got["bias_grad"] == [1.0, 1.0], "the replaced gradients 0 and 2 were averaged"


def test_broadcast_optimizer_state_gives_every_rank_the_roots_state(group_of):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        td.broadcast_parameters(model.state_dict())
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        if td.rank() == 0:
            # As if the root had loaded a checkpoint: three steps of state and a decayed lr;
            # rank 1's optimizer has never stepped.
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(5, 4)).pow(2).sum().backward()
                opt.step()
            opt.param_groups[0]["lr"] = 0.01
            td.broadcast_parameters(model.state_dict())
        else:
            td.broadcast_parameters(model.state_dict())
        td.broadcast_optimizer_state(opt, root_rank=0)
        state = opt.state_dict()
        entries = {
            str(pid): {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in e.items()}
            for pid, e in state["state"].items()
        }
        # The same gradient on both ranks now moves both models the same way.
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        json.dump(
            {"lr": state["param_groups"][0]["lr"], "state": entries,
             "weights": [p.detach().tolist() for p in model.parameters()]},
            open(os.environ["RESULT"], "w"),
        )
        """
    )
    all_succeeded(ranks)
    root, other = (r.result for r in ranks)
    assert root["lr"] == other["lr"] == 0.01
    assert sorted(root["state"]) == sorted(other["state"]) == ["0", "1"], other["state"]
    assert root["state"] == other["state"]
    assert root["state"]["0"]["exp_avg"] != [[0.0] * 4] * 3
    assert root["weights"] == other["weights"]
