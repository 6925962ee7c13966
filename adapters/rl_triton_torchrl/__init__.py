"""TorchRL adapter for ``rl_triton_core`` (work in progress; install with ``rl-triton[torchrl]``).

It will switch TorchRL's value estimators (``GAE``, ``TD1Estimator``, ``TDLambdaEstimator``,
``VTrace``) to ``rl_triton_core`` with one flag: ``rl_triton_torchrl.enable()`` /
``disable()``, a context manager, and the ``RL_TRITON_TORCHRL=1`` environment variable,
on every path a user reaches them (direct construction, ``loss.make_value_estimator``, a
loss's default estimator). It keeps TorchRL's semantics (``[*B, T, F]`` layout read in place,
``done`` cuts the trace, ``terminated`` gates the bootstrap, per-step ``gamma``) and falls back
to TorchRL's own code, with a warning, for any call it cannot serve. It will also offer
explicit estimator classes and a Retrace(λ) estimator, which TorchRL lacks.

Tested against torchrl 0.14.1 and tensordict 0.14.
"""

__all__: list[str] = []
