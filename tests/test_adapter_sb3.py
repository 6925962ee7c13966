"""The Stable-Baselines3 adapter (``rl_triton_sb3``) against SB3's and sb3-contrib's own code.

* Buffers: ours and the SB3 / sb3-contrib class it derives from, filled identically with
  random rollouts (random episode starts, dones and bootstrap values), give the same
  ``advantages`` and ``returns`` (float32 tolerance) for every buffer class we ship.
* Training: a short ``PPO.learn`` / ``A2C.learn`` / ``MaskablePPO.learn`` /
  ``RecurrentPPO.learn`` on CartPole (CPU, same seed) with our buffer logs the same losses and
  ends with the same parameters as with SB3's, to float32 rounding (not bitwise: the scan
  adds in a different order than SB3's loop).
* ``enable()`` / ``disable()`` restore SB3's classes exactly; bad input raises
  ``TypeError`` / ``ValueError`` naming the argument.

No timing asserts (timings: ``benchmarks/sb3_buffer.py``). CUDA tests are marked ``gpu``.
"""

from __future__ import annotations

import copy
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import HAS_CUDA, TRITON_INTERPRET, assert_close

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from gymnasium import spaces
from sb3_contrib import MaskablePPO, RecurrentPPO
from sb3_contrib.common.envs import InvalidActionEnvDiscrete
from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer
from sb3_contrib.common.recurrent.buffers import RecurrentDictRolloutBuffer, RecurrentRolloutBuffer
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env

import rl_triton_sb3
from rl_triton_sb3 import (
    TritonDictRolloutBuffer,
    TritonMaskableDictRolloutBuffer,
    TritonMaskableRolloutBuffer,
    TritonRecurrentDictRolloutBuffer,
    TritonRecurrentPPO,
    TritonRecurrentRolloutBuffer,
    TritonRolloutBuffer,
)
from rl_triton_sb3 import buffers as sb3_buffers

BOX = spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
DICT = spaces.Dict({"x": BOX, "k": spaces.Discrete(4)})
ACTIONS = spaces.Discrete(3)


