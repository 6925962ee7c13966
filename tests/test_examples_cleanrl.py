"""Smoke tests of the CleanRL-style scripts under ``examples/cleanrl/`` (CPU, a few updates).

Each script is imported as a module and its ``main(Args(...))`` run in a temporary directory
with a tiny configuration, once per credit-assignment backend (Triton through the interpreter
when ``TRITON_INTERPRET=1``), and must write its TensorBoard events with CleanRL's metric names
plus ours (``charts/credit_assignment_time``, ``charts/shadow_max_rel_diff``). Short time limits
make episodes end, by termination and by truncation, inside the tiny rollouts. One run goes
through the command line in a subprocess.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import HAS_CUDA, interpreted
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_adapter_cleanrl import cleanrl_gae, cleanrl_gae_bootstrapped

import rl_triton_cleanrl
import rl_triton_core as rtc

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cleanrl"
BACKENDS = ("reference", "torch", "triton", "auto")

# Episodes that end inside a 16-step rollout: CartPole terminates after ~10-40 random steps, so
# with a limit of 12 steps both terminations and truncations happen; Pendulum only truncates.
gym.register("ShortCartPole-v1", "gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=12)  # fmt: skip
gym.register("ShortPendulum-v1", "gymnasium.envs.classic_control.pendulum:PendulumEnv", max_episode_steps=10)  # fmt: skip


@functools.cache
def load(name: str):
    """Imports examples/cleanrl/{name}.py as a module (its main() does not run on import)."""
    spec = importlib.util.spec_from_file_location(
        f"cleanrl_example_{name}", EXAMPLES / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny(name: str, *, num_steps: int = 16, updates: int | None = None, **overrides):
    """Args for a few updates (2 for PPO, 6 for IMPALA) of 2 environments on a short-episode
    task; ``overrides`` replace any field."""
    updates = updates or (6 if name == "impala" else 2)
    config = dict(seed=1, cuda=False, shadow_check=True, num_envs=2, num_steps=num_steps)
    config["total_timesteps"] = updates * 2 * num_steps
    if name == "impala":
        config |= dict(env_id="ShortCartPole-v1", num_actors=2, policy_lag=2)
    else:
        task = "ShortPendulum-v1" if name == "ppo_continuous_action" else "ShortCartPole-v1"
        config |= dict(env_id=task, num_minibatches=2, update_epochs=1)
    return load(name).Args(**(config | overrides))


def tiny_for(name: str, backend: str, **overrides):
    """``tiny``, shorter under the Triton interpreter (a launch there costs ~0.1 s per step)."""
    if interpreted(backend):
        overrides = dict(num_steps=6, updates=4 if name == "impala" else 2) | overrides
    return tiny(name, advantage_backend=backend, **overrides)


def skip_unavailable(backend: str, device: str = "cpu"):
    if backend != "auto" and backend not in rtc.available_backends(device):
        pytest.skip(f"backend {backend!r} is not available on {device}")


def scalars(logdir) -> dict[str, np.ndarray]:
    """Every scalar of a run's TensorBoard events, by tag."""
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: np.array([e.value for e in events.Scalars(tag)]) for tag in events.Tags()["scalars"]
    }


COMMON_TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "charts/credit_assignment_time",
    "charts/shadow_max_rel_diff",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
}
PPO_TAGS = {"losses/old_approx_kl", "losses/clipfrac", "losses/explained_variance"}
IMPALA_TAGS = {"charts/policy_lag", "charts/importance_weight_mean"}


def check_run(logdir, n_updates: int, extra_tags=frozenset()):
    logs = scalars(logdir)
    missing = (COMMON_TAGS | extra_tags) - logs.keys()
    assert not missing, f"missing TensorBoard tags {sorted(missing)}; got {sorted(logs)}"
    assert len(logs["charts/SPS"]) == n_updates
    assert len(logs["charts/episodic_return"]) > 0
    assert np.all(logs["charts/credit_assignment_time"] > 0)
    # float32 against the float64 reference (exactly 0 for the reference itself)
    assert np.all(logs["charts/shadow_max_rel_diff"] < 1e-5), logs["charts/shadow_max_rel_diff"]
    return logs


