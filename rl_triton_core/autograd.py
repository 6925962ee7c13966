"""The differentiable path of the estimators (taken when an input requires grad).

Each estimator is written here once more in whole-tensor torch ops: its coefficients
``(a_t, b_t)`` are built from the inputs exactly as the backends build them (the same cuts, the
same terms switched off), and the recurrence is solved by the differentiable
``torch.ops.rl_triton.linear_scan`` (:mod:`rl_triton_core.ops`), whose backward is one scan in
the other direction on the same backend. Autograd then differentiates the cheap elementwise
part, so every output is differentiable in every floating input: rewards, values,
``next_values``, ``bootstrap_value``, ``initial``, ``x``, Q-values, log-probabilities (through
``exp`` and the clipping ``min``) and tensor coefficients (``gamma``, ``lmbda``, ``rho_bar``,
``c_bar``, ``pg_rho_bar``). Flags are not differentiable (float flags included: they act
through "non-zero is true").

A term the formulas switch off is selected away with ``torch.where`` twice (the input, then the
product), so that a NaN or inf in a switched-off input reaches neither the outputs nor any
gradient except its own. The functions take the public arguments, validate them with the same
:class:`~rl_triton_core._validate.Steps` as the direct path, and work on time-first views in
the compute dtype (float32, float64 for float64 inputs).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops
from ._dispatch import accumulates_in_float64, resolve
from ._validate import Steps, require_next_state

_MAY_BE_NONE = ("pg_rho_bar", "lmbda")  # coefficients whose None is a default (see _Canon)


class _Canon:
    """The validated call in time-first compute-dtype tensors: float32, or float64 for float64
    calls and long horizons (``_dispatch.accumulates_in_float64``, from the ``coefficients``
    and the names of the ``factors`` of ``a_t`` among them), as on the direct paths."""

    def __init__(
        self, fn: str, time_dim: int, values: dict, backend: str, factors=(), coefficients=None
    ) -> None:
        self.steps = steps = Steps(fn, time_dim, values)
        if not torch.compiler.is_compiling():  # (traced, the op's fake checks it)
            resolve(fn, backend, steps.device)  # an unknown or unusable backend fails here
        self.backend = backend
        self._coefs = coefs = {  # validated once (``coefficient`` returns them); None only
            # where it is a default (pg_rho_bar; lmbda where it is not a factor: discounted)
            k: steps.coefficient(k, x)
            for k, x in (coefficients or {}).items()
            if x is not None or k in factors or k not in _MAY_BE_NONE
        }
        acc64 = accumulates_in_float64(
            steps.dtype, steps.T, tuple(coefs[k] for k in factors), tuple(coefs.values())
        )
        self.dtype = torch.float64 if acc64 else torch.float32
        self.T = steps.T

    def step(self, name: str, x: Tensor | None) -> Tensor | None:
        x = self.steps.step(name, x)
        return None if x is None else x.to(self.dtype)

    def flag(self, name: str, x: Tensor | None) -> Tensor | None:
        """A flag as a bool mask (non-zero is true)."""
        x = self.steps.flag(name, x)
        return None if x is None else x != 0

    def coefficient(self, name: str, x):
        x = self._coefs[name] if name in self._coefs else self.steps.coefficient(name, x)
        return x.to(self.dtype) if isinstance(x, Tensor) else x

    def boundary(self, name: str, x: Tensor | None) -> Tensor | None:
        x = self.steps.boundary(name, x)
        return None if x is None else x.to(self.dtype)

    def continues(self, terminated: Tensor | None, truncated: Tensor | None, like: Tensor):
        """``c_t = 1 - done_t``, and 0 at the window edge ``t = T-1`` (a bool mask)."""
        T = self.T
        edge = torch.arange(T, device=like.device) < T - 1
        edge = edge.view((T,) + (1,) * (like.dim() - 1))
        done = _either(terminated, truncated)
        return edge if done is None else edge & ~done

    def scan(self, a: Tensor, b: Tensor, initial: Tensor | None = None, reverse: bool = True):
        return ops.linear_scan_op(a, b, initial, reverse, 0, self.backend)

    def finish(self, out, names: tuple, *results: Tensor):
        """Back to the caller's dtype and axis order; into ``out`` when given."""
        steps = self.steps
        td = steps.time_dim
        results = tuple(
            r.to(steps.dtype) if td == 0 else r.to(steps.dtype).movedim(0, td) for r in results
        )
        if out is not None:
            outs = steps.outputs(out, names)[0]
            for o, r in zip(outs, results, strict=True):
                o.copy_(r)
            return outs if len(outs) > 1 else outs[0]
        return results if len(results) > 1 else results[0]


