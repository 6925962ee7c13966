"""Identities of the spec: estimators that must agree do agree (float64, every backend)."""

from __future__ import annotations

import pytest
import torch
from _support import (
    FUNCTIONS,
    N_OUTPUTS,
    as_tuple,
    build_case,
    call,
    canonical_inputs,
    gen_from,
    kind_of,
)
from conftest import assert_close, hyp_settings, max_T
from hypothesis import given
from hypothesis import strategies as st

import rl_triton_core as rtc

F64 = torch.float64


def hyp(backend, weight=1.0):
    """Decorator: a Hypothesis test with the example count for ``backend``."""

    def deco(fn):
        return hyp_settings(backend, weight)(given(data=st.data())(fn))

    return deco


class Gen:
    """Random float64 tensors and flags drawn from one seeded generator."""

    def __init__(self, data):
        self.draw = data.draw
        self.g = gen_from(data.draw)

    def u(self, *shape, lo=-1.0, hi=1.0):
        return lo + (hi - lo) * torch.rand(shape, generator=self.g, dtype=F64)

    def flags(self, *shape, p=None):
        if p is None:
            p = self.draw(st.sampled_from([0.0, 0.2, 0.5]))
        return torch.rand(shape, generator=self.g) < p

    def gamma(self, T, N):
        if self.draw(st.booleans()):
            return self.draw(st.sampled_from([0.5, 0.9, 0.99, 1.0]))
        return self.u(T, N, lo=0.5, hi=1.0)

    def lmbda(self, T, N):
        if self.draw(st.booleans()):
            return self.draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
        return self.u(T, N, lo=0.0, hi=1.0)


def on(device, *ts):
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in ts)


def consistent_next_values(gen, values, bootstrap, done):
    """next_values with nv_t = values[t+1] wherever c_t = 1 (arbitrary at cuts)."""
    nv = torch.cat([values[1:], bootstrap[None]], 0)
    T = values.shape[0]
    cut = done.clone()
    if T:
        cut[T - 1] = True
    return torch.where(cut, gen.u(*values.shape), nv)


def sizes(data, backend, T=12):
    T = data.draw(st.integers(1, max_T(backend, T)), label="T")
    return T, data.draw(st.integers(1, 4), label="N")


# ---------------------------------------------------------------- GAE / TD(lambda) / TD(1)


