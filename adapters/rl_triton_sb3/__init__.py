"""Stable-Baselines3 adapter for ``rl_triton_core`` (work in progress; ``rl-triton[sb3]``).

It will provide ``TritonRolloutBuffer`` and ``TritonDictRolloutBuffer`` (subclasses of SB3's
``RolloutBuffer`` / ``DictRolloutBuffer``, plus matching buffers for sb3-contrib's MaskablePPO
and a documented route for RecurrentPPO) whose ``compute_returns_and_advantage`` produces the
same ``advantages`` and ``returns`` as SB3's numpy loop, written back into the arrays SB3's
training loop reads::

    PPO("MlpPolicy", env, rollout_buffer_class=TritonRolloutBuffer)

and a global switch ``rl_triton_sb3.enable()`` / ``disable()`` for code whose constructor
call cannot be changed (e.g. rl-zoo configs).

Tested against stable-baselines3 2.9.2 and sb3-contrib 2.9.2.
"""

__all__: list[str] = []
