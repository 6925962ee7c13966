"""``enable()`` / ``disable()``: our computation inside SB3's own buffer classes.

For code whose constructor calls cannot change (rl-zoo configs, RecurrentPPO): patches
``RolloutBuffer.compute_returns_and_advantage`` and the ``reset`` of ``RolloutBuffer`` and
``DictRolloutBuffer`` (the no-copy layout, see :mod:`rl_triton_sb3.buffers`) on SB3's classes,
so every buffer that inherits them picks it up: SB3's PPO and A2C and sb3-contrib's
MaskablePPO and RecurrentPPO buffers. Idempotent; ``disable()`` puts back the exact original
functions (also reachable as ``__wrapped__``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer

from . import buffers

logger = logging.getLogger(__name__)

_originals: dict[tuple[type, str], Callable] = {}  # what enable() replaced


def _reset(original: Callable) -> Callable:
    @functools.wraps(original)
    def reset(self) -> None:
        original(self)
        buffers.install_layout(self)

    return reset


def _compute(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_returns_and_advantage(self, last_values, dones) -> None:
        buffers.compute_returns_and_advantage(self, last_values, dones)

    return compute_returns_and_advantage


_PATCHES = (
    (RolloutBuffer, "reset", _reset),
    (DictRolloutBuffer, "reset", _reset),
    (RolloutBuffer, "compute_returns_and_advantage", _compute),
)


def enable(advantage_device: Any = "auto", advantage_backend: Any = "auto") -> None:
    """Compute the advantages of every SB3 rollout buffer with ``rl_triton_core.gae``.

    The options are :class:`~rl_triton_sb3.TritonBufferMixin`'s, for the buffers SB3 builds
    (our own buffer classes keep theirs). Calling it again only updates the options.
    """
    device, backend = buffers.check_options(advantage_device, advantage_backend)
    buffers.global_options.update(advantage_device=device, advantage_backend=backend)
    if _originals:
        return
    for cls, name, wrap in _PATCHES:
        original = cls.__dict__[name]
        _originals[(cls, name)] = original
        setattr(cls, name, wrap(original))
    logger.info(
        "rl_triton_sb3: patched %s",
        ", ".join(f"{cls.__name__}.{name}" for cls, name, _ in _PATCHES),
    )


def disable() -> None:
    """Undo :func:`enable` (restores SB3's original functions); a no-op when not enabled."""
    for (cls, name), original in _originals.items():
        setattr(cls, name, original)
    _originals.clear()
    buffers.global_options.update(advantage_device="auto", advantage_backend="auto")


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return bool(_originals)


@contextlib.contextmanager
def enabled(advantage_device: Any = "auto", advantage_backend: Any = "auto") -> Iterator[None]:
    """``with rl_triton_sb3.enabled(): ...``: :func:`enable` inside the block, then the previous
    state (enabled with its options, or not) again. A process-wide switch: blocks must nest
    (threads whose blocks overlap should pass ``rollout_buffer_class`` instead)."""
    was, options = is_enabled(), dict(buffers.global_options)
    enable(advantage_device, advantage_backend)
    try:
        yield
    finally:
        if was:
            buffers.global_options.update(options)
        else:
            disable()