def test_gae_lambda_one_returns_equal_discounted_returns(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, bv, term = gen.u(T, N), gen.u(T, N), gen.u(N), gen.flags(T, N)
        gamma = gen.gamma(T, N)
        r, v, bv, term, gamma = on(device, r, v, bv, term, gamma)
        _, ret = rtc.gae(r, v, term, bootstrap_value=bv, gamma=gamma, lmbda=1.0, backend=backend)
        disc = rtc.discounted_returns(r, term, bootstrap_value=bv, gamma=gamma, backend=backend)
        assert_close(ret, disc, F64)

    run()


def test_gae_lambda_one_equals_discounted_returns_with_truncation(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, bv = gen.u(T, N), gen.u(T, N), gen.u(N)
        term, trunc = gen.flags(T, N), gen.flags(T, N)
        nv = consistent_next_values(gen, v, bv, term | trunc)
        gamma = gen.gamma(T, N)
        r, v, nv, term, trunc, gamma = on(device, r, v, nv, term, trunc, gamma)
        kw = dict(truncated=trunc, next_values=nv, gamma=gamma, backend=backend)
        _, ret = rtc.gae(r, v, term, lmbda=1.0, **kw)
        assert_close(ret, rtc.discounted_returns(r, term, **kw), F64)
        # and TD(lambda = 1) is TD(1) for any next values
        assert_close(rtc.lambda_returns(r, v, term, lmbda=1.0, **kw), ret, F64)

    run()


def test_lambda_returns_equal_gae_returns(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, bv = gen.u(T, N), gen.u(T, N), gen.u(N)
        term, trunc = gen.flags(T, N), gen.flags(T, N)
        nv = consistent_next_values(gen, v, bv, term | trunc)
        gamma, lmbda = gen.gamma(T, N), gen.lmbda(T, N)
        r, v, bv, nv, term, trunc, gamma, lmbda = on(
            device, r, v, bv, nv, term, trunc, gamma, lmbda
        )
        kw = dict(gamma=gamma, lmbda=lmbda, backend=backend)
        adv, ret = rtc.gae(r, v, term, truncated=trunc, next_values=nv, **kw)
        assert_close(ret, adv + v, F64, name="returns == advantages + values")
        values_arg = v if data.draw(st.booleans()) else None
        lam = rtc.lambda_returns(r, values_arg, term, truncated=trunc, next_values=nv, **kw)
        assert_close(lam, ret, F64, name="TD(lambda) vs GAE returns (next_values)")
        # bootstrap form: nv_t = values[t+1], bootstrap at the end
        _, ret_b = rtc.gae(r, v, term, bootstrap_value=bv, **kw)
        lam_b = rtc.lambda_returns(r, v, term, bootstrap_value=bv, **kw)
        assert_close(lam_b, ret_b, F64, name="TD(lambda) vs GAE returns (bootstrap)")

    run()


def test_lambda_zero_is_one_step_td(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, nv = gen.u(T, N), gen.u(T, N), gen.u(T, N)
        term, trunc = gen.flags(T, N), gen.flags(T, N)
        gamma = gen.gamma(T, N)
        td = r + gamma * (~term).to(F64) * nv
        r, v, nv, term, trunc, gamma = on(device, r, v, nv, term, trunc, gamma)
        kw = dict(truncated=trunc, next_values=nv, gamma=gamma, lmbda=0.0, backend=backend)
        assert_close(rtc.lambda_returns(r, v, term, **kw), td, F64)
        adv, _ = rtc.gae(r, v, term, **kw)
        assert_close(adv, td - v.cpu(), F64)

    run()


def test_discounted_returns_is_a_reverse_linear_scan(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, bv = gen.u(T, N), gen.u(N)
        g = gen.u(T, N, lo=0.5, hi=1.0)
        r, bv, g = on(device, r, bv, g)
        disc = rtc.discounted_returns(r, None, bootstrap_value=bv, gamma=g, backend=backend)
        scan = rtc.linear_scan(g, r, initial=bv, reverse=True, backend=backend)
        assert_close(disc, scan, F64)
        # a missing bootstrap means 0
        disc0 = rtc.discounted_returns(r, None, gamma=g, backend=backend)
        assert_close(disc0, rtc.linear_scan(g, r, reverse=True, backend=backend), F64)

    run()


# ---------------------------------------------------------------- V-trace


def test_on_policy_vtrace_is_gae(backend, device):
    """target == behaviour, rho_bar = c_bar = 1: vs == GAE(lambda) returns; at lambda = 1,
    vs == discounted returns and pg_advantages == vs - values."""

    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, bv = gen.u(T, N), gen.u(T, N), gen.u(N)
        term = gen.flags(T, N)
        lp = gen.u(T, N, lo=-3.0, hi=0.0)
        gamma, lmbda = gen.gamma(T, N), gen.lmbda(T, N)
        r, v, bv, term, lp, gamma, lmbda = on(device, r, v, bv, term, lp, gamma, lmbda)
        kw = dict(bootstrap_value=bv, gamma=gamma, backend=backend)
        vs, _ = rtc.vtrace(r, v, lp, lp, term, lmbda=lmbda, **kw)
        _, ret = rtc.gae(r, v, term, lmbda=lmbda, **kw)
        assert_close(vs, ret, F64, name="vs vs GAE returns")
        vs1, pg1 = rtc.vtrace(r, v, lp, lp, term, lmbda=1.0, rho_bar=1.0, c_bar=1.0, **kw)
        disc = rtc.discounted_returns(r, term, **kw)
        assert_close(vs1, disc, F64, name="vs vs discounted returns")
        assert_close(pg1, disc - v, F64, name="pg_advantages vs returns - values")

    run()


def test_vtrace_large_clip_thresholds_do_not_clip(backend, device):
    """With rho_bar = c_bar >= max w, V-trace is the unclipped importance-weighted estimator
    (built here from linear_scan: vs_t - V_t = w_t delta_t + gamma lambda w_t (vs_{t+1} -
    V_{t+1})); scaling the thresholds further changes nothing."""

    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, v, bv = gen.u(T, N), gen.u(T, N), gen.u(N)
        tlp = gen.u(T, N, lo=-2.0, hi=0.0)
        blp = tlp - gen.u(T, N, lo=-1.0, hi=0.5)
        r, v, bv, tlp, blp = on(device, r, v, bv, tlp, blp)
        kw = dict(bootstrap_value=bv, gamma=0.9, lmbda=0.9, backend=backend)
        a = rtc.vtrace(r, v, tlp, blp, None, rho_bar=5.0, c_bar=5.0, **kw)  # (w <= e^0.5)
        b = rtc.vtrace(r, v, tlp, blp, None, rho_bar=50.0, c_bar=50.0, **kw)
        for x, y in zip(a, b):
            assert_close(x, y, F64)
        w = torch.exp(tlp - blp)
        v_next = torch.cat([v[1:], bv[None]])
        b_t = w * (r + 0.9 * v_next - v)
        vs = v + rtc.linear_scan(0.81 * w, b_t, reverse=True, backend=backend)
        pg = w * (r + 0.9 * torch.cat([vs[1:], bv[None]]) - v)
        assert_close(a[0], vs, F64, name="vs vs the unclipped estimator")
        assert_close(a[1], pg, F64, name="pg_advantages vs the unclipped estimator")
        c = rtc.vtrace(r, v, tlp, blp, None, rho_bar=0.5, c_bar=0.5, **kw)
        # w > 0.5 somewhere (w >= e^-0.5 > 0.5 wherever the draw is in [-0.5, 0.5]): clipping bites
        assert not torch.allclose(a[0], c[0]) or bool((torch.exp(tlp - blp) <= 0.5).all())

    run()


# ---------------------------------------------------------------- Retrace


def test_retrace_q_lambda_with_lambda_zero_is_expected_sarsa(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, q, neq = gen.u(T, N), gen.u(T, N), gen.u(T, N)
        tlp, blp = gen.u(T, N, lo=-2, hi=0), gen.u(T, N, lo=-2, hi=0)
        term, trunc = gen.flags(T, N), gen.flags(T, N)
        gamma = gen.gamma(T, N)
        want = r + gamma * (~term).to(F64) * neq
        args = on(device, r, q, neq, tlp, blp, term)
        trunc, gamma = on(device, trunc, gamma)
        for trace in ("q_lambda", "retrace", "tree_backup", "importance_sampling"):
            got = rtc.retrace(
                *args, truncated=trunc, gamma=gamma, lmbda=0.0, trace=trace, backend=backend
            )
            assert_close(got, want, F64, name=f"trace={trace}, lambda=0")

    run()


def test_retrace_traces_agree_on_policy(backend, device):
    """w = 1 and c_bar >= 1: retrace == q_lambda == importance_sampling; with pi(a|s) = 1,
    tree_backup == q_lambda too."""

    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        r, q, neq = gen.u(T, N), gen.u(T, N), gen.u(T, N)
        lp = gen.u(T, N, lo=-2, hi=0)
        term, trunc = gen.flags(T, N), gen.flags(T, N)
        gamma, lmbda = gen.gamma(T, N), gen.lmbda(T, N)
        r, q, neq, lp, term, trunc, gamma, lmbda = on(
            device, r, q, neq, lp, term, trunc, gamma, lmbda
        )
        kw = dict(truncated=trunc, gamma=gamma, lmbda=lmbda, backend=backend)
        ql = rtc.retrace(r, q, neq, lp, lp, term, trace="q_lambda", **kw)
        rt = rtc.retrace(r, q, neq, lp, lp, term, trace="retrace", c_bar=1.0, **kw)
        is_ = rtc.retrace(r, q, neq, lp, lp, term, trace="importance_sampling", **kw)
        assert_close(rt, ql, F64, name="retrace vs q_lambda")
        assert_close(is_, ql, F64, name="importance_sampling vs q_lambda")
        zero = torch.zeros_like(lp)
        tb = rtc.retrace(r, q, neq, zero, lp, term, trace="tree_backup", **kw)
        ql0 = rtc.retrace(r, q, neq, zero, lp, term, trace="q_lambda", **kw)
        assert_close(tb, ql0, F64, name="tree_backup(pi=1) vs q_lambda")

    run()


# ---------------------------------------------------------------- forward traces and the scan


def test_linear_scan_reverse_is_flipped_forward(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        a, b, init = gen.u(T, N), gen.u(T, N), gen.u(N)
        a[gen.flags(T, N)] = 0.0
        a, b, init = on(device, a, b, init)
        rev = rtc.linear_scan(a, b, initial=init, reverse=True, backend=backend)
        fwd = rtc.linear_scan(a.flip(0), b.flip(0), initial=init, backend=backend).flip(0)
        assert_close(rev, fwd, F64)

    run()


def test_linear_scan_special_cases(backend, device):
    @hyp(backend, 0.5)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        b, init = gen.u(T, N), gen.u(N)
        b, init = on(device, b, init)
        ones, zeros = torch.ones_like(b), torch.zeros_like(b)
        want = torch.cumsum(b.cpu(), 0) + init.cpu()
        assert_close(rtc.linear_scan(ones, b, initial=init, backend=backend), want, F64)
        x = rtc.linear_scan(zeros, b, initial=init, backend=backend)
        assert torch.equal(x.cpu(), b.cpu()), "a == 0 everywhere must give x == b exactly"

    run()


def test_eligibility_traces_with_unit_discount_is_episodic_cumsum(backend, device):
    @hyp(backend)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        x, init, done = gen.u(T, N, 2), gen.u(N, 2), gen.flags(T, N, 1)
        x, init, done = on(device, x, init, done)
        z = rtc.eligibility_traces(x, done, gamma=1.0, lmbda=1.0, initial=init, backend=backend)
        s = rtc.episodic_cumsum(x, done, initial=init, backend=backend)
        assert_close(z, s, F64)
        # only the product gamma * lambda matters
        g = gen.u(T, N, 1, lo=0.5, hi=1.0).to(device)
        z1 = rtc.eligibility_traces(x, done, gamma=g, lmbda=0.5, backend=backend)
        z2 = rtc.eligibility_traces(x, done, gamma=g * 0.5, lmbda=1.0, backend=backend)
        assert_close(z1, z2, F64)

    run()


def test_episodic_cumsum_without_dones_is_cumsum(backend, device):
    @hyp(backend, 0.5)
    def run(data):
        T, N = sizes(data, backend)
        gen = Gen(data)
        x = gen.u(T, N)
        s = rtc.episodic_cumsum(x.to(device), None, backend=backend)
        assert_close(s, torch.cumsum(x, 0), F64)

    run()


# ---------------------------------------------------------------- episodes are independent


def _slice(fn, inputs, lo, hi):
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and kind_of(fn, k) in ("step", "flag", "param"):
            out[k] = v[lo:hi]
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_concatenated_episodes_equal_separate_episodes(fn, backend, device):
    """A cut at the end of step T1-1 (a done, or a_t = 0 for the scan) splits the computation:
    the whole sequence gives the concatenation of the two halves computed separately."""

    @hyp(backend)
    def run(data):
        T1 = data.draw(st.integers(1, max_T(backend, 16) // 2), label="T1")
        T2 = data.draw(st.integers(1, max_T(backend, 16) // 2), label="T2")
        N = data.draw(st.integers(1, 3), label="N")
        gen = gen_from(data.draw)
        case = build_case(fn, data.draw, T1 + T2, (N,), F64, gen)
        inp = {
            k: (v.clone() if isinstance(v, torch.Tensor) else v)
            for k, v in canonical_inputs(case).items()
        }
        T = T1 + T2
        first_extra, second_extra = {}, {}
        if fn == "linear_scan":
            reverse = inp["reverse"]
            inp["a"][T1 - 1 if reverse else T1] = 0.0
            init = inp.pop("initial", None)
            if init is not None:
                (second_extra if reverse else first_extra)["initial"] = init
        elif fn in ("eligibility_traces", "episodic_cumsum"):
            done = inp.get("done")
            done = torch.zeros(T, N, dtype=torch.bool) if done is None else done
            done[T1 - 1] = True
            inp["done"] = done
            init = inp.pop("initial", None)
            if init is not None:
                first_extra["initial"] = init
        else:
            if fn != "retrace" and "next_values" not in inp:
                if inp.get("values") is not None and "bootstrap_value" in inp:
                    nv = torch.cat([inp["values"][1:], inp["bootstrap_value"][None]], 0)
                else:
                    nv = torch.rand(T, N, generator=gen, dtype=F64)
                inp["next_values"] = nv
            inp.pop("bootstrap_value", None)
            which = data.draw(st.sampled_from(["terminated", "truncated"]), label="cut flag")
            flag = inp.get(which)
            flag = torch.zeros(T, N, dtype=torch.bool) if flag is None else flag
            flag[T1 - 1] = True
            inp[which] = flag
        inp_full = {**inp, **first_extra, **second_extra}

        def run_on(d):
            d = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
            return as_tuple(call(fn, d, backend=backend))

        whole = run_on(inp_full)
        first = run_on({**_slice(fn, inp, 0, T1), **first_extra})
        second = run_on({**_slice(fn, inp, T1, T), **second_extra})
        assert len(whole) == N_OUTPUTS[fn]
        for k in range(N_OUTPUTS[fn]):
            joined = torch.cat([first[k].cpu(), second[k].cpu()], 0)
            assert_close(whole[k], joined, F64, name=f"{fn} output {k} (cut after step {T1 - 1})")

    run()
