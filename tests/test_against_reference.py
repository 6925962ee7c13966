"""Every function x backend x layout x value dtype x flag dtype against ``backend="reference"``.

The expected outputs come from the reference backend run on float64, time-major, contiguous,
fully broadcast copies of the (dtype-quantised) inputs. The call under test gets the inputs in
one of the layouts of ``_support.LAYOUTS`` (batch-major, TorchRL, trailing features, sliced and
transposed views, ...), flags in bool/uint8/int64/float32 with broadcast shapes, scalar or
tensor (per-step, per-env) parameters, ``bootstrap_value``/``initial`` with or without the
kept time axis, and sometimes NaN-poisoned ``out=`` tensors.
"""

from __future__ import annotations

import pytest
import torch
from _support import (
    FLAG_DTYPES,
    FUNCTIONS,
    LAYOUT_BY_NAME,
    LAYOUTS,
    N_OUTPUTS,
    VALUE_DTYPES,
    as_tuple,
    build_case,
    call,
    gen_from,
    realize,
    reference_outputs,
)
from conftest import assert_all_written, assert_close, hyp_settings
from conftest import max_T as cap_T
from hypothesis import given
from hypothesis import strategies as st

import rl_triton_core as rtc


def _snapshot(inputs: dict) -> dict:
    return {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}


def _check_unchanged(inputs: dict, before: dict) -> None:
    for k, v in before.items():
        assert torch.equal(inputs[k].isnan(), v.isnan()) and torch.equal(
            torch.nan_to_num(inputs[k]), torch.nan_to_num(v)
        ), f"input {k!r} was modified by the call"


def run_case(
    data, fn, layout, backend, device, *, dtype=None, flag_dtype=None, max_T=40, with_flags=False
):
    draw = data.draw
    T = draw(st.integers(0, cap_T(backend, max_T)), label="T")
    batch = layout.draw_batch(draw)
    if dtype is None:
        dtype = draw(st.sampled_from(VALUE_DTYPES), label="dtype")
    if flag_dtype is None:
        flag_dtype = draw(st.sampled_from(FLAG_DTYPES), label="flag_dtype")
    time_dim = draw(st.sampled_from(layout.time_dims), label="time_dim")
    keepdim = draw(st.booleans(), label="keepdim")
    gen = gen_from(draw)
    case = build_case(fn, draw, T, batch, dtype, gen, with_flags=with_flags)
    expected = reference_outputs(case)

    inputs = realize(case, layout, dtype, flag_dtype, device, gen, keepdim=keepdim)
    out_shape = layout.shape(case.full)
    # out=: none, a fresh contiguous tensor, or a view laid out like the inputs (strided, e.g.
    # every other column of a NaN buffer); all NaN-poisoned
    out_mode = draw(st.sampled_from(["none", "contiguous", "layout"]), label="out")
    kwargs = {"time_dim": time_dim, "backend": backend}
    out = None
    if out_mode != "none":
        nan = float("nan")
        out = tuple(
            torch.full(out_shape, nan, dtype=dtype, device=device)
            if out_mode == "contiguous"
            else layout.put(torch.full(case.full, nan, dtype=dtype, device=device), nan)
            for _ in range(N_OUTPUTS[fn])
        )
        kwargs["out"] = out if N_OUTPUTS[fn] > 1 else out[0]
    before = _snapshot(inputs)

    result = as_tuple(call(fn, inputs, **kwargs))

    _check_unchanged(inputs, before)
    assert len(result) == N_OUTPUTS[fn]
    for k, (r, e) in enumerate(zip(result, expected)):
        name = f"{fn} output {k} [{layout.name}, time_dim={time_dim}, {dtype}, flags {flag_dtype}]"
        assert r.dtype == dtype, f"{name}: dtype {r.dtype}"
        assert r.device.type == torch.device(device).type, f"{name}: device {r.device}"
        assert tuple(r.shape) == out_shape, f"{name}: shape {tuple(r.shape)} != {out_shape}"
        if out is not None:
            assert r is out[k], f"{name}: out= tensor was not returned"
            assert_all_written(r, name)
            if out_mode == "layout" and layout.mode == "slice" and r.numel():
                gaps = r._base[..., 1::2]
                assert torch.isnan(gaps).all(), f"{name}: wrote outside the out= view"
        assert_close(layout.take(r), e, dtype, name=name)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_matches_reference(fn, layout, backend, device):
    @hyp_settings(backend)
    @given(data=st.data())
    def run(data):
        run_case(data, fn, layout, backend, device)

    run()


