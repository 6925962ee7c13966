"""The TorchRL adapter (``rl_triton_torchrl``): TorchRL's own estimators and ours on the same
tensordicts, the switch (enable/disable/context/environment variable), the fallback, the
explicit classes, Retrace, and ClipPPOLoss with and without the switch.

TorchRL's reference is its Python-loop code (``vectorized=False``): its vectorised GAE and
TD(λ) truncate their geometric filters near 1e-7. Tests take the ``device`` fixture, so on a
CUDA machine the same comparisons run on the Triton kernels (``backend="auto"``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_close
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch.distributions import Categorical
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss, ValueEstimators
from torchrl.objectives.value import (
    GAE,
    MultiAgentGAE,
    TD1Estimator,
    TDLambdaEstimator,
    VTrace,
)
from torchrl.objectives.value import advantages as torchrl_advantages
from torchrl.objectives.value import functional as torchrl_functional

import rl_triton_core as rtc
import rl_triton_torchrl as rtt
from rl_triton_torchrl import _functional
from rl_triton_torchrl.__main__ import main

ORIGINALS = {name: getattr(torchrl_advantages, name) for name in _functional.NAMES}
OBS, N_ACTIONS = 4, 3

# (tensordict batch shape, time dim): time last, first and in the middle; one to three batch dims
LAYOUTS = [((9,), 0), ((3, 9), 1), ((2, 3, 7), 2), ((9, 3), 0), ((2, 8, 3), 1)]


@pytest.fixture(autouse=True)
def _restore():
    """Every test starts and ends with TorchRL untouched and no fallback warned yet."""
    rtt.disable()
    _functional._warned.clear()
    yield
    rtt.disable()
    _functional._warned.clear()
    assert all(getattr(torchrl_advantages, n) is f for n, f in ORIGINALS.items())


@pytest.fixture
def core_calls(monkeypatch):
    """Counts the ``rl_triton_core`` calls made by the adapter, per function."""
    calls = {}
    for name in ("gae", "lambda_returns", "discounted_returns", "vtrace", "retrace"):
        fn = getattr(rtc, name)

        def spy(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(rtc, name, spy)
    return calls


def rollout(shape, device, *, features=1, seed=0, obs=False, steps=False):
    """A TorchRL rollout ``[*shape]`` (any dim may be time): state values, rewards,
    terminations and truncations (``done = terminated | truncated``), optionally observations
    and ``steps_to_next_obs`` (a per-step discount ``gamma ** steps``)."""
    g = torch.Generator().manual_seed(seed)
    shape = tuple(shape)
    step = (*shape, features)
    terminated = torch.rand(step, generator=g) < 0.15
    truncated = torch.rand(step, generator=g) < 0.15
    data = {
        "state_value": torch.randn(step, generator=g),
        "next": {
            "state_value": torch.randn(step, generator=g),
            "reward": torch.randn(step, generator=g),
            "done": terminated | truncated,
            "terminated": terminated,
        },
    }
    if obs:
        data["observation"] = torch.randn((*shape, OBS), generator=g)
        data["next"]["observation"] = torch.randn((*shape, OBS), generator=g)
        data["action"] = torch.randint(N_ACTIONS, shape, generator=g)
    if steps:
        data["steps_to_next_obs"] = torch.randint(1, 4, step, generator=g)
    return TensorDict(data, batch_size=shape).to(device)


def compare(estimator, td, keys=("advantage", "value_target"), reference=None, **call):
    """Run ``reference`` (default: ``estimator``) without the switch and ``estimator`` with it
    on copies of ``td``; the outputs must agree. Returns our output tensordict."""
    expected = (reference or estimator)(td.clone(), **call)
    with rtt.enabled():
        actual = estimator(td.clone(), **call)
    for key in keys:
        assert_close(actual[key], expected[key], torch.float32, name=str(key))
    return actual


def estimator_for(cls, time_dim, ndim, **kwargs):
    """``cls(...)`` told the time dim when it is not the last."""
    if time_dim != ndim - 1:
        kwargs["time_dim"] = time_dim
    return cls(value_network=None, **kwargs)


# ----------------------------------------------------------------------------------------------
# TorchRL's estimators vs ours on the same tensordicts
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,time_dim", LAYOUTS)
@pytest.mark.parametrize("vectorized", [False, True])
@pytest.mark.parametrize("features", [1, 3])
def test_gae(device, core_calls, shape, time_dim, vectorized, features):
    td = rollout(shape, device, features=features)
    ours = estimator_for(GAE, time_dim, len(shape), gamma=0.97, lmbda=0.9, vectorized=vectorized)
    loop = estimator_for(GAE, time_dim, len(shape), gamma=0.97, lmbda=0.9, vectorized=False)
    compare(ours, td, reference=loop)
    assert core_calls == {"gae": 1}


@pytest.mark.parametrize("shape,time_dim", LAYOUTS[1:4])
@pytest.mark.parametrize("vectorized", [False, True])
def test_td_lambda(device, core_calls, shape, time_dim, vectorized):
    td = rollout(shape, device, features=2, seed=1)
    make = lambda v: estimator_for(
        TDLambdaEstimator, time_dim, len(shape), gamma=0.95, lmbda=0.7, vectorized=v
    )
    compare(make(vectorized), td, reference=make(False))
    assert core_calls == {"lambda_returns": 1}


@pytest.mark.parametrize("shape,time_dim", LAYOUTS[1:4])
def test_td1(device, core_calls, shape, time_dim):
    td = rollout(shape, device, features=2, seed=2)
    compare(estimator_for(TD1Estimator, time_dim, len(shape), gamma=0.9), td)
    assert core_calls == {"discounted_returns": 1}


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (GAE, dict(lmbda=0.9, vectorized=False)),
        (GAE, dict(lmbda=0.9, vectorized=True)),
        (TDLambdaEstimator, dict(lmbda=0.8, vectorized=False)),
        (TDLambdaEstimator, dict(lmbda=0.8, vectorized=True)),
        (TD1Estimator, {}),
    ],
)
def test_per_step_gamma(device, core_calls, cls, kwargs):
    """``steps_to_next_obs`` turns gamma into a per-step tensor ``gamma ** steps``."""
    td = rollout((3, 8), device, seed=3, steps=True)
    if cls is TD1Estimator:  # TD(1) has no loop version: TD(λ=1)'s loop is its reference
        reference = TDLambdaEstimator(value_network=None, gamma=0.9, lmbda=1.0, vectorized=False)
    else:
        reference = cls(value_network=None, gamma=0.9, **{**kwargs, "vectorized": False})
    compare(cls(value_network=None, gamma=0.9, **kwargs), td, reference=reference)
    assert sum(core_calls.values()) == 1


def test_per_step_gamma_and_lambda_functional(device, core_calls):
    """TorchRL's functions called directly: gamma and lambda per step and per feature."""
    g = torch.Generator().manual_seed(4)
    shape = (2, 7, 3)
    r, v, nv = (torch.randn(shape, generator=g).to(device) for _ in range(3))
    term = (torch.rand(shape, generator=g) < 0.2).to(device)
    done = term | (torch.rand(shape, generator=g) < 0.2).to(device)
    gamma = torch.rand(shape, generator=g).to(device)
    lmbda = torch.rand((2, 7, 1), generator=g).to(device)
    adv0, ret0 = torchrl_functional.generalized_advantage_estimate(
        gamma, lmbda, v, nv, r, done, term, time_dim=1
    )
    lr0 = torchrl_functional.td_lambda_return_estimate(gamma, lmbda, nv, r, done, term, time_dim=1)
    with rtt.enabled():
        adv, ret = torchrl_advantages.generalized_advantage_estimate(
            gamma, lmbda, v, nv, r, done, term, time_dim=1
        )
        lr = torchrl_advantages.td_lambda_return_estimate(
            gamma, lmbda, nv, r, done, term, time_dim=1
        )
    assert core_calls == {"gae": 1, "lambda_returns": 1}  # served, not left to TorchRL
    assert_close(adv, adv0, torch.float32)
    assert_close(ret, ret0, torch.float32)
    assert_close(lr, lr0, torch.float32)