def gpu(test):
    """Marked ``gpu`` and skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")(test))


# (ours, SB3's / sb3-contrib's class it extends, observation space, recurrent)
PAIRS = {
    "rollout": (TritonRolloutBuffer, RolloutBuffer, BOX, False),
    "dict": (TritonDictRolloutBuffer, DictRolloutBuffer, DICT, False),
    "maskable": (TritonMaskableRolloutBuffer, MaskableRolloutBuffer, BOX, False),
    "maskable_dict": (TritonMaskableDictRolloutBuffer, MaskableDictRolloutBuffer, DICT, False),
    "recurrent": (TritonRecurrentRolloutBuffer, RecurrentRolloutBuffer, BOX, True),
    "recurrent_dict": (TritonRecurrentDictRolloutBuffer, RecurrentDictRolloutBuffer, DICT, True),
}


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny networks and buffers: one torch thread is faster, and much faster when the machine
    is shared (idle OpenMP threads spin). Restored after each test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make(cls, T, N, obs=BOX, recurrent=False, gamma=0.99, gae_lambda=0.95, **kw):
    """A buffer of ``cls`` for ``T`` steps of ``N`` envs (recurrent ones: an LSTM state shape)."""
    args = (T, obs, ACTIONS) + (((T, 1, N, 4),) if recurrent else ())
    return cls(*args, "cpu", gamma=gamma, gae_lambda=gae_lambda, n_envs=N, **kw)


def rollout(T, N, seed, p_start=0.1):
    """Random rewards, values, episode starts, ``last_values`` [N, 1] and ``dones`` [N]."""
    rng = np.random.default_rng(seed)
    return dict(
        rewards=rng.standard_normal((T, N), dtype=np.float32),
        values=rng.standard_normal((T, N), dtype=np.float32),
        episode_starts=(rng.random((T, N)) < p_start).astype(np.float32),
        last_values=torch.from_numpy(rng.standard_normal((N, 1), dtype=np.float32)),
        dones=rng.random(N) < 0.3,
    )


def fill(buffer, data):
    buffer.rewards[:] = data["rewards"]
    buffer.values[:] = data["values"]
    buffer.episode_starts[:] = data["episode_starts"]


def compute(buffer, data):
    buffer.compute_returns_and_advantage(last_values=data["last_values"], dones=data["dones"])
    return torch.from_numpy(buffer.advantages), torch.from_numpy(buffer.returns)


def assert_same_as_sb3(ours, theirs, data):
    """Fill both identically, compute, compare advantages and returns (float32 tolerance)."""
    fill(ours, data)
    fill(theirs, data)
    expected_adv, expected_ret = compute(theirs, data)
    ours.advantages[:] = np.nan  # every element must be written
    ours.returns[:] = np.nan
    adv, ret = compute(ours, data)
    assert_close(adv, expected_adv, name="advantages")
    assert_close(ret, expected_ret, name="returns")


# -- buffers vs SB3 ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_steps", [1, 5, 128, 2048])
@pytest.mark.parametrize("n_envs", [1, 8, 64])
def test_rollout_buffer_matches_sb3(n_envs, n_steps):
    gamma, lmbda = [(0.99, 0.95), (0.9, 1.0), (1.0, 0.0)][(n_envs + n_steps) % 3]
    data = rollout(n_steps, n_envs, seed=n_envs * 10_000 + n_steps)
    ours = make(TritonRolloutBuffer, n_steps, n_envs, gamma=gamma, gae_lambda=lmbda)
    theirs = make(RolloutBuffer, n_steps, n_envs, gamma=gamma, gae_lambda=lmbda)
    assert_same_as_sb3(ours, theirs, data)


def test_empty_buffer_like_sb3():
    """``buffer_size=0`` (numpy gives its empty arrays zero strides): empty results, as SB3's."""
    data = rollout(0, 2, seed=0)
    ours, theirs = make(TritonRolloutBuffer, 0, 2), make(RolloutBuffer, 0, 2)
    for a, e in zip(compute(ours, data), compute(theirs, data)):
        assert a.shape == e.shape == (0, 2)


@pytest.mark.parametrize("kind", PAIRS)
@pytest.mark.parametrize(("n_steps", "n_envs"), [(1, 1), (5, 8), (128, 64)])
def test_every_buffer_class_matches_its_base(kind, n_steps, n_envs):
    ours_cls, base_cls, obs, recurrent = PAIRS[kind]
    assert issubclass(ours_cls, base_cls)
    data = rollout(n_steps, n_envs, seed=n_steps + n_envs)
    ours = make(ours_cls, n_steps, n_envs, obs, recurrent)
    theirs = make(base_cls, n_steps, n_envs, obs, recurrent)
    assert_same_as_sb3(ours, theirs, data)


@pytest.mark.skipif(not TRITON_INTERPRET, reason="needs TRITON_INTERPRET=1 (Triton on the CPU)")
def test_triton_backend_through_the_interpreter():
    data = rollout(6, 3, seed=7)
    ours = make(TritonRolloutBuffer, 6, 3, advantage_backend="triton")
    assert_same_as_sb3(ours, make(RolloutBuffer, 6, 3), data)


def test_filled_through_add_and_sampled_like_sb3():
    """The SB3 path end to end: add() every step, compute, get() minibatches."""
    T, N = 16, 4
    data = rollout(T, N, seed=3)
    obs = np.random.default_rng(0).standard_normal((T, N, 3), dtype=np.float32)
    ours, theirs = make(TritonRolloutBuffer, T, N), make(RolloutBuffer, T, N)
    for buffer in (ours, theirs):
        for t in range(T):
            buffer.add(
                obs[t],
                np.full(N, t % 3),
                data["rewards"][t],
                data["episode_starts"][t],
                torch.from_numpy(data["values"][t]),
                torch.zeros(N),
            )
    expected = compute(theirs, data)
    got = compute(ours, data)
    for x, e in zip(got, expected):
        assert_close(x, e)
    np.random.seed(0)  # noqa: NPY002 (SB3's get() shuffles with the global RNG)
    batch_ours = next(ours.get(batch_size=T * N))
    np.random.seed(0)  # noqa: NPY002
    batch_theirs = next(theirs.get(batch_size=T * N))
    for name in ("observations", "old_values", "advantages", "returns"):
        assert_close(getattr(batch_ours, name), getattr(batch_theirs, name), name=name)
    ours.reset()  # a new rollout gets fresh zeroed arrays
    assert not ours.rewards.any() and not ours.episode_starts.any()


