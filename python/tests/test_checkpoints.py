"""The checkpoint helpers and the DDP communication hook of tandem.torch, on real ranks."""

import pytest
import torch

from conftest import DDP_MODEL, all_succeeded, free_ports

TRAIN_AND_SAVE = """
import json, os
import torch
import torch.nn.functional as F
import tandem.torch as td

td.init()
torch.manual_seed(td.rank())  # every rank starts from other weights
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
start = td.load_checkpoint(model, opt)
for step in range(start + 1, start + 4):
    g = torch.Generator().manual_seed(100 * step + td.rank())
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        td.allreduce_(p.grad)
    opt.step()
    written = td.save_checkpoint(step, model, opt)
    assert (written is None) == (td.rank() != 0), written
td.barrier()  # rank 0 has written its last checkpoint
momentum = [opt.state[p]["momentum_buffer"].sum().item() for p in model.parameters()]
json.dump({"start": start, "weights": [p.detach().sum().item() for p in model.parameters()],
           "momentum": momentum, "files": sorted(os.listdir(os.environ["TANDEM_CHECKPOINT_DIR"]))},
          open(os.environ["RESULT"], "w"))
"""


def test_rank_0_saves_atomically_and_every_rank_resumes_from_the_newest_checkpoint(group_of, tmp_path):
    folder = tmp_path / "checkpoints"
    group = group_of(2)
    first = group.run(TRAIN_AND_SAVE, {"TANDEM_CHECKPOINT_DIR": str(folder)})
    all_succeeded(first)
    assert [r.result["start"] for r in first] == [0, 0], "no checkpoint yet: start from scratch"
    assert first[0].result["files"] == ["step-00000002.pt", "step-00000003.pt"], "the newest 2, no .tmp"
    assert first[1].result["files"] == first[0].result["files"], "one folder, written by rank 0 only"
    # A fresh run with other initial weights resumes at step 3 with rank 0's weights and momentum
    # (ranks had the same after the allreduced steps), then trains 3 more steps.
    second = group.run(
        TRAIN_AND_SAVE.replace("torch.manual_seed(td.rank())", "torch.manual_seed(7 + td.rank())"),
        {"TANDEM_CHECKPOINT_DIR": str(folder)},
    )
    all_succeeded(second)
    assert [r.result["start"] for r in second] == [3, 3]
    assert second[0].result["files"] == ["step-00000005.pt", "step-00000006.pt"]
    assert second[0].result["weights"] == pytest.approx(second[1].result["weights"], abs=1e-6)
    assert second[0].result["momentum"] == pytest.approx(second[1].result["momentum"], abs=1e-6)


def test_checkpoint_helpers_without_a_folder_say_what_to_set(group_of):
    ranks = group_of(1).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        model = torch.nn.Linear(2, 2)
        messages = []
        for call in (lambda: td.save_checkpoint(1, model), lambda: td.load_checkpoint(model)):
            try:
                call()
            except td.ContractError as e:
                messages.append(str(e))
        try:
            td.save_checkpoint(-1, model, folder=".")
        except ValueError as e:
            messages.append(str(e))
        json.dump(messages, open(os.environ["RESULT"], "w"))
        """
    )
    all_succeeded(ranks)
    messages = ranks[0].result
    assert len(messages) == 3, messages
    assert all("TANDEM_CHECKPOINT_DIR" in m and "folder=" in m for m in messages[:2]), messages
    assert "step must be >= 0" in messages[2], messages


def test_the_ddp_comm_hook_gives_ddp_the_gradients_gloo_would(group_of):
    (port,) = free_ports(1)
    ranks = group_of(2).run(
        DDP_MODEL
        + """
td.init()
rank = td.rank()
dist.init_process_group("gloo", rank=rank, world_size=td.size())
torch.manual_seed(0)
ours = torch.nn.parallel.DistributedDataParallel(model())
ours.register_comm_hook(None, td.ddp_comm_hook)
theirs = torch.nn.parallel.DistributedDataParallel(model())
theirs.load_state_dict(ours.state_dict())
worst = 0.0
local_differs = 0.0
for step in range(3):
    x, y = batch(rank, step)
    for m in (ours, theirs):
        m.zero_grad()
        F.cross_entropy(m(x), y).backward()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        worst = max(worst, (a.grad - b.grad).abs().max().item())
    if step == 0:
        local = model()
        local.load_state_dict(ours.module.state_dict())
        F.cross_entropy(local(x), y).backward()
        pairs = zip(local.parameters(), ours.parameters())
        local_differs = max((p.grad - q.grad).abs().max().item() for p, q in pairs)
json.dump({"worst": worst, "local_differs": local_differs}, open(os.environ["RESULT"], "w"))
dist.destroy_process_group()
""",
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
    )
    all_succeeded(ranks)
    for r in ranks:
        assert r.result["worst"] < 1e-6, (r.rank, r.result)
        assert r.result["local_differs"] > 1e-3, "the hook averaged nothing"


# A sharded DistributedOptimizer (Adam over two parameter groups; three ranks, so the blocks cut
# the groups at other places) trains to $STOP, saving at step 3; it starts from $SEED's weights
# unless a checkpoint says otherwise.
SHARDED_RESUME = """
import json, os
import torch
import torch.nn.functional as F
import tandem.torch as td

td.init()
torch.manual_seed(int(os.environ["SEED"]))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
td.broadcast_parameters(model.state_dict())
params = list(model.parameters())
adam = torch.optim.Adam([{"params": params[:1]}, {"params": params[1:], "lr": 0.05}], lr=0.02)
opt = td.DistributedOptimizer(adam, named_parameters=model.named_parameters())
assert opt._tandem_shard
start = td.load_checkpoint(model, opt)
for step in range(start + 1, int(os.environ["STOP"]) + 1):
    g = torch.Generator().manual_seed(100 * step + td.rank())
    x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    if step == 3:
        td.save_checkpoint(step, model, opt)
json.dump({"start": start, "weights": [p.detach().flatten().tolist() for p in model.parameters()]},
          open(os.environ["RESULT"], "w"))
"""


def test_a_sharded_optimizer_resumes_from_a_checkpoint_as_if_never_stopped(group_of, tmp_path):
    group = group_of(3)
    through = group.run(
        SHARDED_RESUME, {"TANDEM_CHECKPOINT_DIR": str(tmp_path / "a"), "SEED": "0", "STOP": "6"}
    )
    all_succeeded(through)
    stopped = group.run(
        SHARDED_RESUME, {"TANDEM_CHECKPOINT_DIR": str(tmp_path / "b"), "SEED": "0", "STOP": "3"}
    )
    all_succeeded(stopped)
    # The checkpoint holds the whole Adam state, gathered from the three blocks.
    saved = torch.load(tmp_path / "b" / "step-00000003.pt", weights_only=False)["optimizer"]
    assert sorted(saved["state"]) == [0, 1, 2, 3]
    assert all(e["exp_avg"].abs().sum() > 0 for e in saved["state"].values()), saved["state"]
    resumed = group.run(
        SHARDED_RESUME, {"TANDEM_CHECKPOINT_DIR": str(tmp_path / "b"), "SEED": "9", "STOP": "6"}
    )
    all_succeeded(resumed)
    for a, b in zip(through, resumed, strict=True):
        assert (a.result["start"], b.result["start"]) == (0, 3)
        for x, y in zip(a.result["weights"], b.result["weights"], strict=True):
            assert x == pytest.approx(y, abs=1e-6), "the resumed run took other steps"
