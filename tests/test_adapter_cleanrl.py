"""``rl_triton_cleanrl``: the one-call replacement of CleanRL's GAE loop, and its V-trace twin.

* ``compute_gae`` against a verbatim copy of the loop in CleanRL's ``ppo.py`` on random
  rollouts (Hypothesis), every backend, float32 and float64, CleanRL's float ``dones`` and
  other flag dtypes, both shapes of ``next_value``.
* The truncation mode against the same loop with the one change it makes: a truncated step
  bootstraps from ``V(final_obs)`` (and still cuts the trace).
* ``compute_vtrace`` against a sequential V-trace loop written in CleanRL's layout, and on-policy
  against ``compute_gae`` with λ = 1.
* Errors that name the argument; ``max_rel_diff``; ``Stopwatch``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_close, hyp_settings, max_T
from hypothesis import given
from hypothesis import strategies as st

import rl_triton_cleanrl

# --------------------------------------------------------------------------------- the oracles


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's GAE loop (ppo.py, ppo_continuous_action.py), verbatim but for the names of
    ``args.num_steps`` / ``args.gamma`` / ``args.gae_lambda`` and ``device``."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


def cleanrl_gae_bootstrapped(
    rewards, values, dones, next_value, next_done, gamma, gae_lambda, truncated, final_values
):
    """The same loop where a truncated step bootstraps from V(final_obs): the trace is still
    cut at every episode end, but only a termination zeroes the next value."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            ended = next_done
            nextvalues = next_value
        else:
            ended = dones[t + 1]
            nextvalues = values[t + 1]
        nextvalues = torch.where(truncated[t], final_values[t], nextvalues)
        nextnonterminal = 1.0 - ended * (1.0 - truncated[t].to(rewards.dtype))
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * (1.0 - ended) * lastgaelam
    return advantages, advantages + values


def vtrace_loop(
    rewards,
    values,
    target_log_probs,
    behavior_log_probs,
    dones,
    next_value,
    next_done,
    gamma,
    lmbda,
    rho_bar,
    c_bar,
    truncated=None,
    final_values=None,
):
    """V-trace (Espeholt et al. 2018, eq. 1 and the policy-gradient term of section 4.2) as a
    sequential loop over a CleanRL-layout rollout."""
    num_steps = rewards.shape[0]
    if truncated is None:
        truncated = torch.zeros_like(dones, dtype=torch.bool)
        final_values = torch.zeros_like(values)
    w = (target_log_probs - behavior_log_probs).exp()
    rho, c = w.clamp(max=rho_bar), lmbda * w.clamp(max=c_bar)
    ended, nextvalues = [None] * num_steps, [None] * num_steps
    for t in range(num_steps):
        e = next_done if t == num_steps - 1 else dones[t + 1]
        nv = next_value if t == num_steps - 1 else values[t + 1]
        ended[t] = e
        nextvalues[t] = torch.where(truncated[t], final_values[t], nv)
    vs = torch.zeros_like(values)
    acc = torch.zeros_like(values[0])
    for t in reversed(range(num_steps)):
        nonterminal = 1.0 - ended[t] * (1.0 - truncated[t].to(values.dtype))
        delta = rho[t] * (rewards[t] + gamma * nonterminal * nextvalues[t] - values[t])
        acc = delta + gamma * c[t] * (1.0 - ended[t]) * acc
        vs[t] = values[t] + acc
    pg = torch.zeros_like(values)
    for t in range(num_steps):
        nonterminal = 1.0 - ended[t] * (1.0 - truncated[t].to(values.dtype))
        if t < num_steps - 1:
            u = torch.where(ended[t] != 0, nextvalues[t], vs[t + 1])
        else:
            u = nextvalues[t]
        pg[t] = rho[t] * (rewards[t] + gamma * nonterminal * u - values[t])
    return vs, pg


# ------------------------------------------------------------------------------ random rollouts