def categorical_actor(device):
    torch.manual_seed(0)
    logits = TensorDictModule(
        torch.nn.Linear(OBS, N_ACTIONS), in_keys=["observation"], out_keys=["logits"]
    )
    return ProbabilisticActor(
        logits, in_keys=["logits"], distribution_class=Categorical, return_log_prob=True
    ).to(device)


@pytest.mark.parametrize("shape,time_dim", [((3, 8), 1), ((8, 2), 0)])
def test_vtrace(device, core_calls, shape, time_dim):
    td = rollout(shape, device, seed=5, obs=True)
    actor = categorical_actor(device)
    vtrace = estimator_for(
        VTrace, time_dim, len(shape), gamma=0.95, actor_network=actor, rho_thresh=1.2, c_thresh=0.9
    )
    td[vtrace.tensor_keys.sample_log_prob] = -torch.rand(shape, device=device) * 2
    compare(vtrace, td)
    assert core_calls == {"vtrace": 1}


@pytest.mark.parametrize("with_terminated", [True, False])
def test_vtrace_functional(device, core_calls, with_terminated):
    """Multi-dim values, tensor thresholds, and ``terminated=None`` (it defaults to ``done``)."""
    g = torch.Generator().manual_seed(6)
    shape = (3, 9, 2)
    log_pi, log_mu, v, nv, r = (torch.randn(shape, generator=g).to(device) for _ in range(5))
    term = (torch.rand(shape, generator=g) < 0.2).to(device)
    done = term | (torch.rand(shape, generator=g) < 0.2).to(device)
    term = term if with_terminated else None
    args = (0.9, log_pi, log_mu, v, nv, r, done, term, torch.tensor(1.5), 0.8)
    expected = torchrl_functional.vtrace_advantage_estimate(*args, time_dim=-2)
    with rtt.enabled():
        actual = torchrl_advantages.vtrace_advantage_estimate(*args, time_dim=-2)
    assert core_calls == {"vtrace": 1}
    for a, e, name in zip(actual, expected, ("advantages", "vs")):
        assert_close(a, e, torch.float32, name=name)


