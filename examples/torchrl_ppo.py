"""PPO on CartPole with TorchRL, its advantages computed by rl_triton_core when switched on.

A plain TorchRL training script (the layout of TorchRL's own PPO examples: a collector, a
``GAE`` module called on each batch under ``no_grad``, ``ClipPPOLoss`` over minibatches). The
only rl_triton line is ``rl_triton_torchrl.enable()``: it swaps the recursion inside TorchRL's
``GAE`` for ``rl_triton_core.gae`` (Triton on CUDA, the vectorised torch path on the CPU);
everything else is TorchRL's code.

    python examples/torchrl_ppo.py                     # TorchRL's own GAE
    python examples/torchrl_ppo.py --rl-triton         # rl_triton_core inside TorchRL's GAE
    python -m rl_triton_torchrl examples/torchrl_ppo.py    # the same, script untouched
    RL_TRITON_TORCHRL=1 python examples/torchrl_ppo.py     # (the variable, read at import)

Needs the ``torchrl`` and ``cleanrl`` extras (torchrl, gymnasium). Runs on the CPU in under a
minute with the defaults; ``--iterations 100`` learns CartPole (episode return near 500).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import OneHotCategorical
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.envs import Compose, GymEnv, RewardSum, SerialEnv, StepCounter, TransformedEnv
from torchrl.modules import MLP, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

import rl_triton_torchrl


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    num_envs: int = 4  # environments stepped in series (SerialEnv): tensordicts [num_envs, T]
    steps_per_env: int = 128  # T, the rollout length per environment and iteration
    iterations: int = 5
    epochs: int = 4
    minibatch_size: int = 128
    lr: float = 2.5e-4
    gamma: float = 0.99
    lmbda: float = 0.95
    clip_epsilon: float = 0.2
    entropy_coeff: float = 0.01
    seed: int = 1
    device: str = "cpu"
    threads: int = 1  # torch CPU threads: one is fastest for these tiny networks
    rl_triton: bool | None = None  # True: enable(); False: disable(); None: leave as is


def parse_args() -> Args:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name, default in vars(Args()).items():
        flag = "--" + name.replace("_", "-")
        if name == "rl_triton":
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=None,
                help="compute TorchRL's GAE with rl_triton_core (default: as the environment "
                "variable RL_TRITON_TORCHRL or the `python -m rl_triton_torchrl` runner say)",
            )
        else:
            parser.add_argument(flag, type=type(default), default=default)
    return Args(**vars(parser.parse_args()))


def make_env(args: Args) -> TransformedEnv:
    env = SerialEnv(args.num_envs, lambda: GymEnv(args.env_id, device=args.device))
    env = TransformedEnv(env, Compose(StepCounter(), RewardSum()))
    env.set_seed(args.seed)
    return env


def make_agent(env: TransformedEnv, device: str) -> tuple[ProbabilisticActor, ValueOperator]:
    n_obs = env.observation_spec["observation"].shape[-1]
    n_actions = env.action_spec.shape[-1]
    logits = MLP(
        in_features=n_obs, out_features=n_actions, num_cells=[64, 64], activation_class=nn.Tanh
    )
    actor = ProbabilisticActor(
        TensorDictModule(logits, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        spec=env.action_spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    value = MLP(in_features=n_obs, out_features=1, num_cells=[64, 64], activation_class=nn.Tanh)
    critic = ValueOperator(value, in_keys=["observation"])
    return actor.to(device), critic.to(device)


def main(args: Args) -> dict[str, float]:
    if args.rl_triton is True:
        rl_triton_torchrl.enable()
    elif args.rl_triton is False:
        rl_triton_torchrl.disable()
    on = rl_triton_torchrl.is_enabled()
    print(f"advantages: {'rl_triton_core inside TorchRL GAE' if on else 'TorchRL GAE'}")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    env = make_env(args)
    actor, critic = make_agent(env, args.device)
    frames_per_batch = args.num_envs * args.steps_per_env
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * args.iterations,
        device=args.device,
        auto_register_policy_transforms=False,  # the MLP policy needs no InitTracker
    )
    # TorchRL's examples: the advantage module runs on each batch, the loss then skips its own.
    advantage = GAE(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=True)
    loss_module = ClipPPOLoss(
        actor, critic, clip_epsilon=args.clip_epsilon, entropy_coeff=args.entropy_coeff
    )
    optim = torch.optim.Adam(loss_module.parameters(), lr=args.lr)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch, device=args.device),
        sampler=SamplerWithoutReplacement(),
        batch_size=args.minibatch_size,
    )

    returns, stats = [], {}
    start = time.perf_counter()
    for iteration, data in enumerate(collector):  # data: [num_envs, T], time last
        t0 = time.perf_counter()
        with torch.no_grad():
            advantage(data)
        adv_ms = 1e3 * (time.perf_counter() - t0)
        buffer.extend(data.reshape(-1))
        for _ in range(args.epochs):
            for _ in range(frames_per_batch // args.minibatch_size):
                losses = loss_module(buffer.sample())
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_module.parameters(), 0.5)
                optim.step()
        collector.update_policy_weights_()
        ended = data["next", "done"]
        if ended.any():
            returns.append(data["next", "episode_reward"][ended].mean().item())
        stats = {
            "iteration": iteration,
            "frames": (iteration + 1) * frames_per_batch,
            "episode_return": returns[-1] if returns else float("nan"),
            "loss": loss.item(),
            "advantage_ms": adv_ms,
            "sps": (iteration + 1) * frames_per_batch / (time.perf_counter() - start),
        }
        print(
            "iter {iteration:3d}  frames {frames:6d}  episode return {episode_return:7.1f}  "
            "loss {loss:7.3f}  GAE {advantage_ms:6.2f} ms  {sps:6.0f} steps/s".format(**stats)
        )
    collector.shutdown()
    return stats


if __name__ == "__main__":
    main(parse_args())
