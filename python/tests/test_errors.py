"""Each bad call to tandem.torch raises an exception that says what to do."""

import json
import os
import subprocess
import sys

import pytest
import torch

import tandem
import tandem.torch as td
from conftest import REPO, all_succeeded


def test_calls_before_init_say_to_call_init_first():
    assert not td.is_initialized()
    for call in (td.rank, td.size, td.local_rank, td.group, td.groups, td.algorithm, td.barrier):
        with pytest.raises(td.NotInitializedError, match=r"call tandem.torch.init\(\) first"):
            call()
    with pytest.raises(td.NotInitializedError, match="init"):
        td.allreduce_(torch.zeros(3))
    with pytest.raises(td.NotInitializedError, match="init"):
        td.broadcast_(torch.zeros(3), 0)
    with pytest.raises(td.NotInitializedError, match="init"):
        td.report(1, loss=0.5)
    with pytest.raises(td.NotInitializedError, match="init"):
        td.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    # Every exception is a TandemError, and a RuntimeError.
    assert issubclass(td.NotInitializedError, tandem.TandemError)
    assert issubclass(td.PeerLostError, td.CommunicationError)
    assert issubclass(tandem.TandemError, RuntimeError)


def test_init_outside_a_job_names_the_missing_variable_and_how_to_run(monkeypatch):
    for key in list(os.environ):
        if key.startswith("TANDEM_"):
            monkeypatch.delenv(key)
    with pytest.raises(td.ContractError, match=r"TANDEM_ROLE is not set.*tandem train -f job.yaml"):
        td.init()
    assert not td.is_initialized()


def test_init_with_a_broken_contract_says_which_part(tmp_path, monkeypatch, group_of):
    group = group_of(1)
    for key, value in group.env(0).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TANDEM_CONFIG", str(tmp_path / "nowhere.json"))
    with pytest.raises(td.ContractError, match=r"cannot read the job config .*nowhere.json"):
        td.init()
    monkeypatch.setenv("TANDEM_CONFIG", str(group.config))
    monkeypatch.setenv("TANDEM_RANK", "3")
    with pytest.raises(td.ContractError, match="TANDEM_RANK=3 is not a rank of group 0, which has 1"):
        td.init()
    monkeypatch.setenv("TANDEM_RANK", "zero")
    with pytest.raises(td.ContractError, match=r"TANDEM_RANK=\"zero\" is invalid"):
        td.init()
    monkeypatch.setenv("TANDEM_RANK", "0")
    empty = tmp_path / "empty-token"
    empty.write_text("")
    monkeypatch.setenv("TANDEM_TOKEN_FILE", str(empty))
    with pytest.raises(td.ContractError, match="is empty"):
        td.init()
    assert not td.is_initialized()


def test_bad_tensors_and_arguments_are_refused_before_any_communication(group_of):
    ranks = group_of(1).run(
        """
        import pytest, torch
        import tandem.torch as td

        td.init()
        with pytest.raises(ValueError, match=r"contiguous.*tensor.contiguous\\(\\)"):
            td.allreduce_(torch.zeros(4, 4).t())
        with pytest.raises(ValueError, match=r"contiguous"):
            td.broadcast_(torch.zeros(4, 4)[:, 1], 0)
        with pytest.raises(TypeError, match=r"float32 tensors, not torch.float64.*tensor.float\\(\\)"):
            td.allreduce_(torch.zeros(3, dtype=torch.float64))
        with pytest.raises(TypeError, match=r"float32 tensors, not torch.int64"):
            td.allreduce_(torch.zeros(3, dtype=torch.int64))
        with pytest.raises(TypeError, match="takes a torch.Tensor, not a list"):
            td.allreduce_([1.0, 2.0])
        with pytest.raises(TypeError, match="takes a torch.Tensor, not a ndarray"):
            import numpy
            td.broadcast_(numpy.zeros(3), 0)
        with pytest.raises(ValueError, match="dense"):
            td.allreduce_(torch.zeros(3, 3).to_sparse())
        with pytest.raises(ValueError, match="root_rank 1 is not a rank of this group of 1"):
            td.broadcast_(torch.zeros(3), 1)
        with pytest.raises(ValueError, match=r"accuracy 83 is outside \\[0, 1\\]"):
            td.report(10, accuracy=83.0)
        with pytest.raises(ValueError, match="loss NaN is not finite"):
            td.report(10, loss=float("nan"))
        with pytest.raises(TypeError, match="torch.float64; Tandem reduces float32"):
            td.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).double().parameters(), lr=1))
        model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="not in named_parameters"):
            td.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=1), named_parameters=other.named_parameters()
            )
        opt = td.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1))
        with pytest.raises(ValueError, match="already wrapped"):
            td.DistributedOptimizer(opt)
        # The communicator still works after the refusals.
        t = torch.ones(3)
        td.allreduce_(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
        """
    )
    all_succeeded(ranks)


