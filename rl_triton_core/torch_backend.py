"""Vectorised PyTorch backend (any device; the default on the CPU).

Each estimator builds its scan coefficients ``(a_t, b_t)`` with a few whole-tensor ops, runs
the one scan engine :func:`scan`, and post-processes (``returns = A + v``, V-trace's policy
gradient advantages). The engine picks between two shapes of the same recurrence:

* **blocked log-depth** when there are few sequences (per-op overhead dominates): time is cut
  into blocks of ``K`` steps, each block is scanned with ``log2 K`` doubling passes
  (Hillis & Steele 1986) over all blocks at once, then the carry crosses the blocks
  sequentially (one tiny op per block) and is applied with one fused multiply-add;
* **sequential** when there are many sequences: one fused ``addcmul`` per step over a row of
  the batch, which moves the fewest bytes.

A zero coefficient is a hard cut (``x_t = b_t`` even where the carry is NaN). On the CPU the
engine runs unguarded and re-runs guarded only when the result has a non-finite value (the
two can only differ there); on other devices it is always guarded (no host sync).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Tuned on a 2-core CPU against Stable-Baselines3's loop (benchmarks/cpu_gae_vs_sb3.py).
SEQUENTIAL_MIN_BATCH = 512  # batch rows at least this wide: one addcmul per step
SEQUENTIAL_MAX_T = 8  # this short: sequential whatever the batch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 arithmetic for 16/32-bit inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# -- the scan engine ---------------------------------------------------------------------------


def _block_size(T: int) -> int:
    k = 4
    while k * k < 4 * T and k < 256:
        k *= 2
    return k


def _combine_in_blocks(A: Tensor, B: Tensor, reverse: bool, guard: bool) -> None:
    """In-place doubling scan along dim 1 of ``[nb, K, M]``: afterwards element i holds the
    composite map from the carry entering its block to x_i."""
    K = A.shape[1]
    d = 1
    while d < K:
        lo, hi = (slice(0, K - d), slice(d, K)) if reverse else (slice(d, K), slice(0, K - d))
        a_lo = A[:, lo]
        b_new = torch.addcmul(B[:, lo], a_lo, B[:, hi])
        if guard:
            b_new = torch.where(a_lo == 0, B[:, lo], b_new)
        a_new = a_lo * A[:, hi]
        B[:, lo] = b_new
        A[:, lo] = a_new
        d *= 2


def _apply(a: Tensor, x: Tensor, b: Tensor, guard: bool, out: Tensor | None = None) -> Tensor:
    """a * x + b; guarded, a == 0 gives exactly b."""
    if not guard:
        return torch.addcmul(b, a, x, out=out)
    return torch.where(a == 0, b, torch.addcmul(b, a, x), out=out)


def _scan_blocked(a: Tensor, b: Tensor, initial: Tensor | None, reverse: bool, guard: bool):
    T, M = b.shape
    K = _block_size(T)
    nb = -(-T // K)
    A = a.new_ones(nb * K, M)  # padding with the identity map (a, b) = (1, 0)
    B = b.new_zeros(nb * K, M)
    A[:T] = a
    B[:T] = b
    A = A.view(nb, K, M)
    B = B.view(nb, K, M)
    _combine_in_blocks(A, B, reverse, guard)
    carries = b.new_empty(nb, 1, M)
    carry = b.new_zeros(M) if initial is None else initial
    edge = 0 if reverse else K - 1  # the element whose value is the carry into the next block
    for j in reversed(range(nb)) if reverse else range(nb):
        carries[j, 0] = carry
        carry = _apply(A[j, edge], carry, B[j, edge], guard)
    return _apply(A, carries, B, guard).view(nb * K, M)[:T]


def _scan_sequential(a: Tensor, b: Tensor, initial: Tensor | None, reverse: bool, guard: bool):
    T = b.shape[0]
    order = range(T - 1, -1, -1) if reverse else range(T)
    prev = initial
    for t in order:
        if prev is not None:
            _apply(a[t], prev, b[t], guard, out=b[t])  # b is ours: overwrite it in place
        prev = b[t]
    return b


def scan(coefficients, reverse: bool = False, initial: Tensor | None = None) -> Tensor:
    """x_t = a_t x_{t-1} + b_t (``reverse``: x_t = a_t x_{t+1} + b_t) along dim 0.

    ``coefficients()`` returns fresh ``(a, b)``: ``[T, *batch]`` tensors of the compute dtype
    that the engine may overwrite (``a`` may be a broadcast view); it is called again in the
    rare case of a guarded re-run. ``initial``: ``[*batch]`` or None (zero). Returns x.
    """
    a, b = coefficients()
    shape = b.shape
    T = shape[0]
    guard = b.device.type != "cpu"
    flat_initial = None if initial is None else initial.expand(shape[1:]).reshape(-1)
    sequential = b[0].numel() >= SEQUENTIAL_MIN_BATCH or T <= SEQUENTIAL_MAX_T
    run = _scan_sequential if sequential else _scan_blocked

    def attempt(a: Tensor, b: Tensor, guard: bool) -> Tensor:
        a = a.expand(shape).reshape(T, -1)
        return run(a, b.reshape(T, -1), flat_initial, reverse, guard).view(shape)

    x = attempt(a, b, guard)
    if not guard and not bool(torch.isfinite(x).all()):  # CPU only: no device sync
        x = attempt(*coefficients(), guard=True)
    return x


# -- coefficient helpers -----------------------------------------------------------------------


def _cast(x, dtype: torch.dtype):
    """A tensor in the compute dtype (no copy when it already is); Python floats unchanged."""
    return x.to(dtype) if isinstance(x, Tensor) else x


def _masked(mask: Tensor, value, dtype: torch.dtype) -> Tensor:
    """value where mask, exactly 0 elsewhere (also where value is NaN)."""
    if isinstance(value, Tensor):
        return torch.where(mask, value, 0.0)
    return mask.to(dtype) * value


def _gated(terminated: Tensor | None, x: Tensor) -> Tensor:
    """x, with exactly 0 at terminated steps: the bootstrap a terminal state does not get."""
    return x if terminated is None else torch.where(terminated != 0, 0.0, x)


def _done(terminated: Tensor | None, truncated: Tensor | None) -> Tensor | None:
    flags = [f != 0 for f in (terminated, truncated) if f is not None]
    return flags[0] | flags[1] if len(flags) == 2 else (flags[0] if flags else None)


def _continues(terminated, truncated, shape: torch.Size, device) -> Tensor:
    """c_t = 1 - done_t, with c_{T-1} = 0 (the window edge always cuts the trace)."""
    done = _done(terminated, truncated)
    c = torch.ones(shape, dtype=torch.bool, device=device) if done is None else ~done
    c[-1] = False
    return c


def _next_state_values(values, next_values, bootstrap_value, dtype) -> Tensor:
    """nv_t: next_values[t], else values[t+1] with bootstrap_value at the last step."""
    if next_values is not None:
        return next_values.to(dtype)
    return torch.cat((values[1:].to(dtype), bootstrap_value.to(dtype)[None]))


def _shifted(x: Tensor) -> Tensor:
    """x_{t+1} (the last row, never read unmasked, is 0)."""
    return torch.cat((x[1:], torch.zeros_like(x[:1])))


def _min(w: Tensor, bound) -> Tensor:
    return torch.clamp(w, max=bound) if not isinstance(bound, Tensor) else torch.minimum(w, bound)


# -- the estimators (canonical arguments: see rl_triton_core._dispatch) -------------------------


def linear_scan(a, b, initial, reverse, out):
    dtype = compute_dtype(out.dtype)

    def coefficients():
        return _cast(a, dtype), torch.empty(out.shape, dtype=dtype, device=out.device).copy_(b)

    out.copy_(scan(coefficients, reverse, _cast(initial, dtype)))


def gae(rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out):
    adv_out, ret_out = out
    dtype = compute_dtype(adv_out.dtype)
    gamma, lmbda = _cast(gamma, dtype), _cast(lmbda, dtype)
    v = values.to(dtype)

    def coefficients():
        nv = _next_state_values(values, next_values, bootstrap_value, dtype)
        delta = rewards.to(dtype) + _gated(terminated, gamma * nv) - v
        c = _continues(terminated, truncated, v.shape, v.device)
        return _masked(c, gamma * lmbda, dtype), delta

    advantages = scan(coefficients, reverse=True)
    adv_out.copy_(advantages)
    torch.add(advantages, v, out=advantages)
    ret_out.copy_(advantages)


def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
):
    dtype = compute_dtype(out.dtype)
    gamma, lmbda = _cast(gamma, dtype), _cast(lmbda, dtype)

    def coefficients():
        nv = _next_state_values(values, next_values, bootstrap_value, dtype)
        c = _continues(terminated, truncated, out.shape, out.device)
        trace = _masked(c, lmbda, dtype)  # lambda_t c_t
        b = rewards.to(dtype) + _gated(terminated, gamma * (1 - trace) * nv)
        return gamma * trace, b

    out.copy_(scan(coefficients, reverse=True))


def discounted_returns(rewards, terminated, truncated, next_values, bootstrap_value, gamma, out):
    dtype = compute_dtype(out.dtype)
    gamma = _cast(gamma, dtype)

    def coefficients():
        c = _continues(terminated, truncated, out.shape, out.device)
        b = rewards.to(dtype, copy=True)
        if next_values is not None:  # bootstrap wherever the trace is cut and not terminated
            b += _gated(terminated, torch.where(c, 0.0, gamma * next_values.to(dtype)))
        elif bootstrap_value is not None:  # elsewhere a cut means terminated: only t = T-1
            g_last = gamma[-1] if isinstance(gamma, Tensor) else gamma
            term_last = None if terminated is None else terminated[-1]
            b[-1] += _gated(term_last, g_last * bootstrap_value.to(dtype))
        return _masked(c, gamma, dtype), b

    out.copy_(scan(coefficients, reverse=True))


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
    dtype = compute_dtype(vs_out.dtype)
    gamma, lmbda = _cast(gamma, dtype), _cast(lmbda, dtype)
    w = torch.exp(target_log_probs.to(dtype) - behavior_log_probs.to(dtype))
    r, v = rewards.to(dtype), values.to(dtype)
    nv = _next_state_values(values, next_values, bootstrap_value, dtype)
    c = _continues(terminated, truncated, v.shape, v.device)

    def coefficients():
        delta = _min(w, _cast(rho_bar, dtype)) * (r + _gated(terminated, gamma * nv) - v)
        kappa = lmbda * _min(w, _cast(c_bar, dtype))
        return _masked(c, gamma * kappa, dtype), delta

    vs = scan(coefficients, reverse=True)
    vs += v
    vs_out.copy_(vs)
    u = torch.where(c, _shifted(vs), nv)
    pg_out.copy_(_min(w, _cast(pg_rho_bar, dtype)) * (r + _gated(terminated, gamma * u) - v))


def trace_coefficient(trace: str, lmbda, w: Tensor, target_log_probs: Tensor, c_bar) -> Tensor:
    """kappa_t of Retrace(lambda) and its relatives (Munos et al. 2016, Table 1)."""
    if trace == "retrace":
        return lmbda * _min(w, c_bar)
    if trace == "tree_backup":
        return lmbda * torch.exp(target_log_probs)
    if trace == "q_lambda":
        return lmbda * torch.ones_like(w)
    return lmbda * w  # importance_sampling


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
    dtype = compute_dtype(out.dtype)
    gamma, lmbda = _cast(gamma, dtype), _cast(lmbda, dtype)

    def coefficients():
        tlp = target_log_probs.to(dtype)
        w = torch.exp(tlp - behavior_log_probs.to(dtype))
        kappa_next = _shifted(trace_coefficient(trace, lmbda, w, tlp, _cast(c_bar, dtype)))
        c = _continues(terminated, truncated, out.shape, out.device)
        a = torch.where(c, gamma * kappa_next, 0.0)
        b = rewards.to(dtype) + _gated(terminated, gamma * next_expected_q.to(dtype))
        b -= torch.where(c, a * _shifted(q_values.to(dtype)), 0.0)
        return a, b

    out.copy_(scan(coefficients, reverse=True))


def eligibility_traces(x, done, gamma, lmbda, initial, out):
    dtype = compute_dtype(out.dtype)
    gamma, lmbda = _cast(gamma, dtype), _cast(lmbda, dtype)

    def coefficients():
        b = torch.empty(out.shape, dtype=dtype, device=out.device).copy_(x)
        if done is None:
            return gamma * lmbda * torch.ones_like(b[:1]), b
        carry = torch.ones(out.shape, dtype=torch.bool, device=out.device)
        carry[1:] = done[:-1] == 0  # z_t carries z_{t-1} unless the episode ended at t-1
        return _masked(carry, gamma * lmbda, dtype), b

    out.copy_(scan(coefficients, initial=_cast(initial, dtype)))
