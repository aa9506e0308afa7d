"""Tandem for PyTorch: the names Horovod and BytePS users know, over Tandem's collectives.

A script run as a TrainingJob's ``workers.command`` (``tandem train -f job.yaml`` or the operator)
joins its worker group with :func:`init` and trains with :class:`DistributedOptimizer`::

    import tandem.torch as td

    td.init()
    model = Net()
    td.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = td.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters())
    for step, (x, y) in enumerate(batches, 1):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        td.report(step, loss=loss.item())

Everything here runs in Tandem's Rust crates (the launch contract, the ``tcp`` collectives with
shared memory between ranks on one host); tensors reach them by data pointer, without a copy, and
the GIL is released while they communicate. CPU ``float32`` tensors only: there is no GPU path yet.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from tandem import _native
from tandem._native import (
    CommunicationError,
    ContractError,
    NotInitializedError,
    ParameterServerError,
    PeerLostError,
    TandemError,
)

__all__ = [
    "EXIT_PEER_LOST",
    "EXIT_PREEMPTED",
    "CommunicationError",
    "ContractError",
    "DistributedOptimizer",
    "NotInitializedError",
    "ParameterServerError",
    "PeerLostError",
    "TandemError",
    "algorithm",
    "allreduce_",
    "barrier",
    "broadcast_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ddp_comm_hook",
    "group",
    "groups",
    "init",
    "is_initialized",
    "load_checkpoint",
    "local_rank",
    "rank",
    "report",
    "save_checkpoint",
    "shutdown",
    "should_stop",
    "size",
    "start_step",
]

#: The exit code of a rank whose group lost a peer (Tandem's contract): retried like the lost
#: peer's own failure, so the group restarts instead of the job failing.
EXIT_PEER_LOST = 200

#: The exit code of a rank that stopped on SIGTERM (preemption, eviction, a drain) after saving
#: what it needs: 128 + SIGTERM, which Tandem retries; the restarted group resumes (from the
#: script's checkpoint with ``allreduce``, from the servers in the PS algorithms).
EXIT_PREEMPTED = 128 + signal.SIGTERM

_handlers_installed = False
_stop = threading.Event()
_stop_installed = False


def init() -> None:
    """Joins this rank's worker group, as the launch contract (``TANDEM_*``) says.

    Forms the group's communicator exactly as ``tandem worker`` does and waits for every peer
    (up to ``TANDEM_PEER_TIMEOUT`` seconds). Calling it again is a no-op. Afterwards an uncaught
    :class:`PeerLostError` exits the process with :data:`EXIT_PEER_LOST`, so Tandem restarts the
    group, and the communicator says goodbye to the peers when the interpreter exits.

    Raises:
        ContractError: the script does not run as a Tandem job's worker (no or a wrong contract).
        PeerLostError: a peer did not join in time.
    """
    _install_handlers()
    _native.init()


def _install_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(_native.shutdown)
    previous = sys.excepthook

    def exit_retryable_on_peer_lost(kind, value, traceback):
        previous(kind, value, traceback)
        if isinstance(value, PeerLostError):
            sys.stdout.flush()
            sys.stderr.flush()
            _native.shutdown()
            os._exit(EXIT_PEER_LOST)

    sys.excepthook = exit_retryable_on_peer_lost


def should_stop() -> bool:
    """Whether this process was asked to stop (SIGTERM: preemption, eviction, a node drain).

    The first call installs the SIGTERM handler, so a script that never asks keeps the default
    (SIGTERM ends it at once). Ask at each step boundary; when it says yes, save what the script
    needs (with ``allreduce``, rank 0's checkpoint; the PS algorithms' state is on the servers)
    and exit with :data:`EXIT_PREEMPTED`, which Tandem retries::

        for step in range(td.start_step() + 1, steps + 1):
            ...
            if td.should_stop():
                save_checkpoint(step)
                sys.exit(td.EXIT_PREEMPTED)

    The ranks of a group may see the signal at different steps; each stops at its own, and the
    group restarts as a whole.
    """
    global _stop_installed
    if not _stop_installed:
        _stop_installed = True
        signal.signal(signal.SIGTERM, lambda signum, frame: _stop.set())
    return _stop.is_set()


def shutdown() -> None:
    """Leaves the group, telling the peers this rank is done. :func:`init` may join again."""
    _native.shutdown()


def is_initialized() -> bool:
    """Whether :func:`init` has joined the group."""
    return _native.is_initialized()


def rank() -> int:
    """This process's rank in its group (``TANDEM_RANK``), in ``range(size())``."""
    return _native.rank()


def size() -> int:
    """The number of ranks in this process's group (``workers.groupSize``)."""
    return _native.size()