def test_multi_agent_gae(device, core_calls):
    """MultiAgentGAE (a GAE subclass) broadcasts team rewards over agents: served in place."""
    td = rollout((2, 8), device, seed=7)
    td["state_value"] = torch.randn(2, 8, 4, 1, device=device)
    td["next", "state_value"] = torch.randn(2, 8, 4, 1, device=device)
    compare(MultiAgentGAE(gamma=0.9, lmbda=0.9, value_network=None), td)
    assert core_calls == {"gae": 1}


# ----------------------------------------------------------------------------------------------
# TorchRL's options around the recursion
# ----------------------------------------------------------------------------------------------


def value_net(device):
    torch.manual_seed(1)
    return ValueOperator(torch.nn.Linear(OBS, 1), in_keys=["observation"]).to(device)


def test_average_gae_and_time_named_dim(device, core_calls):
    td = rollout((8, 3), device, seed=8)
    td.names = ["time", None]  # TorchRL finds the time dim by name
    compare(GAE(gamma=0.99, lmbda=0.95, value_network=None, average_gae=True), td)
    assert core_calls == {"gae": 1}


@pytest.mark.parametrize("shifted", [False, True])
def test_value_network_and_shifted(device, core_calls, shifted):
    td = rollout((3, 8), device, seed=9, obs=True).exclude("state_value", ("next", "state_value"))
    td.names = [None, "time"]
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value_net(device), shifted=shifted)
    out = compare(gae, td, keys=("advantage", "value_target", "state_value"))
    assert ("next", "state_value") in out.keys(True)
    assert core_calls == {"gae": 1}