class Rollout:
    """A random CleanRL-layout rollout ``[T, N]`` drawn from one seeded generator."""

    def __init__(self, data, backend, dtype, T_max=40):
        draw = data.draw
        self.T = draw(st.integers(1, max_T(backend, T_max)), label="T")
        self.N = draw(st.integers(1, 5), label="N")
        self.g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1), label="seed"))
        self.dtype = dtype
        p = draw(st.sampled_from([0.0, 0.1, 0.3, 1.0]), label="p_end")
        shape = (self.T, self.N)
        self.rewards = self.u(*shape)
        self.values = self.u(*shape, scale=5.0)
        # ends[t]: step t ended its episode; CleanRL's dones[t] = ends[t - 1]
        ends = (torch.rand(shape, generator=self.g) < p).to(dtype)
        self.dones = torch.cat((self.u(1, self.N).round().abs().clamp(max=1), ends[:-1]))
        self.next_done = ends[-1].clone()
        self.next_value = self.u(1, self.N, scale=5.0)
        self.truncated = (torch.rand(shape, generator=self.g) < 0.5) & (ends != 0)
        self.final_values = self.u(*shape, scale=5.0)
        self.gamma = draw(st.sampled_from([0.0, 0.9, 0.99, 1.0]), label="gamma")
        self.lmbda = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]), label="lambda")

    def u(self, *shape, scale=1.0):
        return (scale * (2 * torch.rand(shape, generator=self.g, dtype=torch.float64) - 1)).to(
            self.dtype
        )

    def to(self, device):
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self


def hyp(backend, weight=1.0):
    def deco(fn):
        return hyp_settings(backend, weight)(given(data=st.data())(fn))

    return deco


DTYPES = (torch.float32, torch.float64)


# -------------------------------------------------------------------------------- compute_gae


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compute_gae_matches_cleanrl_loop(backend, device, dtype):
    @hyp(backend)
    def check(data):
        r = Rollout(data, backend, dtype).to(device)
        expected = cleanrl_gae(
            r.rewards, r.values, r.dones, r.next_value, r.next_done, r.gamma, r.lmbda
        )
        actual = rl_triton_cleanrl.compute_gae(
            r.rewards, r.values, r.dones, r.next_value, r.next_done, r.gamma, r.lmbda,
            backend=backend,
        )  # fmt: skip
        for name, a, e in zip(("advantages", "returns"), actual, expected):
            assert a.dtype == dtype and a.device == r.rewards.device
            assert_close(a, e, dtype, name=name)

    check()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compute_gae_bootstraps_truncated_steps(backend, device, dtype):
    @hyp(backend)
    def check(data):
        r = Rollout(data, backend, dtype).to(device)
        expected = cleanrl_gae_bootstrapped(
            r.rewards, r.values, r.dones, r.next_value, r.next_done, r.gamma, r.lmbda,
            r.truncated, r.final_values,
        )  # fmt: skip
        actual = rl_triton_cleanrl.compute_gae(
            r.rewards, r.values, r.dones, r.next_value, r.next_done, r.gamma, r.lmbda,
            truncated=r.truncated, final_values=r.final_values, backend=backend,
        )  # fmt: skip
        for name, a, e in zip(("advantages", "returns"), actual, expected):
            assert_close(a, e, dtype, name=name)

    check()


def test_no_truncation_is_cleanrl(backend, device):
    """``truncated`` all false (or the truncated steps' final values equal to a terminal's 0
    contribution) gives CleanRL's numbers."""
    g = torch.Generator().manual_seed(0)
    T, N = 9, 3
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.3).float()
    next_value, next_done = torch.randn(1, N, generator=g), torch.tensor([1.0, 0.0, 0.0])
    args = [x.to(device) for x in (rewards, values, dones, next_value, next_done)]
    expected = cleanrl_gae(*args, 0.99, 0.95)
    no_trunc = torch.zeros(T, N, dtype=torch.bool, device=device)
    actual = rl_triton_cleanrl.compute_gae(
        *args, 0.99, 0.95, truncated=no_trunc, final_values=torch.full((T, N), torch.nan, device=device),
        backend=backend,
    )  # fmt: skip
    for a, e in zip(actual, expected):
        assert_close(a, e, torch.float32)