def local_rank() -> int:
    """This process's rank among its group's processes on the same host (``LOCAL_RANK``)."""
    return _native.local_rank()


def group() -> int:
    """The index of this process's worker group (``TANDEM_GROUP``)."""
    return _native.group()


def groups() -> int:
    """The number of worker groups in the job now (``TANDEM_GROUPS``)."""
    return _native.groups()


def algorithm() -> str:
    """The job's ``training.algorithm`` (``allreduce``, ``ps-sync``, ``ps-async``, ``hybrid``, …)."""
    return _native.algorithm()


def allreduce_(tensor: torch.Tensor, average: bool = True) -> torch.Tensor:
    """Averages (or, with ``average=False``, sums) ``tensor`` over the group, in place.

    Every rank of the group must call it, in the same order, with a tensor of the same size.
    The tensor's memory goes to Tandem's collectives without a copy.

    Raises:
        TypeError: ``tensor`` is not a ``float32`` torch tensor.
        ValueError: ``tensor`` is not a contiguous CPU tensor.
        NotInitializedError: before :func:`init`.
        PeerLostError: a peer of the group died or hung.

    Returns:
        ``tensor``, holding the result.
    """
    _native.allreduce_(tensor, average)
    return tensor


def broadcast_(tensor: torch.Tensor, root_rank: int) -> torch.Tensor:
    """Copies rank ``root_rank``'s ``tensor`` into every rank's ``tensor``, in place.

    Takes a contiguous CPU tensor of any dtype (the bytes are copied exactly).

    Raises:
        TypeError: ``tensor`` is not a torch tensor.
        ValueError: ``tensor`` is not a contiguous CPU tensor, or ``root_rank`` is not a rank.
        NotInitializedError: before :func:`init`.
        PeerLostError: a peer of the group died or hung.

    Returns:
        ``tensor``, holding root's values.
    """
    _native.broadcast_(tensor, root_rank)
    return tensor


def barrier() -> None:
    """Returns once every rank of the group has called it."""
    _native.barrier()


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0
) -> None:
    """Copies rank ``root_rank``'s tensors into every rank's, in place, by name.

    Takes ``model.state_dict()`` (parameters and buffers) or ``model.named_parameters()``. Every
    rank must pass the same names. Call it after building the model (and after loading a
    checkpoint on the root), so every rank starts from the same weights.

    Raises:
        TypeError: a value is not a torch tensor.
        ValueError: a tensor is not on the CPU, or two entries share a name.
    """
    items = list(params.items()) if isinstance(params, Mapping) else list(params)
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError("tandem.torch.broadcast_parameters(): two tensors share a name")
    with torch.no_grad():
        for name, tensor in sorted(items, key=lambda item: item[0]):
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    f"tandem.torch.broadcast_parameters(): {name} is a {type(tensor).__name__}, "
                    "not a torch.Tensor"
                )
            if tensor.is_contiguous():
                _native.broadcast_(tensor, root_rank)
            else:
                staged = tensor.contiguous()
                _native.broadcast_(staged, root_rank)
                tensor.copy_(staged)


def start_step() -> int:
    """The step this rank's group continues from: 0 on a first start; in the parameter-server
    algorithms, after :func:`DistributedOptimizer` joined the servers, the step they recorded for
    the group, so a restarted group skips the steps already trained::

        for step in range(td.start_step(), steps):
            ...
    """
    return _native.start_step()


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Copies rank ``root_rank``'s optimizer state (momentum buffers, step counts, and the
    numeric settings of each parameter group, such as ``lr``) into every rank's optimizer.

    Call it after loading a checkpoint on the root, so every rank resumes with the same state.
    Every rank's optimizer must be of one class over the same parameters. A rank whose state has
    other entries than the root's (an optimizer that has stepped on some ranks only) first takes
    the root's layout, so the call works right after a checkpoint is loaded on the root alone.
    A sharded :func:`DistributedOptimizer` takes the whole state the root loaded, or, when the
    root loaded none since its last step, the group's current state (each rank keeps its block).

    Raises:
        NotInitializedError: before :func:`init`.
        PeerLostError: a peer of the group died or hung.
    """
    state = _shareable_state(optimizer, root_rank)
    _broadcast_state(state, root_rank)
    optimizer.load_state_dict(state)


def _shareable_state(optimizer: torch.optim.Optimizer, root_rank: int) -> dict:
    """The ``state_dict()`` that :func:`broadcast_optimizer_state` sends from the root; for a
    sharded optimizer, the whole state the root loaded (if it did since its last step) or the
    group's gathered state (collective either way)."""
    if not (isinstance(optimizer, _DistributedOptimizer) and optimizer._tandem_shard):
        return optimizer.state_dict()
    loaded = optimizer._tandem_loaded if _native.rank() == root_rank else None
    flag = torch.tensor([0.0 if loaded is None else 1.0], dtype=torch.float32)
    _native.broadcast_(flag, root_rank)
    if flag.item() == 0.0:
        return optimizer.state_dict()
    if loaded is not None:
        return loaded
    # Not the root: the groups and no state; the root's state fills it.
    return optimizer._tandem_state_dict_of({})


