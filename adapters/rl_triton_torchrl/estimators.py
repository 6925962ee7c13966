"""Explicit estimator classes: our kernels for one loss, whatever the global switch says.

* ``TritonGAE``, ``TritonTD1``, ``TritonTDLambda``, ``TritonVTrace``: TorchRL's ``GAE``,
  ``TD1Estimator``, ``TDLambdaEstimator`` and ``VTrace`` with one more keyword, ``backend``
  (``rl_triton_core``'s), whose every call runs on ``rl_triton_core`` (same fallback rules as
  the switch). Use them like TorchRL's: ``TritonGAE(gamma=..., lmbda=..., value_network=...)``,
  ``loss.make_value_estimator(TritonGAE, gamma=..., ...)`` or pass an instance.
* ``Retrace``: Retrace(λ) Q-targets, and tree-backup / Q(λ) / importance-sampling targets, on
  TorchRL tensordicts. TorchRL has no such estimator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.nn import composite_lp_aggregate
from tensordict.utils import NestedKey
from torch import Tensor
from torchrl.objectives.value.advantages import (
    GAE,
    TD1Estimator,
    TDLambdaEstimator,
    ValueEstimatorBase,
    VTrace,
)

import rl_triton_core as rtc

from . import _state
from ._switch import scoped

__all__ = ["Retrace", "TritonGAE", "TritonTD1", "TritonTDLambda", "TritonVTrace"]


class _Routed:
    """Mixin: the calls of this estimator run on ``rl_triton_core`` with ``self.backend``."""

    backend: str

    def __init__(self, *args, backend: str = "auto", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.backend = _state.check_backend(backend)

    def forward(self, *args, **kwargs):
        with scoped(self.backend):
            return super().forward(*args, **kwargs)

    def value_estimate(self, *args, **kwargs):
        with scoped(self.backend):
            return super().value_estimate(*args, **kwargs)


class TritonGAE(_Routed, GAE):
    """TorchRL's :class:`~torchrl.objectives.value.GAE` computed by ``rl_triton_core.gae``
    (both its loop and vectorised paths). Extra keyword: ``backend`` (default ``"auto"``)."""


class TritonTD1(_Routed, TD1Estimator):
    """TorchRL's :class:`~torchrl.objectives.value.TD1Estimator` computed by
    ``rl_triton_core.discounted_returns``. Extra keyword: ``backend``."""


class TritonTDLambda(_Routed, TDLambdaEstimator):
    """TorchRL's :class:`~torchrl.objectives.value.TDLambdaEstimator` computed by
    ``rl_triton_core.lambda_returns``. Extra keyword: ``backend``."""


class TritonVTrace(_Routed, VTrace):
    """TorchRL's :class:`~torchrl.objectives.value.VTrace` computed by
    ``rl_triton_core.vtrace`` (λ = 1, as TorchRL's). Extra keyword: ``backend``."""


def _taken(table: Tensor, action: Tensor) -> Tensor:
    """``table[..., a_t]`` (keepdim) for one-hot actions ``[..., A]`` or indices ``[...(, 1)]``."""
    if action.shape == table.shape:  # one-hot
        return (table * action.to(table.dtype)).sum(-1, keepdim=True)
    if action.shape == table.shape[:-1]:
        action = action.unsqueeze(-1)
    return table.gather(-1, action.long())


class Retrace(ValueEstimatorBase):
    """Retrace(λ) Q-targets on TorchRL tensordicts (Munos et al. 2016, arXiv:1606.02647).

    ``Q^ret_t = r_t + γ_t (1 - terminated_t) [E_t + c_t κ_{t+1} (Q^ret_{t+1} - Q(s_{t+1}, a_{t+1}))]``

    with ``E_t = Σ_a π(a|s_{t+1}) Q(s_{t+1}, a)``, ``c_t = 1 - done_t`` (and 0 at the last step of
    the window) and the trace coefficient ``κ_t`` chosen by ``trace``: ``"retrace"``
    ``λ min(c̄, π/μ)``, ``"tree_backup"`` ``λ π(a_t|s_t)``, ``"q_lambda"`` ``λ``,
    ``"importance_sampling"`` ``λ π/μ`` (``π`` the target policy, ``μ`` the behaviour policy
    that collected the data). TorchRL's conventions: ``done`` cuts the trace, ``terminated``
    gates the bootstrap, ``("next", ...)`` entries describe ``s_{t+1}`` (at a truncation, the
    final observation).

    It reads the tensordict (``[*B, T]``, tensors ``[*B, T, 1]`` or ``[*B, T, A]``) and calls no
    network: fill the Q-values and the target policy's probabilities first (e.g. with a
    ``QValueModule`` on the root and on ``"next"``). Keys (``set_keys``), each read at the root
    unless said otherwise:

    * ``value`` (``"chosen_action_value"``): ``Q(s_t, a_t)``; when missing, taken from
      ``action_value`` at ``action``.
    * ``expected_value`` (``"expected_action_value"``), read under ``"next"``: ``E_t``; when
      missing, ``Σ_a`` of ``("next", target_probs) * ("next", action_value)``.
    * ``action_value`` (``"action_value"``, ``[*B, T, A]``), ``target_probs``
      (``"target_probs"``, ``π(·|s)``, ``[*B, T, A]``), ``action`` (``"action"``: one-hot or
      index): only for what is missing above.
    * ``target_log_prob`` (``"target_log_prob"``): ``log π(a_t|s_t)``; when missing, the log of
      ``target_probs`` at ``action``. Not needed for ``trace="q_lambda"``.
    * ``sample_log_prob`` (TorchRL's default): ``log μ(a_t|s_t)``, recorded by the collector.
    * ``reward``, ``done``, ``terminated`` (under ``"next"``), ``steps_to_next_obs`` (optional:
      ``γ ** steps``), as for TorchRL's estimators.

    Writes ``value_target`` (``Q^ret``) and ``advantage`` (``Q^ret - Q(s_t, a_t)``), detached.

    Keyword Args:
        gamma: discount (float or tensor). lmbda: trace decay λ (default 1).
        c_bar: trace clipping threshold of ``"retrace"`` (default 1).
        trace: ``"retrace"`` (default), ``"tree_backup"``, ``"q_lambda"`` or
            ``"importance_sampling"``.
        time_dim: the tensordict's time dim (default: the dim named ``"time"``, else the last).
        backend: ``rl_triton_core``'s ``backend=`` (default ``"auto"``).
    """

    @dataclass
    class _AcceptedKeys:
        advantage: NestedKey = "advantage"
        value_target: NestedKey = "value_target"
        value: NestedKey = "chosen_action_value"
        expected_value: NestedKey = "expected_action_value"
        action_value: NestedKey = "action_value"
        target_probs: NestedKey = "target_probs"
        action: NestedKey = "action"
        target_log_prob: NestedKey = "target_log_prob"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        steps_to_next_obs: NestedKey = "steps_to_next_obs"
        sample_log_prob: NestedKey | None = None

        def __post_init__(self):
            if self.sample_log_prob is None:
                aggregate = composite_lp_aggregate(nowarn=True)
                self.sample_log_prob = "sample_log_prob" if aggregate else "action_log_prob"

    default_keys = _AcceptedKeys

    def __init__(
        self,
        *,
        gamma: float | Tensor,
        lmbda: float | Tensor = 1.0,
        c_bar: float | Tensor = 1.0,
        trace: str = "retrace",
        time_dim: int | None = None,
        backend: str = "auto",
        device: torch.device | None = None,
    ) -> None:
        super().__init__(value_network=None, device=device)
        if trace not in rtc.TRACES:
            raise ValueError(f"Retrace: `trace` must be one of {rtc.TRACES}, got {trace!r}")
        self.trace = trace
        self.gamma, self.lmbda, self.c_bar = gamma, lmbda, c_bar
        self.time_dim = time_dim
        self.backend = _state.check_backend(backend)

    @property
    def in_keys(self):
        keys = self.tensor_keys
        return [
            ("next", keys.reward),
            ("next", keys.done),
            ("next", keys.terminated),
            keys.value,
            ("next", keys.expected_value),
            keys.target_log_prob,
            keys.sample_log_prob,
        ]

    def _get(self, tensordict: TensorDictBase, key: NestedKey, what: str) -> Tensor:
        value = tensordict.get(key, None)
        if value is None:
            raise KeyError(f"Retrace: {what} {key!r} is missing from the tensordict")
        return value

    def _chosen_value(self, td: TensorDictBase) -> Tensor:
        keys = self.tensor_keys
        q = td.get(keys.value, None)
        if q is None:
            table = self._get(td, keys.action_value, f"`{keys.value}` and the action values")
            q = _taken(table, self._get(td, keys.action, "the action"))
        return q

    def _expected_next_value(self, td: TensorDictBase) -> Tensor:
        keys = self.tensor_keys
        nxt = self._get(td, "next", "the next-state entry")
        expected = nxt.get(keys.expected_value, None)
        if expected is None:
            what = f'("next", {keys.expected_value!r}) and the next action values'
            q = self._get(nxt, keys.action_value, what)
            p = self._get(nxt, keys.target_probs, "the next target probabilities")
            expected = (p * q).sum(-1, keepdim=True)
        return expected

    def _target_log_prob(self, td: TensorDictBase, behaviour: Tensor) -> Tensor:
        keys = self.tensor_keys
        lp = td.get(keys.target_log_prob, None)
        if lp is not None:
            return lp
        if self.trace == "q_lambda":  # κ = λ: the log-probs are not read
            return behaviour
        probs = self._get(td, keys.target_probs, f"`{keys.target_log_prob}` and the target probs")
        return _taken(probs, self._get(td, keys.action, "the action")).log()

    @torch.no_grad()
    def forward(self, tensordict: TensorDictBase, *, time_dim: int | None = None):
        """Write ``value_target`` (Retrace targets) and ``advantage`` into ``tensordict``."""
        if tensordict.batch_dims < 1:
            raise ValueError(
                "Retrace: `tensordict` must have a time dim, got batch_size "
                f"{tuple(tensordict.batch_size)}"
            )
        keys = self.tensor_keys
        reward = self._get(tensordict, ("next", keys.reward), "the reward")
        done = self._get(tensordict, ("next", keys.done), "the done flag")
        terminated = tensordict.get(("next", keys.terminated), done)
        q = self._chosen_value(tensordict)
        expected = self._expected_next_value(tensordict)
        log_mu = self._get(tensordict, keys.sample_log_prob, "the behaviour log-prob")
        log_mu = log_mu.reshape_as(q)  # [*B, T] -> [*B, T, 1]: a view
        log_pi = self._target_log_prob(tensordict, log_mu).reshape_as(q)
        gamma = self.gamma
        steps = tensordict.get(keys.steps_to_next_obs, None)
        if steps is not None:
            gamma = gamma ** steps.view_as(reward)
        targets = rtc.retrace(
            reward,
            q,
            expected,
            log_pi,
            log_mu,
            terminated,
            truncated=done,
            gamma=gamma,
            lmbda=self.lmbda,
            c_bar=self.c_bar,
            trace=self.trace,
            time_dim=self._get_time_dim(time_dim, tensordict),
            backend=self.backend,
        )
        tensordict.set(keys.value_target, targets)
        tensordict.set(keys.advantage, targets - q)
        return tensordict