def test_skip_existing(device):
    """``skip_existing=True``: the state values already in the tensordict are used."""
    td = rollout((3, 8), device, seed=10, obs=True)
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=value_net(device), skip_existing=True)
    out = compare(gae, td)
    torch.testing.assert_close(out["state_value"], td["state_value"])


def test_set_keys(device, core_calls):
    td = rollout((3, 8), device, seed=11)
    renamed = TensorDict(
        {
            "v": td["state_value"],
            "next": {
                "v": td["next", "state_value"],
                "r": td["next", "reward"],
                "d": td["next", "done"],
                "t": td["next", "terminated"],
            },
        },
        batch_size=td.batch_size,
    )
    gae = GAE(gamma=0.9, lmbda=0.9, value_network=None)
    gae.set_keys(value="v", reward="r", done="d", terminated="t", advantage="A", value_target="G")
    out = compare(gae, renamed, keys=("A", "G"))
    plain = GAE(gamma=0.9, lmbda=0.9, value_network=None)(td.clone())
    assert_close(out["A"], plain["advantage"], torch.float32)
    assert core_calls == {"gae": 1}


def test_inputs_read_in_place(device, monkeypatch):
    """The ``[*B, T, 1]`` tensors reach rl_triton_core as they are, with ``time_dim``."""
    td = rollout((3, 8), device, seed=12)
    seen = {}

    def spy(rewards, values, terminated, **kwargs):
        seen.update(rewards=rewards, values=values, time_dim=kwargs["time_dim"])
        return gae(rewards, values, terminated, **kwargs)

    gae = rtc.gae
    monkeypatch.setattr(rtc, "gae", spy)
    with rtt.enabled():
        GAE(gamma=0.9, lmbda=0.9, value_network=None)(td)
    assert seen["rewards"] is td["next", "reward"] and seen["values"] is td["state_value"]
    assert seen["time_dim"] == 1


# ----------------------------------------------------------------------------------------------
# The switch
# ----------------------------------------------------------------------------------------------


def test_enable_disable_restore_torchrl_exactly():
    assert not rtt.is_enabled()
    rtt.enable()
    rtt.enable("torch")  # idempotent: only the backend changes
    assert rtt.is_enabled()
    for name, original in ORIGINALS.items():
        replaced = getattr(torchrl_advantages, name)
        assert replaced is getattr(_functional, name) and replaced.__wrapped__ is original
    rtt.disable()
    rtt.disable()
    assert not rtt.is_enabled()
    assert all(getattr(torchrl_advantages, n) is f for n, f in ORIGINALS.items())


def test_context_manager_nests_and_restores():
    with rtt.enabled("torch"):
        with rtt.enabled("reference"):
            assert rtt._state.global_backend == "reference"
        assert rtt._state.global_backend == "torch"
        with rtt.enabled():
            rtt.disable()
        assert rtt._state.global_backend == "torch"
    assert not rtt.is_enabled()
    assert all(getattr(torchrl_advantages, n) is f for n, f in ORIGINALS.items())


def test_bad_backend_is_a_value_error():
    with pytest.raises(ValueError, match="`backend`"):
        rtt.enable("cuda")
    with pytest.raises(ValueError, match="`backend`"):
        rtt.TritonGAE(gamma=0.9, lmbda=0.9, value_network=None, backend="fast")
    assert not rtt.is_enabled()


def test_environment_variable_read_at_import():
    """``RL_TRITON_TORCHRL`` (1/0 or a backend name) is read when the package is imported."""
    code = (
        "import rl_triton_torchrl as r\n"
        "from torchrl.objectives.value import advantages\n"
        "print(r.is_enabled(), r._state.global_backend,"
        " advantages.vec_generalized_advantage_estimate.__module__)\n"
    )
    env = {**os.environ, "RL_TRITON_TORCHRL": "reference"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "reference", "rl_triton_torchrl._functional"]