def _broadcast_state(state: dict, root_rank: int) -> None:
    """Makes ``state`` (an optimizer ``state_dict()``) the root's, in place."""
    layout = _state_layout(state)
    # The root's layout, as JSON bytes, so every rank knows which tensors follow.
    encoded = torch.tensor(list(json.dumps(layout).encode()), dtype=torch.uint8)
    length = torch.tensor([float(encoded.numel())], dtype=torch.float32)
    _native.broadcast_(length, root_rank)
    incoming = torch.zeros(int(length.item()), dtype=torch.uint8)
    if _native.rank() == root_rank:
        incoming = encoded
    _native.broadcast_(incoming, root_rank)
    root_layout = json.loads(bytes(incoming.tolist()).decode())
    with torch.no_grad():
        for group, settings in zip(state["param_groups"], root_layout["groups"], strict=False):
            for key in settings:
                value = torch.tensor([float(group.get(key, 0.0))], dtype=torch.float64)
                _native.broadcast_(value, root_rank)
                group[key] = type(group[key])(value.item()) if key in group else value.item()
        entries = state["state"]
        for pid, keys in root_layout["state"]:
            entry = entries.setdefault(pid, {})
            for key, (kind, shape, dtype) in keys:
                if kind == "tensor":
                    mine = entry.get(key)
                    if not isinstance(mine, torch.Tensor) or list(mine.shape) != shape:
                        mine = torch.zeros(shape, dtype=getattr(torch, dtype))
                    mine = mine.contiguous()
                    _native.broadcast_(mine, root_rank)
                    entry[key] = mine
                else:
                    value = torch.tensor([float(entry.get(key, 0.0))], dtype=torch.float64)
                    _native.broadcast_(value, root_rank)
                    entry[key] = int(value.item()) if kind == "int" else value.item()
        for pid in [p for p in entries if p not in {q for q, _ in root_layout["state"]}]:
            del entries[pid]


def _state_layout(state: dict) -> dict:
    """What an optimizer ``state_dict()`` holds, by name, kind, shape and dtype (JSON-able)."""
    groups = [
        sorted(k for k, v in g.items() if isinstance(v, int | float) and not isinstance(v, bool))
        for g in state["param_groups"]
    ]
    entries = []
    for pid in sorted(state["state"]):
        keys = []
        for key in sorted(state["state"][pid]):
            value = state["state"][pid][key]
            if isinstance(value, torch.Tensor):
                keys.append([key, ["tensor", list(value.shape), str(value.dtype).removeprefix("torch.")]])
            elif isinstance(value, bool | int):
                keys.append([key, ["int", [], ""]])
            elif isinstance(value, float):
                keys.append([key, ["float", [], ""]])
        entries.append([pid, keys])
    return {"groups": groups, "state": entries}


def report(
    step: int,
    loss: float | torch.Tensor | None = None,
    accuracy: float | None = None,
    samples: int | None = None,
    epoch: int | None = None,
) -> bool:
    """Reports the group's progress, shown in the job's status and ``tandem train``'s output.

    Appends one line to the progress file of the launch contract (``TANDEM_PROGRESS_FILE``).
    Every rank may call it; rank 0's calls write, the others' do nothing, so a script needs no
    ``if td.rank() == 0``.

    Args:
        step: optimizer steps the group completed.
        loss: the training loss (a float or a one-element tensor).
        accuracy: a test accuracy as a fraction in [0, 1].
        samples: samples the group processed in this attempt.
        epoch: the epoch of the group's data.

    Returns:
        Whether this rank wrote the line.

    Raises:
        ValueError: a non-finite loss, or an accuracy outside [0, 1].
        OSError: the progress file cannot be written.
    """
    if isinstance(loss, torch.Tensor):
        loss = loss.item()
    return _native.report(
        int(step),
        None if loss is None else float(loss),
        None if accuracy is None else float(accuracy),
        samples,
        epoch,
    )


