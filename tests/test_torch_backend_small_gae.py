"""The small-call path of ``gae(backend="torch")`` on the CPU (``torch_backend._gae_small``:
short problems computed in numpy, unguarded, handed to the engine when the advantages come out
non-finite) against the float64 reference and the pure-Python oracle.

Every test records what the path returned on each call (True: it wrote the outputs; False:
the engine ran instead) and asserts it, so a test that the path no longer serves fails rather
than passing on the engine. Where the inputs are finite, ``out=`` tensors are NaN-poisoned,
so an element the path forgets to write fails too.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _support import (
    FLAG_DTYPES,
    LAYOUTS,
    build_case,
    call,
    gen_from,
    oracle,
    realize,
    reference_outputs,
)
from conftest import assert_all_written, assert_close, hyp_settings
from hypothesis import given
from hypothesis import strategies as st

from rl_triton_core import torch_backend as tb

F64 = torch.float64
NAN, INF = float("nan"), float("inf")
SERVED_DTYPES = (torch.float32, torch.float64)  # what the numpy path computes in


@pytest.fixture
def small_path(monkeypatch):
    """The results of every ``_gae_small`` call of the test, in order."""
    results = []
    run = tb._gae_small

    def spy(*args):
        results.append(run(*args))
        return results[-1]

    monkeypatch.setattr(tb, "_gae_small", spy)
    return results


def _gae(inputs: dict, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # NaN/inf inputs: no numpy RuntimeWarning either
        return call("gae", inputs, backend="torch", **kwargs)


@pytest.fixture(params=["doubling", "rows"])
def scan(request, monkeypatch):
    """Which scan ``_gae_small`` may use (doubling: only on contiguous rows), and the scans
    it ran."""
    if request.param == "rows":
        monkeypatch.setattr(tb, "SMALL_GAE_DOUBLING_MAX_WIDTH", 0)
    ran = []
    for name in ("doubling", "rows"):
        run = getattr(tb, f"_scan_{name}")

        def spy(*args, _run=run, _name=name, **kwargs):
            ran.append(_name)
            return _run(*args, **kwargs)

        monkeypatch.setattr(tb, f"_scan_{name}", spy)
    return request.param, ran


CONTIGUOUS_ROWS = ("vector", "time_major", "features")  # layouts whose rows are contiguous


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_matches_reference(layout, scan, small_path):
    """Every layout (outputs in it, in another one, or fresh), T from 1 to the path's limit,
    float32/float64, every flag dtype, bootstrap or next values with truncation, float gamma
    and lambda (0 and 1 included); the doubling scan and the row loop."""

    @hyp_settings("torch", 2)
    @given(data=st.data())
    def run(data):
        draw = data.draw
        T = draw(st.integers(1, tb.SMALL_GAE_MAX_STEPS), label="T")
        batch = layout.draw_batch(draw)
        dtype = draw(st.sampled_from(SERVED_DTYPES), label="dtype")
        flag_dtype = draw(st.sampled_from(FLAG_DTYPES), label="flag_dtype")
        time_dim = draw(st.sampled_from(layout.time_dims), label="time_dim")
        gen = gen_from(draw)
        case = build_case("gae", draw, T, batch, dtype, gen)
        for name in ("gamma", "lmbda"):  # the path takes Python floats (tensors: the engine)
            case.inputs[name] = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]), label=name)
        expected = reference_outputs(case)
        inputs = realize(case, layout, dtype, flag_dtype, "cpu", gen, keepdim=draw(st.booleans()))
        out_mode = draw(st.sampled_from(["none", "layout", "contiguous"]), label="out")
        out = None
        if out_mode == "layout":  # laid out like the inputs (strided views included)
            out = tuple(layout.put(torch.full(case.full, NAN, dtype=dtype), NAN) for _ in "ar")
        elif out_mode == "contiguous":
            out = tuple(torch.full(layout.shape(case.full), NAN, dtype=dtype) for _ in "ar")
        small_path.clear()
        result = _gae(inputs, time_dim=time_dim, out=out)
        assert small_path == [True], "the numpy path did not serve the call"
        for k, (r, e) in enumerate(zip(result, expected, strict=True)):
            name = f"gae output {k} [{layout}, T={T}, {dtype}, flags {flag_dtype}, out {out_mode}]"
            assert out is None or r is out[k]
            assert_all_written(r, name)
            assert_close(layout.take(r), e, dtype, name=name)

    run()
    wanted, ran = scan
    if wanted == "rows" or layout.name in CONTIGUOUS_ROWS:
        assert wanted in ran, f"the {wanted} scan never ran"
    if wanted == "rows":
        assert "doubling" not in ran


def test_nan_and_inf_locality(small_path):
    """NaN or inf in rewards, values, next values or the bootstrap value, often behind a
    terminated gate: the outputs match the oracle (a term with an exact zero coefficient is
    dropped), without a numpy warning. The unguarded numpy result is not finite then, so the
    path must hand the call to the engine's guarded scan."""

    @hyp_settings("torch", 6)
    @given(data=st.data())
    def run(data):
        draw = data.draw
        T = draw(st.integers(1, tb.SMALL_GAE_MAX_STEPS), label="T")
        N = draw(st.integers(1, 4), label="N")
        dtype = draw(st.sampled_from(SERVED_DTYPES), label="dtype")
        gen = gen_from(draw)
        case = build_case("gae", draw, T, (N,), dtype, gen, nonzero_params=True)
        case.inputs["gamma"], case.inputs["lmbda"] = 0.99, 0.95
        names = [
            k for k in ("rewards", "values", "next_values", "bootstrap_value") if k in case.inputs
        ]
        name = draw(st.sampled_from(names), label="poisoned")
        bad = draw(st.sampled_from([NAN, INF, -INF]), label="value")
        poisoned = case.inputs[name].clone()
        flat = poisoned.view(-1)
        for _ in range(draw(st.integers(1, 3))):
            flat[draw(st.integers(0, flat.numel() - 1))] = bad
        case.inputs[name] = poisoned
        if draw(st.booleans(), label="gated"):  # terminated where the bad value is nv_t
            at = ~torch.isfinite(poisoned)
            if name == "values":  # values[t] is nv_{t-1}
                at = torch.cat((at[1:], torch.zeros_like(at[:1])))
            elif name == "bootstrap_value":
                at = torch.cat((torch.zeros(T - 1, N, dtype=torch.bool), at[None]))
            if name != "rewards":
                term = case.inputs.get("terminated")
                case.inputs["terminated"] = at if term is None else term.expand(T, N) | at
        expected = oracle("gae", case.inputs, T, (N,))
        small_path.clear()
        result = _gae({k: _cast(v, dtype) for k, v in case.inputs.items()})
        assert small_path == [False], "a non-finite numpy result was kept"
        for k, (r, e) in enumerate(zip(result, expected, strict=True)):
            assert_close(r, e, dtype, name=f"gae output {k} ({bad} in {name})")

    run()


