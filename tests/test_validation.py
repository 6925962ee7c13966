"""Bad input raises ValueError/TypeError naming the offending argument (never AssertionError,
never a wrong result); ``available_backends``."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from _support import (
    FLAG_ARGS,
    FUNCTIONS,
    N_OUTPUTS,
    NOTIME_ARGS,
    PARAM_ARGS,
    POSITIONAL,
    STEP_ARGS,
    as_tuple,
    call,
)
from conftest import HAS_CUDA, TRITON_INTERPRET, assert_close

import rl_triton_core as rtc

T, N = 5, 3
BOOT_FNS = ("gae", "lambda_returns", "vtrace")  # need next_values or bootstrap_value
NV_FNS = ("gae", "lambda_returns", "discounted_returns", "vtrace")  # take next_values


def shape_id(shape) -> str:
    return "x".join(map(str, shape)) if shape else "0dim"


def named(name: str) -> str:
    """Regex: ``name`` as a whole word (so "values" does not match "next_values")."""
    return rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"


def valid(fn, device="cpu", dtype=torch.float32, *, with_next_values=False):
    """Valid time-major [T, N] inputs for ``fn`` (every optional tensor argument filled)."""
    g = torch.Generator().manual_seed(0)
    f = lambda *shape: torch.rand(shape, generator=g).to(device=device, dtype=dtype)
    flag = lambda: (torch.rand(T, N, generator=g) < 0.3).to(device)
    d = {}
    for name in STEP_ARGS[fn]:
        if name == "next_values" and not with_next_values:
            continue
        d[name] = f(T, N)
    for name in FLAG_ARGS[fn]:
        if name == "truncated" and fn in NV_FNS and not with_next_values:
            continue
        d[name] = flag()
    for name in NOTIME_ARGS[fn]:
        if name == "bootstrap_value" and with_next_values:
            continue
        d[name] = f(N)
    for name in PARAM_ARGS[fn]:
        d[name] = {"gamma": 0.9, "lmbda": 0.9}.get(name, 1.0)
    return d


def check_raises(exc, pattern, fn, inputs, backend="torch", **kwargs):
    with pytest.raises(exc) as info:
        call(fn, inputs, backend=backend, **kwargs)
    msg = str(info.value)
    assert re.search(pattern, msg), f"{exc}: message {msg!r} does not match {pattern!r}"


# ---------------------------------------------------------------- baseline


@pytest.mark.parametrize("with_nv", [False, True])
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_valid_inputs_are_accepted(fn, with_nv, backend, device):
    """The baselines the error tests perturb are valid (so each error is caused by the
    perturbation alone)."""
    res = as_tuple(call(fn, valid(fn, device, with_next_values=with_nv), backend=backend))
    assert len(res) == N_OUTPUTS[fn]
    for r in res:
        assert tuple(r.shape) == (T, N) and r.dtype == torch.float32
        assert torch.isfinite(r).all()


# ---------------------------------------------------------------- shapes


def _perturbable(fn, kinds, with_nv=True):
    out = []
    for name in valid(fn, with_next_values=with_nv):
        if name == POSITIONAL[fn][0]:
            continue  # the first argument defines the shape
        if any(name in table[fn] for table in kinds):
            out.append((fn, name))
    return out


STEP_CASES = [c for fn in FUNCTIONS for c in _perturbable(fn, [STEP_ARGS])]
FLAG_CASES = [c for fn in FUNCTIONS for c in _perturbable(fn, [FLAG_ARGS])]
NOTIME_CASES = [c for fn in FUNCTIONS for c in _perturbable(fn, [NOTIME_ARGS], with_nv=False)]
PARAM_CASES = [(fn, name) for fn in FUNCTIONS for name in PARAM_ARGS[fn]]


@pytest.mark.parametrize(("fn", "name"), STEP_CASES)
@pytest.mark.parametrize(
    "bad_shape", [(T, N + 1), (T + 1, N), (T - 1, 1), (T,), (T, N, 2)], ids=str
)
def test_value_shape_mismatch(fn, name, bad_shape, backend):
    inputs = valid(fn, with_next_values=True)
    inputs[name] = torch.rand(bad_shape)
    check_raises(ValueError, named(name), fn, inputs, backend)


@pytest.mark.parametrize(("fn", "name"), FLAG_CASES)
@pytest.mark.parametrize(
    "bad_shape", [(T, N + 1), (T + 1, N), (T - 1, 1), (T,), (T, N, 1)], ids=str
)
def test_flag_shape_mismatch(fn, name, bad_shape, backend):
    """Flags broadcast only with the same number of dims (each dim equal or 1)."""
    inputs = valid(fn, with_next_values=True)
    inputs[name] = torch.zeros(bad_shape, dtype=torch.bool)
    check_raises(ValueError, named(name), fn, inputs, backend)


@pytest.mark.parametrize(("fn", "name"), FLAG_CASES)
def test_flag_broadcast_shapes_are_accepted(fn, name, backend, device):
    inputs = valid(fn, device, with_next_values=True)
    for shape in [(1, N), (T, 1), (1, 1)]:
        inputs[name] = torch.zeros(shape, dtype=torch.bool, device=device)
        call(fn, inputs, backend=backend)


@pytest.mark.parametrize(("fn", "name"), STEP_CASES)
def test_value_broadcast_same_rank(fn, name, backend, device):
    """Library decision: per-step value tensors may broadcast too (same rank, size-1 dims)."""
    inputs = valid(fn, device, dtype=torch.float64, with_next_values=True)
    for shape in [(T, 1), (1, N)]:
        small = torch.rand(shape, dtype=torch.float64, device=device)
        got = as_tuple(call(fn, {**inputs, name: small}, backend=backend))
        ref = as_tuple(call(fn, {**inputs, name: small.expand(T, N)}, backend="reference"))
        for g, r in zip(got, ref):
            assert tuple(g.shape) == (T, N)
            assert_close(g, r, torch.float64)


@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "eligibility_traces"])
def test_zero_dim_coefficient_is_a_scalar(fn, backend, device):
    inputs = valid(fn, device, dtype=torch.float64)
    gamma = torch.tensor(0.75, dtype=torch.float64, device=device)
    a = as_tuple(call(fn, {**inputs, "gamma": 0.75}, backend=backend))
    b = as_tuple(call(fn, {**inputs, "gamma": gamma}, backend=backend))
    for x, y in zip(a, b):
        assert_close(y, x, torch.float64)


@pytest.mark.parametrize(("fn", "name"), PARAM_CASES)
@pytest.mark.parametrize("bad", [True, np.bool_(True), "0.9"], ids=repr)
def test_coefficient_that_is_not_a_number(fn, name, bad, backend):
    """A bool (Python's or numpy's) or a string for a coefficient: a TypeError naming it,
    not a silent 1.0 (``gamma=True``) nor a torch-internal error."""
    inputs = valid(fn)
    inputs[name] = bad
    check_raises(TypeError, named(name), fn, inputs, backend)


@pytest.mark.parametrize(("fn", "name"), NOTIME_CASES)
@pytest.mark.parametrize("bad_shape", [(N + 1,), (T, N), (1, N + 1), (), (N, 1)], ids=shape_id)
def test_bootstrap_and_initial_shape(fn, name, bad_shape, backend):
    inputs = valid(fn)
    inputs[name] = torch.rand(bad_shape)
    check_raises(ValueError, named(name), fn, inputs, backend)


@pytest.mark.parametrize(("fn", "name"), PARAM_CASES)
@pytest.mark.parametrize("bad_shape", [(T, N + 1), (T + 1, 1), (N,), (T, N, 1)], ids=shape_id)
def test_param_shape_mismatch(fn, name, bad_shape, backend):
    inputs = valid(fn)
    inputs[name] = torch.full(bad_shape, 0.5)
    check_raises(ValueError, named(name), fn, inputs, backend)


@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("time_dim", [2, -3, 5])
def test_time_dim_out_of_range(fn, time_dim, backend):
    check_raises(ValueError, named("time_dim"), fn, valid(fn), backend, time_dim=time_dim)


# ---------------------------------------------------------------- missing arguments


@pytest.mark.parametrize("fn", BOOT_FNS)
def test_missing_next_values_and_bootstrap(fn, backend):
    inputs = valid(fn)
    del inputs["bootstrap_value"]
    check_raises(
        ValueError, f"{named('bootstrap_value')}|{named('next_values')}", fn, inputs, backend
    )


def _requiring_grad(inputs: dict) -> dict:
    """The inputs with every floating tensor requiring grad (the differentiable path)."""
    return {k: v.requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in inputs.items()}  # fmt: skip


REQUIRED_CASES = [
    (fn, name)
    for fn in FUNCTIONS
    for name in (*POSITIONAL[fn], *STEP_ARGS[fn])
    if name not in FLAG_ARGS[fn]
    and name != "next_values"
    and (fn, name) != ("lambda_returns", "values")
]


@pytest.mark.parametrize("grad", [False, True], ids=["direct", "autograd"])
@pytest.mark.parametrize(("fn", "name"), sorted(set(REQUIRED_CASES)))
def test_required_input_none(fn, name, grad, backend, device):
    """None for a required tensor: a TypeError naming it (before: an IndexError, an
    AttributeError, or a Triton launch with a null pointer)."""
    inputs = valid(fn, device)
    inputs[name] = None
    if grad:  # (the differentiable path validates on its own)
        inputs = _requiring_grad(inputs)
    check_raises(TypeError, named(name) + ".*None", fn, inputs, backend)


@pytest.mark.parametrize("grad", [False, True], ids=["direct", "autograd"])
@pytest.mark.parametrize("fn", [f for f in FUNCTIONS if "gamma" in PARAM_ARGS[f]])
def test_gamma_none_or_too_large(fn, grad, backend, device):
    """``gamma=None`` is a TypeError on every path (the differentiable one raised a KeyError);
    an int past float64's range a ValueError (an OverflowError before)."""
    inputs = valid(fn, device)
    if grad:
        inputs = _requiring_grad(inputs)
    check_raises(TypeError, named("gamma"), fn, {**inputs, "gamma": None}, backend)
    check_raises(ValueError, named("gamma") + ".*too large", fn, {**inputs, "gamma": 10**400},
                 backend)  # fmt: skip
    if fn == "retrace":  # (c_bar unread by these traces: the differentiable path skipped it)
        for trace in ("q_lambda", "tree_backup"):
            check_raises(TypeError, named("c_bar"), fn, {**inputs, "c_bar": None}, backend,
                         trace=trace)  # fmt: skip


