"""CleanRL helpers for ``rl_triton_core`` (install with ``rl-triton[cleanrl]``).

CleanRL's PPO scripts store a rollout time-major, ``[num_steps, num_envs]``, with
``dones[t]`` marking that observation ``t`` is the *first of a new episode*, and close it with
``next_value`` (the value of the observation after the last step) and ``next_done``. Their GAE
loop becomes one call that gives the same ``advantages`` and ``returns``::

    advantages, returns = rl_triton_cleanrl.compute_gae(
        rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda
    )

CleanRL treats a time-limit truncation as a termination (its issue #198). To bootstrap
truncated steps from the value of the final observation instead, pass ``truncated`` (which
steps were truncated) and ``final_values`` (``V(info["final_obs"])`` at those steps)::

    advantages, returns = rl_triton_cleanrl.compute_gae(
        rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda,
        truncated=truncated, final_values=final_values,
    )

:func:`compute_vtrace` does the same for V-trace (IMPALA). :class:`Stopwatch`,
:func:`shadow_check` and :func:`max_rel_diff` are the small tools the example scripts under
``examples/cleanrl/`` use to log the time spent in credit assignment and the agreement with the
float64 reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

import rl_triton_core as rtc
from rl_triton_core.estimators import Backend

__all__ = ["Stopwatch", "compute_gae", "compute_vtrace", "max_rel_diff", "shadow_check"]


def _contract(
    fn: str,
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_value: Tensor,
    next_done: Tensor,
    truncated: Tensor | None,
    final_values: Tensor | None,
) -> dict:
    """CleanRL's rollout convention -> the keyword arguments of ``rl_triton_core``.

    * ``terminated[t] = dones[t + 1]`` for ``t < T - 1`` and ``next_done`` at ``T - 1``, minus
      the steps flagged in ``truncated``;
    * no truncation: ``bootstrap_value = next_value`` (``values[t + 1]`` is the next value);
    * with ``truncated``: ``next_values[t] = final_values[t]`` where truncated, else
      ``values[t + 1]`` (``next_value`` at ``T - 1``).
    """
    named = {"rewards": rewards, "values": values, "dones": dones}
    named |= {"next_value": next_value, "next_done": next_done}
    if truncated is not None:
        named |= {"truncated": truncated, "final_values": final_values}
    for name, x in named.items():
        if name == "final_values" and x is None:
            raise ValueError(
                f"{fn}: `truncated` needs `final_values`, the value of info['final_obs'] at the "
                "truncated steps (the value of the next observation belongs to the next episode)"
            )
        if not isinstance(x, Tensor):
            raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
        if x.device != rewards.device:
            raise ValueError(
                f"{fn}: `{name}` is on {x.device} but `rewards` on {rewards.device}; "
                "every tensor must be on one device"
            )
        floating = name in ("rewards", "values", "next_value", "final_values")
        if x.is_complex() or (floating and not x.is_floating_point()):
            kind = "a floating-point" if floating else "a bool, integer or float 0/1"
            raise TypeError(f"{fn}: `{name}` must be {kind} tensor, got {x.dtype}")
    if rewards.ndim < 1:
        raise ValueError(f"{fn}: `rewards` must be time-major [num_steps, ...], got a 0-dim tensor")
    shape = tuple(rewards.shape)
    batch = shape[1:]
    if values.ndim != len(shape) or any(v not in (1, s) for v, s in zip(values.shape, shape)):
        raise ValueError(
            f"{fn}: `values` must have the shape of `rewards` {shape} (or broadcast to it with "
            f"as many dims), got {tuple(values.shape)}"
        )
    if tuple(dones.shape) != shape:
        raise ValueError(
            f"{fn}: `dones` must have the shape of `rewards` {shape}, got {tuple(dones.shape)}"
        )
    per_env = tuple(k for k in batch if k != 1)
    for name, x in (("next_value", next_value), ("next_done", next_done)):
        if tuple(k for k in x.shape if k != 1) != per_env:  # (size-1 dims aside: no reordering)
            raise ValueError(
                f"{fn}: `{name}` must hold one entry per environment, of shape {batch} (size-1 "
                f"dims aside, e.g. {(1, *batch)}), got shape {tuple(x.shape)}"
            )
    if truncated is not None:
        for name, x in (("truncated", truncated), ("final_values", final_values)):
            if tuple(x.shape) != shape:
                raise ValueError(
                    f"{fn}: `{name}` must have the shape of `rewards` {shape}, got {tuple(x.shape)}"
                )
        values = values.expand(shape)

    next_done = next_done.reshape(1, *batch)
    next_value = next_value.reshape(batch)
    # episode ends of step t: observation t + 1 starts a new episode
    ends = torch.cat((dones[1:], next_done.to(dones.dtype))) if shape[0] else dones
    if truncated is None:
        return {"terminated": ends, "bootstrap_value": next_value}
    truncated = truncated != 0
    next_values = torch.cat((values[1:], next_value.unsqueeze(0).to(values.dtype)))
    return {
        "terminated": (ends != 0) & ~truncated,
        "truncated": truncated,
        "next_values": torch.where(truncated, final_values.to(values.dtype), next_values),
    }


def _compute_on(fn: str, device, estimator, tensors: tuple, kwargs: dict) -> tuple[Tensor, Tensor]:
    """``estimator(*tensors, **kwargs)``; with ``device``, there: the tensors are copied to it and
    the outputs back to the rollout's device (that of ``tensors[0]``)."""
    if device is None:
        return estimator(*tensors, **kwargs)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{fn}: `device` must name a torch device, got {device!r}") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{fn}: `device` is {device} but CUDA is not available")
    move = lambda x: x.to(device) if isinstance(x, Tensor) else x
    outputs = estimator(*map(move, tensors), **{k: move(v) for k, v in kwargs.items()})
    home = tensors[0].device
    return tuple(x.to(home) for x in outputs)


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    dones: Tensor,
    next_value: Tensor,
    next_done: Tensor,
    gamma: float,
    gae_lambda: float,
    *,
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
    backend: Backend = "auto",
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """CleanRL's GAE loop as one call to :func:`rl_triton_core.gae`.

    Without ``truncated`` this gives the ``advantages`` and ``returns`` of the loop in
    CleanRL's ``ppo.py`` / ``ppo_continuous_action.py`` (every episode end, time limits included,
    is a termination)::

        for t in reversed(range(num_steps)):
            if t == num_steps - 1:
                nextnonterminal, nextvalues = 1.0 - next_done, next_value
            else:
                nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        returns = advantages + values

    With ``truncated``, the steps it flags end their episode (the trace is cut) but bootstrap
    from ``final_values`` instead of 0: ``delta = r + γ V(final_obs) - V(s)``.

    Args:
        rewards, values: ``[num_steps, num_envs]`` (any trailing batch axes allowed).
        dones: same shape; ``dones[t]`` is true when observation ``t`` starts a new episode
            (CleanRL's ``dones[step] = next_done``). Bool, integer or float 0/1.
        next_value: ``V(next_obs)`` after the last step, ``[num_envs]`` (or with size-1 dims:
            ``[1, num_envs]``, ``[num_envs, 1]``).
        next_done: whether ``next_obs`` starts a new episode, ``[num_envs]`` (likewise).
        gamma, gae_lambda: discount and GAE λ.
        truncated: optional, same shape as ``rewards``; ``truncated[t]``: step ``t`` ended its
            episode by truncation and not by termination (gymnasium's
            ``truncations & ~terminations``: a step that is both is terminal).
        final_values: with ``truncated``, ``V(info["final_obs"])`` at the truncated steps
            (same shape as ``rewards``; other entries are not read, nor is it without
            ``truncated``: the examples toggle bootstrapping with ``truncated`` alone).
        backend: ``"auto"``, ``"triton"``, ``"torch"`` or ``"reference"`` (see
            ``rl_triton_core``).
        device: where to compute; ``None`` (default): the rollout's device. E.g. ``"cuda"``
            runs the Triton kernels for a rollout kept on the CPU: the inputs are copied there
            and the results back to the rollout's device (the copies cost more than the kernel
            at CleanRL's sizes; the option is for networks that run faster on the CPU).

    Returns:
        ``(advantages, returns)``, each of the shape of ``rewards``.

    Raises:
        TypeError: an argument is not a tensor.
        ValueError: mismatched shapes, ``truncated`` without ``final_values``, an unknown or
            unavailable backend or device.
    """
    kwargs = _contract(
        "compute_gae", rewards, values, dones, next_value, next_done, truncated, final_values
    )
    kwargs |= dict(gamma=gamma, lmbda=gae_lambda, backend=backend)
    return _compute_on("compute_gae", device, rtc.gae, (rewards, values), kwargs)


