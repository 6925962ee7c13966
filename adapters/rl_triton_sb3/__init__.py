"""Stable-Baselines3 adapter for ``rl_triton_core`` (``pip install 'rl-triton[sb3]'``).

Rollout buffers whose ``compute_returns_and_advantage`` is one ``rl_triton_core.gae`` call
instead of SB3's Python loop over time, with SB3's results (to float32 rounding) written in
place into the numpy arrays SB3's training loop reads::

    from rl_triton_sb3 import TritonRolloutBuffer
    PPO("MlpPolicy", env, rollout_buffer_class=TritonRolloutBuffer)

* ``TritonRolloutBuffer``, ``TritonDictRolloutBuffer``: SB3's ``RolloutBuffer`` /
  ``DictRolloutBuffer`` (PPO, A2C); ``TritonBufferMixin`` makes any other rollout buffer.
* sb3-contrib (imported on first use): ``TritonMaskableRolloutBuffer``,
  ``TritonMaskableDictRolloutBuffer`` for MaskablePPO; ``TritonRecurrentPPO`` (RecurrentPPO
  builds its own buffer) with ``TritonRecurrentRolloutBuffer``,
  ``TritonRecurrentDictRolloutBuffer``.
* ``enable()`` / ``disable()`` / ``with enabled():`` patch SB3's own classes, for code whose
  constructor calls cannot change (e.g. rl-zoo configs).
* Options (``rollout_buffer_kwargs`` or ``enable(...)``): ``advantage_device`` ``"auto"``
  (CPU unless the model is on CUDA and the buffer holds at least ``CUDA_MIN_ELEMENTS`` steps),
  ``"cpu"``, ``"cuda"``; ``advantage_backend`` (``rl_triton_core``'s ``backend=``).

Tested against stable-baselines3 2.9.2 and sb3-contrib 2.9.2. Docs: docs/sb3.md.
"""

from __future__ import annotations

from typing import Any

from .buffers import (
    CUDA_MIN_ELEMENTS,
    TritonBufferMixin,
    TritonDictRolloutBuffer,
    TritonRolloutBuffer,
    compute_returns_and_advantage,
)
from .patch import disable, enable, enabled, is_enabled

_CONTRIB = (
    "TritonMaskableDictRolloutBuffer",
    "TritonMaskableRolloutBuffer",
    "TritonRecurrentDictRolloutBuffer",
    "TritonRecurrentPPO",
    "TritonRecurrentRolloutBuffer",
)

__all__ = [
    "CUDA_MIN_ELEMENTS",
    "TritonBufferMixin",
    "TritonDictRolloutBuffer",
    "TritonRolloutBuffer",
    "compute_returns_and_advantage",
    "disable",
    "enable",
    "enabled",
    "is_enabled",
    *_CONTRIB,
]


def __getattr__(name: str) -> Any:  # sb3-contrib only when asked for
    if name in _CONTRIB:
        from . import contrib

        return getattr(contrib, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
