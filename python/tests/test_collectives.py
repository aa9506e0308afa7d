"""Tensor collectives and the DistributedOptimizer of tandem.torch, against real PyTorch: ranks are
real processes on loopback, started with the launch contract."""

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


# One script, two ways: the same model, batches and SGD with momentum trained by
# td.DistributedOptimizer over Tandem's collectives and by torch.distributed's gloo DDP; every
# gradient and weight is compared after each step.
DDP_COMPARISON = (
    DDP_MODEL
    + """
STEPS = 3
td.init()
rank = td.rank()
ours = model()
td.broadcast_parameters(ours.state_dict(), root_rank=0)
opt = td.DistributedOptimizer(
    torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9),
    named_parameters=ours.named_parameters(),
)
assert isinstance(opt, torch.optim.SGD)
theirs_model = model()
dist.init_process_group("gloo", rank=rank, world_size=td.size())
theirs = torch.nn.parallel.DistributedDataParallel(theirs_model)
theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)

# Rank-local gradients of the first batch: the ranks' batches differ, so these differ from the
# averaged ones, and equality with DDP proves the average was taken.
local = model()
x, y = batch(rank, 0)
F.cross_entropy(local(x), y).backward()

worst = {"grad": 0.0, "weight": 0.0}
differs = 0.0
for step in range(STEPS):
    x, y = batch(rank, step)
    opt.zero_grad()
    F.cross_entropy(ours(x), y).backward()
    opt.step()
    theirs_opt.zero_grad()
    F.cross_entropy(theirs(x), y).backward()
    theirs_opt.step()
    for (name, a), b in zip(ours.named_parameters(), theirs_model.parameters()):
        assert a.grad is not None and b.grad is not None, name
        worst["grad"] = max(worst["grad"], (a.grad - b.grad).abs().max().item())
        worst["weight"] = max(worst["weight"], (a - b).abs().max().item())
    if step == 0:
        pairs = zip(local.parameters(), ours.parameters())
        differs = max((p.grad - q.grad).abs().max().item() for p, q in pairs)
json.dump({"worst": worst, "local_differs": differs}, open(os.environ["RESULT"], "w"))
dist.destroy_process_group()
"""
)


def test_distributed_optimizer_steps_like_gloo_ddp(group_of):
    (port,) = free_ports(1)
    ranks = group_of(2).run(DDP_COMPARISON, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    all_succeeded(ranks)
    for r in ranks:
        worst = r.result["worst"]
        assert worst["grad"] < 1e-6 and worst["weight"] < 1e-6, (r.rank, worst)
        assert r.result["local_differs"] > 1e-3, r.result


def test_gradients_are_views_of_one_buffer_and_synchronize_allows_clipping(group_of):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        opt = td.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
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
        """
    )
    all_succeeded(ranks)
    for r in ranks:
        got = r.result
        assert got["views"] and got["kept"] and got["is_view"], got
        assert got["averaged"] == [1.5, 1.5]
        assert got["applied"] == pytest.approx([1.0, 1.0])
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
