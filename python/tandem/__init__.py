"""Tandem for Python: a training script's collectives and launch contract, from Tandem's own Rust.

Import the framework module you train with; for PyTorch::

    import tandem.torch as td

The exceptions below are shared by every framework module.
"""

from tandem._native import (
    CommunicationError,
    ContractError,
    NotInitializedError,
    ParameterServerError,
    PeerLostError,
    TandemError,
)

__all__ = [
    "CommunicationError",
    "ContractError",
    "NotInitializedError",
    "ParameterServerError",
    "PeerLostError",
    "TandemError",
]
