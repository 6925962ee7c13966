"""The public functions: the contract of ``shared/spec/estimators.md`` (see docs/semantics.md).

Each function validates its arguments (shapes, dtypes and devices only: no data-dependent
check, so no host sync), maps them onto time-first views, allocates the outputs in the
caller's layout (or takes ``out=``) and hands everything to the chosen backend.

Shared conventions, written once here rather than in every docstring:

* ``time_dim`` (default 0, time-major; TorchRL uses -2): every other axis is a batch axis.
  Per-step tensors share one shape; flags and tensor coefficients may broadcast to it with the
  same number of dims. ``bootstrap_value``/``initial`` have that shape without the time axis.
* Step semantics (Gymnasium): ``terminated[t]`` means s_{t+1} is terminal (its value is 0);
  ``truncated[t]`` means the episode was cut and s_{t+1} is worth ``next_values[t]``, but no
  trace flows into the next episode. ``c_t = 1 - done_t`` and ``c_{T-1} = 0`` (window edge).
* Next-state value ``nv_t``: ``next_values[t]``, else ``values[t+1]``, and ``bootstrap_value``
  at ``t = T-1``. ``truncated`` requires ``next_values``.
* Flags: bool, integer or float (non-zero is true). Values: float16/bfloat16/float32/float64,
  computed in float32 (float64 for float64), returned in the inputs' (promoted) dtype.
* ``backend``: ``"auto"`` (Triton for CUDA tensors, torch on the CPU), ``"triton"``,
  ``"torch"`` or ``"reference"`` (float64 loop, the tests' oracle).
* Gradients and ``torch.compile`` (docs/autograd.md): a call with an input that requires grad
  (grad mode on) takes the differentiable path of :mod:`.autograd`; under ``torch.compile`` a
  call without one records the estimator's custom op (:mod:`.ops`). Otherwise nothing changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from . import autograd as _autograd
from . import ops as _ops
from ._dispatch import resolve
from ._replay import replayable
from ._validate import Coefficient, Steps, require_next_state

Backend = Literal["auto", "triton", "torch", "reference"]
Trace = Literal["retrace", "tree_backup", "q_lambda", "importance_sampling"]
TRACES = ("retrace", "tree_backup", "q_lambda", "importance_sampling")
Out = Tensor | Sequence[Tensor] | None


_grad_enabled = torch.is_grad_enabled
_compiling = torch.compiler.is_compiling


def _graph_path(*inputs):
    """Where a call goes: None, the direct path (the common case, after two cheap checks);
    :mod:`.autograd` when grad mode is on and a differentiable input requires grad; the custom
    ops of :mod:`.ops` while :func:`torch.compile` traces (see docs/autograd.md)."""
    if _grad_enabled():
        for x in inputs:  # (isinstance, not getattr: Dynamo cannot trace a numpy scalar's)
            if isinstance(x, Tensor) and x.requires_grad:
                return _autograd
    return _ops if _compiling() else None


def _run(steps: Steps, backend: str, fn: str, out: Out, names: Sequence[str], *args):
    """Allocate outputs, call ``backend.fn(*args, out)`` unless they are empty (T = 0, or an
    empty batch), return the outputs."""
    outputs, views = steps.outputs(out, names)
    impl = resolve(steps.fn, backend, steps.device)
    if 0 not in steps.shape:
        getattr(impl, fn)(*args, views if len(views) > 1 else views[0])
    return outputs if len(outputs) > 1 else outputs[0]


@replayable
def linear_scan(
    a: Tensor,
    b: Tensor,
    *,
    initial: Tensor | None = None,
    reverse: bool = False,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """First-order linear recurrence along ``time_dim``, in O(log T) parallel depth.

    * forward: ``x_t = a_t * x_{t-1} + b_t`` with ``x_{-1} = initial`` (default 0);
    * ``reverse=True``: ``x_t = a_t * x_{t+1} + b_t`` with ``x_T = initial``.

    Every estimator of this library is this recurrence with its own ``(a_t, b_t)``; the scan
    combines pairs with ``(a1, b1) ∘ (a2, b2) = (a1 a2, a2 b1 + b2)`` (Blelloch 1990). Where
    ``a_t == 0``, ``x_t == b_t`` exactly (a NaN carry does not leak through a cut).

    Args:
        a, b: per-step coefficients (broadcastable to one shape, same number of dims).
        initial: the state before the first step (after the last, if ``reverse``); the step
            shape without the time axis.

    Example:
        >>> x = linear_scan(torch.full((4, 1), 0.5), torch.ones(4, 1))  # 1, 1.5, 1.75, 1.875
    """
    if not isinstance(reverse, bool):  # (numpy's bool too; isinstance: Dynamo 2.11 traced
        # reverse.__class__ of a bool as another class)
        if not (type(reverse).__module__ == "numpy" and type(reverse).__name__ in _NUMPY_BOOLS):
            kind = f"{type(reverse).__module__}.{type(reverse).__qualname__}"
            raise TypeError(f"linear_scan: `reverse` must be a bool, got {kind}")
        reverse = bool(reverse)
    if _graph_path(a, b, initial) is not None:  # (the op's schema would raise RuntimeErrors
        # for wrong argument types: the shared checks first)
        steps = Steps("linear_scan", time_dim, {"a": a, "b": b})
        steps.boundary("initial", initial)
        if not _compiling():  # (traced, the op's fake checks it: Dynamo cannot trace imports)
            resolve("linear_scan", backend, steps.device)
        return _ops.linear_scan(a, b, initial, reverse, time_dim, backend, out)
    steps = Steps("linear_scan", time_dim, {"a": a, "b": b})
    return _run(
        steps,
        backend,
        "linear_scan",
        out,
        ("x",),
        steps.step("a", a),
        steps.step("b", b),
        steps.boundary("initial", initial),
        reverse,
    )


_NUMPY_BOOLS = ("bool", "bool_")  # (numpy 2 names its scalar type `bool`)


@replayable
def gae(
    rewards: Tensor,
    values: Tensor,
    terminated: Tensor | None,
    *,
    truncated: Tensor | None = None,
    next_values: Tensor | None = None,
    bootstrap_value: Tensor | None = None,
    gamma: Coefficient = 0.99,
    lmbda: Coefficient = 0.95,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Sequence[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    * ``δ_t = r_t + γ_t (1 - terminated_t) nv_t - v_t``
    * ``A_t = δ_t + γ_t λ_t c_t A_{t+1}``,  ``returns_t = A_t + v_t``

    ``λ = 1`` gives Monte-Carlo advantages (returns equal :func:`discounted_returns`),
    ``λ = 0`` one-step TD errors.

    Args:
        rewards, values: ``r_t`` and ``V(s_t)``, per step.
        terminated, truncated: episode-end flags of step t (``truncated`` needs next_values).
        next_values: ``V(s_{t+1})`` per step (at a truncated step: of the final observation).
        bootstrap_value: ``V(s_T)`` when ``next_values`` is not given.
        gamma, lmbda: floats or per-step tensors.

    Returns:
        ``(advantages, returns)``, each of the per-step shape.

    Example:
        >>> r = torch.tensor([1.0, 1.0, 1.0]); v = torch.zeros(3)
        >>> term = torch.tensor([False, True, False])  # episode ends after step 1
        >>> adv, ret = gae(r, v, term, bootstrap_value=torch.tensor(0.0), gamma=1, lmbda=1)
        >>> adv  # tensor([2., 1., 1.])
    """
    path = _graph_path(rewards, values, next_values, bootstrap_value, gamma, lmbda)
    if path is not None:
        return path.gae(
            rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
            time_dim, backend, out,
        )  # fmt: skip
    steps = Steps(
        "gae",
        time_dim,
        {"rewards": rewards, "values": values, "next_values": next_values},
    )
    require_next_state("gae", next_values, bootstrap_value, truncated)
    return _run(
        steps,
        backend,
        "gae",
        out,
        ("advantages", "returns"),
        steps.step("rewards", rewards),
        steps.step("values", values),
        steps.flag("terminated", terminated),
        steps.flag("truncated", truncated),
        steps.step("next_values", next_values),
        steps.boundary("bootstrap_value", bootstrap_value),
        steps.coefficient("gamma", gamma),
        steps.coefficient("lmbda", lmbda),
    )