def test_discounted_returns_missing_bootstrap_means_zero(backend, device):
    inputs = valid("discounted_returns", device)
    del inputs["bootstrap_value"]
    got = call("discounted_returns", inputs, backend=backend)
    inputs["bootstrap_value"] = torch.zeros(N, device=device)
    want = call("discounted_returns", inputs, backend=backend)
    # Equal up to rounding: on a GPU the two calls run differently specialised kernels.
    assert_close(got, want, torch.float32)
    inputs["bootstrap_value"] = torch.ones(N, device=device)
    assert not torch.allclose(got, call("discounted_returns", inputs, backend=backend))


def test_lambda_returns_needs_values_or_next_values(backend):
    inputs = valid("lambda_returns")
    inputs["values"] = None
    check_raises(
        ValueError, f"{named('values')}|{named('next_values')}", "lambda_returns", inputs, backend
    )


@pytest.mark.parametrize("fn", NV_FNS)
def test_truncated_without_next_values(fn, backend):
    inputs = valid(fn)  # has bootstrap_value, no next_values
    inputs["truncated"] = torch.zeros(T, N, dtype=torch.bool)
    check_raises(ValueError, named("truncated"), fn, inputs, backend)


# ---------------------------------------------------------------- dtypes


DTYPE_CASES = [
    (fn, name)
    for fn in FUNCTIONS
    for name in {**valid(fn, with_next_values=True), **valid(fn)}
    if name in STEP_ARGS[fn] or name in NOTIME_ARGS[fn]
]
# every tensor argument kind: values, bootstrap values, flags, coefficient tensors
TENSOR_ARG_CASES = [*DTYPE_CASES, *FLAG_CASES, ("gae", "gamma"), ("vtrace", "rho_bar")]


