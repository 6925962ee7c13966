"""Drop-in replacements for the functions TorchRL's value estimators call.

``torchrl.objectives.value.advantages`` imports six functions from ``functional`` by name and
its estimator classes call those names. The hook (:mod:`rl_triton_torchrl._switch`) puts the
functions below in their place. Each has the exact signature and semantics of the TorchRL
function it replaces and maps the call onto one ``rl_triton_core`` call:

=========================================  =======================================
TorchRL                                    rl_triton_core
=========================================  =======================================
``generalized_advantage_estimate``         ``gae``
``vec_generalized_advantage_estimate``     ``gae``
``td_lambda_return_estimate``              ``lambda_returns``
``vec_td_lambda_return_estimate``          ``lambda_returns``
``vec_td1_return_estimate``                ``discounted_returns``
``vtrace_advantage_estimate``              ``vtrace`` (``lmbda=1``)
=========================================  =======================================

TorchRL's ``done`` cuts the trace and its ``terminated`` gates the bootstrap (``terminated``
defaults to ``done``); with explicit next-state values this is the core's contract with
``truncated=done``, for data where ``done`` includes ``terminated`` (TorchRL's environments,
``shifted`` and ``auto_reset_env`` always produce that; on hand-built data with ``terminated``
but not ``done`` our trace is cut there and TorchRL's is not). TorchRL's ``time_dim`` (an index into every tensor, counted from the left
when non-negative) is passed through unchanged, so the ``[*B, T, F]`` tensors are read in place.

A call the core cannot serve exactly goes to TorchRL's own function (see
:func:`fallback_reason`), with one :class:`RLTritonFallbackWarning` per reason.
"""

from __future__ import annotations

import numbers
import warnings

import torch
from torch import Tensor

import rl_triton_core as rtc

from . import _state

__all__ = [
    "NAMES",
    "REPLACEMENTS",
    "RLTritonFallbackWarning",
    "fallback_reason",
    "generalized_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_generalized_advantage_estimate",
    "vec_td1_return_estimate",
    "vec_td_lambda_return_estimate",
    "vtrace_advantage_estimate",
]


class RLTritonFallbackWarning(UserWarning):
    """A TorchRL estimator call went to TorchRL's own code (shown once per function and reason)."""


_warned: set[tuple[str, str]] = set()
_is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)


def fallback_reason(
    backend: str,
    time_dim: object,
    values: tuple[Tensor, ...],
    flags: tuple[Tensor | None, ...],
    coefficients: tuple[object, ...],
) -> str | None:
    """Why ``rl_triton_core`` cannot serve this call with TorchRL's result, or ``None``.

    The one place that decides what falls back; it reads only metadata (shapes, dtypes,
    devices, ``requires_grad``), never tensor data, so it costs no device synchronisation.
    ``values`` are the per-step floating tensors, ``flags`` ``done``/``terminated``,
    ``coefficients`` gamma, lambda and the clipping thresholds.
    """
    if torch.compiler.is_compiling():
        return "torch.compile is tracing the estimator"
    flags = tuple(f for f in flags if f is not None)
    if not all(isinstance(t, Tensor) for t in values + flags):
        return "a value, reward, log-prob or flag argument is not a tensor"
    tensors = values + flags + tuple(c for c in coefficients if isinstance(c, Tensor))
    if any(_is_wrapped(t) for t in tensors):
        return "the inputs are functorch-transformed tensors (vmap/grad)"
    first = values[0]
    shape, dtype, device = first.shape, first.dtype, first.device
    if not dtype.is_floating_point:
        return f"the values are {dtype} tensors"
    if any(v.shape != shape or v.dtype != dtype or v.device != device for v in values[1:]):
        return "the value, reward and log-prob tensors differ in shape, dtype or device"
    if any(f.dtype != torch.bool or f.shape != shape or f.device != device for f in flags):
        return "`done`/`terminated` are not bool tensors of the values' shape and device"
    ndim = first.dim()
    if time_dim.__class__ is not int or not -ndim <= time_dim < ndim:
        return f"`time_dim`={time_dim!r} does not index the {ndim}-dim inputs"
    for c in coefficients:
        if not isinstance(c, Tensor):
            if not isinstance(c, numbers.Real):  # (numpy's scalars too: gamma=np.float32(.99))
                return f"a coefficient of type {type(c).__name__}"
        elif c.numel() == 1:
            if c.device != device and c.device.type != "cpu":
                return f"a coefficient tensor on {c.device} for inputs on {device}"
        elif (
            c.dim() != ndim
            or c.device != device
            or any(n != s and n != 1 for n, s in zip(c.shape, shape))
        ):
            return (
                f"a coefficient tensor of shape {tuple(c.shape)} for inputs of shape {tuple(shape)}"
            )
    if backend != "auto" and backend not in rtc.available_backends(device):
        return f"backend {backend!r} cannot run on {device}"
    return None