def test_no_copies_in_the_hot_path():
    """The buffer's arrays are views of two blocks; gae writes into the arrays SB3 reads."""
    buffer = make(TritonRolloutBuffer, 8, 2)
    layout = buffer._rl_triton_layout
    arrays = [buffer.rewards, buffer.values, buffer.episode_starts]
    assert all(np.shares_memory(a, layout.inputs.numpy()) for a in arrays)
    advantages, returns = buffer.advantages, buffer.returns
    compute(buffer, rollout(8, 2, seed=0))
    assert buffer.advantages is advantages and buffer.returns is returns
    assert np.shares_memory(buffer.returns, layout.outputs.numpy())


def test_copied_buffer():
    """copy.deepcopy (or pickle) of a filled buffer computes from the copy's own data."""
    data = rollout(8, 3, seed=2)
    original = fill_and_return(make(TritonRolloutBuffer, 8, 3), data)
    copied = copy.deepcopy(original)
    original.rewards[:] = 0.0  # must not reach the copy
    theirs = fill_and_return(make(RolloutBuffer, 8, 3), data)
    for x, e in zip(compute(copied, data), compute(theirs, data)):
        assert_close(x, e)


def test_nan_stays_in_its_episode():
    """A NaN reward reaches only the advantages of its own episode (SB3's loop multiplies it
    by a zero mask at the episode start and so spreads it into the episode before, too)."""
    T, N = 10, 2
    data = rollout(T, N, seed=1, p_start=0.0)
    data["episode_starts"][5, 0] = 1.0  # env 0: episodes [0, 5) and [5, 10)
    data["rewards"][7, 0] = np.nan
    adv, ret = compute(fill_and_return(make(TritonRolloutBuffer, T, N), data), data)
    assert torch.isnan(adv[5:8, 0]).all() and torch.isnan(ret[5:8, 0]).all()
    assert torch.isfinite(adv[:5, 0]).all() and torch.isfinite(adv[8:, 0]).all()
    assert torch.isfinite(adv[:, 1]).all()


def fill_and_return(buffer, data):
    fill(buffer, data)
    return buffer


# -- the global switch -------------------------------------------------------------------------


@pytest.fixture
def restore_sb3():
    """Whatever a test does, SB3's classes are left unpatched."""
    yield
    rl_triton_sb3.disable()


@pytest.fixture
def gae_calls(monkeypatch):
    """The ``rl_triton_core.gae`` calls the adapter makes, one entry a call (SB3's own loop
    gives the same numbers: a test of the switch must also see that the library ran)."""
    calls, real = [], sb3_buffers.rtc.gae

    def counted(*args, **kwargs):
        calls.append(None)
        return real(*args, **kwargs)

    monkeypatch.setattr(sb3_buffers.rtc, "gae", counted)
    return calls


def test_enable_disable_restores_exactly(restore_sb3):
    originals = {
        (cls, name): cls.__dict__.get(name)
        for cls in (RolloutBuffer, DictRolloutBuffer, MaskableRolloutBuffer)
        for name in ("reset", "compute_returns_and_advantage")
    }
    rl_triton_sb3.enable()
    rl_triton_sb3.enable(advantage_device="cpu")  # idempotent: options only, no double patch
    assert rl_triton_sb3.is_enabled()
    assert RolloutBuffer.reset.__wrapped__ is originals[(RolloutBuffer, "reset")]
    compute_fn = RolloutBuffer.compute_returns_and_advantage
    assert compute_fn.__wrapped__ is originals[(RolloutBuffer, "compute_returns_and_advantage")]
    rl_triton_sb3.disable()
    rl_triton_sb3.disable()  # no-op
    assert not rl_triton_sb3.is_enabled()
    for (cls, name), original in originals.items():
        assert cls.__dict__.get(name) is original