@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo(backend, tmp_path, monkeypatch):
    skip_unavailable(backend)
    monkeypatch.chdir(tmp_path)
    logdir = load("ppo").main(tiny_for("ppo", backend))
    check_run(logdir, n_updates=2, extra_tags=PPO_TAGS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ppo_continuous_action(backend, tmp_path, monkeypatch):
    skip_unavailable(backend)
    monkeypatch.chdir(tmp_path)
    logdir = load("ppo_continuous_action").main(tiny_for("ppo_continuous_action", backend))
    check_run(logdir, n_updates=2, extra_tags=PPO_TAGS)


@pytest.mark.parametrize("backend", BACKENDS)
def test_impala(backend, tmp_path, monkeypatch):
    skip_unavailable(backend)
    monkeypatch.chdir(tmp_path)
    args = tiny_for("impala", backend)
    logdir = load("impala").main(args)
    n_updates = args.num_iterations
    logs = check_run(logdir, n_updates=n_updates, extra_tags=IMPALA_TAGS)
    # rollout u comes from the parameters of update u - 2: behaviour != target policy
    assert list(logs["charts/policy_lag"]) == [min(u, 2) for u in range(n_updates)]
    assert logs["charts/importance_weight_mean"][0] == 1.0
    assert np.all(logs["losses/approx_kl"][2:] > 0)


@pytest.mark.parametrize(("num_actors", "policy_lag"), [(2, -1), (0, 2)])
def test_impala_refuses_a_negative_lag_or_no_actors(num_actors, policy_lag, tmp_path, monkeypatch):
    """A negative lag would deadlock the actors and the learner; no actor, crash late."""
    monkeypatch.chdir(tmp_path)
    args = tiny("impala", num_actors=num_actors, policy_lag=policy_lag)
    with pytest.raises(ValueError, match="--num-actors must be >= 1 and --policy-lag >= 0"):
        load("impala").main(args)
    assert not (tmp_path / "runs").exists()


def test_impala_is_reproducible(tmp_path, monkeypatch):
    """Actor threads, yet the same seed gives the same run: which parameters act for which
    rollout is fixed by the lag, not by thread timing."""
    monkeypatch.chdir(tmp_path)
    runs = [
        scalars(load("impala").main(tiny("impala", exp_name=f"run{i}", advantage_backend="torch")))
        for i in range(2)
    ]
    for tag in ("losses/value_loss", "losses/policy_loss", "charts/episodic_return"):
        np.testing.assert_array_equal(runs[0][tag], runs[1][tag], err_msg=tag)


@pytest.mark.parametrize("bootstrap", (False, True), ids=("no-bootstrap", "bootstrap"))
@pytest.mark.parametrize("name", ("ppo", "ppo_continuous_action"))
def test_ppo_advantages_are_cleanrl_loop(name, bootstrap, tmp_path, monkeypatch):
    """Inside the scripts, the one call equals CleanRL's loop on the rollout they collected
    (``--no-bootstrap-truncated``), or the loop that bootstraps truncated steps from
    V(final obs); and the rollouts did contain truncations."""
    calls = []
    compute_gae = rl_triton_cleanrl.compute_gae

    def recording(*args, **kwargs):
        out = compute_gae(*args, **kwargs)
        copy = lambda x: x.clone() if isinstance(x, torch.Tensor) else x
        calls.append(([copy(a) for a in args], {k: copy(v) for k, v in kwargs.items()}, out))
        return out

    monkeypatch.setattr(rl_triton_cleanrl, "compute_gae", recording)
    monkeypatch.chdir(tmp_path)
    args = tiny(name, advantage_backend="torch", shadow_check=False, bootstrap_truncated=bootstrap)
    load(name).main(args)
    assert len(calls) == 2
    n_truncated = 0
    for args, kwargs, (advantages, returns) in calls:
        if bootstrap:
            truncated, final_values = kwargs["truncated"], kwargs["final_values"]
            n_truncated += int(truncated.sum())
            expected = cleanrl_gae_bootstrapped(*args, truncated, final_values)
        else:
            assert kwargs["truncated"] is None
            expected = cleanrl_gae(*args)
        torch.testing.assert_close(advantages, expected[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(returns, expected[1], rtol=1e-5, atol=1e-5)
    assert n_truncated > 0 or not bootstrap


class StepRecorder(gym.Wrapper):
    """Records what each step returned, inside the vector env: ``(obs, terminated, truncated)``
    with the true final observation of an episode (before the vector env resets it)."""

    instances: list[StepRecorder] = []  # in creation order: the vector env's index order

    def __init__(self, env):
        super().__init__(env)
        self.steps = []
        StepRecorder.instances.append(self)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps.append((obs, terminated, truncated))
        return obs, reward, terminated, truncated, info


def _recorded_short_cartpole(**kwargs):
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return StepRecorder(gym.wrappers.TimeLimit(CartPoleEnv(**kwargs), max_episode_steps=12))


gym.register("RecordedShortCartPole-v1", _recorded_short_cartpole)


def test_ppo_bootstraps_truncations_from_the_final_observation(tmp_path, monkeypatch):
    """``--bootstrap-truncated``: the value a truncated step bootstraps from is V of that
    episode's final observation, as the environment itself returned it (recorded inside the
    vector env), under the rollout's parameters; not V of the next episode's first observation.
    (test_ppo_advantages_are_cleanrl_loop checks the call given the script's final values.)"""
    module = load("ppo")
    agents, checked = [], []

    class RecordedAgent(module.Agent):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            agents.append(self)

    compute_gae = rl_triton_cleanrl.compute_gae

    def checking(*args, **kwargs):  # (before the update: the parameters that collected it)
        truncated, final_values = kwargs["truncated"], kwargs["final_values"]
        rollout = len(checked)
        for t, i in truncated.nonzero().tolist():
            obs, terminated, was_truncated = StepRecorder.instances[i].steps[
                rollout * truncated.shape[0] + t
            ]
            assert was_truncated and not terminated
            with torch.no_grad():
                want = agents[0].get_value(torch.as_tensor(obs, dtype=torch.float32)[None])
            torch.testing.assert_close(final_values[t, i], want.flatten()[0])
        checked.append(int(truncated.sum()))
        return compute_gae(*args, **kwargs)

    StepRecorder.instances.clear()
    monkeypatch.setattr(module, "Agent", RecordedAgent)
    monkeypatch.setattr(rl_triton_cleanrl, "compute_gae", checking)
    monkeypatch.chdir(tmp_path)
    args = tiny("ppo", advantage_backend="torch", shadow_check=False, bootstrap_truncated=True)
    args.env_id = "RecordedShortCartPole-v1"
    module.main(args)
    assert len(StepRecorder.instances) == args.num_envs and len(agents) == 1
    assert len(checked) == 2 and sum(checked) > 0, checked


def test_ppo_async_envs(tmp_path, monkeypatch):
    """Worker processes may be spawned (another test's import can set the start method), and
    then they only know the registered environments: no ShortCartPole here."""
    monkeypatch.chdir(tmp_path)
    args = tiny("ppo", advantage_backend="torch", async_envs=True, env_id="CartPole-v1")
    logdir = load("ppo").main(args)
    check_run(logdir, n_updates=2, extra_tags=PPO_TAGS)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Box2D's SWIG types on import
def test_default_tasks(tmp_path, monkeypatch):
    """The default harder tasks construct and run (MuJoCo's HalfCheetah-v5 for continuous PPO,
    Box2D's LunarLander-v3 for IMPALA), when their packages are installed."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for name, env_id, module in (
        ("ppo_continuous_action", "HalfCheetah-v5", "mujoco"),
        ("impala", "LunarLander-v3", "Box2D"),
    ):
        if importlib.util.find_spec(module) is None:
            continue
        kw = dict(env_id=env_id, advantage_backend="torch", shadow_check=False)
        load(name).main(tiny(name, **kw))
        ran += 1
    if not ran:
        pytest.skip("neither mujoco nor Box2D is installed")


def test_command_line(tmp_path):
    """The script runs as CleanRL's do, flags parsed by tyro (subprocess)."""
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    flags = ["--env-id", "CartPole-v1", "--num-envs", "2", "--num-steps", "16"]
    flags += ["--total-timesteps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
    flags += ["--no-cuda", "--advantage-backend", "torch", "--no-bootstrap-truncated"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "ppo.py"), *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SPS:" in done.stdout
    (run,) = (tmp_path / "runs").iterdir()
    assert "losses/value_loss" in scalars(run)


@pytest.mark.parametrize("name", ("ppo", "ppo_continuous_action", "impala"))
def test_flags(name):
    """The rl_triton options of every script, as tyro parses them."""
    import tyro

    Args = load(name).Args
    args = tyro.cli(Args, args=["--advantage-backend", "triton", "--no-bootstrap-truncated"])
    assert args.advantage_backend == "triton" and args.bootstrap_truncated is False
    assert tyro.cli(Args, args=["--shadow-check"]).shadow_check is True
    assert Args().bootstrap_truncated is True and Args().advantage_backend == "auto"
    with pytest.raises(SystemExit):
        tyro.cli(Args, args=["--advantage-backend", "cuda"])


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("name", ("ppo", "ppo_continuous_action", "impala"))
def test_cuda_triton(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = tiny(name, cuda=True, advantage_backend="triton")
    logdir = load(name).main(args)  # sets args.num_iterations
    check_run(logdir, n_updates=args.num_iterations)