def ddp_comm_hook(state, bucket):  # no annotations: DDP refuses any but its own
    """A DDP communication hook, for scripts that keep ``DistributedDataParallel``: each gradient
    bucket is averaged over the group by Tandem's collectives instead of the process group's::

        model = torch.nn.parallel.DistributedDataParallel(model)
        model.register_comm_hook(None, td.ddp_comm_hook)

    DDP still needs its process group, for the first broadcast of the weights and its checks;
    the gradients go through Tandem (``tcp``, with shared memory between ranks on one host).
    ``state`` is not used. Call :func:`init` first. :func:`init` listens on rank 0's
    ``MASTER_PORT``, so give ``init_process_group`` a rendezvous of its own
    (``init_method="tcp://<MASTER_ADDR>:<another port>"``).

    Raises:
        NotInitializedError: before :func:`init`.
        PeerLostError: a peer of the group died or hung.
    """
    buffer = bucket.buffer()
    if buffer.dtype == torch.float32 and buffer.is_contiguous():
        _native.allreduce_(buffer, True)
        result = buffer
    else:
        staged = buffer.to(torch.float32).contiguous()
        _native.allreduce_(staged, True)
        result = staged.to(buffer.dtype)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return future


#: Name of a checkpoint file: ``step-<8 digits>.pt``.
_CHECKPOINT = "step-{:08d}.pt"


def _checkpoint_folder(folder: str | os.PathLike | None, call: str) -> str:
    chosen = folder if folder is not None else os.environ.get("TANDEM_CHECKPOINT_DIR")
    if not chosen:
        raise ContractError(
            f"tandem.torch.{call}(): no checkpoint folder: TANDEM_CHECKPOINT_DIR is not set (Tandem "
            "sets it for workers.command; outside a job, pass folder=)"
        )
    return os.fspath(chosen)


def _checkpoint_steps(folder: str) -> list[int]:
    if not os.path.isdir(folder):
        return []
    steps = []
    for name in os.listdir(folder):
        if name.startswith("step-") and name.endswith(".pt") and name[5:-3].isdigit():
            steps.append(int(name[5:-3]))
    return sorted(steps)


def save_checkpoint(
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    folder: str | os.PathLike | None = None,
    keep: int = 2,
) -> str | None:
    """Rank 0 writes the model's (and the optimizer's) state at ``step`` to the group's checkpoint
    folder. Every rank calls it: a sharded :func:`DistributedOptimizer`'s state is gathered from
    the group first; the other ranks then return. Pair it with :func:`load_checkpoint`.

    The file, ``step-<step>.pt``, is written under a temporary name and renamed, so a rank killed
    while writing leaves the previous checkpoint whole; the newest ``keep`` files stay. The folder
    is ``TANDEM_CHECKPOINT_DIR``: the group's folder on the job's output volume (on a cluster, a
    claim keeps it across pods: ``spec.output``). With ``allreduce``, save every few steps and
    when :func:`should_stop` says so; the parameter-server algorithms keep their state on the
    servers and need none.

    Raises:
        ContractError: no folder (``TANDEM_CHECKPOINT_DIR`` unset and no ``folder``).
        ValueError: ``step`` is negative or ``keep`` is below 1.

    Returns:
        The file written on rank 0; ``None`` on the others.
    """
    if step < 0 or keep < 1:
        raise ValueError(
            f"tandem.torch.save_checkpoint(): step must be >= 0 and keep >= 1, not {step} and {keep}"
        )
    where = _checkpoint_folder(folder, "save_checkpoint")
    # A sharded optimizer's state is gathered from the whole group, so every rank takes part.
    optimizer_state = optimizer.state_dict() if optimizer is not None else None
    if _native.rank() != 0:
        return None
    os.makedirs(where, exist_ok=True)
    path = os.path.join(where, _CHECKPOINT.format(step))
    state = {"step": step, "model": model.state_dict()}
    if optimizer_state is not None:
        state["optimizer"] = optimizer_state
    temporary = f"{path}.tmp"
    torch.save(state, temporary)
    os.replace(temporary, path)
    for old in _checkpoint_steps(where)[:-keep]:
        os.remove(os.path.join(where, _CHECKPOINT.format(old)))
    return path


def load_checkpoint(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    folder: str | os.PathLike | None = None,
) -> int:
    """Resumes from the newest checkpoint of :func:`save_checkpoint`: rank 0 reads it, every rank
    of the group takes its weights (and optimizer state), and all return its step. Every rank
    must call it. Without a checkpoint nothing changes and it returns 0, so a script can start
    every run with it::

        start = td.load_checkpoint(model, optimizer)
        for step in range(start + 1, steps + 1):
            ...

    Raises:
        ContractError: no folder (``TANDEM_CHECKPOINT_DIR`` unset and no ``folder``).
        NotInitializedError: before :func:`init`.
        PeerLostError: a peer of the group died or hung.
    """
    where = _checkpoint_folder(folder, "load_checkpoint")
    found = torch.zeros(1, dtype=torch.float64)
    state = None
    if _native.rank() == 0:
        steps = _checkpoint_steps(where)
        if steps:
            path = os.path.join(where, _CHECKPOINT.format(steps[-1]))
            # The job's own file (weights_only would refuse the optimizer's floats on older torch).
            state = torch.load(path, map_location="cpu", weights_only=False)
            found[0] = float(state["step"]) + 1.0
    _native.broadcast_(found, 0)
    if found.item() == 0.0:
        return 0
    if state is not None:
        model.load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
    broadcast_parameters(model.state_dict(), root_rank=0)
    if optimizer is not None:
        broadcast_optimizer_state(optimizer, root_rank=0)
    return int(found.item()) - 1