def _served(name: str, reason: str | None) -> bool:
    """True when ``reason`` is None; otherwise warn (once per function and reason)."""
    if reason is None:
        return True
    if (name, reason) not in _warned:
        _warned.add((name, reason))
        warnings.warn(
            f"rl_triton_torchrl: TorchRL's own `{name}` computes this call because {reason} "
            "(shown once per reason)",
            RLTritonFallbackWarning,
            stacklevel=4,
        )
    return False


def _coefficient(c, dtype: torch.dtype, device: torch.device):
    """gamma, lambda or a threshold as ``rl_triton_core`` takes it: a float or a float tensor.
    A trainable scalar stays a tensor so that its gradient flows; on the CPU with inputs on an
    accelerator it is copied there (differentiably; PyTorch ops accept such 0-dim CPU tensors,
    ``rl_triton_core`` wants one device)."""
    if not isinstance(c, Tensor):
        return float(c)
    if c.numel() == 1:
        if c.device.type == "cpu" and not c.requires_grad:
            return float(c)  # a CPU scalar: reading it synchronises no accelerator
        c = c.reshape(()).to(device)
    return c if c.is_floating_point() else c.to(dtype)


def _gae(name, gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim):
    backend = _state.routed_backend()
    if backend is not None and _served(
        name,
        fallback_reason(
            backend,
            time_dim,
            (state_value, next_state_value, reward),
            (done, terminated),
            (gamma, lmbda),
        ),
    ):
        dtype = state_value.dtype
        return rtc.gae(
            reward,
            state_value,
            done if terminated is None else terminated,
            truncated=done,
            next_values=next_state_value,
            gamma=_coefficient(gamma, dtype, next_state_value.device),
            lmbda=_coefficient(lmbda, dtype, next_state_value.device),
            time_dim=time_dim,
            backend=backend,
        )
    return _state.previous(name)(
        gamma, lmbda, state_value, next_state_value, reward, done, terminated, time_dim=time_dim
    )


def generalized_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *, time_dim=-2
):
    """TorchRL's ``generalized_advantage_estimate``, computed by ``rl_triton_core.gae``."""
    return _gae(
        "generalized_advantage_estimate",
        gamma,
        lmbda,
        state_value,
        next_state_value,
        reward,
        done,
        terminated,
        time_dim,
    )


def vec_generalized_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *, time_dim=-2
):
    """TorchRL's ``vec_generalized_advantage_estimate``, computed by ``rl_triton_core.gae``
    (exactly: TorchRL's version truncates its geometric filter below 1e-7)."""
    return _gae(
        "vec_generalized_advantage_estimate",
        gamma,
        lmbda,
        state_value,
        next_state_value,
        reward,
        done,
        terminated,
        time_dim,
    )


def _td_lambda(
    name, gamma, lmbda, next_state_value, reward, done, terminated, rolling_gamma, time_dim
):
    backend = _state.routed_backend()
    if backend is not None:
        if rolling_gamma is False:  # None and True mean the same in TorchRL
            reason = "`rolling_gamma=False` (a discount tied to the whole upcoming trajectory)"
        else:
            reason = fallback_reason(
                backend, time_dim, (next_state_value, reward), (done, terminated), (gamma, lmbda)
            )
        if _served(name, reason):
            dtype = next_state_value.dtype
            return rtc.lambda_returns(
                reward,
                None,
                done if terminated is None else terminated,
                truncated=done,
                next_values=next_state_value,
                gamma=_coefficient(gamma, dtype, next_state_value.device),
                lmbda=_coefficient(lmbda, dtype, next_state_value.device),
                time_dim=time_dim,
                backend=backend,
            )
    return _state.previous(name)(
        gamma, lmbda, next_state_value, reward, done, terminated, rolling_gamma, time_dim=time_dim
    )