@pytest.mark.parametrize("kind", ["rollout", "dict", "maskable", "recurrent_dict"])
def test_enabled_sb3_classes_match_sb3(kind, restore_sb3, gae_calls):
    _, base_cls, obs, recurrent = PAIRS[kind]
    data = rollout(64, 8, seed=5)
    theirs = make(base_cls, 64, 8, obs, recurrent)
    fill(theirs, data)
    expected = compute(theirs, data)
    assert not gae_calls
    with rl_triton_sb3.enabled():
        patched = make(base_cls, 64, 8, obs, recurrent)
        assert hasattr(patched, "_rl_triton_layout")  # SB3's reset() laid it out
        fill(patched, data)
        patched.advantages[:] = np.nan  # every element must be written
        patched.returns[:] = np.nan
        got = compute(patched, data)
    assert len(gae_calls) == 1
    assert not rl_triton_sb3.is_enabled()
    assert base_cls.compute_returns_and_advantage is RolloutBuffer.compute_returns_and_advantage
    for x, e in zip(got, expected):
        assert_close(x, e)


def test_enable_reaches_a_buffer_built_before(restore_sb3, gae_calls):
    """A buffer filled before enable() (SB3's own arrays) is copied into the layout once."""
    data = rollout(32, 4, seed=6)
    buffer = fill_and_return(make(RolloutBuffer, 32, 4), data)
    expected = [x.clone() for x in compute(buffer, data)]
    with rl_triton_sb3.enabled():
        sb3_buffers.layout_of(buffer)  # (what the patched compute does first: adopt the data)
        assert np.array_equal(buffer.rewards, data["rewards"])
        buffer.advantages[:] = np.nan  # the adopted outputs: every element must be written
        buffer.returns[:] = np.nan
        got = compute(buffer, data)
    assert len(gae_calls) == 1
    for x, e in zip(got, expected):
        assert_close(x, e)


# -- training ----------------------------------------------------------------------------------


def train_log(algo, buffer_class=None, env_id="CartPole-v1", n_iterations=3, **kw):
    """Train on CPU with seed 0; per update: the advantages, the ``train/*`` log; then the
    final parameters."""
    env = make_vec_env(env_id, n_envs=2, seed=0)
    if buffer_class is not None:
        kw["rollout_buffer_class"] = buffer_class
    model = algo("MlpPolicy", env, seed=0, device="cpu", policy_kwargs=dict(net_arch=[16]), **kw)
    updates, train = [], model.train

    def recorded_train():
        advantages = model.rollout_buffer.advantages.copy()
        train()
        logged = model.logger.name_to_value
        updates.append((advantages, {k: v for k, v in logged.items() if k.startswith("train/")}))

    model.train = recorded_train
    model.learn(total_timesteps=model.n_steps * model.n_envs * n_iterations)
    params = torch.nn.utils.parameters_to_vector(model.policy.parameters()).detach()
    return updates, params


def assert_same_training(ours, theirs):
    (updates, params), (expected_updates, expected_params) = ours, theirs
    assert len(updates) == len(expected_updates) > 0
    for i, ((adv, log), (expected_adv, expected_log)) in enumerate(zip(updates, expected_updates)):
        assert_close(torch.from_numpy(adv), torch.from_numpy(expected_adv), name=f"adv {i}")
        assert log.keys() == expected_log.keys()
        for key, value in expected_log.items():
            assert log[key] == pytest.approx(value, rel=1e-5, abs=1e-5), f"update {i}: {key}"
    assert_close(params, expected_params, name="parameters")


