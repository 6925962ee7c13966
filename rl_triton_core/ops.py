"""The library as PyTorch custom operators (``torch.library``), namespace ``rl_triton``.

Registered when ``rl_triton_core`` is imported:

* ``torch.ops.rl_triton.linear_scan(a, b, initial, reverse, time_dim, backend) -> x``,
  differentiable in ``a``, ``b`` and ``initial``: its backward is the adjoint recurrence, the
  same scan run the other way with the coefficients shifted by one step, on the same backend
  (see :func:`_linear_scan_backward`). The autograd path of every estimator
  (:mod:`rl_triton_core.autograd`) builds its ``(a_t, b_t)`` with differentiable torch ops
  and calls this op.
* one fused, non-differentiable op per estimator (``gae``, ``lambda_returns``,
  ``discounted_returns``, ``vtrace``, ``retrace``, ``eligibility_traces``; episodic sums are
  ``eligibility_traces`` with ``gamma = lmbda = 1``): what :func:`torch.compile` records for
  a call that needs no gradient.

Every op takes the caller's tensors as they are (any layout, ``time_dim``), validates them in
its fake (meta) implementation, so that errors surface while tracing, and again when it runs.
A coefficient that may be a float or a tensor (``gamma`` ...) is two arguments, ``Tensor?
name_t`` and ``float name``. The ops return new tensors; ``out=`` is a copy after the op.

Under :func:`torch.compile` the ops are opaque to Inductor (it calls them as extern kernels),
which keeps one implementation for every device: the Triton launcher on CUDA, the torch path
on the CPU, and the reference loop. ``torch.compile(fullgraph=True)`` of a function calling
the estimators traces without graph breaks, and CUDA-graph capture (``mode="reduce-overhead"``
or ``torch.cuda.graph``) records the kernels.
"""

from __future__ import annotations

import torch
from torch import Tensor

# A circular import: estimators imports this module, which needs estimators only when an op
# runs (Python resolves the partially initialised submodule).
from . import estimators as _est
from ._dispatch import resolve
from ._validate import Steps, check_out, not_a_coefficient, real_to_float, require_next_state

NAMESPACE = "rl_triton"
_OPT_COEF = "Tensor? {0}_t, float {0}"


def _schema(args: str, outputs: str) -> str:
    return f"({args}) -> {outputs}"


def split(fn: str, name: str, c) -> tuple[Tensor | None, float]:
    """A coefficient as the ops' ``(Tensor? name_t, float name)`` pair; a bool, a string or None
    is a TypeError naming it, as in eager calls. A deny-list: Dynamo models numpy scalars as
    arrays, so it can neither test them against ``numbers.Real`` nor read their ``dtype`` under
    ``fullgraph=True``; a numpy bool is therefore read as 1.0 / 0.0 here (eager calls refuse it)."""
    if isinstance(c, Tensor):
        return c, 0.0
    if c is None or isinstance(c, (bool, str, bytes)):
        raise not_a_coefficient(fn, name, c)
    return None, real_to_float(fn, name, c)


def _join(t: Tensor | None, f: float):
    return f if t is None else t


def _fake(fn: str, time_dim: int, values: dict, names, backend: str, **checks) -> tuple:
    """Fake (meta) implementation shared by the fused ops: validate what can be validated
    from metadata and allocate the outputs exactly as the real implementation does."""
    steps = Steps(fn, time_dim, values)
    for name, kind in checks.items():
        x = kind[1]
        if kind[0] == "flag":
            steps.flag(name, x)
        elif kind[0] == "boundary":
            steps.boundary(name, x)
        elif isinstance(x, Tensor) and x.dim():  # a coefficient (0-dim: checked when run)
            steps.coefficient(name, x)
    resolve(fn, backend, steps.device)
    outs = steps.outputs(None, names)[0]
    return outs if len(outs) > 1 else outs[0]


# -- linear_scan: the differentiable primitive --------------------------------------------------


@torch.library.custom_op(
    f"{NAMESPACE}::linear_scan",
    mutates_args=(),
    schema=_schema(
        "Tensor a, Tensor b, Tensor? initial, bool reverse, int time_dim, str backend", "Tensor"
    ),
)
def linear_scan_op(
    a: Tensor, b: Tensor, initial: Tensor | None, reverse: bool, time_dim: int, backend: str
) -> Tensor:
    with torch.no_grad():  # (the public function then takes its direct path)
        return _est.linear_scan(
            a, b, initial=initial, reverse=reverse, time_dim=time_dim, backend=backend
        )