def _discount(gamma, lmbda=None, **others) -> tuple[tuple, dict]:
    """``_Canon``'s ``factors`` and ``coefficients``: the factor of ``a_t`` that repeats step
    after step is gamma lmbda (gamma alone without lmbda)."""
    factors = ("gamma",) if lmbda is None else ("gamma", "lmbda")
    return factors, {"gamma": gamma, "lmbda": lmbda, **others}


def _either(x: Tensor | None, y: Tensor | None) -> Tensor | None:
    return y if x is None else (x if y is None else x | y)


def _not(x: Tensor | None) -> Tensor | None:
    return None if x is None else ~x


def _keep(mask: Tensor | None, x, like: Tensor) -> Tensor:
    """``x`` where ``mask``, else exactly 0 (``x``: a tensor or a Python number)."""
    if not isinstance(x, Tensor):
        x = torch.full_like(like, x)  # (a fill: no host-to-device copy, CUDA-graph safe)
    return x if mask is None else torch.where(mask, x, 0.0)


def _keep_product(mask: Tensor | None, x, y, like: Tensor) -> Tensor:
    """``x * y`` where ``mask``, else exactly 0, each factor masked first: a NaN in one factor
    where the mask is off reaches neither the result nor the other factor's gradient."""
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        return _keep(mask, x * y, like)
    return _keep(mask, x, like) * _keep(mask, y, like)


def _gated(mask: Tensor | None, coef, x: Tensor) -> Tensor:
    """``coef * x`` where ``mask``, else exactly 0; a NaN in ``x`` where the mask is off
    reaches neither the result nor the gradient of ``coef``."""
    if mask is None:
        return coef * x
    return torch.where(mask, coef * torch.where(mask, x, 0.0), 0.0)


def _cut(coef: Tensor, x: Tensor) -> Tensor:
    """``coef * x``, exactly 0 where ``coef`` is 0 (a hard cut: a NaN or inf in ``x`` there does
    not pass), with the exact gradient ``x`` for ``coef`` wherever ``x`` is finite."""
    return coef * torch.where((coef != 0) | torch.isfinite(x), x, 0.0)


def _next(x, last: Tensor | None = None):
    """``x[t + 1]`` along time; ``last`` (default 0) at ``t = T-1``. Floats pass."""
    if not isinstance(x, Tensor) or x.shape[0] == 0:
        return x
    tail = torch.zeros_like(x[:1]) if last is None else last.unsqueeze(0).expand_as(x[:1])
    return torch.cat((x[1:], tail))


def _previous(x: Tensor | None) -> Tensor | None:
    """``x[t - 1]`` along time; 0 (False) at ``t = 0``."""
    if x is None or x.shape[0] == 0:
        return x
    return torch.cat((torch.zeros_like(x[:1]), x[:-1]))


def _min(w: Tensor, bound) -> Tensor:
    return torch.clamp_max(w, bound) if isinstance(bound, float) else torch.minimum(w, bound)


def _next_state(c: _Canon, v, next_values, bootstrap_value) -> Tensor:
    if next_values is not None:
        return c.step("next_values", next_values)
    return _next(v, c.boundary("bootstrap_value", bootstrap_value))