def test_runner_runs_an_unchanged_script(tmp_path, monkeypatch, capsys):
    """``python -m rl_triton_torchrl --backend torch script.py args`` (called in process)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\n"
        "from torchrl.objectives.value import advantages\n"
        "import rl_triton_torchrl\n"
        "print(advantages.generalized_advantage_estimate.__module__,"
        " rl_triton_torchrl._state.global_backend, sys.argv)\n"
    )
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    main(["--backend", "torch", str(script), "--x", "1"])
    out = capsys.readouterr().out.split(" ", 2)
    assert out[:2] == ["rl_triton_torchrl._functional", "torch"]
    assert out[2].strip() == str([str(script), "--x", "1"])


# ----------------------------------------------------------------------------------------------
# Fallback to TorchRL's own code
# ----------------------------------------------------------------------------------------------


def test_differentiable_matches_torchrl_gradients(device, core_calls):
    """Gradients through the estimator (state values that require grad, ``differentiable=True``)
    are served by rl_triton_core's autograd path, with TorchRL's values and gradients."""
    td = rollout((3, 8), device, seed=13, obs=True)
    net = value_net(device)
    gae = GAE(gamma=0.9, lmbda=0.9, value_network=None, differentiable=True)

    def advantage_and_grads(enabled: bool):
        net.zero_grad()
        data = td.clone()
        data["state_value"] = net(data.select("observation").clone())["state_value"]
        with rtt.enabled() if enabled else contextlib.nullcontext():
            out = gae(data)
        out["advantage"].square().sum().backward()
        return out["advantage"].detach(), [p.grad.clone() for p in net.parameters()]

    expected, expected_grads = advantage_and_grads(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rtt.RLTritonFallbackWarning)
        actual, grads = advantage_and_grads(True)
    assert core_calls == {"gae": 1}
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["generalized_advantage_estimate", "td_lambda_return_estimate"])
def test_trainable_scalar_gamma_keeps_its_gradient(name, device):
    """A 0-dim gamma that requires grad (meta-gradient discounts) is not read as a float: its
    gradient equals that of TorchRL's loop function (TorchRL's vectorised TD(lambda) gives a
    different gradient for a scalar gamma than its own loop, so the loop is the oracle)."""
    g = torch.Generator().manual_seed(21)
    shape = (2, 8, 1)
    nv, r, v = (torch.randn(shape, generator=g, dtype=torch.float64).to(device) for _ in range(3))
    done = (torch.rand(shape, generator=g) < 0.2).to(device)

    def call(fn, gamma):
        if name == "generalized_advantage_estimate":
            return fn(gamma, 0.95, v, nv, r, done, done)[0]
        return fn(gamma, 0.95, nv, r, done, done)

    grads = []
    for module, switch in (
        (torchrl_functional, contextlib.nullcontext()),
        (torchrl_advantages, rtt.enabled()),
    ):
        gamma = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
        with switch, warnings.catch_warnings():
            warnings.simplefilter("error", rtt.RLTritonFallbackWarning)
            call(getattr(module, name), gamma).sum().backward()
        grads.append(gamma.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-9)


def test_rolling_gamma_false_falls_back(device, core_calls):
    g = torch.Generator().manual_seed(14)
    nv, r = (torch.randn(2, 6, 1, generator=g).to(device) for _ in range(2))
    done = torch.zeros(2, 6, 1, dtype=torch.bool, device=device)
    gamma = torch.full((2, 6, 1), 0.9, device=device)
    expected = torchrl_functional.td_lambda_return_estimate(gamma, 0.9, nv, r, done, None, False)
    with rtt.enabled(), pytest.warns(rtt.RLTritonFallbackWarning, match="rolling_gamma"):
        actual = torchrl_advantages.td_lambda_return_estimate(gamma, 0.9, nv, r, done, None, False)
    assert core_calls == {}
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_fallback_reason_is_metadata_only():
    v = torch.zeros(2, 5, 1)
    done = torch.zeros(2, 5, 1, dtype=torch.bool)
    ok = dict(values=(v, v), flags=(done, None), coefficients=(0.9, torch.tensor(0.95)))
    assert rtt.fallback_reason("auto", -2, **ok) is None
    assert "time_dim" in rtt.fallback_reason("auto", 3, **ok)
    assert "bool" in rtt.fallback_reason("auto", 1, (v, v), (done.int(),), ())
    assert "shape" in rtt.fallback_reason("auto", 1, (v, v[:, :4]), (), ())
    assert "coefficient" in rtt.fallback_reason("auto", 1, (v,), (), (torch.ones(5, 1),))
    assert "coefficient of type str" in rtt.fallback_reason("auto", 1, (v,), (), ("0.9",))


def test_numpy_scalar_coefficients_are_served(device, core_calls):
    """gamma = np.float32(0.9) (a numpy scalar, not a Python float) is served, with TorchRL's
    result, instead of falling back to TorchRL's code with a warning."""
    g = torch.Generator().manual_seed(16)
    v, nv, r = (torch.randn(2, 6, 1, generator=g).to(device) for _ in range(3))
    done = (torch.rand(2, 6, 1, generator=g) < 0.3).to(device)
    gamma, lmbda = np.float32(0.9), np.float64(0.8)
    expected = torchrl_functional.generalized_advantage_estimate(gamma, lmbda, v, nv, r, done, done)
    with rtt.enabled(), warnings.catch_warnings():
        warnings.simplefilter("error", rtt.RLTritonFallbackWarning)
        actual = torchrl_advantages.generalized_advantage_estimate(
            gamma, lmbda, v, nv, r, done, done
        )
    assert core_calls == {"gae": 1}
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Explicit classes and losses
# ----------------------------------------------------------------------------------------------