@pytest.mark.parametrize(
    "flag_dtype", (torch.bool, torch.uint8, torch.int64, torch.float32), ids=str
)
def test_flag_dtypes_and_next_value_shapes(flag_dtype):
    g = torch.Generator().manual_seed(1)
    T, N = 7, 4
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    ends = torch.rand(T + 1, N, generator=g) < 0.3
    next_value = torch.randn(1, N, generator=g)
    expected = cleanrl_gae(rewards, values, ends[:T].float(), next_value, ends[T].float(), 0.9, 0.8)
    for nv in (next_value, next_value.flatten()):
        actual = rl_triton_cleanrl.compute_gae(
            rewards, values, ends[:T].to(flag_dtype), nv, ends[T].to(flag_dtype), 0.9, 0.8,
            backend="torch",
        )  # fmt: skip
        for a, e in zip(actual, expected):
            assert_close(a, e, torch.float32)


def test_trailing_batch_axes():
    """``[T, N, K]`` rollouts (e.g. several reward heads) work like K separate ``[T, N]`` ones."""
    g = torch.Generator().manual_seed(2)
    T, N, K = 6, 3, 2
    rewards, values = torch.randn(T, N, K, generator=g), torch.randn(T, N, K, generator=g)
    dones = (torch.rand(T, N, K, generator=g) < 0.3).float()
    next_value, next_done = torch.randn(N, K, generator=g), torch.zeros(N, K)
    adv, ret = rl_triton_cleanrl.compute_gae(
        rewards, values, dones, next_value, next_done, 0.99, 0.95, backend="torch"
    )
    for k in range(K):
        e_adv, e_ret = cleanrl_gae(
            rewards[..., k], values[..., k], dones[..., k], next_value[:, k], next_done[:, k],
            0.99, 0.95,
        )  # fmt: skip
        assert_close(adv[..., k], e_adv, torch.float32)
        assert_close(ret[..., k], e_ret, torch.float32)


def test_per_env_tensors_keep_their_layout():
    """``next_value`` / ``next_done`` of the environments' shape, size-1 dims aside: ``[N, 1]``
    (a value head's output) is accepted, a ``[K, N]`` for ``[T, N, K]`` rollouts is refused, not
    silently reshaped; ``values`` of ``[T, 1]`` broadcast with ``truncated`` as without it."""
    g = torch.Generator().manual_seed(3)
    T, N, K = 5, 3, 2
    rewards, values = torch.randn(T, N, K, generator=g), torch.randn(T, N, K, generator=g)
    dones, next_value = torch.zeros(T, N, K), torch.randn(N, K, generator=g)
    with pytest.raises(ValueError, match="`next_value` must hold one entry per environment"):
        rl_triton_cleanrl.compute_gae(rewards, values, dones, next_value.T.contiguous(),
                                      torch.zeros(N, K), 0.9, 0.8)  # fmt: skip
    r, v = rewards[..., 0], values[:, :1, 0]
    nv = next_value[:, :1]  # [N, 1]
    want = rl_triton_cleanrl.compute_gae(r, v.expand(T, N), dones[..., 0], nv.flatten(),
                                         torch.zeros(N), 0.9, 0.8, backend="torch")  # fmt: skip
    got = rl_triton_cleanrl.compute_gae(r, v, dones[..., 0], nv, torch.zeros(N, 1), 0.9, 0.8,
                                        backend="torch")  # fmt: skip
    for a, e in zip(got, want):
        assert_close(a, e, torch.float32)
    trunc = torch.zeros(T, N, dtype=torch.bool)
    trunc[2, 1] = True
    kw = dict(truncated=trunc, final_values=torch.randn(T, N, generator=g), backend="torch")
    want = rl_triton_cleanrl.compute_gae(r, v.expand(T, N).clone(), dones[..., 0], nv, torch.zeros(N),
                                         0.9, 0.8, **kw)  # fmt: skip
    got = rl_triton_cleanrl.compute_gae(r, v, dones[..., 0], nv, torch.zeros(N), 0.9, 0.8, **kw)
    for a, e in zip(got, want):
        assert_close(a, e, torch.float32)