def test_a_parameter_server_job_without_servers_or_steps_says_what_to_set(group_of):
    script = """
        import json, os, pytest, torch
        import tandem.torch as td

        td.init()
        assert td.algorithm() == "hybrid"
        expected = json.loads(os.environ["EXPECTED"])
        error = getattr(td, expected["error"])
        with pytest.raises(ValueError, match="shard=True has no effect in hybrid"):
            td.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1), shard=True)
        with pytest.raises(error, match=expected["match"]):
            td.DistributedOptimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1))
        """
    no_servers = group_of(1, algorithm="hybrid")
    expected = {"error": "ContractError", "match": "lists no parameter server"}
    all_succeeded(no_servers.run(script, {"EXPECTED": json.dumps(expected)}))

    in_epochs = group_of(1, algorithm="hybrid")
    config = json.loads(in_epochs.config.read_text())
    config["spec"]["training"] = {"algorithm": "hybrid", "epochs": 1}
    config["parameterServers"] = [{"host": "127.0.0.1", "port": 1}]
    in_epochs.config.write_text(json.dumps(config))
    expected = {"error": "ParameterServerError", "match": "sets training.epochs: set training.steps"}
    all_succeeded(in_epochs.run(script, {"EXPECTED": json.dumps(expected)}))


def test_a_lost_peer_raises_peer_lost_and_exits_with_the_retryable_code(group_of):
    ranks = group_of(2).run(
        """
        import os, torch
        import tandem.torch as td

        td.init()
        td.barrier()
        if td.rank() == 1:
            os._exit(3)  # dies without a goodbye
        td.allreduce_(torch.ones(1000))  # uncaught: the handler exits 200
        """
    )
    lost = ranks[0]
    assert lost.code == td.EXIT_PEER_LOST == 200, lost.output
    assert "PeerLostError" in lost.output and "rank 1" in lost.output, lost.output
    assert ranks[1].code == 3


def test_a_rank_whose_peer_never_comes_fails_init_naming_it(group_of):
    group = group_of(2)
    env = group.env(0)
    env["TANDEM_PEER_TIMEOUT"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", "import tandem.torch as td; td.init()"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 200, done.stderr
    assert "PeerLostError" in done.stderr and "init (joining group 0 as rank 0)" in done.stderr, done.stderr


def test_a_sharded_state_loaded_on_one_rank_alone_is_refused_by_state_dict(group_of):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        model = torch.nn.Linear(4, 3)
        opt = td.DistributedOptimizer(torch.optim.Adam(model.parameters()))
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
        state = opt.state_dict()  # collective: every rank gathers the blocks
        if td.rank() == 0:
            fresh = torch.optim.Adam(torch.nn.Linear(4, 3).parameters())
            opt.load_state_dict(fresh.state_dict())  # rank 0 alone, and never broadcast
        try:
            opt.state_dict()
            message = None
        except ValueError as e:
            message = str(e)
        # broadcast_optimizer_state mends it: every rank takes the root's loaded (empty) state.
        td.broadcast_optimizer_state(opt, root_rank=0)
        after = opt.state_dict()
        json.dump({"message": message, "before": len(state["state"]), "after": len(after["state"])},
                  open(os.environ["RESULT"], "w"))
        """
    )
    all_succeeded(ranks)
    for r in ranks:
        assert "optimizer states differ" in r.result["message"], r.result
        assert "broadcast_optimizer_state" in r.result["message"]
        assert (r.result["before"], r.result["after"]) == (2, 0), r.result


def test_a_sharded_state_dict_on_one_rank_alone_says_every_rank_must_call_it(group_of):
    ranks = group_of(2).run(
        """
        import json, os
        import torch
        import tandem.torch as td

        td.init()
        model = torch.nn.Linear(4, 3)
        opt = td.DistributedOptimizer(torch.optim.Adam(model.parameters()))
        message = None
        try:
            model(torch.ones(1, 4)).sum().backward()
            if td.rank() == 0:
                opt.state_dict()  # as a Horovod script saves: rank 0 alone
            opt.step()
        except td.CommunicationError as e:
            message = str(e)
        json.dump(message, open(os.environ["RESULT"], "w"))
        """
    )
    all_succeeded(ranks)
    root, other = (r.result for r in ranks)
    assert "same collectives in the same order" in root and "call it on every rank" in root, root
    assert "same collectives in the same order" in other, other