@replayable
def lambda_returns(
    rewards: Tensor,
    values: Tensor | None,
    terminated: Tensor | None,
    *,
    truncated: Tensor | None = None,
    next_values: Tensor | None = None,
    bootstrap_value: Tensor | None = None,
    gamma: Coefficient = 0.99,
    lmbda: Coefficient = 0.95,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """TD(λ) returns (Sutton & Barto 2018, §12.1), as used by TorchRL and Dreamer.

    * ``G_t = r_t + γ_t (1 - terminated_t) [ (1 - λ_t c_t) nv_t + λ_t c_t G_{t+1} ]``

    ``values`` may be None when ``next_values`` is given. With ``nv_t = v_{t+1}`` wherever
    ``c_t = 1`` this equals the returns of :func:`gae`; ``λ = 1`` is :func:`discounted_returns`.
    """
    if values is None and next_values is None:
        raise ValueError("lambda_returns: pass `values` or `next_values`")
    path = _graph_path(rewards, values, next_values, bootstrap_value, gamma, lmbda)
    if path is not None:
        return path.lambda_returns(
            rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
            time_dim, backend, out,
        )  # fmt: skip
    steps = Steps(
        "lambda_returns",
        time_dim,
        {"rewards": rewards, "values": values, "next_values": next_values},
    )
    require_next_state("lambda_returns", next_values, bootstrap_value, truncated)
    return _run(
        steps,
        backend,
        "lambda_returns",
        out,
        ("returns",),
        steps.step("rewards", rewards),
        steps.step("values", values),
        steps.flag("terminated", terminated),
        steps.flag("truncated", truncated),
        steps.step("next_values", next_values),
        steps.boundary("bootstrap_value", bootstrap_value),
        steps.coefficient("gamma", gamma),
        steps.coefficient("lmbda", lmbda),
    )


@replayable
def discounted_returns(
    rewards: Tensor,
    terminated: Tensor | None,
    *,
    truncated: Tensor | None = None,
    next_values: Tensor | None = None,
    bootstrap_value: Tensor | None = None,
    gamma: Coefficient = 0.99,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """Discounted returns with bootstrapping at cuts: TD(λ = 1).

    * ``G_t = r_t + γ_t (1 - terminated_t) [ c_t G_{t+1} + (1 - c_t) nv_t ]``

    ``nv_{T-1}`` is ``bootstrap_value`` (0 when missing) unless ``next_values`` is given.
    """
    path = _graph_path(rewards, next_values, bootstrap_value, gamma)
    if path is not None:
        return path.discounted_returns(
            rewards, terminated, truncated, next_values, bootstrap_value, gamma, time_dim,
            backend, out,
        )  # fmt: skip
    steps = Steps("discounted_returns", time_dim, {"rewards": rewards, "next_values": next_values})
    require_next_state("discounted_returns", next_values, None, truncated, needed=False)
    return _run(
        steps,
        backend,
        "discounted_returns",
        out,
        ("returns",),
        steps.step("rewards", rewards),
        steps.flag("terminated", terminated),
        steps.flag("truncated", truncated),
        steps.step("next_values", next_values),
        steps.boundary("bootstrap_value", bootstrap_value),
        steps.coefficient("gamma", gamma),
    )


@replayable
def vtrace(
    rewards: Tensor,
    values: Tensor,
    target_log_probs: Tensor,
    behavior_log_probs: Tensor,
    terminated: Tensor | None,
    *,
    truncated: Tensor | None = None,
    next_values: Tensor | None = None,
    bootstrap_value: Tensor | None = None,
    gamma: Coefficient = 0.99,
    lmbda: Coefficient = 1.0,
    rho_bar: Coefficient = 1.0,
    c_bar: Coefficient = 1.0,
    pg_rho_bar: Coefficient | None = None,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Sequence[Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018, arXiv:1802.01561).

    * ``w_t = exp(target_log_probs_t - behavior_log_probs_t)``, ``ρ_t = min(ρ̄, w_t)``,
      ``κ_t = λ_t min(c̄, w_t)``
    * ``δ_t = ρ_t (r_t + γ_t (1 - terminated_t) nv_t - v_t)``
    * ``D_t = δ_t + γ_t κ_t c_t D_{t+1}``,  ``vs_t = v_t + D_t``
    * ``pg_advantages_t = min(ρ̄_pg, w_t) (r_t + γ_t (1 - terminated_t) u_t - v_t)`` with
      ``u_t = vs_{t+1}`` where ``c_t = 1``, else ``nv_t``; ``pg_rho_bar`` defaults to ``rho_bar``.

    On-policy with ``ρ̄ = c̄ = λ = 1`` the targets ``vs`` are TD(1) (Monte-Carlo) targets.

    Returns:
        ``(vs, pg_advantages)``.
    """
    path = _graph_path(
        rewards, values, target_log_probs, behavior_log_probs, next_values, bootstrap_value,
        gamma, lmbda, rho_bar, c_bar, pg_rho_bar,
    )  # fmt: skip
    if path is not None:
        return path.vtrace(
            rewards, values, target_log_probs, behavior_log_probs, terminated, truncated,
            next_values, bootstrap_value, gamma, lmbda, rho_bar, c_bar, pg_rho_bar, time_dim,
            backend, out,
        )  # fmt: skip
    steps = Steps(
        "vtrace",
        time_dim,
        {
            "rewards": rewards,
            "values": values,
            "target_log_probs": target_log_probs,
            "behavior_log_probs": behavior_log_probs,
            "next_values": next_values,
        },
    )
    require_next_state("vtrace", next_values, bootstrap_value, truncated)
    rho_bar = steps.coefficient("rho_bar", rho_bar)
    return _run(
        steps,
        backend,
        "vtrace",
        out,
        ("vs", "pg_advantages"),
        steps.step("rewards", rewards),
        steps.step("values", values),
        steps.step("target_log_probs", target_log_probs),
        steps.step("behavior_log_probs", behavior_log_probs),
        steps.flag("terminated", terminated),
        steps.flag("truncated", truncated),
        steps.step("next_values", next_values),
        steps.boundary("bootstrap_value", bootstrap_value),
        steps.coefficient("gamma", gamma),
        steps.coefficient("lmbda", lmbda),
        rho_bar,
        steps.coefficient("c_bar", c_bar),
        rho_bar if pg_rho_bar is None else steps.coefficient("pg_rho_bar", pg_rho_bar),
    )


@replayable
def retrace(
    rewards: Tensor,
    q_values: Tensor,
    next_expected_q: Tensor,
    target_log_probs: Tensor,
    behavior_log_probs: Tensor,
    terminated: Tensor | None,
    *,
    truncated: Tensor | None = None,
    gamma: Coefficient = 0.99,
    lmbda: Coefficient = 1.0,
    c_bar: Coefficient = 1.0,
    trace: Trace = "retrace",
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """Retrace(λ) Q-targets and its relatives (Munos et al. 2016, arXiv:1606.02647).

    * ``Q^ret_t = r_t + γ_t (1 - terminated_t) [ E_t + c_t κ_{t+1} (Q^ret_{t+1} - q_{t+1}) ]``
      with ``q_t = Q(s_t, a_t)`` (``q_values``), ``E_t = Σ_a π(a|s_{t+1}) Q(s_{t+1}, a)``
      (``next_expected_q``; at a truncated step: of the final observation).
    * trace coefficient ``κ_t`` (``trace=``): ``"retrace"`` ``λ_t min(c̄, w_t)``;
      ``"tree_backup"`` ``λ_t π(a_t|s_t)``; ``"q_lambda"`` ``λ_t`` (Harutyunyan et al. 2016);
      ``"importance_sampling"`` ``λ_t w_t``; ``w_t = π(a_t|s_t) / μ(a_t|s_t)``.

    ``q_lambda`` with ``λ = 0`` gives one-step expected-SARSA targets.
    """
    if trace not in TRACES:
        raise ValueError(f"retrace: unknown `trace`={trace!r}; expected one of {TRACES}")
    path = _graph_path(
        rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, gamma, lmbda,
        c_bar,
    )  # fmt: skip
    if path is not None:
        return path.retrace(
            rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs,
            terminated, truncated, gamma, lmbda, c_bar, trace, time_dim, backend, out,
        )  # fmt: skip
    steps = Steps(
        "retrace",
        time_dim,
        {
            "rewards": rewards,
            "q_values": q_values,
            "next_expected_q": next_expected_q,
            "target_log_probs": target_log_probs,
            "behavior_log_probs": behavior_log_probs,
        },
    )
    return _run(
        steps,
        backend,
        "retrace",
        out,
        ("q_targets",),
        steps.step("rewards", rewards),
        steps.step("q_values", q_values),
        steps.step("next_expected_q", next_expected_q),
        steps.step("target_log_probs", target_log_probs),
        steps.step("behavior_log_probs", behavior_log_probs),
        steps.flag("terminated", terminated),
        steps.flag("truncated", truncated),
        steps.coefficient("gamma", gamma),
        steps.coefficient("lmbda", lmbda),
        steps.coefficient("c_bar", c_bar),
        trace,
    )


@replayable
def eligibility_traces(
    x: Tensor,
    done: Tensor | None,
    *,
    gamma: Coefficient = 0.99,
    lmbda: Coefficient = 0.95,
    initial: Tensor | None = None,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """Accumulating eligibility traces, forward in time (Sutton & Barto 2018, §12.2).

    * ``z_t = x_t + γ_t λ_t (1 - done_{t-1}) z_{t-1}``, ``done_{-1} = 0``, ``z_{-1} = initial``

    ``x`` may carry trailing feature axes (e.g. gradients of ``log π`` per parameter).
    """
    path = _graph_path(x, gamma, lmbda, initial)
    if path is not None:
        return path.eligibility_traces(x, done, gamma, lmbda, initial, time_dim, backend, out)
    steps = Steps("eligibility_traces", time_dim, {"x": x})
    return _run(
        steps,
        backend,
        "eligibility_traces",
        out,
        ("traces",),
        steps.step("x", x),
        steps.flag("done", done),
        steps.coefficient("gamma", gamma),
        steps.coefficient("lmbda", lmbda),
        steps.boundary("initial", initial),
    )


@replayable
def episodic_cumsum(
    x: Tensor,
    done: Tensor | None,
    *,
    initial: Tensor | None = None,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: Tensor | None = None,
) -> Tensor:
    """Running sums that restart after every episode end, forward in time.

    * ``s_t = x_t + (1 - done_{t-1}) s_{t-1}``, ``done_{-1} = 0``, ``s_{-1} = initial``

    (:func:`eligibility_traces` with ``γ λ = 1``; e.g. episode returns so far.)
    """
    path = _graph_path(x, initial)
    if path is not None:
        return path.eligibility_traces(
            x, done, 1.0, 1.0, initial, time_dim, backend, out, fn="episodic_cumsum"
        )
    steps = Steps("episodic_cumsum", time_dim, {"x": x})
    return _run(
        steps,
        backend,
        "eligibility_traces",
        out,
        ("sums",),
        steps.step("x", x),
        steps.flag("done", done),
        1.0,
        1.0,
        steps.boundary("initial", initial),
    )