# torch.optim's optimizers whose update of an element reads only that element's gradient, state
# and the group's settings: run on a block of the flat vector, they update it exactly as on the
# whole (what lets `allreduce` shard them).
_ELEMENTWISE = tuple(
    cls
    for cls in (
        getattr(torch.optim, name, None)
        for name in (
            "SGD",
            "Adam",
            "AdamW",
            "Adamax",
            "Adagrad",
            "Adadelta",
            "RMSprop",
            "NAdam",
            "RAdam",
            "Rprop",
            "ASGD",
        )
    )
    if cls is not None
)


class _Shard:
    """This rank's block of one parameter group's stretch of the flat vector, as the parameter
    the optimizer steps in its place: a view of the flat weights, its gradient a view of the flat
    gradients (empty where the block misses the group)."""

    def __init__(
        self, weights: torch.Tensor, grads: torch.Tensor, group: tuple[int, int], block: tuple[int, int]
    ):
        self.group_start, group_end = group
        self.start = min(max(block[0], self.group_start), group_end)
        self.end = max(self.start, min(block[1], group_end))
        self.param = torch.nn.Parameter(weights[self.start : self.end])
        self.param.grad = grads[self.start : self.end]

    def within(self) -> slice:
        """Where the block lies in the group's stretch."""
        return slice(self.start - self.group_start, self.end - self.group_start)