def test_empty_rollout():
    z = torch.zeros(0, 3)
    adv, ret = rl_triton_cleanrl.compute_gae(z, z, z, torch.zeros(3), torch.zeros(3), 0.99, 0.95)
    assert adv.shape == ret.shape == (0, 3)


# ------------------------------------------------------------------------------ compute_vtrace


@pytest.mark.parametrize("truncation", (False, True), ids=("cleanrl", "bootstrap"))
def test_compute_vtrace_matches_loop(backend, device, truncation):
    @hyp(backend)
    def check(data):
        r = Rollout(data, backend, torch.float64).to(device)
        tlp = (-r.u(r.T, r.N).abs() * 2).to(device)
        blp = tlp - r.u(r.T, r.N).to(device) * 0.5
        rho_bar = data.draw(st.sampled_from([0.5, 1.0, 2.0]), label="rho_bar")
        c_bar = data.draw(st.sampled_from([0.5, 1.0]), label="c_bar")
        trunc = dict(truncated=r.truncated, final_values=r.final_values) if truncation else {}
        expected = vtrace_loop(
            r.rewards, r.values, tlp, blp, r.dones, r.next_value.flatten(), r.next_done,
            r.gamma, r.lmbda, rho_bar, c_bar, **trunc,
        )  # fmt: skip
        actual = rl_triton_cleanrl.compute_vtrace(
            r.rewards, r.values, tlp, blp, r.dones, r.next_value, r.next_done, r.gamma,
            lmbda=r.lmbda, rho_bar=rho_bar, c_bar=c_bar, backend=backend, **trunc,
        )  # fmt: skip
        for name, a, e in zip(("vs", "pg_advantages"), actual, expected):
            assert_close(a, e, torch.float64, name=name)

    check()


def test_vtrace_on_policy_is_gae_lambda_one(backend, device):
    """With the behaviour policy = the target policy and ρ̄ = c̄ = λ = 1, vs are the returns of
    GAE(λ = 1)."""
    g = torch.Generator().manual_seed(3)
    T, N = 8, 3
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.3).float()
    next_value, next_done = torch.randn(N, generator=g), torch.tensor([0.0, 1.0, 0.0])
    logp = -torch.rand(T, N, generator=g)
    args = [x.to(device) for x in (rewards, values, dones, next_value, next_done)]
    vs, _ = rl_triton_cleanrl.compute_vtrace(
        args[0], args[1], logp.to(device), logp.to(device), *args[2:], 0.99, backend=backend
    )
    _, returns = rl_triton_cleanrl.compute_gae(*args, 0.99, 1.0, backend=backend)
    assert_close(vs, returns, torch.float32)