def test_explicit_classes_without_the_switch(device, core_calls):
    """``TritonGAE``... run on rl_triton_core with the switch off, and leave TorchRL untouched."""
    td = rollout((3, 8), device, seed=15)
    for ours, theirs, kwargs in (
        (rtt.TritonGAE, GAE, {"lmbda": 0.8}),
        (rtt.TritonTDLambda, TDLambdaEstimator, {"lmbda": 0.8}),
        (rtt.TritonTD1, TD1Estimator, {}),
    ):
        expected = theirs(gamma=0.9, value_network=None, **kwargs)(td.clone())
        actual = ours(gamma=0.9, value_network=None, **kwargs)(td.clone())
        for key in ("advantage", "value_target"):
            assert_close(actual[key], expected[key], torch.float32, name=key)
        assert not rtt.is_enabled()
        assert all(getattr(torchrl_advantages, n) is f for n, f in ORIGINALS.items())
    assert core_calls == {"gae": 1, "lambda_returns": 1, "discounted_returns": 1}


def ppo_setup(device, seed=16):
    actor = categorical_actor(device)
    critic = value_net(device)
    td = rollout((4, 16), device, seed=seed, obs=True).exclude(
        "state_value", ("next", "state_value")
    )
    with torch.no_grad():
        actor(td)  # the behaviour log-probs of the recorded actions
    return actor, critic, td


def test_clip_ppo_loss_default_estimator(device, core_calls):
    """ClipPPOLoss's default GAE (differentiable=True, loop): same loss with the switch."""
    actor, critic, td = ppo_setup(device)
    loss = ClipPPOLoss(actor, critic)
    expected = loss(td.clone())
    with rtt.enabled():
        actual = loss(td.clone())
    assert core_calls == {"gae": 1}
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        assert_close(actual[key], expected[key], torch.float32, name=key)
    actual["loss_objective"].backward()  # gradients reach the actor as usual


