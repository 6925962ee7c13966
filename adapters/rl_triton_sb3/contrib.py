"""sb3-contrib: MaskablePPO's buffers, RecurrentPPO's buffers and a RecurrentPPO that uses them.

MaskablePPO takes ``rollout_buffer_class``::

    MaskablePPO("MlpPolicy", env, rollout_buffer_class=TritonMaskableRolloutBuffer)

RecurrentPPO builds its buffer itself (``RecurrentRolloutBuffer`` or
``RecurrentDictRolloutBuffer``, no ``rollout_buffer_class`` argument), so use
:class:`TritonRecurrentPPO` (same arguments, plus ``advantage_device`` and
``advantage_backend``), or ``rl_triton_sb3.enable()``, which reaches its buffers through the
SB3 classes they inherit from.
"""

from __future__ import annotations

from typing import Any

try:
    from sb3_contrib import RecurrentPPO
    from sb3_contrib.common.maskable.buffers import (
        MaskableDictRolloutBuffer,
        MaskableRolloutBuffer,
    )
    from sb3_contrib.common.recurrent.buffers import (
        RecurrentDictRolloutBuffer,
        RecurrentRolloutBuffer,
    )
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"this part of rl_triton_sb3 needs sb3-contrib ({e}); install it with "
        "pip install 'rl-triton[sb3]'"
    ) from e

from .buffers import TritonBufferMixin


class TritonMaskableRolloutBuffer(TritonBufferMixin, MaskableRolloutBuffer):
    """MaskablePPO's ``MaskableRolloutBuffer`` with advantages from ``rl_triton_core.gae``."""


class TritonMaskableDictRolloutBuffer(TritonBufferMixin, MaskableDictRolloutBuffer):
    """MaskablePPO's ``MaskableDictRolloutBuffer`` with advantages from ``rl_triton_core.gae``."""


class TritonRecurrentRolloutBuffer(TritonBufferMixin, RecurrentRolloutBuffer):
    """RecurrentPPO's ``RecurrentRolloutBuffer`` with advantages from ``rl_triton_core.gae``."""


class TritonRecurrentDictRolloutBuffer(TritonBufferMixin, RecurrentDictRolloutBuffer):
    """RecurrentPPO's ``RecurrentDictRolloutBuffer`` with advantages from ``rl_triton_core.gae``."""


class TritonRecurrentPPO(RecurrentPPO):
    """sb3-contrib's ``RecurrentPPO`` with the matching ``TritonRecurrent*RolloutBuffer``.

    Takes RecurrentPPO's arguments plus ``advantage_device`` and ``advantage_backend`` (see
    :class:`~rl_triton_sb3.TritonBufferMixin`). Everything else, saving and loading included,
    is RecurrentPPO's.
    """

    def __init__(
        self, *args: Any, advantage_device: Any = "auto", advantage_backend: Any = "auto", **kw
    ) -> None:
        # set before RecurrentPPO.__init__, which calls _setup_model()
        self.advantage_device, self.advantage_backend = advantage_device, advantage_backend
        super().__init__(*args, **kw)

    def _setup_model(self) -> None:
        super()._setup_model()
        sb3 = self.rollout_buffer  # rebuilt with the same arguments (RecurrentPPO._setup_model)
        is_dict = isinstance(sb3, RecurrentDictRolloutBuffer)
        cls = TritonRecurrentDictRolloutBuffer if is_dict else TritonRecurrentRolloutBuffer
        self.rollout_buffer = cls(
            sb3.buffer_size,
            sb3.observation_space,
            sb3.action_space,
            sb3.hidden_state_shape,
            sb3.device,
            gamma=sb3.gamma,
            gae_lambda=sb3.gae_lambda,
            n_envs=sb3.n_envs,
            advantage_device=self.advantage_device,
            advantage_backend=self.advantage_backend,
        )