@pytest.mark.parametrize("fn", ("compute_gae", "compute_vtrace"))
def test_device_computes_there_for_a_cpu_rollout(backend, device, fn):
    """``device=``: a CPU rollout computed on ``device`` (e.g. Triton on CUDA while the networks
    run on the CPU) gives the reference's numbers, handed back on the CPU."""
    g = torch.Generator().manual_seed(5)
    T, N = 11, 3
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    dones = (torch.rand(T, N, generator=g) < 0.3).float()
    tail = [torch.randn(1, N, generator=g), torch.tensor([0.0, 1.0, 0.0]), 0.99]
    trunc = dict(truncated=torch.rand(T, N, generator=g) < 0.2, final_values=values * 2)
    if fn == "compute_gae":
        args = [rewards, values, dones, *tail, 0.95]
    else:
        logp = -torch.rand(2, T, N, generator=g)
        args = [rewards, values, logp[0], logp[1], dones, *tail]
    call = getattr(rl_triton_cleanrl, fn)
    expected = call(*args, **trunc, backend="reference")
    actual = call(*args, **trunc, backend=backend, device=device)
    for a, e in zip(actual, expected):
        assert a.device.type == "cpu"
        assert_close(a, e, torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_device_cuda_without_cuda():
    r = _rollout()
    with pytest.raises(ValueError, match="`device` is cuda but CUDA is not available"):
        rl_triton_cleanrl.compute_gae(*r.values(), 0.99, 0.95, device="cuda")


# ------------------------------------------------------------------------------------ errors


def _rollout(T=5, N=2):
    z = torch.zeros(T, N)
    return dict(rewards=z, values=z, dones=z, next_value=torch.zeros(N), next_done=torch.zeros(N))


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(dones=np.zeros((5, 2))), TypeError, "`dones` must be a torch.Tensor"),
        (dict(rewards=[0.0] * 5), TypeError, "`rewards` must be a torch.Tensor"),
        (dict(next_done=False), TypeError, "`next_done` must be a torch.Tensor"),
        (dict(rewards=torch.tensor(0.0)), ValueError, "`rewards` must be time-major"),
        (dict(dones=torch.zeros(5, 3)), ValueError, "`dones` must have the shape of `rewards`"),
        (dict(next_value=torch.zeros(3)), ValueError, "`next_value` must hold one entry"),
        (dict(next_done=torch.zeros(2, 2)), ValueError, "`next_done` must hold one entry"),
        (dict(values=torch.zeros(4, 2)), ValueError, "values"),
        (
            dict(
                values=torch.zeros(4, 2),
                truncated=torch.zeros(5, 2),
                final_values=torch.zeros(5, 2),
            ),
            ValueError,
            "`values` must have the shape of `rewards`",
        ),
        (
            dict(next_value=torch.zeros(2, dtype=torch.int64)),
            TypeError,
            "`next_value` must be a floating",
        ),
        (
            dict(
                next_value=torch.zeros(2, dtype=torch.int64),
                truncated=torch.zeros(5, 2),
                final_values=torch.zeros(5, 2),
            ),
            TypeError,
            "`next_value` must be a floating",
        ),
        (dict(dones=torch.zeros(5, 2, dtype=torch.complex64)), TypeError, "`dones` must be a bool"),
        (dict(truncated=torch.zeros(5, 2)), ValueError, "`truncated` needs `final_values`"),
        (
            dict(truncated=torch.zeros(5, 1), final_values=torch.zeros(5, 2)),
            ValueError,
            "`truncated` must have the shape",
        ),
        (
            dict(truncated=torch.zeros(5, 2), final_values=torch.zeros(5)),
            ValueError,
            "`final_values` must have the shape",
        ),
        (
            dict(truncated=torch.zeros(5, 2), final_values=np.zeros((5, 2))),
            TypeError,
            "`final_values` must be a torch.Tensor",
        ),
        (dict(backend="cuda"), ValueError, "backend"),
        (dict(device="gpu0"), ValueError, "`device` must name a torch device, got 'gpu0'"),
        (dict(next_value=torch.zeros(2, device="meta")), ValueError, "`next_value` is on meta"),
        (
            dict(truncated=np.zeros((5, 2)), final_values=torch.zeros(5, 2)),
            TypeError,
            "`truncated` must be a torch.Tensor",
        ),
    ],
)
@pytest.mark.parametrize("fn", ("compute_gae", "compute_vtrace"))
def test_errors_name_the_argument(fn, change, error, match):
    kw = _rollout() | change
    positional = [kw.pop(k) for k in ("rewards", "values", "dones", "next_value", "next_done")]
    if fn == "compute_gae":
        call = lambda: rl_triton_cleanrl.compute_gae(*positional, 0.99, 0.95, **kw)
    else:
        lp = torch.zeros(5, 2)
        call = lambda: rl_triton_cleanrl.compute_vtrace(
            *positional[:2], lp, lp, *positional[2:], 0.99, **kw
        )
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------- small helpers