def gae(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
    time_dim, backend, out,
):  # fmt: skip
    """A_t = δ_t + γ_t λ_t c_t A_{t+1}: reverse scan with a = γλc, b = δ."""
    values_ = {"rewards": rewards, "values": values, "next_values": next_values}
    c = _Canon("gae", time_dim, values_, backend, *_discount(gamma, lmbda))
    require_next_state("gae", next_values, bootstrap_value, truncated)
    r, v = c.step("rewards", rewards), c.step("values", values)
    term, trunc = c.flag("terminated", terminated), c.flag("truncated", truncated)
    g, lam = c.coefficient("gamma", gamma), c.coefficient("lmbda", lmbda)
    nv = _next_state(c, v, next_values, bootstrap_value)
    delta = r + _gated(_not(term), g, nv) - v
    advantages = c.scan(_keep_product(c.continues(term, trunc, r), g, lam, r), delta)
    return c.finish(out, ("advantages", "returns"), advantages, advantages + v)


def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
    time_dim, backend, out,
):  # fmt: skip
    """G_t = r_t + γ_t (1 - term_t) [(1 - λ_t c_t) nv_t + λ_t c_t G_{t+1}]."""
    if values is None and next_values is None:
        raise ValueError("lambda_returns: pass `values` or `next_values`")
    values_ = {"rewards": rewards, "values": values, "next_values": next_values}
    c = _Canon("lambda_returns", time_dim, values_, backend, *_discount(gamma, lmbda))
    require_next_state("lambda_returns", next_values, bootstrap_value, truncated)
    r, v = c.step("rewards", rewards), c.step("values", values)
    term, trunc = c.flag("terminated", terminated), c.flag("truncated", truncated)
    g, lam = c.coefficient("gamma", gamma), c.coefficient("lmbda", lmbda)
    nv = _next_state(c, v, next_values, bootstrap_value)
    cont = c.continues(term, trunc, r)
    trace = _keep(cont, lam, r)  # λ_t c_t
    weight = 1 - trace  # of nv_t: exactly 0 (nv_t unused) where λ_t c_t = 1
    b = r + _gated(_not(term), g, _cut(weight, nv))
    # a = γ_t λ_t c_t, γ masked too: a NaN γ_t where the trace is cut is not read
    return c.finish(out, ("returns",), c.scan(trace * _keep(cont, g, r), b))


def discounted_returns(
    rewards, terminated, truncated, next_values, bootstrap_value, gamma, time_dim, backend, out
):
    """G_t = r_t + γ_t (1 - term_t) [c_t G_{t+1} + (1 - c_t) nv_t]."""
    values_ = {"rewards": rewards, "next_values": next_values}
    c = _Canon("discounted_returns", time_dim, values_, backend, *_discount(gamma))
    require_next_state("discounted_returns", next_values, None, truncated, needed=False)
    r = c.step("rewards", rewards)
    term, trunc = c.flag("terminated", terminated), c.flag("truncated", truncated)
    g = c.coefficient("gamma", gamma)
    cont = c.continues(term, trunc, r)
    b = r
    if next_values is not None:
        bootstraps = ~cont if term is None else ~cont & ~term  # a cut that is not terminal
        b = r + _gated(bootstraps, g, c.step("next_values", next_values))
    elif bootstrap_value is not None:  # only t = T-1 (elsewhere a cut is a termination)
        boot = c.boundary("bootstrap_value", bootstrap_value)
        nv = _next(torch.zeros_like(r), boot)
        edge = ~c.continues(None, None, r)
        b = r + _gated(edge if term is None else edge & ~term, g, nv)
    return c.finish(out, ("returns",), c.scan(_keep(cont, g, r), b))


