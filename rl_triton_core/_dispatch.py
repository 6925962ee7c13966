"""Backend selection: maps ``backend=`` and the tensors' device onto an implementation module.

Every backend module implements the same canonical functions (time-first views, validated
arguments, preallocated outputs): ``linear_scan``, ``gae``, ``lambda_returns``,
``discounted_returns``, ``vtrace``, ``retrace``, ``eligibility_traces``. A new backend plugs in
here without touching the public functions.
"""

from __future__ import annotations

import functools
import importlib
import math
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


def accumulates_in_float64(dtype: torch.dtype, T: int, factors: tuple, others: tuple = ()) -> bool:
    """Whether a call with outputs of ``dtype`` accumulates in float64 (every path): float64
    calls, and float32 calls whose recurrence keeps a state for long, ``min(T, 1 / (1 - |s|))
    > 128`` steps, with ``s`` the product of ``factors``, the factor of ``a_t`` that repeats step
    after step (gamma lmbda; gamma for discounted returns; none for the scan, whose ``a`` is a
    tensor), and every coefficient (``factors`` and ``others``) a Python float (a tensor one
    keeps float32).

    A float32 scan drifts there: the nearest float32 of ``s`` is off by up to 6e-8 relative, and
    each composite ``A`` of a span is a product of the same factors, rounded the same way at
    every level, so both errors grow with the span rather than as random noise. At gamma =
    0.999 over 2000 steps float32 missed float64 by 1.03e-5 relative (the Triton backend on an
    H200; the torch backend 9.2e-6), at gamma = 0.9995, lambda = 1 by 1.1-2.4e-5 at the
    benchmark shapes (the torch backend on the CPU, gamma 0.9997 over 20000 steps: 6.4e-5);
    float64 accumulation keeps it at the output's rounding (3.2-5.4e-8), for 1.3-3.0x the
    device time of those calls on the H200 (sweep 20 in
    benchmarks/results/sweep_tiles_h200.txt). ``s = 1`` (undiscounted sums) multiplies
    exactly. 16-bit outputs keep float32: their own rounding is far coarser."""
    if dtype == torch.float64:
        return True
    if dtype != torch.float32 or any(isinstance(c, torch.Tensor) for c in (*factors, *others)):
        return False
    s = abs(math.prod(factors))
    return s != 1 and min(T, 1 / (1 - s) if s < 1 else math.inf) > 128


@functools.cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(_MODULES[name])


def resolve(fn: str, backend: str, device: torch.device) -> ModuleType:
    """The implementation module for ``backend`` on ``device`` (``"auto"`` resolved here)."""
    if backend == "auto":
        backend = "triton" if device.type == "cuda" and _triton_importable() else "torch"
    elif not isinstance(backend, str):
        raise TypeError(f"{fn}: `backend` must be a str, got {type(backend).__name__}")
    elif backend not in _MODULES:
        raise ValueError(f"{fn}: unknown `backend`={backend!r}; expected one of {BACKENDS}")
    elif backend == "triton" and not triton_runs_on(device):
        raise ValueError(
            f"{fn}: `backend`='triton' needs CUDA tensors (or, on the CPU, the Triton "
            f"interpreter: set TRITON_INTERPRET=1 before importing triton); got {device} tensors"
            + ("" if _triton_importable() else " and triton is not installed")
        )
    return _module(backend)