class _DistributedOptimizer:
    """The methods :func:`DistributedOptimizer` mixes into a copy of the wrapped optimizer."""

    _tandem_params: list[torch.Tensor]
    _tandem_views: list[torch.Tensor]
    _tandem_flat: torch.Tensor
    _tandem_weights: torch.Tensor | None
    _tandem_kind: str | None
    _tandem_shard: bool
    _tandem_shards: list[_Shard]
    _tandem_block: tuple[int, int]
    _tandem_loaded: dict | None
    _tandem_step: int
    _tandem_synchronized: bool

    def _tandem_attach(self, names: list[str]) -> None:
        params = self._tandem_params
        for name, p in zip(names, params, strict=True):
            if p.dtype != torch.float32:
                raise TypeError(
                    f"tandem.torch.DistributedOptimizer: parameter {name} is {p.dtype}; Tandem reduces "
                    "float32 gradients: call model.float()"
                )
            if p.device.type != "cpu":
                raise ValueError(
                    f"tandem.torch.DistributedOptimizer: parameter {name} is on {p.device}; there is no "
                    "GPU path yet: keep the model on the CPU"
                )
        total = sum(p.numel() for p in params)
        flat = torch.zeros(total, dtype=torch.float32)
        views = []
        offset = 0
        with torch.no_grad():
            for p in params:
                view = flat[offset : offset + p.numel()].view_as(p)
                if p.grad is not None:
                    view.copy_(p.grad)
                p.grad = view
                views.append(view)
                offset += p.numel()
        self._tandem_flat = flat
        self._tandem_views = views
        self._tandem_weights = None
        self._tandem_shards = []
        self._tandem_loaded = None
        self._tandem_step = 0
        self._tandem_synchronized = False
        if self._tandem_kind is not None or self._tandem_shard:
            self._tandem_flatten_weights()
        if self._tandem_kind is not None:
            # The group takes the servers' weights and continues at their step.
            self._tandem_step = _native.ps_start(self._tandem_weights)
        if self._tandem_shard:
            self._tandem_make_shards()

    @torch.no_grad()
    def _tandem_flatten_weights(self) -> None:
        """Makes the parameters views of one flat weight buffer (which the parameter servers'
        weights fill, and which the group's allgather shares)."""
        weights = torch.empty_like(self._tandem_flat)
        offset = 0
        for p in self._tandem_params:
            view = weights[offset : offset + p.numel()].view_as(p)
            view.copy_(p)
            p.data = view
            offset += p.numel()
        self._tandem_weights = weights

    def _tandem_make_shards(self) -> None:
        """Gives every parameter group this rank's block of its stretch of the flat vector, and
        turns any state the optimizer already holds into the blocks' state."""
        weights = self._tandem_weights
        assert weights is not None
        self._tandem_block = tuple(_native.block(self._tandem_flat.numel()))
        offset = 0
        for group in self.param_groups:  # type: ignore[attr-defined]
            length = sum(p.numel() for p in group["params"])
            shard = _Shard(weights, self._tandem_flat, (offset, offset + length), self._tandem_block)
            self._tandem_shards.append(shard)
            offset += length
        self.state = self._tandem_shard_state(self.state)  # type: ignore[attr-defined]

    @torch.no_grad()
    def _tandem_shard_state(self, whole: Mapping[torch.Tensor, dict]) -> defaultdict:
        """The blocks' state from the state of whole parameters: each elementwise tensor (one of
        its parameter's shape) cut to the block, other entries (step counts) as they are."""
        state: defaultdict = defaultdict(dict)
        for shard, group in zip(self._tandem_shards, self.param_groups, strict=True):  # type: ignore[attr-defined]
            entry: dict = {}
            pieces: dict[str, torch.Tensor] = {}
            offset = shard.group_start
            for p in group["params"]:
                for key, value in whole.get(p, {}).items():
                    if isinstance(value, torch.Tensor) and value.shape == p.shape:
                        if key not in pieces:
                            pieces[key] = torch.zeros(shard.end - shard.start, dtype=value.dtype)
                        lo, hi = max(offset, shard.start), min(offset + p.numel(), shard.end)
                        if lo < hi:
                            pieces[key][lo - shard.start : hi - shard.start] = value.reshape(-1)[
                                lo - offset : hi - offset
                            ]
                    elif key not in entry:
                        entry[key] = value.clone() if isinstance(value, torch.Tensor) else value
                offset += p.numel()
            entry.update(pieces)
            if entry:
                state[shard.param] = entry
        return state

    @torch.no_grad()
    def _tandem_whole_state(self) -> defaultdict:
        """The state of whole parameters, gathered from every rank's blocks (collective): each
        entry has one owner, so a sum over the group puts it together exactly."""
        shards = self._tandem_shards
        mine = [self.state.get(s.param, {}) for s in shards]  # type: ignore[attr-defined]
        keys = [
            sorted(k for k, v in entry.items() if isinstance(v, torch.Tensor) and v.shape == s.param.shape)
            for s, entry in zip(shards, mine, strict=True)
        ]
        # Every rank must gather the same entries; a rank that loaded or stepped alone has others.
        counts = torch.tensor([float(len(k)) for k in keys] + [1.0], dtype=torch.float32)
        agreed = counts.clone()
        _native.allreduce_(agreed, False)
        if not torch.equal(agreed, counts * agreed[-1]):
            raise ValueError(
                "tandem.torch.DistributedOptimizer.state_dict(): the ranks' optimizer states differ "
                "(a state loaded or stepped on some ranks only); load it on every rank, or on the root "
                "followed by td.broadcast_optimizer_state(optimizer)"
            )
        whole: defaultdict = defaultdict(dict)
        for shard, group, entry, names in zip(shards, self.param_groups, mine, keys, strict=True):  # type: ignore[attr-defined]
            length = sum(p.numel() for p in group["params"])
            gathered = {}
            for key in names:
                buffer = torch.zeros(length, dtype=torch.float32)
                buffer[shard.within()] = entry[key].float()
                _native.allreduce_(buffer, False)
                gathered[key] = buffer.to(entry[key].dtype)
            offset = 0
            for p in group["params"]:
                whole_entry = {
                    k: (v.clone() if isinstance(v, torch.Tensor) else v)
                    for k, v in entry.items()
                    if k not in names
                }
                for key in names:
                    whole_entry[key] = gathered[key][offset : offset + p.numel()].view_as(p).clone()
                offset += p.numel()
                if whole_entry:
                    whole[p] = whole_entry
        return whole

    def _tandem_state_dict_of(self, whole: Mapping[torch.Tensor, dict]) -> dict:
        """The optimizer's own ``state_dict()`` format for the state of whole parameters."""
        kept = self.state  # type: ignore[attr-defined]
        self.state = defaultdict(dict, whole)  # type: ignore[attr-defined]
        try:
            return super().state_dict()  # type: ignore[misc]
        finally:
            self.state = kept  # type: ignore[attr-defined]

    def state_dict(self) -> dict:
        """The optimizer's state in its own class's format. Sharded (see
        :func:`DistributedOptimizer`): gathered from every rank's block, so every rank of the group
        must call it (:func:`save_checkpoint` does)."""
        if not self._tandem_shard:
            return super().state_dict()  # type: ignore[misc]
        try:
            whole = self._tandem_whole_state()
        except CommunicationError as e:
            if type(e) is not CommunicationError:  # a lost peer stays a PeerLostError
                raise
            raise CommunicationError(
                f"{e}. A sharded DistributedOptimizer's state_dict() gathers the blocks from the group: "
                "call it on every rank (td.save_checkpoint does), or wrap the optimizer with shard=False"
            ) from e
        return self._tandem_state_dict_of(whole)

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads a state of the optimizer's own format. Sharded: each rank keeps its block of it,
        so every rank loads it, or the root alone followed by :func:`broadcast_optimizer_state`."""
        super().load_state_dict(state_dict)  # type: ignore[misc]
        if self._tandem_shard:
            self.state = self._tandem_shard_state(self.state)  # type: ignore[attr-defined]
            self._tandem_loaded = state_dict

    @torch.no_grad()
    def _tandem_gather(self) -> None:
        """Makes every parameter's ``.grad`` its view of the flat buffer again, where an
        optimizer's ``zero_grad(set_to_none=True)`` or a user replaced it."""
        for p, view in zip(self._tandem_params, self._tandem_views, strict=True):
            grad = p.grad
            if grad is None:
                view.zero_()
                p.grad = view
            elif grad.data_ptr() != view.data_ptr():
                view.copy_(grad)
                p.grad = view

    def _tandem_check_weights(self) -> None:
        weights = self._tandem_weights
        assert weights is not None
        offset = 0
        for p in self._tandem_params:
            if p.data_ptr() != weights[offset:].data_ptr():
                raise ValueError(
                    "tandem.torch.DistributedOptimizer.step(): a parameter no longer lives in the buffer "
                    "the parameter servers fill (model.to(), or .data replaced, after wrapping the "
                    "optimizer); move or replace parameters before wrapping, and load weights in place "
                    "(load_state_dict)"
                )
            offset += p.numel()

    def synchronize(self) -> None:
        """Averages the gradients over the group now: one allreduce of the flat gradient buffer.

        Call it before editing the averaged gradients (clipping); the next :meth:`step` then
        does not average again (in ``ps-sync``, ``ps-async`` and ``hybrid`` it averages the
        already averaged gradient once more on its way to the servers, which changes nothing).
        """
        self._tandem_gather()
        _native.allreduce_(self._tandem_flat, True)
        self._tandem_synchronized = True

    def step(self, closure=None):
        """Runs one step of the job's algorithm. A ``closure`` runs first, with gradients enabled.

        - ``allreduce``, sharded (PCL-DNN): a reduce-scatter averages the gradients over the group,
          leaving each rank its block of the flat vector averaged (or :meth:`synchronize` averaged
          them all); each rank runs the wrapped optimizer on its block alone, and an allgather
          gives every rank the new weights. Afterwards a rank's ``.grad`` holds the average only in
          its own block: call :meth:`synchronize` before ``step()`` to read or edit whole averaged
          gradients.
        - ``allreduce``, not sharded: averages the gradients over the group (unless
          :meth:`synchronize` just did), then runs the wrapped optimizer's step on every rank.
        - ``ps-sync``, ``ps-async``, ``hybrid``: averages the gradients over the group, each rank
          pushes its block of them to the parameter servers, which run ``training.optimizer``
          and its schedule, and pulls the new weights back; the group shares them. The wrapped
          optimizer's own update is not run.
        - ``easgd``: the group's step as in ``allreduce`` (sharded or not); every
          ``training.easgd.tau`` steps the group's weights and the servers' centre move towards
          each other by ``alpha`` of their difference.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        kind = self._tandem_kind
        if kind == "gradients":
            self._tandem_check_weights()
            self._tandem_gather()
            _native.ps_push_pull(self._tandem_step, self._tandem_weights, self._tandem_flat)
        elif self._tandem_shard:
            self._tandem_check_weights()
            self._tandem_gather()
            if not self._tandem_synchronized:
                block = tuple(_native.reduce_scatter_(self._tandem_flat, True))
                if block != self._tandem_block:
                    raise CommunicationError(
                        f"tandem.torch.DistributedOptimizer.step(): the reduce-scatter gave this rank "
                        f"elements {block}, not its block {self._tandem_block}; report this as a bug"
                    )
            self._tandem_shard_step()
            _native.allgather_(self._tandem_weights)
        else:
            if not self._tandem_synchronized:
                self.synchronize()
            super().step()  # type: ignore[misc]
        if kind == "elastic":
            self._tandem_check_weights()
            _native.ps_elastic(self._tandem_step, self._tandem_weights)
        self._tandem_loaded = None
        self._tandem_synchronized = False
        self._tandem_step += 1
        return loss

    def _tandem_shard_step(self) -> None:
        """The wrapped optimizer's own step over this rank's blocks alone, with each parameter
        group's current settings (a scheduler's ``lr``)."""
        groups = self.param_groups  # type: ignore[attr-defined]
        self.param_groups = [  # type: ignore[attr-defined]
            {**group, "params": [shard.param]}
            for group, shard in zip(groups, self._tandem_shards, strict=True)
        ]
        try:
            super().step()  # type: ignore[misc]
        finally:
            self.param_groups = groups  # type: ignore[attr-defined]

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the gradients in place. They stay views of the flat buffer: ``set_to_none`` is
        accepted for compatibility and ignored."""
        del set_to_none
        self._tandem_gather()
        self._tandem_flat.zero_()
        self._tandem_synchronized = False