@pytest.mark.parametrize("dtype", VALUE_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_every_value_dtype(fn, dtype, backend, device):
    """Every dtype on every function, whatever the random draws of the test above."""
    layout = LAYOUT_BY_NAME["batch_major"]

    @hyp_settings(backend, 0.3)
    @given(data=st.data())
    def run(data):
        run_case(data, fn, layout, backend, device, dtype=dtype, max_T=16)

    run()


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    "fn", ["gae", "discounted_returns", "vtrace", "retrace", "episodic_cumsum"]
)
def test_every_flag_dtype(fn, flag_dtype, backend, device):
    """Each flag dtype read as it is (with its odd true values): terminated / done always given,
    with a flag set."""
    layout = LAYOUT_BY_NAME["time_major"]

    @hyp_settings(backend, 0.3)
    @given(data=st.data())
    def run(data):
        run_case(
            data, fn, layout, backend, device, dtype=torch.float32, flag_dtype=flag_dtype,
            max_T=16, with_flags=True,
        )  # fmt: skip

    run()


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_auto_backend(fn, device):
    """backend="auto" (Triton on CUDA, torch on CPU) agrees with the reference."""

    @hyp_settings("torch", 0.5)
    @given(data=st.data())
    def run(data):
        run_case(data, fn, LAYOUT_BY_NAME["torchrl"], "auto", device)

    run()


def test_default_backend_is_auto_and_matches_reference(device):
    g = torch.Generator().manual_seed(0)
    r = torch.rand(7, 3, generator=g).to(device)
    v = torch.rand(7, 3, generator=g).to(device)
    term = (torch.rand(7, 3, generator=g) < 0.3).to(device)
    bv = torch.rand(3, generator=g).to(device)
    adv, ret = rtc.gae(r, v, term, bootstrap_value=bv)
    adv_ref, ret_ref = rtc.gae(
        r.double().cpu(),
        v.double().cpu(),
        term.cpu(),
        bootstrap_value=bv.double().cpu(),
        backend="reference",
    )
    assert adv.dtype == torch.float32
    assert_close(adv, adv_ref, torch.float32)
    assert_close(ret, ret_ref, torch.float32)


# ---------------------------------------------------------------- dtype promotion


def test_mixed_value_dtypes_promote(backend, device):
    g = torch.Generator().manual_seed(1)
    r64 = torch.rand(6, 2, generator=g, dtype=torch.float64)
    v64 = torch.rand(6, 2, generator=g, dtype=torch.float64)
    b64 = torch.rand(2, generator=g, dtype=torch.float64)
    for rd, vd in [
        (torch.float16, torch.float32),
        (torch.float32, torch.float64),
        (torch.bfloat16, torch.float16),  # -> float32 (torch.result_type)
    ]:
        want = torch.result_type(torch.empty(0, dtype=rd), torch.empty(0, dtype=vd))
        r, v = r64.to(rd), v64.to(vd)
        adv, ret = rtc.gae(
            r.to(device),
            v.to(device),
            None,
            bootstrap_value=b64.to(vd).to(device),
            backend=backend,
        )
        assert adv.dtype == want and ret.dtype == want, (rd, vd, adv.dtype, ret.dtype)
        adv_ref, ret_ref = rtc.gae(
            r.double(), v.double(), None, bootstrap_value=b64.to(vd).double(), backend="reference"
        )
        assert_close(adv, adv_ref, want, name=f"advantages {rd}+{vd}")
        assert_close(ret, ret_ref, want, name=f"returns {rd}+{vd}")

    a = torch.rand(5, 3, generator=g, dtype=torch.float64)
    b = torch.rand(5, 3, generator=g, dtype=torch.float64)
    x = rtc.linear_scan(a.float().to(device), b.to(device), backend=backend)
    assert x.dtype == torch.float64
    assert_close(x, rtc.linear_scan(a.float().double(), b, backend="reference"), torch.float64)