def compute_vtrace(
    rewards: Tensor,
    values: Tensor,
    target_log_probs: Tensor,
    behavior_log_probs: Tensor,
    dones: Tensor,
    next_value: Tensor,
    next_done: Tensor,
    gamma: float,
    *,
    truncated: Tensor | None = None,
    final_values: Tensor | None = None,
    lmbda: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    backend: Backend = "auto",
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """V-trace targets and policy-gradient advantages for a CleanRL-layout rollout.

    :func:`rl_triton_core.vtrace` (Espeholt et al. 2018) with the rollout convention of
    :func:`compute_gae`: ``dones[t]`` marks that observation ``t`` starts a new episode,
    ``next_value`` / ``next_done`` close the rollout, and ``truncated`` / ``final_values``
    optionally bootstrap truncated steps from the value of the final observation.

    Args:
        rewards, values: ``[num_steps, num_envs]``; ``values`` under the learner's (target)
            policy.
        target_log_probs, behavior_log_probs: ``log π(a_t|s_t)`` under the learner's policy and
            under the policy that acted, same shape.
        dones, next_value, next_done, gamma, truncated, final_values, backend, device: as in
            :func:`compute_gae`.
        lmbda, rho_bar, c_bar, pg_rho_bar: V-trace's λ and clipping thresholds ``ρ̄``, ``c̄``,
            ``ρ̄_pg`` (defaults to ``rho_bar``).

    Returns:
        ``(vs, pg_advantages)``: value targets and the (ρ-weighted) advantages for the
        policy-gradient loss, each of the shape of ``rewards``.
    """
    kwargs = _contract(
        "compute_vtrace", rewards, values, dones, next_value, next_done, truncated, final_values
    )
    kwargs |= dict(gamma=gamma, lmbda=lmbda, rho_bar=rho_bar, c_bar=c_bar)
    kwargs |= dict(pg_rho_bar=pg_rho_bar, backend=backend)
    tensors = (rewards, values, target_log_probs, behavior_log_probs)
    return _compute_on("compute_vtrace", device, rtc.vtrace, tensors, kwargs)


def max_rel_diff(actual: Tensor | Sequence[Tensor], expected: Tensor | Sequence[Tensor]) -> float:
    """``max |actual - expected| / max |expected|`` over the paired tensors taken together.

    A normwise relative difference of the outputs as one vector: every error is divided by one
    scale, the largest magnitude in any expected tensor (for GAE the returns, for V-trace the
    value targets ``vs``). Advantages are differences of value-sized numbers
    (``A_t = G^λ_t - V_t``), so float32 rounds them to within a fraction of the *values'* size,
    not of their own: once a critic fits, ``max |A|`` can be ~1e-3 with ``V`` ~ 100, and any
    float32 evaluation, CleanRL's own loop included, is then off by ~1e-2 of ``max |A|``
    (docs/parity.md). Scaled by the largest output, float32 results stay below 1e-5 (the
    scripts' ``--shadow-check`` against ``backend="reference"``). NaN anywhere gives NaN; equal
    infinities differ by 0 (and do not count in the scale), an infinity against any other
    value by ``inf``.
    """
    if isinstance(actual, Tensor):
        actual, expected = (actual,), (expected,)
    if len(actual) != len(expected):
        raise ValueError(
            f"max_rel_diff: {len(actual)} `actual` tensors but {len(expected)} `expected`"
        )
    error, scale = 0.0, torch.finfo(torch.float64).tiny
    for a, e in zip(actual, expected):
        if a.shape != e.shape:
            raise ValueError(
                f"max_rel_diff: shapes differ, `actual` {tuple(a.shape)} vs `expected` "
                f"{tuple(e.shape)}"
            )
        if e.numel() == 0:
            continue
        a, e = a.detach().to("cpu", torch.float64), e.detach().to("cpu", torch.float64)
        diff = torch.where(a == e, 0.0, (a - e).abs()).max().item()  # (inf - inf: NaN)
        if diff != diff:  # NaN
            return diff
        finite = e.abs().nan_to_num(0.0, 0.0, 0.0)  # (the scale: the largest finite |e|)
        error, scale = max(error, diff), max(scale, finite.max().item())
    return error / scale


def shadow_check(outputs: Tensor | Sequence[Tensor], fn, *args, **kwargs) -> float:
    """Recomputes ``fn(*args, **kwargs)`` with ``backend="reference"`` and returns
    :func:`max_rel_diff` of ``outputs`` against it.

    The float64 reference is a Python loop over time, fastest on the CPU, so the tensor
    arguments are copied there first (on a GPU the loop would launch thousands of tiny kernels).
    ``fn`` is :func:`compute_gae` or :func:`compute_vtrace` (or any function that takes
    ``backend=``); pass the arguments of the call that produced ``outputs``, without ``backend``::

        advantages, returns = compute_gae(*inputs, backend="triton")
        diff = shadow_check((advantages, returns), compute_gae, *inputs)
    """
    if "backend" in kwargs:
        raise ValueError("shadow_check: do not pass `backend`; the check uses 'reference'")
    cpu = lambda x: x.detach().cpu() if isinstance(x, Tensor) else x
    reference = fn(*map(cpu, args), **{k: cpu(v) for k, v in kwargs.items()}, backend="reference")
    return max_rel_diff(outputs, reference)


class Stopwatch:
    """Wall-clock seconds of a ``with`` block, GPU work included.

    On a CUDA device it synchronises on entry (so queued work from before is not counted) and
    on exit (so the block's kernels are). ``seconds`` holds the result::

        with Stopwatch(device) as sw:
            advantages, returns = compute_gae(...)
        writer.add_scalar("charts/credit_assignment_time", sw.seconds, global_step)
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.seconds = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __enter__(self) -> Stopwatch:
        self._sync()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self._sync()
        self.seconds = time.perf_counter() - self._start