def td_lambda_return_estimate(
    gamma,
    lmbda,
    next_state_value,
    reward,
    done,
    terminated=None,
    rolling_gamma=None,
    *,
    time_dim=-2,
):
    """TorchRL's ``td_lambda_return_estimate``, computed by ``rl_triton_core.lambda_returns``."""
    return _td_lambda(
        "td_lambda_return_estimate",
        gamma,
        lmbda,
        next_state_value,
        reward,
        done,
        terminated,
        rolling_gamma,
        time_dim,
    )


def vec_td_lambda_return_estimate(
    gamma,
    lmbda,
    next_state_value,
    reward,
    done,
    terminated=None,
    rolling_gamma=None,
    *,
    time_dim=-2,
):
    """TorchRL's ``vec_td_lambda_return_estimate``, computed by
    ``rl_triton_core.lambda_returns``."""
    return _td_lambda(
        "vec_td_lambda_return_estimate",
        gamma,
        lmbda,
        next_state_value,
        reward,
        done,
        terminated,
        rolling_gamma,
        time_dim,
    )


def vec_td1_return_estimate(
    gamma, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2
):
    """TorchRL's ``vec_td1_return_estimate`` (TD(λ = 1)), computed by
    ``rl_triton_core.discounted_returns``."""
    name = "vec_td1_return_estimate"
    backend = _state.routed_backend()
    if backend is not None:
        if rolling_gamma is False:
            reason = "`rolling_gamma=False` (a discount tied to the whole upcoming trajectory)"
        else:
            reason = fallback_reason(
                backend, time_dim, (next_state_value, reward), (done, terminated), (gamma,)
            )
        if _served(name, reason):
            return rtc.discounted_returns(
                reward,
                done if terminated is None else terminated,
                truncated=done,
                next_values=next_state_value,
                gamma=_coefficient(gamma, next_state_value.dtype, next_state_value.device),
                time_dim=time_dim,
                backend=backend,
            )
    return _state.previous(name)(
        gamma, next_state_value, reward, done, terminated, rolling_gamma, time_dim=time_dim
    )


def vtrace_advantage_estimate(
    gamma,
    log_pi,
    log_mu,
    state_value,
    next_state_value,
    reward,
    done,
    terminated=None,
    rho_thresh=1.0,
    c_thresh=1.0,
    time_dim=-2,
):
    """TorchRL's ``vtrace_advantage_estimate``, computed by ``rl_triton_core.vtrace``.

    TorchRL's V-trace has no λ (``lmbda=1``); ``log_pi`` is the target policy's log-prob,
    ``log_mu`` the behaviour policy's. Returns ``(advantages, vs)`` in TorchRL's order.
    """
    name = "vtrace_advantage_estimate"
    backend = _state.routed_backend()
    if backend is not None and _served(
        name,
        fallback_reason(
            backend,
            time_dim,
            (state_value, next_state_value, reward, log_pi, log_mu),
            (done, terminated),
            (gamma, rho_thresh, c_thresh),
        ),
    ):
        dtype = state_value.dtype
        vs, advantages = rtc.vtrace(
            reward,
            state_value,
            log_pi,
            log_mu,
            done if terminated is None else terminated,
            truncated=done,
            next_values=next_state_value,
            gamma=_coefficient(gamma, dtype, next_state_value.device),
            lmbda=1.0,
            rho_bar=_coefficient(rho_thresh, dtype, next_state_value.device),
            c_bar=_coefficient(c_thresh, dtype, next_state_value.device),
            time_dim=time_dim,
            backend=backend,
        )
        return advantages, vs
    return _state.previous(name)(
        gamma,
        log_pi,
        log_mu,
        state_value,
        next_state_value,
        reward,
        done,
        terminated,
        rho_thresh,
        c_thresh,
        time_dim=time_dim,
    )


# The names the hook replaces in torchrl.objectives.value.advantages, and their replacements.
REPLACEMENTS = {
    fn.__name__: fn
    for fn in (
        generalized_advantage_estimate,
        vec_generalized_advantage_estimate,
        td_lambda_return_estimate,
        vec_td_lambda_return_estimate,
        vec_td1_return_estimate,
        vtrace_advantage_estimate,
    )
}
NAMES = tuple(REPLACEMENTS)