@pytest.mark.parametrize(
    "value_type,kwargs,core",
    [
        (ValueEstimators.GAE, dict(gamma=0.9, lmbda=0.9), "gae"),
        (ValueEstimators.TDLambda, dict(gamma=0.9, lmbda=0.9), "lambda_returns"),
        (ValueEstimators.TD1, dict(gamma=0.9), "discounted_returns"),
        (rtt.TritonGAE, dict(gamma=0.9, lmbda=0.9, value_network=None), "gae"),
    ],
)
def test_make_value_estimator(device, core_calls, value_type, kwargs, core):
    actor, critic, td = ppo_setup(device, seed=17)
    loss = ClipPPOLoss(actor, critic)
    if isinstance(value_type, type):  # our class, built with the loss's critic
        kwargs = {**kwargs, "value_network": critic}
    loss.make_value_estimator(value_type, **kwargs)
    if isinstance(value_type, type):
        assert isinstance(loss.value_estimator, rtt.TritonGAE)
        core_calls.clear()
        actual = loss(td.clone())
        assert core_calls == {core: 1}
        return
    expected = loss(td.clone())
    with rtt.enabled():
        actual = loss(td.clone())
    assert core_calls == {core: 1}
    assert_close(actual["loss_objective"], expected["loss_objective"], torch.float32)


@pytest.mark.skipif(
    "triton" not in rtc.available_backends("cpu"), reason="needs TRITON_INTERPRET=1 on the CPU"
)
def test_triton_kernels_through_the_interpreter(core_calls):
    """The explicit classes with ``backend="triton"``: the Triton kernels, interpreted."""
    td = rollout((2, 6), "cpu", seed=18, obs=True)
    td["action_log_prob"] = -torch.rand(2, 6)
    actor = categorical_actor("cpu")
    cases = (
        (rtt.TritonGAE, GAE, dict(lmbda=0.9, vectorized=False)),
        (rtt.TritonTDLambda, TDLambdaEstimator, dict(lmbda=0.9, vectorized=False)),
        (rtt.TritonTD1, TD1Estimator, {}),
        (rtt.TritonVTrace, VTrace, dict(actor_network=actor)),
    )
    for ours, theirs, kwargs in cases:
        expected = theirs(gamma=0.9, value_network=None, **kwargs)(td.clone())
        actual = ours(gamma=0.9, value_network=None, backend="triton", **kwargs)(td.clone())
        for key in ("advantage", "value_target"):
            assert_close(actual[key], expected[key], torch.float32, name=f"{theirs.__name__} {key}")
    assert sum(core_calls.values()) == 4


# ----------------------------------------------------------------------------------------------
# Retrace
# ----------------------------------------------------------------------------------------------


def retrace_rollout(device, shape=(3, 7), seed=19):
    """Q-tables, target probabilities, actions and behaviour log-probs, TorchRL layout."""
    g = torch.Generator().manual_seed(seed)
    A = N_ACTIONS
    probs = lambda: torch.softmax(torch.randn((*shape, A), generator=g), -1)
    action = torch.randint(A, shape, generator=g)
    terminated = torch.rand((*shape, 1), generator=g) < 0.15
    done = terminated | (torch.rand((*shape, 1), generator=g) < 0.15)
    td = TensorDict(
        {
            "action_value": torch.randn((*shape, A), generator=g),
            "target_probs": probs(),
            "action": torch.nn.functional.one_hot(action, A),
            "action_log_prob": -torch.rand(shape, generator=g),
            "next": {
                "action_value": torch.randn((*shape, A), generator=g),
                "target_probs": probs(),
                "reward": torch.randn((*shape, 1), generator=g),
                "done": done,
                "terminated": terminated,
            },
        },
        batch_size=shape,
    )
    return td.to(device)


def retrace_loop(td, gamma, lmbda, c_bar):
    """Munos et al.'s recursion, one step at a time, from the tensordict's tables ([B, T])."""
    q_all, pi, nxt = td["action_value"], td["target_probs"], td["next"]
    a = td["action"].argmax(-1, keepdim=True)
    q = q_all.gather(-1, a)
    log_pi, log_mu = pi.gather(-1, a).log(), td["action_log_prob"].unsqueeze(-1)
    expected = (nxt["target_probs"] * nxt["action_value"]).sum(-1, keepdim=True)
    kappa = lmbda * (log_pi - log_mu).exp().clamp(max=c_bar)
    r, done, term = nxt["reward"], nxt["done"].float(), nxt["terminated"].float()
    out = torch.empty_like(q)
    T = q.shape[1]
    for t in reversed(range(T)):
        follow = 0.0
        if t < T - 1:
            follow = (1 - done[:, t]) * kappa[:, t + 1] * (out[:, t + 1] - q[:, t + 1])
        out[:, t] = r[:, t] + gamma * (1 - term[:, t]) * (expected[:, t] + follow)
    return out, q


