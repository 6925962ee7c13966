"""Where calls are routed: the switch's state, shared by the hook and the replacements.

* ``global_backend``: set by :func:`rl_triton_torchrl.enable` (``None``: off).
* ``scoped_backend``: set for the duration of one call of an explicit estimator class
  (``TritonGAE``...), whatever the global switch says; a ``ContextVar``, so it is per thread
  and per task.
* ``saved``: the functions that ``torchrl.objectives.value.advantages`` held before the hook
  replaced them; the replacements fall back to these.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

from torchrl.objectives.value import functional as _torchrl_functional

BACKENDS = ("auto", "triton", "torch", "reference")

global_backend: str | None = None
scoped_backend: ContextVar[str | None] = ContextVar("rl_triton_torchrl_backend", default=None)
saved: dict[str, Callable] = {}


def routed_backend() -> str | None:
    """The ``rl_triton_core`` backend this call should use, or ``None`` for TorchRL's code."""
    return scoped_backend.get() or global_backend


def previous(name: str) -> Callable:
    """TorchRL's function ``name`` (what the hook replaced, else TorchRL's functional one)."""
    fn = saved.get(name)
    return fn if fn is not None else getattr(_torchrl_functional, name)


def check_backend(backend: object) -> str:
    """``backend`` if it is one of ``rl_triton_core``'s backend names."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"`backend` must be one of {BACKENDS}, got {backend!r}")
    return backend
