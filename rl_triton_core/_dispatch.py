"""Backend selection: maps ``backend=`` and the tensors' device onto an implementation module.

Every backend module implements the same canonical functions (time-first views, validated
arguments, preallocated outputs): ``linear_scan``, ``gae``, ``lambda_returns``,
``discounted_returns``, ``vtrace``, ``retrace``, ``eligibility_traces``. A new backend plugs in
here without touching the public functions.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

import torch

BACKENDS = ("auto", "triton", "torch", "reference")
_MODULES = {
    "reference": "rl_triton_core.reference",
    "torch": "rl_triton_core.torch_backend",
    "triton": "rl_triton_core.triton_backend",
}


# Triton reads TRITON_INTERPRET when a kernel is decorated (our kernels: at import), so it is
# read once here too.
_INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_interpreted() -> bool:
    """True when Triton kernels run on the CPU through the interpreter (TRITON_INTERPRET=1 set
    before the import)."""
    return _INTERPRETED


@functools.cache
def _triton_importable() -> bool:
    try:
        importlib.import_module(_MODULES["triton"])
    except ImportError:
        return False
    return True


def triton_runs_on(device: torch.device) -> bool:
    """Whether the Triton backend can run for tensors on ``device``."""
    if device.type == "cuda":
        return _triton_importable()
    return device.type == "cpu" and triton_interpreted() and _triton_importable()


def available_backends(device: torch.device | str = "cpu") -> list[str]:
    """The concrete backends usable for tensors on ``device``, fastest first."""
    device = torch.device(device)
    names = ["torch", "reference"]
    if triton_runs_on(device):
        names.insert(0, "triton")
    return names


@functools.cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(_MODULES[name])


def resolve(fn: str, backend: str, device: torch.device) -> ModuleType:
    """The implementation module for ``backend`` on ``device`` (``"auto"`` resolved here)."""
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and _triton_importable() else "torch"
    elif backend not in _MODULES:
        raise ValueError(f"{fn}: unknown `backend`={backend!r}; expected one of {BACKENDS}")
    elif backend == "triton" and not triton_runs_on(device):
        raise ValueError(
            f"{fn}: `backend`='triton' needs CUDA tensors (or, on the CPU, the Triton "
            f"interpreter: set TRITON_INTERPRET=1 before importing triton); got {device} tensors"
            + ("" if _triton_importable() else " and triton is not installed")
        )
    return _module(backend)