def vtrace(
    rewards, values, target_log_probs, behavior_log_probs, terminated, truncated, next_values,
    bootstrap_value, gamma, lmbda, rho_bar, c_bar, pg_rho_bar, time_dim, backend, out,
):  # fmt: skip
    """D_t = ρ_t δ_t + γ_t κ_t c_t D_{t+1}; vs = v + D; pg = ρ^pg_t (r + γ (1 - term) u - v)."""
    values_ = {
        "rewards": rewards,
        "values": values,
        "target_log_probs": target_log_probs,
        "behavior_log_probs": behavior_log_probs,
        "next_values": next_values,
    }
    discount = _discount(gamma, lmbda, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar)
    c = _Canon("vtrace", time_dim, values_, backend, *discount)
    require_next_state("vtrace", next_values, bootstrap_value, truncated)
    r, v = c.step("rewards", rewards), c.step("values", values)
    term, trunc = c.flag("terminated", terminated), c.flag("truncated", truncated)
    g, lam = c.coefficient("gamma", gamma), c.coefficient("lmbda", lmbda)
    rho_bar_ = c.coefficient("rho_bar", rho_bar)
    pg_bar = rho_bar_ if pg_rho_bar is None else c.coefficient("pg_rho_bar", pg_rho_bar)
    w = torch.exp(
        c.step("target_log_probs", target_log_probs)
        - c.step("behavior_log_probs", behavior_log_probs)
    )
    nv = _next_state(c, v, next_values, bootstrap_value)
    live, cont = _not(term), c.continues(term, trunc, r)
    delta = _min(w, rho_bar_) * (r + _gated(live, g, nv) - v)
    kappa = lam * _min(w, c.coefficient("c_bar", c_bar))
    vs = v + c.scan(_keep_product(cont, g, kappa, r), delta)
    u = torch.where(cont, _next(vs), nv)  # vs_{t+1} where the trace goes on, else nv_t
    pg = _min(w, pg_bar) * (r + _gated(live, g, u) - v)
    return c.finish(out, ("vs", "pg_advantages"), vs, pg)


def retrace(
    rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, terminated,
    truncated, gamma, lmbda, c_bar, trace, time_dim, backend, out,
):  # fmt: skip
    """Q_t = r_t + γ_t (1 - term_t) [E_t + c_t κ_{t+1} (Q_{t+1} - q_{t+1})]."""
    values_ = {
        "rewards": rewards,
        "q_values": q_values,
        "next_expected_q": next_expected_q,
        "target_log_probs": target_log_probs,
        "behavior_log_probs": behavior_log_probs,
    }
    c = _Canon("retrace", time_dim, values_, backend, *_discount(gamma, lmbda, c_bar=c_bar))
    r = c.step("rewards", rewards)
    term, trunc = c.flag("terminated", terminated), c.flag("truncated", truncated)
    g = c.coefficient("gamma", gamma)
    cont = c.continues(term, trunc, r)
    # κ_{t+1}, read only where c_t = 1 (its inputs are selected away elsewhere)
    tlp = _keep(cont, _next(c.step("target_log_probs", target_log_probs)), r)
    lam = _next(c.coefficient("lmbda", lmbda))
    if trace == "retrace":
        blp = _keep(cont, _next(c.step("behavior_log_probs", behavior_log_probs)), r)
        kappa = lam * _min(torch.exp(tlp - blp), _next(c.coefficient("c_bar", c_bar)))
    elif trace == "tree_backup":
        kappa = lam * torch.exp(tlp)
    elif trace == "q_lambda":
        kappa = _keep(None, lam, r)
    else:  # importance_sampling
        blp = _keep(cont, _next(c.step("behavior_log_probs", behavior_log_probs)), r)
        kappa = lam * torch.exp(tlp - blp)
    a = _keep_product(cont, g, kappa, r)
    q_next = _next(c.step("q_values", q_values))
    b = r + _gated(_not(term), g, c.step("next_expected_q", next_expected_q))
    b = b - _cut(a, q_next)  # a zero trace coefficient drops q_{t+1}
    return c.finish(out, ("q_targets",), c.scan(a, b))


def eligibility_traces(
    x, done, gamma, lmbda, initial, time_dim, backend, out, fn="eligibility_traces"
):
    """z_t = x_t + γ_t λ_t (1 - done_{t-1}) z_{t-1}, forward in time from ``initial``
    (``fn``: the public name, for messages; ``episodic_cumsum`` comes here too)."""
    c = _Canon(fn, time_dim, {"x": x}, backend, *_discount(gamma, lmbda))
    x_ = c.step("x", x)
    g, lam = c.coefficient("gamma", gamma), c.coefficient("lmbda", lmbda)
    carries = _not(_previous(c.flag("done", done)))
    a = _keep_product(carries, g, lam, x_)
    z = c.scan(a, x_, c.boundary("initial", initial), reverse=False)
    return c.finish(out, ("traces",), z)