def test_ppo_learn_same_as_with_sb3_buffer():
    kw = dict(n_steps=32, batch_size=32, n_epochs=2)
    assert_same_training(train_log(PPO, TritonRolloutBuffer, **kw), train_log(PPO, **kw))


def test_ppo_learn_with_enable_same_as_sb3(restore_sb3, gae_calls):
    """The rl-zoo route: SB3's own RolloutBuffer, patched by enable()."""
    kw = dict(n_steps=32, batch_size=32, n_epochs=2)
    expected = train_log(PPO, **kw)
    assert not gae_calls
    with rl_triton_sb3.enabled():
        assert hasattr(RolloutBuffer.compute_returns_and_advantage, "__wrapped__")
        assert_same_training(train_log(PPO, **kw), expected)
    assert len(gae_calls) == 3  # one a rollout


def test_a2c_learn_same_as_with_sb3_buffer():
    kw = dict(n_steps=8)
    assert_same_training(train_log(A2C, TritonRolloutBuffer, **kw), train_log(A2C, **kw))


def test_maskable_ppo_learn_same_as_with_its_buffer():
    def run(buffer_class):
        env = InvalidActionEnvDiscrete(dim=4, n_invalid_actions=2)
        model = MaskablePPO(
            "MlpPolicy", env, n_steps=32, batch_size=32, n_epochs=2, seed=0, device="cpu",
            policy_kwargs=dict(net_arch=[16]), rollout_buffer_class=buffer_class,
        )  # fmt: skip
        model.learn(96)
        return torch.nn.utils.parameters_to_vector(model.policy.parameters()).detach()

    assert_close(run(TritonMaskableRolloutBuffer), run(None), name="parameters")


def test_recurrent_ppo_learn_same_as_sb3_contrib():
    def run(algo):
        model = algo(
            "MlpLstmPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=8,
            batch_size=16, n_epochs=2, seed=0, device="cpu",
            policy_kwargs=dict(net_arch=[8], lstm_hidden_size=8),
        )  # fmt: skip
        model.learn(32)
        return model

    ours, theirs = run(TritonRecurrentPPO), run(RecurrentPPO)
    assert isinstance(ours.rollout_buffer, TritonRecurrentRolloutBuffer)
    params = [torch.nn.utils.parameters_to_vector(m.policy.parameters()) for m in (ours, theirs)]
    assert_close(params[0].detach(), params[1].detach(), name="parameters")


def test_example_runs(monkeypatch, capsys):
    example = Path(__file__).resolve().parents[1] / "examples" / "sb3_ppo.py"
    argv = ["--total-timesteps", "128", "--n-envs", "2", "--n-steps", "32", "--eval-episodes", "1"]
    monkeypatch.setattr(sys, "argv", [str(example), *argv])
    runpy.run_path(str(example), run_name="__main__")
    out = capsys.readouterr().out
    assert "PPO with TritonRolloutBuffer" in out and "mean episode reward" in out


# -- options and bad input ---------------------------------------------------------------------


class FakeBuffer:
    """What resolve_device reads: the model's device and the buffer's size."""

    def __init__(self, device, T, N):
        self.device, self.buffer_size, self.n_envs = torch.device(device), T, N


def test_auto_device_policy():
    big = sb3_buffers.CUDA_MIN_ELEMENTS
    resolve = sb3_buffers.resolve_device
    assert resolve("auto", FakeBuffer("cpu", big, 2)).type == "cpu"  # model on the CPU
    assert resolve("auto", FakeBuffer("cuda:0", 1, big - 1)).type == "cpu"  # small buffer
    assert resolve("auto", FakeBuffer("cuda:0", 1, big)) == torch.device("cuda:0")
    assert resolve("cpu", FakeBuffer("cuda:0", 1, big)).type == "cpu"
    assert resolve("cuda", FakeBuffer("cuda:1", 1, 1)) == torch.device("cuda:1")  # model's GPU
    assert make(TritonRolloutBuffer, 4, 2)._rl_triton_plan.device.type == "cpu"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(advantage_device="tpu"), ValueError, "advantage_device"),
        (dict(advantage_device="cpu:0"), ValueError, "advantage_device"),
        (dict(advantage_device=0), TypeError, "advantage_device"),
        (dict(advantage_backend="fast"), ValueError, "advantage_backend"),
    ],
)
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        make(TritonRolloutBuffer, 4, 2, **kwargs)
    with pytest.raises(error, match=match):
        rl_triton_sb3.enable(**kwargs)
    assert not rl_triton_sb3.is_enabled()


