"""Helpers shared by the test modules (not a test module itself).

* Tables describing the public API of every function (which arguments are per-step values,
  flags, broadcastable parameters, time-less tensors).
* ``Layout``: how a canonical time-major tensor ``[T, *B]`` is laid out for the call under test
  (batch-major, TorchRL ``[*B, T, 1]``, trailing feature axes, sliced and transposed views).
* ``build_case``: random inputs for one function, drawn with Hypothesis.
* ``oracle``: an independent, deliberately naive pure-Python implementation of the formulas of
  ``/work/shared/spec/estimators.md`` (one Python float at a time, no torch arithmetic). It
  validates the library's own ``backend="reference"``, and encodes the NaN-locality rule: a term
  multiplied by an exact zero coefficient (a cut, a terminated gate, ``a_t == 0``) is dropped,
  so a NaN there does not reach the output.
* ``forget_launches`` / ``described_launch``: the Triton launcher's descriptions of calls.
* ``random_step_inputs`` / ``run_every_estimator`` / ``close_all_to_float64``: every estimator
  on one set of random inputs against the torch backend in float64 (tests/test_gpu_triton.py,
  at shapes too large for the pure-Python oracle; tests/test_tile_geometries.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

import rl_triton_core as rtc

F64 = torch.float64

FUNCTIONS = (
    "linear_scan",
    "gae",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_cumsum",
)
TRACES = ("retrace", "tree_backup", "q_lambda", "importance_sampling")
VALUE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
FLAG_DTYPES = (torch.bool, torch.uint8, torch.int64, torch.float32)

POSITIONAL = {
    "linear_scan": ("a", "b"),
    "gae": ("rewards", "values", "terminated"),
    "lambda_returns": ("rewards", "values", "terminated"),
    "discounted_returns": ("rewards", "terminated"),
    "vtrace": ("rewards", "values", "target_log_probs", "behavior_log_probs", "terminated"),
    "retrace": (
        "rewards",
        "q_values",
        "next_expected_q",
        "target_log_probs",
        "behavior_log_probs",
        "terminated",
    ),
    "eligibility_traces": ("x", "done"),
    "episodic_cumsum": ("x", "done"),
}
STEP_ARGS = {
    "linear_scan": ("a", "b"),
    "gae": ("rewards", "values", "next_values"),
    "lambda_returns": ("rewards", "values", "next_values"),
    "discounted_returns": ("rewards", "next_values"),
    "vtrace": ("rewards", "values", "target_log_probs", "behavior_log_probs", "next_values"),
    "retrace": (
        "rewards",
        "q_values",
        "next_expected_q",
        "target_log_probs",
        "behavior_log_probs",
    ),
    "eligibility_traces": ("x",),
    "episodic_cumsum": ("x",),
}
FLAG_ARGS = {
    "linear_scan": (),
    "gae": ("terminated", "truncated"),
    "lambda_returns": ("terminated", "truncated"),
    "discounted_returns": ("terminated", "truncated"),
    "vtrace": ("terminated", "truncated"),
    "retrace": ("terminated", "truncated"),
    "eligibility_traces": ("done",),
    "episodic_cumsum": ("done",),
}
PARAM_ARGS = {
    "linear_scan": (),
    "gae": ("gamma", "lmbda"),
    "lambda_returns": ("gamma", "lmbda"),
    "discounted_returns": ("gamma",),
    "vtrace": ("gamma", "lmbda", "rho_bar", "c_bar", "pg_rho_bar"),
    "retrace": ("gamma", "lmbda", "c_bar"),
    "eligibility_traces": ("gamma", "lmbda"),
    "episodic_cumsum": (),
}
NOTIME_ARGS = {
    "linear_scan": ("initial",),
    "gae": ("bootstrap_value",),
    "lambda_returns": ("bootstrap_value",),
    "discounted_returns": ("bootstrap_value",),
    "vtrace": ("bootstrap_value",),
    "retrace": (),
    "eligibility_traces": ("initial",),
    "episodic_cumsum": ("initial",),
}
N_OUTPUTS = {fn: 2 if fn in ("gae", "vtrace") else 1 for fn in FUNCTIONS}


def kind_of(fn: str, name: str) -> str:
    if name in STEP_ARGS[fn]:
        return "step"
    if name in FLAG_ARGS[fn]:
        return "flag"
    if name in PARAM_ARGS[fn]:
        return "param"
    if name in NOTIME_ARGS[fn]:
        return "notime"
    return "static"


def call(fn: str, inputs: dict, **kwargs):
    """Call ``rtc.<fn>`` with the positional arguments of the spec passed positionally."""
    pos = [inputs.get(name) for name in POSITIONAL[fn]]
    rest = {k: v for k, v in inputs.items() if k not in POSITIONAL[fn]}
    return getattr(rtc, fn)(*pos, **rest, **kwargs)


def as_tuple(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


# ----------------------------------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """``perm``: layout dim i holds canonical dim ``perm[i]`` (canonical dim 0 is time)."""

    name: str
    perm: tuple
    time_dims: tuple
    mode: str  # "contiguous" | "view" | "transposed" | "slice"
    batch_ranges: tuple  # (lo, hi) for each canonical batch dim

    def __str__(self) -> str:
        return self.name

    @property
    def inverse(self) -> tuple:
        inv = [0] * len(self.perm)
        for i, p in enumerate(self.perm):
            inv[p] = i
        return tuple(inv)

    @property
    def perm_notime(self) -> tuple:
        return tuple(p - 1 for p in self.perm if p != 0)

    def draw_batch(self, draw) -> tuple:
        return tuple(draw(st.integers(lo, hi)) for lo, hi in self.batch_ranges)

    def shape(self, canonical_shape) -> tuple:
        return tuple(canonical_shape[p] for p in self.perm)

    def put(self, t: torch.Tensor, fill) -> torch.Tensor:
        """Lay out a canonical per-step tensor (any same-rank broadcast shape)."""
        return _materialize(t.contiguous(), self.perm, self.mode, fill)

    def put_notime(self, t: torch.Tensor, fill, keepdim: bool = False) -> torch.Tensor:
        if keepdim:
            return _materialize(t.unsqueeze(0).contiguous(), self.perm, self.mode, fill)
        return _materialize(t.contiguous(), self.perm_notime, self.mode, fill)

    def take(self, t: torch.Tensor) -> torch.Tensor:
        """Back from the layout to the canonical time-major order."""
        return t.permute(self.inverse)


def _materialize(t: torch.Tensor, perm, mode: str, fill) -> torch.Tensor:
    t = t.permute(perm)
    if mode == "view" or t.dim() == 0:
        return t if mode == "view" else t.contiguous()
    if mode == "contiguous":
        return t.contiguous()
    if mode == "transposed":
        rev = tuple(reversed(range(t.dim())))
        return t.permute(rev).contiguous().permute(rev)
    if mode == "slice":
        shape = list(t.shape)
        shape[-1] *= 2
        big = torch.full(shape, fill, dtype=t.dtype, device=t.device)
        big[..., ::2] = t
        return big[..., ::2]
    raise ValueError(mode)


LAYOUTS = (
    # a single environment: [T], time_dim 0 or -1
    Layout("vector", (0,), (0, -1), "contiguous", ()),
    # SB3 / CleanRL: [T, N]
    Layout("time_major", (0, 1), (0,), "contiguous", ((1, 6),)),
    # [N, T], time_dim 1 or -1
    Layout("batch_major", (1, 0), (1, -1), "contiguous", ((1, 6),)),
    # [N, T] view of a time-major buffer (strides (1, N))
    Layout("batch_major_view", (1, 0), (1, -1), "view", ((1, 6),)),
    # [T, N] view of a batch-major buffer (strides (1, T))
    Layout("transposed", (0, 1), (0, -2), "transposed", ((1, 6),)),
    # [T, N] = buffer[:, ::2] (NaN in the skipped columns)
    Layout("sliced", (0, 1), (0,), "slice", ((1, 6),)),
    # trailing feature axes [T, N, F]
    Layout("features", (0, 1, 2), (0,), "contiguous", ((1, 4), (1, 3))),
    # TorchRL [B1, B2, T, 1], time_dim -2
    Layout("torchrl", (1, 2, 0, 3), (-2, 2), "contiguous", ((1, 3), (1, 3), (1, 1))),
    # TorchRL with features [B, T, F], sliced along F
    Layout("torchrl_features_sliced", (1, 0, 2), (-2, 1), "slice", ((1, 4), (1, 3))),
)
LAYOUT_BY_NAME = {lay.name: lay for lay in LAYOUTS}


# ----------------------------------------------------------------------------------------------
# Random cases
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    fn: str
    T: int
    batch: tuple
    inputs: dict  # canonical (time-major) float64 tensors already quantised to the test dtype

    @property
    def full(self) -> tuple:
        return (self.T, *self.batch)


def flag_cast(b: torch.Tensor, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """bool -> flag dtype; integer flags get assorted non-zero values (non-zero is true)."""
    if dtype == torch.bool:
        return b.clone()
    if dtype.is_floating_point:
        return b.to(dtype)
    if dtype == torch.uint8:
        vals = torch.randint(1, 256, b.shape, generator=gen).to(torch.uint8)
    else:
        choices = torch.tensor([1, -1, 5, -7, 2**40], dtype=dtype)
        vals = choices[torch.randint(0, len(choices), b.shape, generator=gen)]
    return torch.where(b, vals, torch.zeros((), dtype=dtype))


def _flag_fill(dtype):
    return True if dtype == torch.bool else 1


def realize(
    case: Case,
    layout: Layout,
    dtype: torch.dtype,
    flag_dtype: torch.dtype,
    device,
    gen: torch.Generator,
    keepdim: bool = False,
) -> dict:
    """The inputs of ``case`` in ``layout``, value dtype ``dtype``, on ``device``."""
    out = {}
    for name, v in case.inputs.items():
        if not isinstance(v, torch.Tensor):
            out[name] = v
            continue
        kind = kind_of(case.fn, name)
        if kind == "flag":
            t = flag_cast(v, flag_dtype, gen).to(device)
            out[name] = layout.put(t, _flag_fill(flag_dtype))
        elif kind == "notime":
            out[name] = layout.put_notime(v.to(device=device, dtype=dtype), math.nan, keepdim)
        else:
            out[name] = layout.put(v.to(device=device, dtype=dtype), math.nan)
    return out


def canonical_inputs(case: Case) -> dict:
    """Float64 (bool for flags), fully expanded, contiguous, time-major inputs on the CPU."""
    out = {}
    for name, v in case.inputs.items():
        if not isinstance(v, torch.Tensor):
            out[name] = v
            continue
        kind = kind_of(case.fn, name)
        if kind == "flag":
            out[name] = (v != 0).expand(case.full).contiguous()
        elif kind == "notime":
            out[name] = v.to(F64).contiguous()
        else:
            out[name] = v.to(F64).expand(case.full).contiguous()
    return out


def reference_outputs(case: Case) -> tuple:
    """``backend="reference"`` on float64 time-major copies of the inputs."""
    res = call(case.fn, canonical_inputs(case), time_dim=0, backend="reference")
    return tuple(r.to(F64) for r in as_tuple(res))


def gen_from(draw) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(draw(st.integers(0, 2**32 - 1)))
    return g


def build_case(
    fn: str,
    draw,
    T: int,
    batch: tuple,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    nonzero_params: bool = False,
    with_flags: bool = False,
) -> Case:
    """Random inputs for ``fn``; values quantised to ``dtype`` and kept as float64.

    ``nonzero_params``: gamma and lambda strictly positive (for the NaN tests, where a zero
    discount would be a cut of its own). ``with_flags``: ``terminated`` (``done``) always
    given, with at least one flag set where there is a step (for the tests of flag dtypes).
    """
    full = (T, *batch)

    def quant(t):
        return t.to(dtype).to(F64)

    def uniform(lo, hi, shape=full):
        return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=F64)

    def U(lo, hi, shape=full):
        return quant(uniform(lo, hi, shape))

    def bshape():
        mask = draw(st.lists(st.booleans(), min_size=len(full), max_size=len(full)))
        return tuple(1 if m else s for m, s in zip(mask, full))

    def flag(some_set=False):
        p = draw(st.sampled_from([0.1, 0.3, 1.0] if some_set else [0.0, 0.1, 0.3, 1.0]))
        flags = torch.rand(bshape(), generator=gen) < p
        if some_set and flags.numel() and not flags.any():
            flags.view(-1)[int(torch.randint(flags.numel(), (), generator=gen))] = True
        return flags

    def maybe_flag():
        return flag(some_set=True) if with_flags else flag() if draw(st.booleans()) else None

    def param(floats, lo, hi, allow_omit=True):
        kinds = ["float", "tensor"] + (["omit"] if allow_omit else [])
        kind = draw(st.sampled_from(kinds))
        if kind == "omit":
            return "omit"
        if kind == "float":
            return draw(st.sampled_from(floats))
        return U(lo, hi, bshape())

    gammas = [0.5, 0.9, 0.99, 1.0] if nonzero_params else [0.0, 0.5, 0.9, 0.99, 1.0]
    lmbdas = [0.5, 0.95, 1.0] if nonzero_params else [0.0, 0.5, 0.95, 1.0]
    if nonzero_params and fn == "lambda_returns":
        # lambda = 1 zeroes the weight (1 - lambda c) of nv_t: covered by its own test
        lmbdas = [0.5, 0.95]
    g_lo, l_lo = 0.5, (0.3 if nonzero_params else 0.0)
    clips = [0.5, 1.0, 1.2]

    inp: dict = {}
    if fn == "linear_scan":
        a = uniform(-1, 1)
        pz = draw(st.sampled_from([0.0, 0.1, 0.3]))
        a[torch.rand(full, generator=gen) < pz] = 0.0
        inp["a"] = quant(a)
        inp["b"] = U(-1, 1)
        if draw(st.booleans()):
            inp["initial"] = U(-1, 1, batch)
        inp["reverse"] = draw(st.booleans())
    elif fn in ("gae", "lambda_returns", "discounted_returns", "vtrace"):
        inp["rewards"] = U(-1, 1)
        if fn != "discounted_returns":
            inp["values"] = U(-1, 1)
        if fn == "vtrace":
            tlp = uniform(-2, 0)
            inp["target_log_probs"] = quant(tlp)
            inp["behavior_log_probs"] = quant(tlp - uniform(-1, 0.25))
        inp["terminated"] = maybe_flag()
        modes = ["bootstrap", "next_values"] + (["none"] if fn == "discounted_returns" else [])
        mode = draw(st.sampled_from(modes))
        if mode == "next_values":
            inp["next_values"] = U(-1, 1)
            if draw(st.booleans()):
                inp["truncated"] = flag()
            if fn == "lambda_returns" and draw(st.booleans()):
                inp["values"] = None
        elif mode == "bootstrap":
            inp["bootstrap_value"] = U(-1, 1, batch)
        inp["gamma"] = param(gammas, g_lo, 1.0)
        if fn in ("gae", "lambda_returns", "vtrace"):
            inp["lmbda"] = param(lmbdas, l_lo, 1.0)
        if fn == "vtrace":
            inp["rho_bar"] = param(clips, 0.5, 1.2)
            inp["c_bar"] = param(clips, 0.5, 1.2)
            inp["pg_rho_bar"] = param(clips, 0.5, 1.2)
    elif fn == "retrace":
        trace = draw(st.sampled_from([*TRACES, "omit"]))
        inp["rewards"] = U(-1, 1)
        inp["q_values"] = U(-1, 1)
        inp["next_expected_q"] = U(-1, 1)
        tlp = uniform(-2, 0)
        hi = 0.05 if trace == "importance_sampling" else 0.25
        inp["target_log_probs"] = quant(tlp)
        inp["behavior_log_probs"] = quant(tlp - uniform(-1, hi))
        inp["terminated"] = maybe_flag()
        if draw(st.booleans()):
            inp["truncated"] = flag()
        inp["gamma"] = param(gammas, g_lo, 1.0)
        inp["lmbda"] = param(lmbdas, l_lo, 1.0)
        inp["c_bar"] = param(clips, 0.5, 1.2)
        inp["trace"] = trace
    elif fn in ("eligibility_traces", "episodic_cumsum"):
        inp["x"] = U(-1, 1)
        inp["done"] = maybe_flag()
        if fn == "eligibility_traces":
            inp["gamma"] = param(gammas, g_lo, 1.0)
            inp["lmbda"] = param(lmbdas, l_lo, 1.0)
        if draw(st.booleans()):
            inp["initial"] = U(-1, 1, batch)
    else:
        raise ValueError(fn)
    inp = {k: v for k, v in inp.items() if not (isinstance(v, str) and v == "omit")}
    return Case(fn, T, tuple(batch), inp)


# ----------------------------------------------------------------------------------------------
# The independent oracle (pure Python floats, straight from the spec's formulas)
# ----------------------------------------------------------------------------------------------


def _nanmin(a: float, b: float) -> float:
    return math.nan if (math.isnan(a) or math.isnan(b)) else min(a, b)


def _cuts(T: int, done: list) -> list:
    """c_t = 1 - done_t for t < T-1, c_{T-1} = 0."""
    return [0 if (t == T - 1 or done[t]) else 1 for t in range(T)]


def seq_linear_scan(a, b, initial, reverse):
    T = len(a)
    x = [0.0] * T
    prev = 0.0 if initial is None else initial
    order = reversed(range(T)) if reverse else range(T)
    for t in order:
        x[t] = b[t] + (a[t] * prev if a[t] != 0 else 0.0)
        prev = x[t]
    return (x,)


def _next_values(T, values, next_values, bootstrap):
    if next_values is not None:
        return list(next_values)
    return [*list(values[1:]), bootstrap]


def seq_gae(r, v, term, trunc, nv, gamma, lmbda):
    T = len(r)
    c = _cuts(T, [term[t] or trunc[t] for t in range(T)])
    A = [0.0] * T
    for t in reversed(range(T)):
        boot = 0.0 if term[t] else gamma[t] * nv[t]
        A[t] = r[t] + boot - v[t]
        coef = gamma[t] * lmbda[t] if c[t] else 0.0
        if coef != 0:
            A[t] += coef * A[t + 1]
    return A, [A[t] + v[t] for t in range(T)]


def seq_lambda_returns(r, term, trunc, nv, gamma, lmbda):
    T = len(r)
    c = _cuts(T, [term[t] or trunc[t] for t in range(T)])
    G = [0.0] * T
    for t in reversed(range(T)):
        G[t] = r[t]
        if term[t]:
            continue
        lc = lmbda[t] if c[t] else 0.0  # (lambda_t unused where the trace is cut)
        inner = 0.0
        if 1 - lc != 0:
            inner += (1 - lc) * nv[t]
        if lc != 0:
            inner += lc * G[t + 1]
        G[t] += gamma[t] * inner
    return (G,)


def seq_discounted_returns(r, term, trunc, nv, gamma):
    T = len(r)
    c = _cuts(T, [term[t] or trunc[t] for t in range(T)])
    G = [0.0] * T
    for t in reversed(range(T)):
        G[t] = r[t]
        if term[t]:
            continue
        G[t] += gamma[t] * (G[t + 1] if c[t] else nv[t])
    return (G,)


def seq_vtrace(r, v, tlp, blp, term, trunc, nv, gamma, lmbda, rho_bar, c_bar, pg_rho_bar):
    T = len(r)
    c = _cuts(T, [term[t] or trunc[t] for t in range(T)])
    w = [
        math.exp(tlp[t] - blp[t]) if not math.isnan(tlp[t] - blp[t]) else math.nan for t in range(T)
    ]
    rho = [_nanmin(rho_bar[t], w[t]) for t in range(T)]
    kappa = [lmbda[t] * _nanmin(c_bar[t], w[t]) for t in range(T)]
    pg_rho = [_nanmin(pg_rho_bar[t], w[t]) for t in range(T)]
    D = [0.0] * T
    for t in reversed(range(T)):
        target = r[t] + (0.0 if term[t] else gamma[t] * nv[t])
        D[t] = rho[t] * (target - v[t])
        coef = gamma[t] * kappa[t] if c[t] else 0.0  # kappa may be NaN: cut first
        if coef != 0:
            D[t] += coef * D[t + 1]
    vs = [v[t] + D[t] for t in range(T)]
    pg = [0.0] * T
    for t in range(T):
        u = vs[t + 1] if c[t] else nv[t]
        pg[t] = pg_rho[t] * (r[t] + (0.0 if term[t] else gamma[t] * u) - v[t])
    return vs, pg


def seq_retrace(r, q, neq, tlp, blp, term, trunc, gamma, lmbda, c_bar, trace):
    T = len(r)
    c = _cuts(T, [term[t] or trunc[t] for t in range(T)])

    def kappa(t):
        diff = tlp[t] - blp[t]
        w = math.nan if math.isnan(diff) else math.exp(diff)
        if trace == "retrace":
            return lmbda[t] * _nanmin(c_bar[t], w)
        if trace == "tree_backup":
            return lmbda[t] * (math.nan if math.isnan(tlp[t]) else math.exp(tlp[t]))
        if trace == "q_lambda":
            return lmbda[t]
        if trace == "importance_sampling":
            return lmbda[t] * w
        raise ValueError(trace)

    Q = [0.0] * T
    for t in reversed(range(T)):
        Q[t] = r[t]
        if term[t]:
            continue
        inner = neq[t]
        if c[t]:
            k = kappa(t + 1)
            if k != 0:
                inner += k * (Q[t + 1] - q[t + 1])
        Q[t] += gamma[t] * inner
    return (Q,)


def seq_forward_trace(x, done, coef_step, initial):
    """z_t = x_t + coef_t (1 - done_{t-1}) z_{t-1}; ``x`` may be a list of floats."""
    T = len(x)
    z = [0.0] * T
    prev = 0.0 if initial is None else initial
    for t in range(T):
        coef = 0.0 if (t > 0 and done[t - 1]) else coef_step[t]
        z[t] = x[t] + (coef * prev if coef != 0 else 0.0)
        prev = z[t]
    return (z,)


def oracle(fn: str, inputs: dict, T: int, batch: tuple) -> tuple:
    """Pure-Python evaluation of the spec on canonical time-major inputs (float64 outputs).

    ``inputs``: like ``Case.inputs`` (tensors broadcastable to ``[T, *batch]``, floats, None).
    """
    full = (T, *batch)
    M = math.prod(batch)

    def cols(name, default=None):
        v = inputs.get(name, default)
        if v is None:
            return [None] * M
        if isinstance(v, (int, float)):
            return [[float(v)] * T for _ in range(M)]
        e = v.to(F64).expand(full).reshape(T, M)
        return [e[:, m].tolist() for m in range(M)]

    def flags(name):
        v = inputs.get(name)
        if v is None:
            return [[False] * T for _ in range(M)]
        e = (v != 0).expand(full).reshape(T, M)
        return [e[:, m].tolist() for m in range(M)]

    def notime(name):
        v = inputs.get(name)
        if v is None:
            return [None] * M
        return v.to(F64).reshape(M).tolist()

    outs: list = []
    for m in range(M):
        if fn == "linear_scan":
            res = seq_linear_scan(
                cols("a")[m], cols("b")[m], notime("initial")[m], inputs.get("reverse", False)
            )
        elif fn in ("gae", "lambda_returns", "discounted_returns", "vtrace"):
            term, trunc = flags("terminated")[m], flags("truncated")[m]
            values = cols("values")[m]
            boot = notime("bootstrap_value")[m]
            next_values = cols("next_values")[m]
            if fn == "discounted_returns":
                nv = next_values if next_values is not None else [0.0] * T
                if next_values is None and T:
                    nv[T - 1] = 0.0 if boot is None else boot
                res = seq_discounted_returns(
                    cols("rewards")[m], term, trunc, nv, cols("gamma", 0.99)[m]
                )
            else:
                nv = _next_values(T, values, next_values, boot)
                if fn == "gae":
                    res = seq_gae(
                        cols("rewards")[m],
                        values,
                        term,
                        trunc,
                        nv,
                        cols("gamma", 0.99)[m],
                        cols("lmbda", 0.95)[m],
                    )
                elif fn == "lambda_returns":
                    res = seq_lambda_returns(
                        cols("rewards")[m],
                        term,
                        trunc,
                        nv,
                        cols("gamma", 0.99)[m],
                        cols("lmbda", 0.95)[m],
                    )
                else:
                    rho_bar = cols("rho_bar", 1.0)[m]
                    pg = inputs.get("pg_rho_bar")
                    res = seq_vtrace(
                        cols("rewards")[m],
                        values,
                        cols("target_log_probs")[m],
                        cols("behavior_log_probs")[m],
                        term,
                        trunc,
                        nv,
                        cols("gamma", 0.99)[m],
                        cols("lmbda", 1.0)[m],
                        rho_bar,
                        cols("c_bar", 1.0)[m],
                        rho_bar if pg is None else cols("pg_rho_bar")[m],
                    )
        elif fn == "retrace":
            res = seq_retrace(
                cols("rewards")[m],
                cols("q_values")[m],
                cols("next_expected_q")[m],
                cols("target_log_probs")[m],
                cols("behavior_log_probs")[m],
                flags("terminated")[m],
                flags("truncated")[m],
                cols("gamma", 0.99)[m],
                cols("lmbda", 1.0)[m],
                cols("c_bar", 1.0)[m],
                inputs.get("trace", "retrace"),
            )
        elif fn == "eligibility_traces":
            g, lam = cols("gamma", 0.99)[m], cols("lmbda", 0.95)[m]
            res = seq_forward_trace(
                cols("x")[m],
                flags("done")[m],
                [g[t] * lam[t] for t in range(T)],
                notime("initial")[m],
            )
        elif fn == "episodic_cumsum":
            res = seq_forward_trace(cols("x")[m], flags("done")[m], [1.0] * T, notime("initial")[m])
        else:
            raise ValueError(fn)
        outs.append(res)
    n_out = N_OUTPUTS[fn]
    result = []
    for k in range(n_out):
        data = torch.tensor([outs[m][k] for m in range(M)], dtype=F64).reshape(M, T)
        result.append(data.T.reshape(full).contiguous())
    return tuple(result)


def forget_launches() -> None:
    """Clear the Triton launcher's launch descriptions and the replay table, so that the next
    calls describe their launches (a replayed call would not)."""
    from rl_triton_core import _replay
    from rl_triton_core import triton_backend as tb

    tb._LAUNCHES.clear()
    _replay._PLANS.clear()


def described_launch(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``'s result and the one Triton launch description it made."""
    from rl_triton_core import triton_backend as tb

    forget_launches()
    result = fn(*args, **kwargs)
    (launch,) = tb._LAUNCHES.values()
    return result, launch


