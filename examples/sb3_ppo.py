"""Stable-Baselines3 PPO on CartPole with advantages computed by ``rl_triton_core``.

The only change to an SB3 script is the rollout buffer class:

    PPO("MlpPolicy", env, rollout_buffer_class=TritonRolloutBuffer)

Prints the mean episode reward of the trained policy and the time spent computing advantages
(``compute_returns_and_advantage``). ``--baseline`` runs the same training with SB3's own
``RolloutBuffer`` for comparison: with the same seed both train the same policy, to float32
rounding.

    python examples/sb3_ppo.py                             # 8 envs x 256 steps, 100k steps
    python examples/sb3_ppo.py --baseline                  # SB3's buffer
    python examples/sb3_ppo.py --n-envs 64 --n-steps 2048 --total-timesteps 400000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from rl_triton_sb3 import TritonRolloutBuffer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--n-steps", type=int, default=256, help="steps per env per rollout")
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="the model's device (SB3's device=)")
    parser.add_argument(
        "--advantage-device", default="auto", choices=["auto", "cpu", "cuda"],
        help="where the advantages are computed (rl_triton_sb3; 'auto': see docs/sb3.md)",
    )  # fmt: skip
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--torch-threads", type=int, default=1,
        help="torch.set_num_threads (1, as rl-zoo does on the CPU: small networks run faster)",
    )  # fmt: skip
    parser.add_argument("--baseline", action="store_true", help="use SB3's RolloutBuffer")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)

    env = make_vec_env(args.env_id, n_envs=args.n_envs, seed=args.seed)
    buffer = dict(rollout_buffer_class=RolloutBuffer)
    if not args.baseline:
        buffer = dict(
            rollout_buffer_class=TritonRolloutBuffer,
            rollout_buffer_kwargs=dict(advantage_device=args.advantage_device),
        )
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=args.n_steps,
        batch_size=min(256, args.n_steps * args.n_envs),
        seed=args.seed,
        device=args.device,
        **buffer,
    )

    # time the advantage computation (the only thing the buffer class changes)
    rollout_buffer, seconds = model.rollout_buffer, []
    compute = rollout_buffer.compute_returns_and_advantage

    def timed_compute(last_values, dones):
        start = time.perf_counter()
        compute(last_values, dones)
        seconds.append(time.perf_counter() - start)

    rollout_buffer.compute_returns_and_advantage = timed_compute

    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps)
    train_s = time.perf_counter() - start
    mean, std = evaluate_policy(model, model.get_env(), n_eval_episodes=args.eval_episodes)

    name = type(rollout_buffer).__name__
    print(f"{args.env_id}, PPO with {name}, {model.num_timesteps} steps in {train_s:.1f} s")
    print(
        f"compute_returns_and_advantage: {len(seconds)} calls on [{args.n_steps}, "
        f"{args.n_envs}], median {1e3 * np.median(seconds):.3f} ms"
    )
    print(f"mean episode reward: {mean:.1f} +/- {std:.1f}")


if __name__ == "__main__":
    main()