@pytest.mark.parametrize(("fn", "name"), DTYPE_CASES)
@pytest.mark.parametrize("bad_dtype", [torch.int64, torch.bool, torch.int32])
def test_non_float_values(fn, name, bad_dtype, backend):
    inputs = valid(fn, with_next_values=name != "bootstrap_value")
    inputs[name] = torch.ones_like(inputs[name], dtype=bad_dtype)
    pattern = named(name)
    check_raises(TypeError, pattern, fn, inputs, backend)


@pytest.mark.parametrize(("fn", "name"), TENSOR_ARG_CASES)
def test_float8_refused(fn, name, backend):
    """float8 values, flags and coefficients: a TypeError naming them (they passed as floating
    point, then failed inside torch or Triton)."""
    inputs = valid(fn, with_next_values=name != "bootstrap_value")
    like = inputs[name] if isinstance(inputs[name], torch.Tensor) else torch.ones(T, 1)
    inputs[name] = torch.zeros(like.shape).to(torch.float8_e4m3fn)
    check_raises(TypeError, named(name) + ".*float8", fn, inputs, backend)


def _irregular(kind: str, x: torch.Tensor) -> torch.Tensor:
    return torch.nested.nested_tensor([x, x[:-1]]) if kind == "nested" else x.to_sparse()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("kind", ["nested", "sparse"])
