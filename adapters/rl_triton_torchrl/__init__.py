"""TorchRL adapter for ``rl_triton_core`` (``pip install 'rl-triton[torchrl]'``).

One switch computes TorchRL's value estimators ``GAE``, ``TD1Estimator``,
``TDLambdaEstimator`` and ``VTrace`` with ``rl_triton_core`` (Triton kernels on CUDA, the
vectorised torch path on the CPU), on every path a user reaches them: direct construction,
``loss.make_value_estimator(...)`` and a loss's default estimator (e.g. ``ClipPPOLoss``)::

    import rl_triton_torchrl
    rl_triton_torchrl.enable()          # or: with rl_triton_torchrl.enabled(): ...
    rl_triton_torchrl.disable()         # TorchRL's own functions again

* Environment: ``RL_TRITON_TORCHRL=1`` (or a backend name: ``triton``, ``torch``,
  ``reference``) enables it when this package is imported; ``python -m rl_triton_torchrl
  script.py [args]`` runs an unchanged script with it enabled.
* Semantics stay TorchRL's (``[*B, T, F]`` read in place with ``time_dim``, ``done`` cuts the
  trace, ``terminated`` gates the bootstrap, explicit next-state values, per-step ``gamma``,
  ``average_gae``, ``shifted``, ``skip_existing``, ``set_keys``): only the recursion is
  swapped, TorchRL's estimator code does the rest.
* Gradients through the estimator go through ``rl_triton_core``'s autograd path. A call the
  core cannot serve exactly (``torch.compile``, ``rolling_gamma=False``, unusual shapes or
  dtypes) runs TorchRL's own code, with one :class:`RLTritonFallbackWarning` per reason.
* Explicit classes for per-loss choice: ``TritonGAE``, ``TritonTD1``, ``TritonTDLambda``,
  ``TritonVTrace`` (TorchRL's, plus a ``backend=`` keyword), and ``Retrace`` (Retrace(λ),
  tree-backup, Q(λ) targets; TorchRL has none).

Tested against torchrl 0.14.1 and tensordict 0.14. Docs: docs/torchrl.md.
"""

from __future__ import annotations

import os
import warnings

try:
    import torchrl  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rl_triton_torchrl needs TorchRL: pip install 'rl-triton[torchrl]' "
        "(tested with torchrl 0.14.1, tensordict 0.14)"
    ) from err

from ._functional import RLTritonFallbackWarning, fallback_reason
from ._state import BACKENDS
from ._switch import disable, enable, enabled, is_enabled
from .estimators import Retrace, TritonGAE, TritonTD1, TritonTDLambda, TritonVTrace

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "RLTritonFallbackWarning",
    "Retrace",
    "TritonGAE",
    "TritonTD1",
    "TritonTDLambda",
    "TritonVTrace",
    "disable",
    "enable",
    "enabled",
    "fallback_reason",
    "is_enabled",
]

ENV_VAR = "RL_TRITON_TORCHRL"


def _enable_from_environment() -> None:
    """``RL_TRITON_TORCHRL``: 1/true/yes/on (backend "auto") or a backend name enables."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return
    if value in ("1", "true", "yes", "on"):
        enable()
    elif value in BACKENDS:
        enable(value)
    else:
        warnings.warn(
            f"rl_triton_torchrl: ignoring {ENV_VAR}={value!r}; expected 0/1 or a backend "
            f"name {BACKENDS}",
            stacklevel=2,
        )


_enable_from_environment()