def test_retrace_against_the_recursion(device, core_calls):
    td = retrace_rollout(device)
    estimator = rtt.Retrace(gamma=0.95, lmbda=0.9, c_bar=1.1)
    out = estimator(td.clone())
    targets, q = retrace_loop(td, 0.95, 0.9, 1.1)
    assert_close(out["value_target"], targets, torch.float32)
    assert_close(out["advantage"], targets - q, torch.float32)
    assert core_calls == {"retrace": 1}


@pytest.mark.parametrize("trace", ["tree_backup", "q_lambda", "importance_sampling"])
def test_retrace_traces_precomputed_entries_and_keys(device, trace):
    """Precomputed ``chosen_action_value`` / ``expected_action_value`` / ``target_log_prob``
    under custom keys, time first: the core's reference on the same tensors."""
    td = retrace_rollout(device, shape=(7, 2), seed=20)
    a = td["action"].argmax(-1, keepdim=True)
    q = td["action_value"].gather(-1, a)
    expected = (td["next", "target_probs"] * td["next", "action_value"]).sum(-1, keepdim=True)
    log_pi = td["target_probs"].gather(-1, a).log()
    log_mu = td["action_log_prob"].unsqueeze(-1)
    plain = TensorDict(
        {
            "q": q,
            "mu": td["action_log_prob"],
            "pi": log_pi,
            "next": {"E": expected, "rew": td["next", "reward"], "done": td["next", "done"]},
        },
        batch_size=td.batch_size,
    )
    estimator = rtt.Retrace(gamma=0.9, lmbda=0.8, trace=trace, time_dim=0)
    estimator.set_keys(value="q", expected_value="E", target_log_prob="pi")
    estimator.set_keys(sample_log_prob="mu", reward="rew", value_target="Qret")
    out = estimator(plain)
    reference = rtc.retrace(
        td["next", "reward"],
        q,
        expected,
        log_pi,
        log_mu,
        td["next", "done"],  # no "terminated" entry: done gates the bootstrap
        truncated=td["next", "done"],
        gamma=0.9,
        lmbda=0.8,
        trace=trace,
        backend="reference",
    )
    assert_close(out["Qret"], reference, torch.float32)


def test_retrace_errors():
    with pytest.raises(ValueError, match="`trace`"):
        rtt.Retrace(gamma=0.9, trace="watkins")
    td = retrace_rollout("cpu").exclude("action_log_prob")
    with pytest.raises(KeyError, match="action_log_prob"):
        rtt.Retrace(gamma=0.9)(td)


# ----------------------------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------------------------


def test_example_ppo_runs_with_and_without_the_switch(monkeypatch):
    """examples/torchrl_ppo.py, one short iteration each way, in process: same losses."""
    pytest.importorskip("gymnasium")
    path = Path(__file__).resolve().parents[1] / "examples" / "torchrl_ppo.py"
    spec = importlib.util.spec_from_file_location("torchrl_ppo_example", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # (its dataclass looks itself up)
    spec.loader.exec_module(example)
    small = dict(num_envs=2, steps_per_env=32, iterations=1, epochs=1, minibatch_size=32)
    threads = torch.get_num_threads()
    try:
        plain = example.main(example.Args(**small, rl_triton=False))
        ours = example.main(example.Args(**small, rl_triton=True))
    finally:
        torch.set_num_threads(threads)
    assert rtt.is_enabled()
    assert ours["frames"] == plain["frames"] == 64
    assert ours["loss"] == pytest.approx(plain["loss"], rel=1e-4, abs=1e-5)