@pytest.mark.parametrize(("fn", "name"), [*TENSOR_ARG_CASES, ("gae", "out")])
def test_irregular_tensors(fn, name, kind, backend):
    """A nested tensor (no single shape nor strides) or a sparse one (no strides; torch or
    Triton failed on it inside) anywhere: a TypeError naming it."""
    inputs = valid(fn, with_next_values=name != "bootstrap_value")
    if name == "out":
        inputs["out"] = tuple(_irregular(kind, torch.zeros(T, N)) for _ in range(2))
    else:
        x = inputs[name] if isinstance(inputs[name], torch.Tensor) else torch.full((T, N), 0.9)
        inputs[name] = _irregular(kind, x)
    check_raises(TypeError, named(name) + f".*{kind}", fn, inputs, backend)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_unknown_backend(fn):
    for bad in ("bogus", "cuda", ""):
        check_raises(ValueError, named("backend"), fn, valid(fn), backend=bad)


def test_unknown_trace(backend):
    for bad in ("tree-backup", "retrace_lambda", ""):
        check_raises(ValueError, named("trace"), "retrace", valid("retrace"), backend, trace=bad)


# ---------------------------------------------------------------- out=


def _outs(fn, shape=(T, N), dtype=torch.float32, device="cpu"):
    outs = tuple(torch.empty(shape, dtype=dtype, device=device) for _ in range(N_OUTPUTS[fn]))
    return outs if len(outs) > 1 else outs[0]


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_out_wrong_shape(fn, backend):
    for shape in [(T, N + 1), (T + 1, N), (N, T), (T * N,)]:
        check_raises(ValueError, named("out"), fn, valid(fn), backend, out=_outs(fn, shape))


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_out_wrong_dtype(fn, backend):
    for dtype in (torch.float64, torch.float16, torch.int64):
        check_raises(
            (TypeError, ValueError),
            named("out"),
            fn,
            valid(fn),
            backend,
            out=_outs(fn, dtype=dtype),
        )


@pytest.mark.parametrize("fn", ["gae", "vtrace"])
def test_out_must_be_a_pair_for_two_outputs(fn, backend):
    one = torch.empty(T, N)
    for bad in (one, (one,), (one, torch.empty(T, N), torch.empty(T, N))):
        check_raises((TypeError, ValueError), named("out"), fn, valid(fn), backend, out=bad)


@pytest.mark.parametrize(("fn", "name"), [(fn, name) for fn, name in DTYPE_CASES])
def test_out_sharing_memory_with_an_input(fn, name, backend):
    """A scan would read what it has overwritten: an out= tensor that is (or overlaps) an
    input, even as another view of its buffer, is refused."""
    inputs = valid(fn, with_next_values=name != "bootstrap_value")
    x = inputs[name]
    buffer = torch.zeros(T + 1, N)
    if x.dim() == 2:
        inputs[name] = buffer[:T].copy_(x)
        aliased = buffer[1:]  # overlaps all but its first row
    else:
        inputs[name] = buffer[T].copy_(x)
        aliased = buffer[1:]  # ends with it
    outs = list(as_tuple(_outs(fn)))
    outs[-1] = aliased
    out = tuple(outs) if len(outs) > 1 else outs[0]
    check_raises(ValueError, named("out") + ".*shares memory.*" + named(name), fn, inputs, backend,
                 out=out)  # fmt: skip


@pytest.mark.parametrize("fn", ["gae", "vtrace"])
def test_outs_sharing_memory_or_interleaved(fn, backend, device):
    buffer = torch.full((T, 2 * N), float("nan"), device=device)
    inputs = valid(fn, device)
    same = (buffer[:, :N], buffer[:, :N])
    check_raises(ValueError, named("out") + ".*shares memory", fn, inputs, backend, out=same)
    shifted = (buffer[:, :N], buffer[:, 1 : N + 1])
    check_raises(ValueError, named("out") + ".*shares memory", fn, inputs, backend, out=shifted)
    interleaved = (buffer[:, 0::2], buffer[:, 1::2])  # one buffer, no element shared: fine
    got = call(fn, inputs, backend=backend, out=interleaved)
    want = call(fn, valid(fn), backend="reference")
    for g, w in zip(got, want, strict=True):
        assert_close(g.cpu(), w, torch.float32)
    assert not buffer.isnan().any()