def test_max_rel_diff():
    e = torch.tensor([1.0, -4.0, 2.0])
    assert rl_triton_cleanrl.max_rel_diff(e, e) == 0.0
    assert rl_triton_cleanrl.max_rel_diff(e + torch.tensor([0.0, 0.0, 0.4]), e) == pytest.approx(
        0.1
    )
    pair = rl_triton_cleanrl.max_rel_diff((e, e * 1.5), (e, e))
    assert pair == pytest.approx(0.5)
    # one scale for all outputs: an advantage error of 1e-3 next to returns of 100 is 1e-5
    advantages, returns = torch.tensor([1e-3, -2e-3]), torch.tensor([100.0, 50.0])
    got = rl_triton_cleanrl.max_rel_diff((advantages + 1e-3, returns), (advantages, returns))
    assert got == pytest.approx(1e-5)
    assert rl_triton_cleanrl.max_rel_diff((advantages, returns + 1), (advantages, returns)) == (
        pytest.approx(0.01)
    )
    assert np.isnan(rl_triton_cleanrl.max_rel_diff(torch.tensor([np.nan]), torch.tensor([1.0])))
    assert rl_triton_cleanrl.max_rel_diff(torch.zeros(0), torch.zeros(0)) == 0.0
    inf = torch.tensor([np.inf, -np.inf, 2.0])  # equal infinities differ by 0, not by NaN,
    assert rl_triton_cleanrl.max_rel_diff(inf, inf) == 0.0  # and leave the scale finite
    assert rl_triton_cleanrl.max_rel_diff(inf + torch.tensor([0.0, 0.0, 1.0]), inf) == 0.5
    shifted = e + torch.tensor([0.0, 0.0, 0.4])  # (an inf in another output: the same)
    got = rl_triton_cleanrl.max_rel_diff((inf[:1], shifted), (inf[:1], e))
    assert got == pytest.approx(0.1)
    assert rl_triton_cleanrl.max_rel_diff(inf.flip(0), inf) == np.inf
    assert rl_triton_cleanrl.max_rel_diff(torch.tensor([np.inf]), torch.tensor([1.0])) == np.inf
    with pytest.raises(ValueError, match="shapes differ"):
        rl_triton_cleanrl.max_rel_diff(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="2 `actual` tensors but 1"):
        rl_triton_cleanrl.max_rel_diff((e, e), (e,))


def test_stopwatch(device):
    with rl_triton_cleanrl.Stopwatch(device) as sw:
        torch.ones(4, device=device).sum()
    assert sw.seconds > 0


def test_shadow_check(backend, device):
    """``shadow_check`` recomputes a call with the reference backend (on the CPU) and returns
    the largest relative difference: tiny for float32 outputs of any backend."""
    g = torch.Generator().manual_seed(4)
    T, N = 12, 3
    rollout = [torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)]
    rollout += [(torch.rand(T, N, generator=g) < 0.2).float()]
    rollout += [torch.randn(1, N, generator=g), torch.zeros(N)]
    rollout = [x.to(device) for x in rollout]
    trunc = dict(truncated=rollout[2] > 0, final_values=rollout[1] * 2)
    outputs = rl_triton_cleanrl.compute_gae(*rollout, 0.99, 0.95, **trunc, backend=backend)
    diff = rl_triton_cleanrl.shadow_check(outputs, rl_triton_cleanrl.compute_gae, *rollout, 0.99, 0.95, **trunc)  # fmt: skip
    assert 0 <= diff < 1e-5
    wrong = (outputs[0] + 1, outputs[1])
    assert rl_triton_cleanrl.shadow_check(wrong, rl_triton_cleanrl.compute_gae, *rollout, 0.99, 0.95, **trunc) > 0.01  # fmt: skip
    with pytest.raises(ValueError, match="do not pass `backend`"):
        rl_triton_cleanrl.shadow_check(outputs, rl_triton_cleanrl.compute_gae, *rollout, 0.99, 0.95, backend="torch")  # fmt: skip
