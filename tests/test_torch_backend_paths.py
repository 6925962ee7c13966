"""The CPU paths of ``backend="torch"`` against the float64 reference backend.

The torch backend picks, per problem, between one chunk (the per-step tensors used as they
are) and cache-sized time chunks with a carry, and per chunk between a dense transfer-matrix
scan, a blocked scan, a sequential one and its numpy twin, each first unguarded and redone
guarded when the result has a non-finite value. Short GAE problems go to numpy before all that
(``_gae_small``; its own tests: test_torch_backend_small_gae.py). Small test problems all take
the one-chunk dense path, so each regime is forced here by shrinking the module's thresholds
(and the regimes of the engine turn ``_gae_small`` off). Outputs are NaN-poisoned ``out=``
tensors, so a row a path forgets to write fails.
"""

from __future__ import annotations

import pytest
import torch

import rl_triton_core as rtc
from rl_triton_core import torch_backend as tb

# regime -> threshold overrides (module attributes of rl_triton_core.torch_backend)
NUMPY = {"DENSE_MAX_ELEMENTS": 0, "BLOCKED_MIN_STEPS": 10**9, "NUMPY_MIN_WIDTH": 1}
REGIMES = {
    "one-chunk-dense": {},
    "one-chunk-sequential": {"DENSE_MAX_ELEMENTS": 0, "BLOCKED_MIN_STEPS": 10**9},
    "one-chunk-blocked": {"DENSE_MAX_ELEMENTS": 0, "BLOCKED_MIN_STEPS": 4},
    "one-chunk-numpy": NUMPY,
    # many steps, rows too wide for the blocked scan: numpy as well
    "one-chunk-numpy-wide": {
        "DENSE_MAX_ELEMENTS": 0,
        "BLOCKED_MIN_STEPS": 4,
        "BLOCKED_MAX_WIDTH": 0,
        "NUMPY_MIN_WIDTH": 1,
    },
    "chunks-dense": {"CHUNK_ELEMENTS": 12},
    "chunks-sequential": {
        "CHUNK_ELEMENTS": 12,
        "DENSE_MAX_ELEMENTS": 0,
        "BLOCKED_MIN_STEPS": 10**9,
    },
    "chunks-blocked": {"CHUNK_ELEMENTS": 40, "DENSE_MAX_ELEMENTS": 0, "BLOCKED_MIN_STEPS": 4},
    "chunks-numpy": {"CHUNK_ELEMENTS": 12, **NUMPY},
    # GAE of short problems in numpy, before the engine (every shape here; the other
    # regimes turn it off so that their GAE calls reach the engine)
    "small-gae-numpy": {"SMALL_GAE_MAX_STEPS": 10**9},
}
SHAPES = [(1, 3), (2, 1), (7, 3), (16, 1), (33, 2)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.fixture(params=list(REGIMES))
def regime(request, monkeypatch):
    numpy_limit = 0 if "numpy" not in request.param else 10**9
    monkeypatch.setattr(tb, "NUMPY_MAX_ELEMENTS", numpy_limit)
    monkeypatch.setattr(tb, "NUMPY_MAX_WIDTH", numpy_limit)
    monkeypatch.setattr(tb, "SMALL_GAE_MAX_STEPS", 0)
    for name, value in REGIMES[request.param].items():
        monkeypatch.setattr(tb, name, value)
    return request.param


def _inputs(T: int, N: int, dtype: torch.dtype, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def randn():
        return torch.randn(T, N, generator=g, dtype=torch.float64).to(dtype)

    def flags(p):
        return torch.rand(T, N, generator=g) < p

    return dict(
        rewards=randn(),
        values=randn(),
        next_values=randn(),
        terminated=flags(0.2),
        truncated=flags(0.15),
        bootstrap=torch.randn(N, generator=g, dtype=torch.float64).to(dtype),
        gamma=(0.8 + 0.2 * torch.rand(T, 1, generator=g, dtype=torch.float64)).to(dtype),
        log_probs=(-torch.rand(T, N, generator=g, dtype=torch.float64)).to(dtype),
        other_log_probs=(-torch.rand(T, N, generator=g, dtype=torch.float64)).to(dtype),
        a=torch.rand(T, N, generator=g, dtype=torch.float64).to(dtype),
    )


def _poisoned(like: torch.Tensor, n: int, poison: float = float("nan")) -> tuple[torch.Tensor, ...]:
    return tuple(torch.full_like(like, poison) for _ in range(n))


def _check(fn, n_out: int, like: torch.Tensor, poison: float = float("nan"), **kwargs):
    """Run ``fn`` with the torch backend into poisoned outputs (NaN, or ``poison`` where NaN is
    an expected result) and compare with the reference backend (float64 inside; its result
    cast to the outputs' dtype), which is returned."""
    out = _poisoned(like, n_out, poison)
    fn(backend="torch", out=out if n_out > 1 else out[0], **kwargs)
    want = fn(backend="reference", **kwargs)
    want = want if isinstance(want, tuple) else (want,)
    tol = {
        torch.float64: 1e-9,
        torch.float32: 2e-5,
        torch.float16: 4e-3,
        torch.bfloat16: 3e-2,
    }[like.dtype]
    for got, ref in zip(out, want, strict=True):
        torch.testing.assert_close(got, ref.to(got.dtype), atol=tol, rtol=tol, equal_nan=True)
    return want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("variant", ["bootstrap", "next_values", "truncated+tensor_gamma"])
def test_gae_paths(regime, T, N, dtype, variant):
    x = _inputs(T, N, dtype, seed=T * 100 + N)
    kwargs = dict(rewards=x["rewards"], values=x["values"], terminated=x["terminated"])
    if variant == "bootstrap":
        kwargs.update(bootstrap_value=x["bootstrap"], gamma=0.97, lmbda=0.9)
    elif variant == "next_values":
        kwargs.update(next_values=x["next_values"], gamma=0.99, lmbda=0.95)
    else:
        kwargs.update(
            truncated=x["truncated"],
            next_values=x["next_values"],
            gamma=x["gamma"],
            lmbda=0.9,
        )
    _check(rtc.gae, 2, x["rewards"], **kwargs)


# the engine's numpy scan multiplies an infinite carry by a zero coefficient in its unguarded
# pass (then redone guarded) and numpy warns; _gae_small switches the warnings off
@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
@pytest.mark.parametrize("T,N", SHAPES)
def test_gae_nan_locality(regime, T, N):
    """NaNs and infinities in next_values: dropped where a cut or a terminated gate
    multiplies them by an exact zero, propagated elsewhere (the guarded re-run). Outputs are
    poisoned with a finite value: NaN is an expected result here."""
    x = _inputs(T, N, torch.float32, seed=7 + T)
    g = torch.Generator().manual_seed(T * N)
    nan_at = torch.rand(T, N, generator=g) < 0.1
    bad = torch.where(torch.rand(T, N, generator=g) < 0.5, float("nan"), float("inf"))
    gated = nan_at & (torch.rand(T, N, generator=g) < 0.7)  # most sit behind a terminated
    # gate, the others reach the scan (0 · inf at a cut); whatever the draws, one of each
    # (T * N > 1): reaching it at the last step of sequence 0, gated at step 0 of the last one
    nan_at[-1, 0] = nan_at[0, -1] = gated[0, -1] = True
    gated[-1, 0] = False
    next_values = torch.where(nan_at, bad, x["next_values"])
    terminated = (x["terminated"] | gated) & ~(nan_at & ~gated)
    kwargs = dict(
        rewards=x["rewards"],
        values=x["values"],
        terminated=terminated,
        truncated=x["truncated"],
        next_values=next_values,
        gamma=0.99,
        lmbda=0.95,
    )
    advantages = _check(rtc.gae, 2, x["rewards"], poison=1e30, **kwargs)[0]
    assert not advantages[-1, 0].isfinite() and advantages[0, -1].isfinite()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("T,N", SHAPES)
def test_other_estimators_paths(regime, T, N, dtype):
    """The estimators sharing the engine and its row helpers, in the same regimes."""
    x = _inputs(T, N, dtype, seed=T + 31 * N)
    r, v, term, trunc, nv = (
        x["rewards"],
        x["values"],
        x["terminated"],
        x["truncated"],
        x["next_values"],
    )
    for reverse in (False, True):
        _check(rtc.linear_scan, 1, r, a=x["a"], b=r, initial=x["bootstrap"], reverse=reverse)
    for nexts in (
        dict(bootstrap_value=x["bootstrap"]),
        dict(truncated=trunc, next_values=nv, gamma=x["gamma"]),
    ):
        _check(rtc.lambda_returns, 1, r, rewards=r, values=v, terminated=term, **nexts)
    _check(rtc.discounted_returns, 1, r, rewards=r, terminated=term, bootstrap_value=x["bootstrap"])
    _check(
        rtc.discounted_returns, 1, r, rewards=r, terminated=term, truncated=trunc, next_values=nv
    )
    _check(
        rtc.vtrace,
        2,
        r,
        rewards=r,
        values=v,
        target_log_probs=x["log_probs"],
        behavior_log_probs=x["other_log_probs"],
        terminated=term,
        truncated=trunc,
        next_values=nv,
    )
    for trace in ("retrace", "tree_backup", "q_lambda", "importance_sampling"):
        _check(
            rtc.retrace,
            1,
            r,
            rewards=r,
            q_values=v,
            next_expected_q=nv,
            target_log_probs=x["log_probs"],
            behavior_log_probs=x["other_log_probs"],
            terminated=term,
            truncated=trunc,
            trace=trace,
        )
    _check(rtc.eligibility_traces, 1, r, x=r, done=term, initial=x["bootstrap"])
    _check(rtc.episodic_cumsum, 1, r, x=r, done=term)


@pytest.mark.parametrize("T,N", SHAPES)
def test_no_flags_paths(regime, T, N):
    """No flag at all (``terminated`` / ``done`` None): the chunks before the last have no
    keep mask (None), which V-trace's outputs pass read (a TypeError before)."""
    x = _inputs(T, N, torch.float32, seed=T + 7 * N)
    r, v, boot = x["rewards"], x["values"], x["bootstrap"]
    logp = dict(target_log_probs=x["log_probs"], behavior_log_probs=x["other_log_probs"])
    _check(rtc.gae, 2, r, rewards=r, values=v, terminated=None, bootstrap_value=boot)
    _check(rtc.lambda_returns, 1, r, rewards=r, values=v, terminated=None, bootstrap_value=boot)
    _check(rtc.discounted_returns, 1, r, rewards=r, terminated=None, bootstrap_value=boot)
    _check(rtc.vtrace, 2, r, rewards=r, values=v, terminated=None, bootstrap_value=boot, **logp)
    for trace in ("retrace", "importance_sampling"):
        _check(
            rtc.retrace, 1, r, rewards=r, q_values=v, next_expected_q=x["next_values"],
            terminated=None, trace=trace, **logp,
        )  # fmt: skip
    _check(rtc.eligibility_traces, 1, r, x=r, done=None, initial=boot)
    _check(rtc.episodic_cumsum, 1, r, x=r, done=None)


def test_long_horizon_float32_paths(regime):
    """float32 calls with a long horizon (gamma = 0.9995, lambda = 1, over 300 steps)
    accumulate in float64 (``_dispatch.accumulates_in_float64``) in every regime: float64
    arithmetic beside float32 outputs, rounded once at the write; within 1e-6 of float64
    (float32 accumulation drifts past that here)."""
    T, N = 300, 2
    g = torch.Generator().manual_seed(5)
    r = 0.5 + 0.5 * torch.rand(T, N, generator=g, dtype=torch.float64)  # no cancellation
    v = torch.rand(T, N, generator=g, dtype=torch.float64)
    term = torch.zeros(T, N, dtype=torch.bool)
    boot = torch.rand(N, generator=g, dtype=torch.float64)
    calls = [
        (rtc.gae, 2, dict(rewards=r, values=v, terminated=term, bootstrap_value=boot, lmbda=1.0)),
        (rtc.lambda_returns, 1, dict(rewards=r, values=v, terminated=term, bootstrap_value=boot,
                                     lmbda=1.0)),
        (rtc.discounted_returns, 1, dict(rewards=r, terminated=term, bootstrap_value=boot)),
        (rtc.vtrace, 2, dict(rewards=r, values=v, target_log_probs=-r, behavior_log_probs=-r,
                             terminated=term, bootstrap_value=boot)),
        (rtc.eligibility_traces, 1, dict(x=r, done=term, lmbda=1.0)),
    ]  # fmt: skip
    for fn, n_out, kw in calls:
        want = fn(**kw, gamma=0.9995, backend="reference")
        f32 = {k: x.float() if x.is_floating_point() else x for k, x in kw.items()
               if isinstance(x, torch.Tensor)}  # fmt: skip
        f32.update({k: x for k, x in kw.items() if not isinstance(x, torch.Tensor)})
        out = _poisoned(r.float(), n_out)
        fn(**f32, gamma=0.9995, backend="torch", out=out if n_out > 1 else out[0])
        for got, ref in zip(out, want if isinstance(want, tuple) else (want,), strict=True):
            err = ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1.0)).item()
            assert err <= 1e-6, f"{fn.__name__} ({regime}): max relative error {err:.3g}"
