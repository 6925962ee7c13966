"""The float64 reference: sequential loops written straight from the contract's formulas.

Slow and obviously correct; the oracle of the test suite. Every function takes the canonical,
validated arguments of :mod:`rl_triton_core._dispatch` (time-first views ``[T, *batch]``) and
writes its results into the given output views. A term the formulas switch off (a cut trace,
a terminated bootstrap) is skipped with ``torch.where``, not multiplied by 0, so a NaN only
reaches the outputs that mathematically depend on it.
"""

from __future__ import annotations

import torch
from torch import Tensor

F64 = torch.float64


def _f64(x):
    return x.to(F64) if isinstance(x, Tensor) else x


def _coef(x, t: int):
    """gamma_t / lmbda_t / a threshold at step t (Python float or a float64 row)."""
    return x[t].to(F64) if isinstance(x, Tensor) else x


def _flag(flags: Tensor | None, t: int, like: Tensor) -> Tensor:
    if flags is None:
        return torch.zeros_like(like, dtype=torch.bool)
    return flags[t] != 0


def _done(terminated, truncated, t: int, like: Tensor) -> Tensor:
    return _flag(terminated, t, like) | _flag(truncated, t, like)


def _cont(terminated, truncated, t: int, T: int, like: Tensor) -> Tensor:
    """c_t: 1 where the trace continues into step t+1; always 0 at the window edge t = T-1."""
    if t == T - 1:
        return torch.zeros_like(like, dtype=torch.bool)
    return ~_done(terminated, truncated, t, like)


def _next_value(values, next_values, bootstrap_value, t: int, T: int, like: Tensor) -> Tensor:
    """nv_t: next_values[t] if given, else values[t+1], else bootstrap_value at t = T-1."""
    if next_values is not None:
        return _f64(next_values[t])
    if t < T - 1:
        return _f64(values[t + 1])
    if bootstrap_value is None:  # only discounted_returns gets here: a missing bootstrap is 0
        return torch.zeros_like(like)
    return _f64(bootstrap_value)


def _min(w: Tensor, bound) -> Tensor:
    return torch.minimum(w, torch.as_tensor(bound, dtype=F64, device=w.device))


def _keep(mask: Tensor, x: Tensor) -> Tensor:
    """x where mask, else exactly 0 (even where x is NaN or inf)."""
    return torch.where(mask, x, torch.zeros_like(x))


def _carry(coef: Tensor, x: Tensor) -> Tensor:
    """coef * x, dropped (exactly 0) where coef is 0: a zero coefficient is a hard cut."""
    coef = coef.expand_as(x) if isinstance(coef, Tensor) else torch.full_like(x, coef)
    return _keep(coef != 0, coef * x)


def _write(out: Tensor, rows: list[Tensor]) -> None:
    out.copy_(torch.stack(rows))


def linear_scan(a, b, initial, reverse, out):
    T = out.shape[0]
    x = torch.zeros_like(out[0], dtype=F64) if initial is None else _f64(initial)
    rows = [None] * T
    for t in reversed(range(T)) if reverse else range(T):
        x = _f64(b[t]) + _carry(_f64(a[t]), x)
        rows[t] = x
    _write(out, rows)


def gae(rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out):
    adv_out, ret_out = out
    T = rewards.shape[0]
    like = torch.zeros_like(adv_out[0], dtype=F64)
    A = like
    adv = [None] * T
    for t in reversed(range(T)):
        g, lam = _coef(gamma, t), _coef(lmbda, t)
        nv = _next_value(values, next_values, bootstrap_value, t, T, like)
        term = _flag(terminated, t, like)
        delta = _f64(rewards[t]) + _keep(~term, g * nv) - _f64(values[t])
        A = delta + _carry(_keep(_cont(terminated, truncated, t, T, like), g * lam + like), A)
        adv[t] = A
    _write(adv_out, adv)
    _write(ret_out, [adv[t] + _f64(values[t]) for t in range(T)])


def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
):
    T = rewards.shape[0]
    like = torch.zeros_like(out[0], dtype=F64)
    G = like
    rows = [None] * T
    for t in reversed(range(T)):
        g, lam = _coef(gamma, t), _coef(lmbda, t)
        nv = _next_value(values, next_values, bootstrap_value, t, T, like)
        c = _cont(terminated, truncated, t, T, like)
        trace = _keep(c, lam + like)  # lambda_t c_t (lambda unused where the trace is cut)
        weight = 1 - trace  # of nv_t; exactly 0 (nv_t unused) when lambda c = 1
        # (the carried G_{t+1} dropped where its coefficient gamma lambda c is 0)
        future = g * _carry(weight, nv) + _carry(g, _carry(trace, G))
        G = _f64(rewards[t]) + _keep(~_flag(terminated, t, like), future)
        rows[t] = G
    _write(out, rows)


