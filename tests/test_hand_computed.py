"""Small cases worked out by hand from the formulas of the spec, for every backend.

These do not use the library's reference: they are what validates it. The last test runs the
independent pure-Python oracle of ``_support.py`` against ``backend="reference"`` (and every
other backend) on random inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
from _support import (
    FUNCTIONS,
    LAYOUT_BY_NAME,
    as_tuple,
    build_case,
    call,
    gen_from,
    oracle,
)
from conftest import assert_close, hyp_settings, max_T
from hypothesis import given
from hypothesis import strategies as st

import rl_triton_core as rtc

LN2 = math.log(2.0)

DTYPES = (torch.float64, torch.float32)


@pytest.fixture(params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def dtype(request):
    return request.param


def T_(values, dtype, device):
    return torch.tensor(values, dtype=dtype, device=device)


def F_(values, device):
    return torch.tensor(values, dtype=torch.bool, device=device)


def check(result, expected, dtype):
    result = as_tuple(result)
    assert len(result) == len(expected)
    for k, (r, e) in enumerate(zip(result, expected)):
        assert r.dtype == dtype, f"output {k}: dtype {r.dtype} != {dtype}"
        assert_close(r, torch.tensor(e, dtype=torch.float64), dtype, name=f"output {k}")


# ---------------------------------------------------------------- linear_scan


def test_linear_scan_forward_and_reverse(backend, device, dtype):
    a = T_([0.5, 2.0, 0.0, 1.0], dtype, device)
    b = T_([1.0, 1.0, 1.0, 1.0], dtype, device)
    init = T_(4.0, dtype, device)
    # forward: x0 = .5*4+1 = 3, x1 = 2*3+1 = 7, x2 = 0*7+1 = 1, x3 = 1*1+1 = 2
    check(rtc.linear_scan(a, b, initial=init, backend=backend), [[3, 7, 1, 2]], dtype)
    # reverse: x3 = 1*4+1 = 5, x2 = 0*5+1 = 1, x1 = 2*1+1 = 3, x0 = .5*3+1 = 2.5
    check(
        rtc.linear_scan(a, b, initial=init, reverse=True, backend=backend),
        [[2.5, 3, 1, 5]],
        dtype,
    )
    # no initial = 0: forward 1, 3, 1, 2; reverse 2.5, 3, 1, 1
    check(rtc.linear_scan(a, b, backend=backend), [[1, 3, 1, 2]], dtype)
    check(rtc.linear_scan(a, b, reverse=True, backend=backend), [[2.5, 3, 1, 1]], dtype)


def test_linear_scan_batch_major(backend, device, dtype):
    # two sequences in rows, time along dim 1
    a = T_([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]], dtype, device)
    b = T_([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]], dtype, device)
    init = T_([10.0, 0.0], dtype, device)
    # row 0: cumsum from 10: 11, 13, 16; row 1: 4, 6, 7
    check(
        rtc.linear_scan(a, b, initial=init, time_dim=1, backend=backend),
        [[[11, 13, 16], [4, 6, 7]]],
        dtype,
    )


# ---------------------------------------------------------------- gae


def test_gae_terminated_with_bootstrap(backend, device, dtype):
    r = T_([1.0, 2.0, 3.0], dtype, device)
    v = T_([0.5, 1.0, 1.5], dtype, device)
    term = F_([0, 1, 0], device)
    bv = T_(2.0, dtype, device)
    # nv = [1.0, 1.5 (gated), 2.0]
    # delta = [1 + .9*1 - .5, 2 + 0 - 1, 3 + .9*2 - 1.5] = [1.4, 1.0, 3.3]
    # A2 = 3.3, A1 = 1.0 (cut), A0 = 1.4 + .9*.8*1.0 = 2.12
    res = rtc.gae(r, v, term, bootstrap_value=bv, gamma=0.9, lmbda=0.8, backend=backend)
    check(res, [[2.12, 1.0, 3.3], [2.62, 2.0, 4.8]], dtype)


def test_gae_truncated_with_next_values(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0, 1.0], dtype, device)
    v = T_([0.0, 0.0, 0.0, 0.0], dtype, device)
    nv = T_([2.0, 4.0, 0.0, 8.0], dtype, device)
    trunc = F_([0, 1, 0, 0], device)
    # delta = r + .5 nv - v = [2, 3, 1, 5]; c = [1, 0, 1, 0]; gamma*lambda = .25
    # A3 = 5, A2 = 1 + .25*5 = 2.25, A1 = 3, A0 = 2 + .25*3 = 2.75
    res = rtc.gae(
        r,
        v,
        None,
        truncated=trunc,
        next_values=nv,
        gamma=0.5,
        lmbda=0.5,
        backend=backend,
    )
    check(res, [[2.75, 3.0, 2.25, 5.0], [2.75, 3.0, 2.25, 5.0]], dtype)


def test_gae_per_step_gamma_two_envs(backend, device, dtype):
    r = T_([[1.0, 2.0], [3.0, 4.0]], dtype, device)
    v = T_([[0.0, 0.0], [0.0, 0.0]], dtype, device)
    bv = T_([10.0, 20.0], dtype, device)
    gamma = T_([[0.5, 1.0], [0.1, 0.0]], dtype, device)
    # env0: delta1 = 3 + .1*10 = 4, delta0 = 1 + .5*v1 = 1, A0 = 1 + .5*1*4 = 3
    # env1: delta1 = 4 + 0*20 = 4, delta0 = 2, A0 = 2 + 1*1*4 = 6
    res = rtc.gae(r, v, None, bootstrap_value=bv, gamma=gamma, lmbda=1.0, backend=backend)
    check(res, [[[3.0, 6.0], [4.0, 4.0]], [[3.0, 6.0], [4.0, 4.0]]], dtype)


def test_gae_torchrl_layout(backend, device, dtype):
    # [B=1, T=3, F=1], time_dim=-2; same numbers as test_gae_terminated_with_bootstrap
    r = T_([[[1.0], [2.0], [3.0]]], dtype, device)
    v = T_([[[0.5], [1.0], [1.5]]], dtype, device)
    term = F_([[[0], [1], [0]]], device)
    nv = T_([[[1.0], [123.0], [2.0]]], dtype, device)
    res = rtc.gae(r, v, term, next_values=nv, gamma=0.9, lmbda=0.8, time_dim=-2, backend=backend)
    check(res, [[[[2.12], [1.0], [3.3]]], [[[2.62], [2.0], [4.8]]]], dtype)


# ---------------------------------------------------------------- lambda_returns


def test_lambda_returns_next_values_only(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    nv = T_([2.0, 4.0, 8.0], dtype, device)
    term = F_([0, 0, 1], device)
    # c = [1, 1, 0]
    # G2 = 1 (terminated)
    # G1 = 1 + .5*((1-.5)*4 + .5*1) = 2.25
    # G0 = 1 + .5*(.5*2 + .5*2.25) = 2.0625
    res = rtc.lambda_returns(r, None, term, next_values=nv, gamma=0.5, lmbda=0.5, backend=backend)
    check(res, [[2.0625, 2.25, 1.0]], dtype)


def test_lambda_returns_values_and_bootstrap(backend, device, dtype):
    r = T_([0.0, 0.0, 1.0], dtype, device)
    v = T_([1.0, 2.0, 3.0], dtype, device)
    bv = T_(4.0, dtype, device)
    # nv = [2, 3, 4]; G2 = 1 + 4 = 5; G1 = .5*3 + .5*5 = 4; G0 = .5*2 + .5*4 = 3
    res = rtc.lambda_returns(r, v, None, bootstrap_value=bv, gamma=1.0, lmbda=0.5, backend=backend)
    check(res, [[3.0, 4.0, 5.0]], dtype)


# ---------------------------------------------------------------- discounted_returns


def test_discounted_returns(backend, device, dtype):
    r = T_([1.0, 2.0, 3.0, 4.0], dtype, device)
    term = F_([0, 1, 0, 0], device)
    # no bootstrap (0): G3 = 4, G2 = 3 + .5*4 = 5, G1 = 2, G0 = 1 + .5*2 = 2
    check(rtc.discounted_returns(r, term, gamma=0.5, backend=backend), [[2, 2, 5, 4]], dtype)
    # bootstrap 8: G3 = 4 + 4 = 8, G2 = 3 + 4 = 7
    bv = T_(8.0, dtype, device)
    check(
        rtc.discounted_returns(r, term, bootstrap_value=bv, gamma=0.5, backend=backend),
        [[2, 2, 7, 8]],
        dtype,
    )


def test_discounted_returns_truncated(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    trunc = F_([1, 0, 0], device)
    nv = T_([10.0, 99.0, 6.0], dtype, device)
    # c = [0, 1, 0]: G2 = 1 + .5*6 = 4, G1 = 1 + .5*4 = 3 (nv_1 unused), G0 = 1 + .5*10 = 6
    res = rtc.discounted_returns(
        r,
        None,
        truncated=trunc,
        next_values=nv,
        gamma=0.5,
        backend=backend,
    )
    check(res, [[6.0, 3.0, 4.0]], dtype)


# ---------------------------------------------------------------- vtrace


def test_vtrace_clipping(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    v = T_([1.0, 2.0, 3.0], dtype, device)
    bv = T_(4.0, dtype, device)
    tlp = T_([0.0, 0.0, 0.0], dtype, device)
    blp = T_([LN2, -LN2, 0.0], dtype, device)
    # w = [.5, 2, 1]; rho = kappa = [.5, 1, 1]; nv = [2, 3, 4]; c = [1, 1, 0]; gamma = .5
    # delta = [.5*(1 + 1 - 1), 1*(1 + 1.5 - 2), 1*(1 + 2 - 3)] = [.5, .5, 0]
    # D2 = 0, D1 = .5 + .5*1*0 = .5, D0 = .5 + .5*.5*.5 = .625 ; vs = v + D
    # pg = pg_rho * (r + gamma*u - v), u = [vs1, vs2, nv2] = [2.5, 3, 4]
    #    = [.5*(1 + 1.25 - 1), 1*(1 + 1.5 - 2), 1*(1 + 2 - 3)] = [.625, .5, 0]
    res = rtc.vtrace(r, v, tlp, blp, None, bootstrap_value=bv, gamma=0.5, backend=backend)
    check(res, [[1.625, 2.5, 3.0], [0.625, 0.5, 0.0]], dtype)
    # pg_rho_bar = .25 clips every weight: pg = .25 * [1.25, .5, 0]
    res = rtc.vtrace(
        r,
        v,
        tlp,
        blp,
        None,
        bootstrap_value=bv,
        gamma=0.5,
        pg_rho_bar=0.25,
        backend=backend,
    )
    check(res, [[1.625, 2.5, 3.0], [0.3125, 0.125, 0.0]], dtype)


def test_vtrace_terminated_lambda(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    v = T_([1.0, 2.0, 3.0], dtype, device)
    bv = T_(4.0, dtype, device)
    tlp = T_([0.0, 0.0, 0.0], dtype, device)
    blp = T_([LN2, -LN2, 0.0], dtype, device)
    term = F_([0, 1, 0], device)
    # w = [.5, 2, 1]; rho_bar 1.5 -> rho = [.5, 1.5, 1]; kappa = .5*min(1, w) = [.25, .5, .5]
    # c = [1, 0, 0]; delta = [.5*(1 + .5*2 - 1), 1.5*(1 - 2), 1*(1 + .5*4 - 3)] = [.5, -1.5, 0]
    # D2 = 0, D1 = -1.5, D0 = .5 + .5*.25*(-1.5) = .3125
    # pg (pg_rho_bar defaults to rho_bar): [.5*(1 + .5*vs1 - 1), 1.5*(1 - 2), 1*(1 + 2 - 3)]
    res = rtc.vtrace(
        r,
        v,
        tlp,
        blp,
        term,
        bootstrap_value=bv,
        gamma=0.5,
        lmbda=0.5,
        rho_bar=1.5,
        c_bar=1.0,
        backend=backend,
    )
    check(res, [[1.3125, 0.5, 3.0], [0.125, -1.5, 0.0]], dtype)


# ---------------------------------------------------------------- retrace

# r = 1, q = [1, 2, 2], next_expected_q = [2, 3, 4], gamma = .5, w = [2, .5, 2]
# Q2 = 1 + .5*4 = 3 (window edge)
# Q1 = 1 + .5*(3 + k2*(Q2 - q2)) = 1 + .5*(3 + k2)
# Q0 = 1 + .5*(2 + k1*(Q1 - q1))
RETRACE_CASES = {
    # k = min(1, w) = [1, .5, 1]: Q1 = 3, Q0 = 1 + .5*(2 + .5*1) = 2.25
    "retrace": [2.25, 3.0, 3.0],
    # k = pi(a|s) = [.5, .25, .5]: Q1 = 2.75, Q0 = 1 + .5*(2 + .25*.75) = 2.09375
    "tree_backup": [2.09375, 2.75, 3.0],
    # k = 1: Q1 = 3, Q0 = 1 + .5*(2 + 1) = 2.5
    "q_lambda": [2.5, 3.0, 3.0],
    # k = w = [2, .5, 2]: Q1 = 3.5, Q0 = 1 + .5*(2 + .5*1.5) = 2.375
    "importance_sampling": [2.375, 3.5, 3.0],
}


@pytest.mark.parametrize("trace", list(RETRACE_CASES))
def test_retrace_traces(backend, device, dtype, trace):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    q = T_([1.0, 2.0, 2.0], dtype, device)
    neq = T_([2.0, 3.0, 4.0], dtype, device)
    tlp = T_([math.log(0.5), math.log(0.25), math.log(0.5)], dtype, device)
    blp = T_([math.log(0.25), math.log(0.5), math.log(0.25)], dtype, device)
    res = rtc.retrace(r, q, neq, tlp, blp, None, gamma=0.5, trace=trace, backend=backend)
    check(res, [RETRACE_CASES[trace]], dtype)


def test_retrace_default_trace_is_retrace_and_c_bar(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    q = T_([1.0, 2.0, 2.0], dtype, device)
    neq = T_([2.0, 3.0, 4.0], dtype, device)
    tlp = T_([math.log(0.5), math.log(0.25), math.log(0.5)], dtype, device)
    blp = T_([math.log(0.25), math.log(0.5), math.log(0.25)], dtype, device)
    res = rtc.retrace(r, q, neq, tlp, blp, None, gamma=0.5, backend=backend)
    check(res, [RETRACE_CASES["retrace"]], dtype)
    # c_bar = .4: k2 = .4 -> Q1 = 1 + .5*3.4 = 2.7; k1 = .4 -> Q0 = 1 + .5*(2 + .4*.7) = 2.14
    res = rtc.retrace(r, q, neq, tlp, blp, None, gamma=0.5, c_bar=0.4, backend=backend)
    check(res, [[2.14, 2.7, 3.0]], dtype)
    # lmbda = .5 halves every trace coefficient: k2 = .5 -> Q1 = 2.75; k1 = .25 -> Q0 = 2.09375
    res = rtc.retrace(r, q, neq, tlp, blp, None, gamma=0.5, lmbda=0.5, backend=backend)
    check(res, [[2.09375, 2.75, 3.0]], dtype)


def test_retrace_flags(backend, device, dtype):
    r = T_([1.0, 1.0, 1.0], dtype, device)
    q = T_([1.0, 2.0, 2.0], dtype, device)
    neq = T_([2.0, 3.0, 4.0], dtype, device)
    tlp = T_([0.0, 0.0, 0.0], dtype, device)
    term = F_([0, 0, 1], device)
    trunc = F_([1, 0, 0], device)
    # q_lambda, lambda 1: Q2 = 1 (terminated); Q1 = 1 + .5*(3 + (1 - 2)) = 2;
    # Q0 = 1 + .5*2 = 2 (truncated: bootstrap on next_expected_q, no trace)
    res = rtc.retrace(
        r,
        q,
        neq,
        tlp,
        tlp,
        term,
        truncated=trunc,
        gamma=0.5,
        trace="q_lambda",
        backend=backend,
    )
    check(res, [[2.0, 2.0, 1.0]], dtype)


# ---------------------------------------------------------------- eligibility_traces


def test_eligibility_traces(backend, device, dtype):
    x = T_([1.0, 2.0, 3.0, 4.0], dtype, device)
    done = F_([0, 1, 0, 0], device)
    init = T_(8.0, dtype, device)
    # gamma*lambda = .25: z0 = 1 + .25*8 = 3, z1 = 2 + .25*3 = 2.75, z2 = 3 (done_1),
    # z3 = 4 + .25*3 = 4.75
    res = rtc.eligibility_traces(x, done, gamma=0.5, lmbda=0.5, initial=init, backend=backend)
    check(res, [[3.0, 2.75, 3.0, 4.75]], dtype)


def test_eligibility_traces_per_step_gamma_index(backend, device, dtype):
    # z_t = x_t + gamma_t lambda_t z_{t-1}: the discount of step t (not t-1) multiplies z_{t-1}
    x = T_([1.0, 2.0, 3.0, 4.0], dtype, device)
    gamma = T_([1.0, 0.5, 1.0, 0.1], dtype, device)
    # z0 = 1, z1 = 2 + .5*1 = 2.5, z2 = 3 + 2.5 = 5.5, z3 = 4 + .1*5.5 = 4.55
    res = rtc.eligibility_traces(x, None, gamma=gamma, lmbda=1.0, backend=backend)
    check(res, [[1.0, 2.5, 5.5, 4.55]], dtype)


def test_eligibility_traces_feature_axes(backend, device, dtype):
    # x [T=2, N=1, F=2], done [T, N, 1]
    x = T_([[[1.0, 10.0]], [[2.0, 20.0]]], dtype, device)
    done = F_([[[0]], [[0]]], device)
    res = rtc.eligibility_traces(x, done, gamma=1.0, lmbda=0.5, backend=backend)
    check(res, [[[[1.0, 10.0]], [[2.5, 25.0]]]], dtype)


# ---------------------------------------------------------------- episodic_cumsum


def test_episodic_cumsum(backend, device, dtype):
    x = T_([1.0, 2.0, 3.0, 4.0, 5.0], dtype, device)
    done = F_([0, 0, 1, 0, 1], device)
    init = T_(10.0, dtype, device)
    # s0 = 11, s1 = 13, s2 = 16, s3 = 4 (restart after done_2), s4 = 9
    res = rtc.episodic_cumsum(x, done, initial=init, backend=backend)
    check(res, [[11.0, 13.0, 16.0, 4.0, 9.0]], dtype)
    res = rtc.episodic_cumsum(x, done, backend=backend)
    check(res, [[1.0, 3.0, 6.0, 4.0, 9.0]], dtype)


# ---------------------------------------------------------------- the oracle


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_reference_matches_independent_oracle(fn, backend, device):
    """Random [T, N] float64 inputs: every backend (the reference included) == the oracle."""
    layout = LAYOUT_BY_NAME["time_major"]

    @hyp_settings(backend, 2.0)
    @given(data=st.data())
    def run(data):
        T = data.draw(st.integers(0, max_T(backend, 12)), label="T")
        batch = layout.draw_batch(data.draw)
        gen = gen_from(data.draw)
        case = build_case(fn, data.draw, T, batch, torch.float64, gen)
        expected = oracle(fn, case.inputs, T, batch)
        inputs = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.inputs.items()
        }
        result = as_tuple(call(fn, inputs, backend=backend))
        assert len(result) == len(expected)
        for k, (r, e) in enumerate(zip(result, expected)):
            assert_close(r, e, torch.float64, name=f"{fn} output {k}")

    run()