def _cast(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _inputs(T: int, N: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    r, v, nv = (torch.rand(T, N, generator=g, dtype=F64) * 2 - 1 for _ in range(3))
    return dict(
        rewards=r,
        values=v,
        terminated=torch.rand(T, N, generator=g) < 0.2,
        next_values=nv,
        truncated=torch.rand(T, N, generator=g) < 0.2,
        bootstrap_value=torch.rand(N, generator=g, dtype=F64),
    )


def _check(inputs: dict, dtype: torch.dtype | None, served: bool, small_path: list) -> None:
    """The call into NaN-poisoned outputs against the reference; ``served``: whether the numpy
    path must have served it. ``dtype``: the value inputs cast to it (None: as they are)."""
    if dtype is not None:
        inputs = {k: _cast(v, dtype) for k, v in inputs.items()}
    inputs = {"gamma": 0.97, "lmbda": 0.9, **inputs}
    want = call("gae", inputs, backend="reference")
    like = inputs["values"]  # (the outputs' dtype in every case below)
    out = (torch.full_like(like, NAN), torch.full_like(like, NAN))
    small_path.clear()
    got = _gae(inputs, out=out)
    assert small_path == [served]
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_all_written(g, f"output {k}")
        assert_close(g, w.to(g.dtype), g.dtype, name=f"output {k}")


def _without(d: dict, *names: str) -> dict:
    return {k: v for k, v in d.items() if k not in names}


@pytest.mark.parametrize("dtype", SERVED_DTYPES, ids=str)
def test_edge_cases(dtype, small_path):
    """T = 1, every step terminated or truncated, a truncation at the last step, no flags."""
    T, N = 9, 5
    x = _inputs(T, N)
    boot = _without(x, "next_values", "truncated")
    nexts = _without(x, "bootstrap_value")
    yes = torch.ones(T, N, dtype=torch.bool)
    cases = {
        "T=1 bootstrap": _inputs(1, N, seed=1) | {"next_values": None, "truncated": None},
        "T=1 next_values": _without(_inputs(1, N, seed=2), "bootstrap_value"),
        "bootstrap": boot,
        "next_values": nexts,
        "all terminated": nexts | {"terminated": yes},
        "all truncated": nexts | {"truncated": yes},
        "truncated at T-1": nexts | {"truncated": torch.zeros(T, N, dtype=torch.bool)},
        "no flags": _without(boot, "terminated") | {"terminated": None},
        "int flags": nexts | {"terminated": x["terminated"].to(torch.int32) * 3},
        "float flags": nexts | {"truncated": x["truncated"].to(torch.float32)},
        "broadcast flags": nexts | {"terminated": x["terminated"][:, :1]},
    }
    cases["truncated at T-1"]["truncated"][-1] = True
    for name, inputs in cases.items():
        inputs = {k: v for k, v in inputs.items() if v is not None or k == "terminated"}
        try:
            _check(inputs, dtype, True, small_path)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_what_the_engine_serves(small_path):
    """float16/bfloat16 outputs, an input numpy cannot view, tensor gamma, too many steps or
    elements: the path declines and the engine's result is the reference's."""
    x = _without(_inputs(9, 4), "bootstrap_value")
    _check(x, torch.float16, False, small_path)
    _check(x, torch.bfloat16, False, small_path)
    bf16_rewards = {k: _cast(v, torch.float32) for k, v in x.items()}  # float32 outputs
    bf16_rewards["rewards"] = x["rewards"].to(torch.bfloat16)
    _check(bf16_rewards, None, False, small_path)
    _check(x | {"gamma": torch.full((9, 1), 0.97)}, torch.float32, False, small_path)
    too_long = _without(_inputs(tb.SMALL_GAE_MAX_STEPS + 1, 3), "bootstrap_value")
    _check(too_long, torch.float32, False, small_path)
    n = tb.SMALL_GAE_MAX_ELEMENTS // 2
    _check(_without(_inputs(2, n + 1), "bootstrap_value"), torch.float32, False, small_path)
    _check(_without(_inputs(2, n), "bootstrap_value"), torch.float32, True, small_path)