@linear_scan_op.register_fake
def _linear_scan_fake(a, b, initial, reverse, time_dim, backend):
    return _fake(
        "linear_scan", time_dim, {"a": a, "b": b}, ("x",), backend, initial=("boundary", initial)
    )


def _shift(x: Tensor, dim: int, fill: Tensor, later: bool) -> Tensor:
    """``x`` moved one step along ``dim``: ``later`` gives ``x[t + 1]`` (``fill`` at the end),
    otherwise ``x[t - 1]`` (``fill`` at the start). ``fill``: one step, size 1 along ``dim``."""
    n = x.shape[dim]
    if later:
        return torch.cat((x.narrow(dim, 1, n - 1), fill), dim)
    return torch.cat((fill, x.narrow(dim, 0, n - 1)), dim)


def _reduce(g: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """A gradient of the broadcast shape summed back to an input's shape, in its dtype."""
    if g.shape != shape:
        g = g.sum_to_size(shape)
    return g if g.dtype == dtype else g.to(dtype)


def _linear_scan_setup(ctx, inputs, output) -> None:
    a, b, initial, reverse, time_dim, backend = inputs
    ctx.reverse, ctx.backend = reverse, backend
    ctx.time_dim = time_dim % output.dim()
    ctx.b_shape, ctx.b_dtype = b.shape, b.dtype
    ctx.save_for_backward(a, output, initial)


def _linear_scan_backward(ctx, grad: Tensor):
    """The adjoint of ``x_t = a_t x_{t-1} + b_t`` (forward; mirrored for reverse).

    With ``g_t = dL/dx_t`` (total): ``g_t = grad_t + a_{t+1} g_{t+1}`` (``a_T = 0``), i.e. a
    scan in the other direction with the coefficients shifted by one step. Then
    ``dL/db_t = g_t``, ``dL/da_t = g_t x_{t-1}`` (``x_{-1} = initial``) and
    ``dL/dinitial = a_0 g_0`` (exactly 0 where ``a_0 == 0``: a cut). One scan, one shifted
    copy of ``a`` and of ``x``; nothing of size T x T. The backward is made of differentiable
    ops (this op included), so double backward works too.
    """
    a, x, initial = ctx.saved_tensors
    td, reverse = ctx.time_dim, ctx.reverse
    need_a, need_b, need_init = ctx.needs_input_grad[:3]
    T = x.shape[td]
    if T == 0:
        return (
            torch.zeros_like(a) if need_a else None,
            torch.zeros(ctx.b_shape, dtype=ctx.b_dtype, device=x.device) if need_b else None,
            torch.zeros_like(initial) if need_init and initial is not None else None,
            None,
            None,
            None,
        )
    a_full = a if a.shape == x.shape else a.expand(x.shape)
    zero_step = torch.zeros_like(a_full.narrow(td, 0, 1))
    # the adjoint of a forward scan runs in reverse with a_{t+1}; of a reverse scan, forward
    # with a_{t-1}
    a_adj = _shift(a_full, td, zero_step, later=not reverse)
    g = linear_scan_op(a_adj, grad, None, not reverse, td, ctx.backend)
    ga = gb = gi = None
    if need_b:
        gb = _reduce(g, ctx.b_shape, ctx.b_dtype)
    if need_a or need_init:
        first = T - 1 if reverse else 0  # the step that reads `initial`
        if need_a:
            if initial is None:
                init_step = torch.zeros_like(x.narrow(td, 0, 1))
            else:
                init = initial if initial.dim() == x.dim() else initial.unsqueeze(td)
                init_step = init.to(x.dtype).expand(x.narrow(td, 0, 1).shape)
            ga = _reduce(g * _shift(x, td, init_step, later=reverse), a.shape, a.dtype)
        if need_init:
            a0, g0 = a_full.select(td, first), g.select(td, first)
            # a0 g0, exactly 0 where a0 == 0 even for a non-finite g0, and differentiable in
            # a0 there too (a torch.where of the product blocked d/da0: double backward)
            gi = a0 * torch.where(a0 == 0, g0.nan_to_num(0.0, 0.0, 0.0), g0)
            if initial.dim() == x.dim():
                gi = gi.unsqueeze(td)
            gi = _reduce(gi, initial.shape, initial.dtype)
    return ga, gb, gi, None, None, None


linear_scan_op.register_autograd(_linear_scan_backward, setup_context=_linear_scan_setup)


def linear_scan(a, b, initial, reverse, time_dim, backend, out):
    """The public ``linear_scan`` through the op (autograd or compiled path)."""
    result = linear_scan_op(a, b, initial, bool(reverse), time_dim, backend)
    inputs = (("a", a), ("b", b), ("initial", initial))  # (the gradient path checks out= here)
    return _into("linear_scan", ("x",), out, result, [(n, x) for n, x in inputs if x is not None])


def _into(fn: str, names: tuple, out, result, inputs=()):
    """``out=`` after an op: the results copied in (the op itself is functional). ``inputs``:
    ``(name, tensor)`` pairs that ``out`` must share no memory with (outside tracing)."""
    if out is None:
        return result
    results = (result,) if isinstance(result, Tensor) else tuple(result)
    first = results[0]
    outs = check_out(fn, out, names, first.shape, first.dtype, first.device, inputs)
    for o, r in zip(outs, results, strict=True):
        o.copy_(r)
    return outs if len(outs) > 1 else outs[0]


# -- the fused estimators (no autograd) ---------------------------------------------------------

_BOOT = "Tensor? terminated, Tensor? truncated, Tensor? next_values, Tensor? bootstrap_value"
_GL = f"{_OPT_COEF.format('gamma')}, {_OPT_COEF.format('lmbda')}"
_TAIL = "int time_dim, str backend"


@torch.library.custom_op(
    f"{NAMESPACE}::gae",
    mutates_args=(),
    schema=_schema(f"Tensor rewards, Tensor values, {_BOOT}, {_GL}, {_TAIL}", "(Tensor, Tensor)"),
)
def gae_op(
    rewards, values, terminated, truncated, next_values, bootstrap_value,
    gamma_t, gamma, lmbda_t, lmbda, time_dim, backend,
):  # fmt: skip
    with torch.no_grad():
        return _est.gae(
            rewards, values, terminated, truncated=truncated, next_values=next_values,
            bootstrap_value=bootstrap_value, gamma=_join(gamma_t, gamma),
            lmbda=_join(lmbda_t, lmbda), time_dim=time_dim, backend=backend,
        )  # fmt: skip


@gae_op.register_fake
def _gae_fake(
    rewards, values, terminated, truncated, next_values, bootstrap_value,
    gamma_t, gamma, lmbda_t, lmbda, time_dim, backend,
):  # fmt: skip
    require_next_state("gae", next_values, bootstrap_value, truncated)
    return _fake(
        "gae",
        time_dim,
        {"rewards": rewards, "values": values, "next_values": next_values},
        ("advantages", "returns"),
        backend,
        terminated=("flag", terminated),
        truncated=("flag", truncated),
        bootstrap_value=("boundary", bootstrap_value),
        gamma=("coef", gamma_t),
        lmbda=("coef", lmbda_t),
    )


@torch.library.custom_op(
    f"{NAMESPACE}::lambda_returns",
    mutates_args=(),
    schema=_schema(f"Tensor rewards, Tensor? values, {_BOOT}, {_GL}, {_TAIL}", "Tensor"),
)
def lambda_returns_op(
    rewards, values, terminated, truncated, next_values, bootstrap_value,
    gamma_t, gamma, lmbda_t, lmbda, time_dim, backend,
):  # fmt: skip
    with torch.no_grad():
        return _est.lambda_returns(
            rewards, values, terminated, truncated=truncated, next_values=next_values,
            bootstrap_value=bootstrap_value, gamma=_join(gamma_t, gamma),
            lmbda=_join(lmbda_t, lmbda), time_dim=time_dim, backend=backend,
        )  # fmt: skip


@lambda_returns_op.register_fake
def _lambda_returns_fake(
    rewards, values, terminated, truncated, next_values, bootstrap_value,
    gamma_t, gamma, lmbda_t, lmbda, time_dim, backend,
):  # fmt: skip
    if values is None and next_values is None:
        raise ValueError("lambda_returns: pass `values` or `next_values`")
    require_next_state("lambda_returns", next_values, bootstrap_value, truncated)
    return _fake(
        "lambda_returns",
        time_dim,
        {"rewards": rewards, "values": values, "next_values": next_values},
        ("returns",),
        backend,
        terminated=("flag", terminated),
        truncated=("flag", truncated),
        bootstrap_value=("boundary", bootstrap_value),
        gamma=("coef", gamma_t),
        lmbda=("coef", lmbda_t),
    )


@torch.library.custom_op(
    f"{NAMESPACE}::discounted_returns",
    mutates_args=(),
    schema=_schema(f"Tensor rewards, {_BOOT}, {_OPT_COEF.format('gamma')}, {_TAIL}", "Tensor"),
)
def discounted_returns_op(
    rewards, terminated, truncated, next_values, bootstrap_value, gamma_t, gamma, time_dim,
    backend,
):  # fmt: skip
    with torch.no_grad():
        return _est.discounted_returns(
            rewards, terminated, truncated=truncated, next_values=next_values,
            bootstrap_value=bootstrap_value, gamma=_join(gamma_t, gamma), time_dim=time_dim,
            backend=backend,
        )  # fmt: skip


@discounted_returns_op.register_fake
def _discounted_returns_fake(
    rewards, terminated, truncated, next_values, bootstrap_value, gamma_t, gamma, time_dim,
    backend,
):  # fmt: skip
    require_next_state("discounted_returns", next_values, None, truncated, needed=False)
    return _fake(
        "discounted_returns",
        time_dim,
        {"rewards": rewards, "next_values": next_values},
        ("returns",),
        backend,
        terminated=("flag", terminated),
        truncated=("flag", truncated),
        bootstrap_value=("boundary", bootstrap_value),
        gamma=("coef", gamma_t),
    )


_VT_COEFS = ", ".join(_OPT_COEF.format(n) for n in ("gamma", "lmbda", "rho_bar", "c_bar", "pg"))


@torch.library.custom_op(
    f"{NAMESPACE}::vtrace",
    mutates_args=(),
    schema=_schema(
        "Tensor rewards, Tensor values, Tensor target_log_probs, Tensor behavior_log_probs, "
        f"{_BOOT}, {_VT_COEFS}, {_TAIL}",
        "(Tensor, Tensor)",
    ),
)
def vtrace_op(
    rewards, values, target_log_probs, behavior_log_probs, terminated, truncated, next_values,
    bootstrap_value, gamma_t, gamma, lmbda_t, lmbda, rho_bar_t, rho_bar, c_bar_t, c_bar, pg_t,
    pg, time_dim, backend,
):  # fmt: skip
    with torch.no_grad():
        return _est.vtrace(
            rewards, values, target_log_probs, behavior_log_probs, terminated,
            truncated=truncated, next_values=next_values, bootstrap_value=bootstrap_value,
            gamma=_join(gamma_t, gamma), lmbda=_join(lmbda_t, lmbda),
            rho_bar=_join(rho_bar_t, rho_bar), c_bar=_join(c_bar_t, c_bar),
            pg_rho_bar=_join(pg_t, pg), time_dim=time_dim, backend=backend,
        )  # fmt: skip


@vtrace_op.register_fake
def _vtrace_fake(
    rewards, values, target_log_probs, behavior_log_probs, terminated, truncated, next_values,
    bootstrap_value, gamma_t, gamma, lmbda_t, lmbda, rho_bar_t, rho_bar, c_bar_t, c_bar, pg_t,
    pg, time_dim, backend,
):  # fmt: skip
    require_next_state("vtrace", next_values, bootstrap_value, truncated)
    values_ = {
        "rewards": rewards,
        "values": values,
        "target_log_probs": target_log_probs,
        "behavior_log_probs": behavior_log_probs,
        "next_values": next_values,
    }
    return _fake(
        "vtrace",
        time_dim,
        values_,
        ("vs", "pg_advantages"),
        backend,
        terminated=("flag", terminated),
        truncated=("flag", truncated),
        bootstrap_value=("boundary", bootstrap_value),
        gamma=("coef", gamma_t),
        lmbda=("coef", lmbda_t),
        rho_bar=("coef", rho_bar_t),
        c_bar=("coef", c_bar_t),
        pg_rho_bar=("coef", pg_t),
    )


@torch.library.custom_op(
    f"{NAMESPACE}::retrace",
    mutates_args=(),
    schema=_schema(
        "Tensor rewards, Tensor q_values, Tensor next_expected_q, Tensor target_log_probs, "
        "Tensor behavior_log_probs, Tensor? terminated, Tensor? truncated, "
        f"{_GL}, {_OPT_COEF.format('c_bar')}, str trace, {_TAIL}",
        "Tensor",
    ),
)
def retrace_op(
    rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, terminated,
    truncated, gamma_t, gamma, lmbda_t, lmbda, c_bar_t, c_bar, trace, time_dim, backend,
):  # fmt: skip
    with torch.no_grad():
        return _est.retrace(
            rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs,
            terminated, truncated=truncated, gamma=_join(gamma_t, gamma),
            lmbda=_join(lmbda_t, lmbda), c_bar=_join(c_bar_t, c_bar), trace=trace,
            time_dim=time_dim, backend=backend,
        )  # fmt: skip


@retrace_op.register_fake
def _retrace_fake(
    rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, terminated,
    truncated, gamma_t, gamma, lmbda_t, lmbda, c_bar_t, c_bar, trace, time_dim, backend,
):  # fmt: skip
    if trace not in _est.TRACES:
        raise ValueError(f"retrace: unknown `trace`={trace!r}; expected one of {_est.TRACES}")
    values_ = {
        "rewards": rewards,
        "q_values": q_values,
        "next_expected_q": next_expected_q,
        "target_log_probs": target_log_probs,
        "behavior_log_probs": behavior_log_probs,
    }
    return _fake(
        "retrace",
        time_dim,
        values_,
        ("q_targets",),
        backend,
        terminated=("flag", terminated),
        truncated=("flag", truncated),
        gamma=("coef", gamma_t),
        lmbda=("coef", lmbda_t),
        c_bar=("coef", c_bar_t),
    )


@torch.library.custom_op(
    f"{NAMESPACE}::eligibility_traces",
    mutates_args=(),
    schema=_schema(f"Tensor x, Tensor? done, {_GL}, Tensor? initial, {_TAIL}", "Tensor"),
)
def eligibility_traces_op(x, done, gamma_t, gamma, lmbda_t, lmbda, initial, time_dim, backend):
    with torch.no_grad():
        return _est.eligibility_traces(
            x, done, gamma=_join(gamma_t, gamma), lmbda=_join(lmbda_t, lmbda), initial=initial,
            time_dim=time_dim, backend=backend,
        )  # fmt: skip


@eligibility_traces_op.register_fake
def _eligibility_traces_fake(x, done, gamma_t, gamma, lmbda_t, lmbda, initial, time_dim, backend):
    return _fake(
        "eligibility_traces",
        time_dim,
        {"x": x},
        ("traces",),
        backend,
        done=("flag", done),
        initial=("boundary", initial),
        gamma=("coef", gamma_t),
        lmbda=("coef", lmbda_t),
    )


# -- the compiled path of the public functions (no gradient needed) -----------------------------


def gae(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
    time_dim, backend, out,
):  # fmt: skip
    result = gae_op(
        rewards, values, terminated, truncated, next_values, bootstrap_value,
        *split("gae", "gamma", gamma), *split("gae", "lmbda", lmbda), time_dim, backend,
    )  # fmt: skip
    return _into("gae", ("advantages", "returns"), out, result)


def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda,
    time_dim, backend, out,
):  # fmt: skip
    result = lambda_returns_op(
        rewards, values, terminated, truncated, next_values, bootstrap_value,
        *split("lambda_returns", "gamma", gamma), *split("lambda_returns", "lmbda", lmbda),
        time_dim, backend,
    )  # fmt: skip
    return _into("lambda_returns", ("returns",), out, result)


