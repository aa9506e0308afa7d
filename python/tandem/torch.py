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
import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from tandem import _native
from tandem._native import (
    CommunicationError,
    ContractError,
    NotInitializedError,
    PeerLostError,
    TandemError,
)

__all__ = [
    "EXIT_PEER_LOST",
    "CommunicationError",
    "ContractError",
    "DistributedOptimizer",
    "NotInitializedError",
    "PeerLostError",
    "TandemError",
    "algorithm",
    "allreduce_",
    "barrier",
    "broadcast_",
    "broadcast_parameters",
    "group",
    "groups",
    "init",
    "is_initialized",
    "local_rank",
    "rank",
    "report",
    "shutdown",
    "size",
]

#: The exit code of a rank whose group lost a peer (Tandem's contract): retried like the lost
#: peer's own failure, so the group restarts instead of the job failing.
EXIT_PEER_LOST = 200

_handlers_installed = False


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


class _DistributedOptimizer:
    """The methods :func:`DistributedOptimizer` mixes into a copy of the wrapped optimizer."""

    _tandem_params: list[torch.Tensor]
    _tandem_views: list[torch.Tensor]
    _tandem_flat: torch.Tensor
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
        self._tandem_synchronized = False

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

    def synchronize(self) -> None:
        """Averages the gradients over the group now: one allreduce of the flat gradient buffer.

        Call it before editing the averaged gradients (clipping); the next :meth:`step` then
        does not average again.
        """
        self._tandem_gather()
        _native.allreduce_(self._tandem_flat, True)
        self._tandem_synchronized = True

    def step(self, closure=None):
        """Averages the gradients over the group (unless :meth:`synchronize` just did), then runs
        the wrapped optimizer's step. A ``closure`` runs first, with gradients enabled."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._tandem_synchronized:
            self.synchronize()
        self._tandem_synchronized = False
        super().step()  # type: ignore[misc]
        return loss

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
) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that its ``step()`` trains the group together, as the job's
    ``training.algorithm`` says.

    With ``allreduce``, the gradients of all parameters live in one contiguous float32 buffer
    (each parameter's ``.grad`` is a view into it), which ``step()`` averages over the group
    with one allreduce before the wrapped optimizer's step. Every rank then applies the same
    update, so the weights stay equal on all ranks (start them equal with
    :func:`broadcast_parameters`).

    The result is an instance of the optimizer's own class, sharing its parameter groups and
    state: learning-rate schedulers and ``state_dict()`` work unchanged. Use it instead of
    ``optimizer`` from then on.

    Args:
        optimizer: the optimizer to wrap, over CPU float32 parameters.
        named_parameters: ``model.named_parameters()``, to name parameters in errors; every
            parameter of the optimizer must be among them.

    Raises:
        NotInitializedError: before :func:`init`.
        NotImplementedError: the job's algorithm is a parameter-server one, not built yet.
        TypeError: a parameter is not float32.
        ValueError: a parameter is not on the CPU, or not among ``named_parameters``.
    """
    chosen = _native.algorithm()
    if chosen != "allreduce":
        raise NotImplementedError(
            f"this job's training.algorithm is {chosen}; tandem.torch.DistributedOptimizer runs "
            "algorithm: allreduce only so far (the parameter-server modes are not built yet): set "
            "training.algorithm: allreduce in the job"
        )
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
    wrapped._tandem_attach(names)
    return wrapped