def discounted_returns(rewards, terminated, truncated, next_values, bootstrap_value, gamma, out):
    T = rewards.shape[0]
    like = torch.zeros_like(out[0], dtype=F64)
    G = like
    rows = [None] * T
    for t in reversed(range(T)):
        c = _cont(terminated, truncated, t, T, like)
        # Without next_values, nv_t matters only at the window edge (elsewhere c_t = 0 means
        # terminated_t, which gates the bootstrap out).
        nv = like
        if next_values is not None or t == T - 1:
            nv = _next_value(None, next_values, bootstrap_value, t, T, like)
        g = _coef(gamma, t)
        future = torch.where(c, _carry(g, G), g * nv)  # (G_{t+1} dropped where gamma is 0)
        G = _f64(rewards[t]) + _keep(~_flag(terminated, t, like), future)
        rows[t] = G
    _write(out, rows)


def vtrace(
    rewards,
    values,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    next_values,
    bootstrap_value,
    gamma,
    lmbda,
    rho_bar,
    c_bar,
    pg_rho_bar,
    out,
):
    vs_out, pg_out = out
    T = rewards.shape[0]
    like = torch.zeros_like(vs_out[0], dtype=F64)
    D = like
    vs = [None] * T
    pg = [None] * T
    for t in reversed(range(T)):
        g, lam = _coef(gamma, t), _coef(lmbda, t)
        w = torch.exp(_f64(target_log_probs[t]) - _f64(behavior_log_probs[t]))
        rho = _min(w, _coef(rho_bar, t))
        kappa = lam * _min(w, _coef(c_bar, t))
        pg_rho = _min(w, _coef(pg_rho_bar, t))
        nv = _next_value(values, next_values, bootstrap_value, t, T, like)
        term = _flag(terminated, t, like)
        c = _cont(terminated, truncated, t, T, like)
        r, v = _f64(rewards[t]), _f64(values[t])
        delta = rho * (r + _keep(~term, g * nv) - v)
        vs_next = vs[t + 1] if t < T - 1 else like  # only read where c_t = 1
        u = torch.where(c, vs_next, nv)
        pg[t] = pg_rho * (r + _keep(~term, g * u) - v)
        D = delta + _carry(_keep(c, g * kappa), D)
        vs[t] = v + D
    _write(vs_out, vs)
    _write(pg_out, pg)


def trace_coefficient(trace: str, lam, w: Tensor, target_log_prob: Tensor, c_bar) -> Tensor:
    """kappa_t of Retrace(lambda) and its relatives (Munos et al. 2016, Table 1)."""
    if trace == "retrace":
        return lam * _min(w, c_bar)
    if trace == "tree_backup":
        return lam * torch.exp(target_log_prob)
    if trace == "q_lambda":
        return lam * torch.ones_like(w)
    return lam * w  # importance_sampling


def retrace(
    rewards,
    q_values,
    next_expected_q,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    gamma,
    lmbda,
    c_bar,
    trace,
    out,
):
    T = rewards.shape[0]
    like = torch.zeros_like(out[0], dtype=F64)
    Q = like
    rows = [None] * T
    for t in reversed(range(T)):
        g = _coef(gamma, t)
        term = _flag(terminated, t, like)
        c = _cont(terminated, truncated, t, T, like)
        future = g * _f64(next_expected_q[t])
        if t < T - 1:
            tlp = _f64(target_log_probs[t + 1])
            w = torch.exp(tlp - _f64(behavior_log_probs[t + 1]))
            kappa = trace_coefficient(trace, _coef(lmbda, t + 1), w, tlp, _coef(c_bar, t + 1))
            # (the carried Q_{t+1} dropped where its coefficient gamma kappa c is 0)
            future = future + _carry(g, _carry(_keep(c, kappa), Q - _f64(q_values[t + 1])))
        Q = _f64(rewards[t]) + _keep(~term, future)
        rows[t] = Q
    _write(out, rows)


def eligibility_traces(x, done, gamma, lmbda, initial, out):
    T = x.shape[0]
    like = torch.zeros_like(out[0], dtype=F64)
    z = like if initial is None else _f64(initial).expand_as(like)
    rows = [None] * T
    for t in range(T):
        carry = ~_flag(done, t - 1, like) if t > 0 else torch.ones_like(like, dtype=torch.bool)
        z = _f64(x[t]) + _carry(_keep(carry, _coef(gamma, t) * _coef(lmbda, t) + like), z)
        rows[t] = z
    _write(out, rows)