# ----------------------------------------------------------------------------------------------
# Every estimator on one input set, against the torch backend in float64
# ----------------------------------------------------------------------------------------------

RTOL_VS_FLOAT64 = {
    torch.float64: 1e-9,
    torch.float32: 1e-5,
    torch.float16: 3e-3,
    torch.bfloat16: 2e-2,
}


def close_to_float64(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    """No NaN left in ``got`` (outputs are poisoned first) and its largest error relative to
    ``max |want|`` (at least 1) within ``RTOL_VS_FLOAT64[dtype]``."""
    assert not torch.isnan(got).any(), f"{name}: NaN left in the output (unwritten elements?)"
    scale = want.abs().max().clamp_min(1.0)
    err = ((got.double() - want.double()).abs().max() / scale).item()
    rtol = RTOL_VS_FLOAT64[dtype]
    assert err <= rtol, f"{name}: max relative error {err:.3g} > {rtol:g}"


def close_all_to_float64(got: dict, want: dict, dtype: torch.dtype, label: str) -> None:
    """Every output of every estimator of ``run_every_estimator``."""
    for name, g in got.items():
        g, w = as_tuple(g), as_tuple(want[name])
        for i, (gi, wi) in enumerate(zip(g, w, strict=True)):
            close_to_float64(gi, wi, dtype, f"{name}[{i}] {label}")


def random_step_inputs(shape, time_dim, dtype, gen, flag_dtype=torch.bool) -> dict:
    """Per-step inputs of ``shape`` on the generator's device: normal rewards, values and next
    values, negative log-probabilities, 2% terminated and 1% truncated steps."""

    def step():
        return torch.randn(shape, generator=gen, device=gen.device).to(dtype)

    term = (torch.rand(shape, generator=gen, device=gen.device) < 0.02).to(flag_dtype)
    trunc = (torch.rand(shape, generator=gen, device=gen.device) < 0.01).to(flag_dtype)
    return dict(
        rewards=step(),
        values=step(),
        next_values=step(),
        tlp=-step().abs(),
        blp=-step().abs(),
        term=term,
        trunc=trunc,
    )


def as_float64(d: dict) -> dict:
    return {k: (v.double() if v.is_floating_point() else v) for k, v in d.items()}


def run_every_estimator(d, time_dim, backend, out_like=None, long_horizon=False, only=None):
    """Every estimator on one input set (``random_step_inputs``); returns a dict of outputs by
    name: gae, lambda, disc, vtrace, retrace, traces, scan (backward), scan_forward, or those
    in ``only``. ``out_like``: outputs into NaN-poisoned tensors like it. ``long_horizon``:
    gamma = 0.9995 and lambda = 1 throughout (float32 calls then accumulate in float64), the
    scans left out (their a is a tensor: they accumulate in float32)."""
    kw = dict(time_dim=time_dim, backend=backend)
    g, lam = (dict(gamma=0.9995), 1.0) if long_horizon else ({}, None)
    r, v, term = d["rewards"], d["values"], d["term"]
    nv = dict(truncated=d["trunc"], next_values=d["next_values"])

    def poisoned(n=1):
        if out_like is None:
            return None
        outs = tuple(torch.full_like(out_like, float("nan")) for _ in range(n))
        return outs if n > 1 else outs[0]

    calls = {
        "gae": lambda: rtc.gae(
            r, v, term, **nv, gamma=g.get("gamma", 0.99), lmbda=lam or 0.95, out=poisoned(2), **kw
        ),
        "lambda": lambda: rtc.lambda_returns(
            r, v, term, **nv, **(dict(g, lmbda=lam) if long_horizon else {}), out=poisoned(), **kw
        ),
        "disc": lambda: rtc.discounted_returns(r, term, **nv, **g, out=poisoned(), **kw),
        "vtrace": lambda: rtc.vtrace(
            r, v, d["tlp"], d["blp"], term, **nv, lmbda=lam or 0.9, **g, out=poisoned(2), **kw
        ),
        "retrace": lambda: rtc.retrace(
            r,
            v,
            d["next_values"],
            d["tlp"],
            d["blp"],
            term,
            truncated=d["trunc"],
            lmbda=lam or 0.9,
            **g,
            out=poisoned(),
            **kw,
        ),
        "traces": lambda: rtc.eligibility_traces(
            r, term, **(dict(g, lmbda=lam) if long_horizon else {}), out=poisoned(), **kw
        ),
    }
    if not long_horizon:
        a = v.sigmoid()
        calls["scan"] = lambda: rtc.linear_scan(a, r, reverse=True, out=poisoned(), **kw)
        calls["scan_forward"] = lambda: rtc.linear_scan(a, r, out=poisoned(), **kw)
    if only is not None and not set(only) <= calls.keys():
        raise ValueError(f"no estimator {set(only) - calls.keys()} here (long_horizon: no scans)")
    return {name: call() for name, call in calls.items() if only is None or name in only}
