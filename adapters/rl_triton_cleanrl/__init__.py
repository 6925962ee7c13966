"""CleanRL helpers for ``rl_triton_core`` (work in progress; ``rl-triton[cleanrl]``).

It will convert CleanRL's conventions (``dones[t]`` marks that observation ``t`` starts a new
episode; ``next_value`` / ``next_done`` close the rollout) into the estimator contract, so that
CleanRL's GAE loop becomes one line that matches it exactly::

    advantages, returns = rl_triton_cleanrl.compute_gae(
        rewards, values, dones, next_value, next_done, gamma, gae_lambda
    )

The CleanRL-style scripts that use it (PPO discrete and continuous, IMPALA with V-trace, on
gymnasium 1.4 vector envs) live under ``examples/cleanrl/``.
"""

__all__: list[str] = []
