"""Why the shadow check scales errors by the largest output (docs/parity.md#the-shadow-check).

Builds CartPole-like rollouts late in training: reward 1 per step, episodes truncated at 500
steps, and a critic that has fitted the value of that chain (~100) up to a noise level. Every
TD error is then tiny, and so are the advantages. Each float32 evaluation of GAE (CleanRL's
verbatim loop; ``rl_triton_core``'s torch path; Triton, under the interpreter on a CPU) is
compared with the float64 reference on the same float32 inputs, by two metrics:

* per output: ``max_k max|ours_k - ref_k| / max|ref_k|`` (each output scaled by itself);
* normwise (``rl_triton_cleanrl.max_rel_diff``, the shadow check): one scale, the largest
  output, for all of them.

    TRITON_INTERPRET=1 python examples/parity/shadow_conditioning.py
"""

from __future__ import annotations

import os

import torch

import rl_triton_cleanrl as rc


def cleanrl_loop(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """The GAE loop of CleanRL's ppo.py, in float32 as it runs there."""
    advantages, lastgaelam = torch.zeros_like(rewards), 0
    for t in reversed(range(rewards.shape[0])):
        if t == rewards.shape[0] - 1:
            nextnonterminal, nextvalues = 1.0 - next_done, next_value
        else:
            nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


def per_output(actual, expected) -> float:
    return max(
        ((a.double() - e).abs().max() / e.abs().max()).item() for a, e in zip(actual, expected)
    )


def rollout(g: torch.Generator, noise: float, T=128, N=4, gamma=0.99, horizon=500):
    start = torch.randint(0, horizon, (N,), generator=g)
    k = (start[None] + torch.arange(T + 1)[:, None]) % horizon  # step within the episode
    true_value = (1 - gamma ** (horizon - k).double()) / (1 - gamma)
    fitted = (true_value + noise * torch.randn(T + 1, N, generator=g, dtype=torch.float64)).float()
    return dict(
        rewards=torch.ones(T, N),
        values=fitted[:T],
        dones=(k[:T] == 0).float(),
        next_value=fitted[T][None],
        next_done=(k[T] == 0).float(),
    )


def errors(noise: float, backends: list[str], rollouts: int = 20, seed: int = 0) -> dict:
    """``{(metric, implementation): worst error}`` over ``rollouts`` rollouts at a critic
    ``noise``, plus ``"max|A|"``: the median of the rollouts' largest advantage."""
    g = torch.Generator().manual_seed(seed)
    worst, scales = {}, []
    for _ in range(rollouts):
        r = rollout(g, noise)
        args = (*r.values(), 0.99, 0.95)
        ref = rc.compute_gae(*(x.double() if torch.is_tensor(x) else x for x in args),
                             backend="reference")  # fmt: skip
        scales.append(ref[0].abs().max().item())
        outs = {"CleanRL loop": cleanrl_loop(*args)}
        outs |= {b: rc.compute_gae(*args, backend=b) for b in backends}
        for name, out in outs.items():
            for metric, fn in (("per output", per_output), ("normwise", rc.max_rel_diff)):
                key = (metric, name)
                worst[key] = max(worst.get(key, 0.0), fn(out, ref))
    worst["max|A|"] = sorted(scales)[len(scales) // 2]
    return worst


def main() -> None:
    backends = ["torch"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else [])
    names = ["CleanRL loop", *backends]
    print("critic noise | max|A| (median) | per output: " + ", ".join(names)
          + " | normwise: " + ", ".join(names))  # fmt: skip
    for noise in (1e-1, 1e-2, 1e-3, 1e-4):
        worst = errors(noise, backends)
        cells = [f"{worst[(m, n)]:.1e}" for m in ("per output", "normwise") for n in names]
        print(f"{noise:g} | {worst['max|A|']:.1e} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