def discounted_returns(
    rewards, terminated, truncated, next_values, bootstrap_value, gamma, time_dim, backend, out
):
    result = discounted_returns_op(
        rewards, terminated, truncated, next_values, bootstrap_value,
        *split("discounted_returns", "gamma", gamma), time_dim, backend,
    )  # fmt: skip
    return _into("discounted_returns", ("returns",), out, result)


def vtrace(
    rewards, values, target_log_probs, behavior_log_probs, terminated, truncated, next_values,
    bootstrap_value, gamma, lmbda, rho_bar, c_bar, pg_rho_bar, time_dim, backend, out,
):  # fmt: skip
    result = vtrace_op(
        rewards, values, target_log_probs, behavior_log_probs, terminated, truncated,
        next_values, bootstrap_value, *split("vtrace", "gamma", gamma),
        *split("vtrace", "lmbda", lmbda), *split("vtrace", "rho_bar", rho_bar),
        *split("vtrace", "c_bar", c_bar),
        *split("vtrace", "pg_rho_bar", rho_bar if pg_rho_bar is None else pg_rho_bar),
        time_dim, backend,
    )  # fmt: skip
    return _into("vtrace", ("vs", "pg_advantages"), out, result)


def retrace(
    rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, terminated,
    truncated, gamma, lmbda, c_bar, trace, time_dim, backend, out,
):  # fmt: skip
    result = retrace_op(
        rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs, terminated,
        truncated, *split("retrace", "gamma", gamma), *split("retrace", "lmbda", lmbda),
        *split("retrace", "c_bar", c_bar), trace, time_dim, backend,
    )  # fmt: skip
    return _into("retrace", ("q_targets",), out, result)


def eligibility_traces(
    x, done, gamma, lmbda, initial, time_dim, backend, out, fn="eligibility_traces"
):
    result = eligibility_traces_op(
        x, done, *split(fn, "gamma", gamma), *split(fn, "lmbda", lmbda), initial, time_dim, backend
    )
    names = ("sums",) if fn == "episodic_cumsum" else ("traces",)
    return _into(fn, names, out, result)