@pytest.mark.skipif(HAS_CUDA, reason="checks the error raised without CUDA")
def test_cuda_without_cuda():
    with pytest.raises(ValueError, match=r"advantage_device.*CUDA is not available"):
        make(TritonRolloutBuffer, 4, 2, advantage_device="cuda")


@pytest.mark.skipif(TRITON_INTERPRET, reason="Triton runs on the CPU under the interpreter")
def test_triton_backend_on_cpu_without_interpreter():
    with pytest.raises(ValueError, match="advantage_backend"):
        make(TritonRolloutBuffer, 4, 2, advantage_backend="triton")


@pytest.mark.parametrize(
    ("last_values", "dones", "error", "match"),
    [
        (np.zeros((2, 1), np.float32), np.zeros(2, bool), TypeError, "last_values"),
        (torch.zeros(2, 1, dtype=torch.int64), np.zeros(2, bool), TypeError, "last_values"),
        (torch.zeros(3, 1), np.zeros(2, bool), ValueError, "last_values"),
        (torch.zeros(2, 1), np.zeros(3, bool), ValueError, "dones"),
        (torch.zeros(2, 1), np.array(["no", "yes"]), TypeError, "dones"),
    ],
)
def test_bad_arguments(last_values, dones, error, match):
    buffer = make(TritonRolloutBuffer, 4, 2)
    with pytest.raises(error, match=match):
        buffer.compute_returns_and_advantage(last_values=last_values, dones=dones)


def test_compute_after_get_is_an_error():
    buffer = make(TritonRolloutBuffer, 4, 2)
    buffer.full = True
    next(buffer.get())  # SB3 flattens the arrays
    with pytest.raises(ValueError, match="before get"):
        buffer.compute_returns_and_advantage(torch.zeros(2, 1), np.zeros(2, bool))


# -- CUDA --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_steps", "n_envs"), [(1, 1), (128, 64), (2048, 16), (128, 4096)])
@pytest.mark.parametrize("on_model_device", [False, True])
@gpu
def test_cuda_matches_sb3(n_steps, n_envs, on_model_device):
    data = rollout(n_steps, n_envs, seed=n_steps)
    if on_model_device:  # last_values as SB3 hands them over from a CUDA model
        data["last_values"] = data["last_values"].cuda()
    ours = make(TritonRolloutBuffer, n_steps, n_envs, advantage_device="cuda")
    assert ours._rl_triton_plan.device.type == "cuda"
    theirs = make(RolloutBuffer, n_steps, n_envs)
    fill(theirs, data)
    expected = compute(theirs, {**data, "last_values": data["last_values"].cpu()})
    ours.advantages[:] = np.nan
    ours.returns[:] = np.nan
    got = compute(fill_and_return(ours, data), data)
    for x, e in zip(got, expected):
        assert_close(x, e)


@gpu
def test_cuda_ppo_learn_close_to_sb3():
    def run(buffer_class, **buffer_kwargs):
        model = PPO(
            "MlpPolicy", make_vec_env("CartPole-v1", n_envs=2, seed=0), n_steps=32,
            batch_size=32, n_epochs=2, seed=0, device="cuda", policy_kwargs=dict(net_arch=[16]),
            rollout_buffer_class=buffer_class, rollout_buffer_kwargs=buffer_kwargs,
        )  # fmt: skip
        model.learn(192)
        return torch.nn.utils.parameters_to_vector(model.policy.parameters()).detach().cpu()

    expected = run(None)
    for device in ("cuda", "cpu"):
        assert_close(run(TritonRolloutBuffer, advantage_device=device), expected, rtol=1e-4)