def test_out_sharing_memory_through_separate_storages(backend):
    """Two torch.from_numpy views of one numpy buffer have storages of their own: the check
    compares addresses, not storage objects."""
    np = pytest.importorskip("numpy")
    block = np.random.default_rng(0).random((3, T, N), dtype=np.float32)
    r, v = torch.from_numpy(block[0:2]).unbind(0)
    outs = torch.from_numpy(block[1:3]).unbind(0)  # advantages is `values`, byte for byte
    inputs = {**valid("gae"), "rewards": r, "values": v}
    check_raises(ValueError, named("out") + ".*shares memory.*" + named("values"), "gae", inputs,
                 backend, out=outs)  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")  # (torch.quantize_per_tensor: deprecated)
def test_out_and_flag_kinds_refused(backend):
    """out= that is not a tensor, a broadcast view, a leaf requiring grad or an inference
    tensor; a quantized flag."""
    inputs = valid("discounted_returns")
    check_raises(TypeError, named("out") + ".*got int", "discounted_returns", inputs, backend,
                 out=5)  # fmt: skip
    for bad, what in [
        (torch.empty(T, 1).expand(T, N), "broadcast"),
        (torch.zeros(T, N, requires_grad=True), "requires grad"),
    ]:
        check_raises(ValueError, named("out") + f".*{what}", "discounted_returns", inputs, backend,
                     out=bad)  # fmt: skip
    with torch.inference_mode():
        frozen = torch.empty(T, N)
    check_raises(ValueError, named("out") + ".*inference", "discounted_returns", inputs, backend,
                 out=frozen)  # fmt: skip
    flags = torch.quantize_per_tensor(torch.zeros(T, N), 1.0, 0, torch.quint8)
    check_raises(TypeError, named("terminated"), "discounted_returns",
                 {**inputs, "terminated": flags}, backend)  # fmt: skip


def test_empty_out_with_zero_strides_is_accepted(backend, device):
    """An empty ``out=`` has no element to write twice: zero strides (numpy's empty arrays have
    them) pass."""
    assert torch.from_numpy(np.zeros((0, N), dtype=np.float32)).stride() == (0, 0)
    empty = torch.empty_strided((0, N), (0, 0), device=device)
    got = rtc.discounted_returns(torch.zeros(0, N, device=device), None, backend=backend, out=empty)
    assert got is empty


def test_linear_scan_argument_types(backend):
    """``reverse`` must be a bool; the differentiable path (an input requiring grad) checks the
    op's argument types before calling it; ``backend`` must be a str."""
    a, b = torch.full((T, N), 0.5), torch.ones(T, N)
    for bad in (torch.tensor([1, 0]), "no", 1):
        with pytest.raises(TypeError, match=named("reverse")):
            rtc.linear_scan(a, b, reverse=bad, backend=backend)
    grad_b = torch.ones(T, N, requires_grad=True)
    for kwargs, name in [
        (dict(initial=0.5), "initial"),
        (dict(time_dim=0.0), "time_dim"),
        (dict(time_dim=False), "time_dim"),
        (dict(a=a.numpy()), "a"),
        (dict(backend=None), "backend"),
    ]:
        args = {"a": a, "b": grad_b, "backend": backend, **kwargs}
        with pytest.raises(TypeError, match=named(name)):
            rtc.linear_scan(**args)
    with pytest.raises(TypeError, match=named("backend")):
        rtc.linear_scan(a, b, backend=["torch"])


# ---------------------------------------------------------------- devices (CUDA only)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_device_mismatch(fn):
    for backend in rtc.available_backends(torch.device("cuda")):
        base = valid(fn, "cuda", with_next_values=True)
        for name, v in base.items():
            if not isinstance(v, torch.Tensor):
                continue
            inputs = dict(base)
            inputs[name] = v.cpu()
            check_raises(ValueError, named(name), fn, inputs, backend)
        check_raises(ValueError, named("out"), fn, base, backend, out=_outs(fn, device="cpu"))


# ---------------------------------------------------------------- backends


def test_available_backends():
    cpu = rtc.available_backends(torch.device("cpu"))
    assert isinstance(cpu, list)
    assert "reference" in cpu and "torch" in cpu
    assert ("triton" in cpu) == TRITON_INTERPRET, (cpu, TRITON_INTERPRET)
    assert set(cpu) <= {"reference", "torch", "triton"}
    if HAS_CUDA:
        cuda = rtc.available_backends(torch.device("cuda"))
        assert "triton" in cuda and "torch" in cuda


@pytest.mark.skipif(TRITON_INTERPRET, reason="Triton runs on CPU under the interpreter")
def test_triton_on_cpu_without_interpreter_is_refused():
    with pytest.raises(ValueError, match=r"`backend`='triton' needs CUDA tensors"):
        rtc.gae(**{**valid("gae"), "terminated": None}, backend="triton")