def DistributedOptimizer(  # noqa: N802 (Horovod's name)
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    shard: bool | None = None,
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that its ``step()`` trains the group together, as the job's
    ``training.algorithm`` says.

    The gradients of all parameters live in one contiguous float32 buffer (each parameter's
    ``.grad`` is a view into it), which the collectives and the parameter-server client read
    without a copy; :meth:`step` says what each algorithm does with it. With ``allreduce``
    every rank ends each step with the same weights (start them equal with
    :func:`broadcast_parameters`).

    Sharded, as ``tandem worker`` runs ``allreduce`` and ``easgd`` (PCL-DNN): the parameters
    become views of one flat weight buffer, each rank keeps the optimizer state (momentum, Adam's
    moments) of its block of it alone and updates only that block, and an allgather shares the
    weights — a group of N ranks holds 1/N of the state each and spends 1/N of the optimizer's
    time. It needs an elementwise optimizer, so by default torch.optim's ``SGD``, ``Adam``,
    ``AdamW``, ``Adamax``, ``Adagrad``, ``Adadelta``, ``RMSprop``, ``NAdam``, ``RAdam``,
    ``Rprop`` and ``ASGD`` are sharded and any other class (LARS, LAMB, a subclass) runs whole
    on every rank. ``state_dict()`` then gathers the blocks, so every rank calls it (as
    :func:`save_checkpoint` and :func:`broadcast_optimizer_state` do).

    In the parameter-server algorithms the parameters also become views of one flat weight
    buffer, and wrapping joins the servers (collective: every rank of the group wraps its
    optimizer): the group takes the servers' weights — the first group's initial weights, or
    the job's current ones for a group that joins later or restarts — and continues at the step
    the servers recorded (:func:`start_step`). Move the model (``model.to()``) before wrapping.

    The result is an instance of the optimizer's own class, sharing its parameter groups and
    state: learning-rate schedulers and ``state_dict()`` work unchanged. Use it instead of
    ``optimizer`` from then on.

    Args:
        optimizer: the optimizer to wrap, over CPU float32 parameters.
        named_parameters: ``model.named_parameters()``, to name parameters in errors; every
            parameter of the optimizer must be among them.
        shard: in ``allreduce`` and ``easgd``, whether to shard the optimizer (above): ``None``
            decides by its class, ``True`` asserts it is elementwise, ``False`` runs it whole.
            The parameter servers run the optimizer in the other algorithms, so there it must be
            ``None``.

    Raises:
        NotInitializedError: before :func:`init`.
        ParameterServerError: a parameter server refused this rank (another job's token, another
            model's size), or the job runs in ``training.epochs`` (the servers' schedule needs
            ``training.steps``).
        PeerLostError: a parameter server or a peer of the group could not be reached.
        TypeError: a parameter is not float32.
        ValueError: a parameter is not on the CPU, or not among ``named_parameters``, or
            ``shard`` is given where the parameter servers run the optimizer.
    """
    kind = _native.ps_kind()
    if kind == "gradients":
        if shard is not None:
            raise ValueError(
                f"tandem.torch.DistributedOptimizer: shard={shard} has no effect in {_native.algorithm()}, "
                "where the parameter servers run training.optimizer; leave it out"
            )
        shard = False
    elif shard is None:
        shard = type(optimizer) in _ELEMENTWISE
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("tandem.torch.DistributedOptimizer: this optimizer is already wrapped")
    params: list[torch.Tensor] = []
    seen: set[int] = set()
    for param_group in optimizer.param_groups:
        for p in param_group["params"]:
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
    if named_parameters is None:
        names = [f"parameter {i}" for i in range(len(params))]
    else:
        name_of = {id(p): name for name, p in named_parameters}
        unnamed = [i for i, p in enumerate(params) if id(p) not in name_of]
        if unnamed:
            raise ValueError(
                f"tandem.torch.DistributedOptimizer: {len(unnamed)} of the optimizer's parameters are "
                "not in named_parameters; pass model.named_parameters() of the model it optimizes"
            )
        names = [name_of[id(p)] for p in params]
    base = type(optimizer)
    cls = type(base.__name__, (_DistributedOptimizer, base), {"__module__": __name__})
    wrapped: Any = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._tandem_params = params
    wrapped._tandem_kind = kind
    wrapped._tandem_shard = bool(shard)
    wrapped._tandem_attach(names)
    return wrapped
