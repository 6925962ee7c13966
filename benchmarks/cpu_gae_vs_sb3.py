"""CPU GAE: Stable-Baselines3's ``RolloutBuffer`` loop against ``rl_triton_core.gae``.

The baseline is SB3's own code, not a copy of it: a real ``RolloutBuffer`` (gymnasium ``Box``
spaces) whose numpy arrays ``rewards``, ``values`` and ``episode_starts`` are filled with random
data, timed through ``compute_returns_and_advantage(last_values, dones)``.

Ours gets the same data converted to the contract (SB3 marks ``episode_starts[t + 1]`` where
the contract has ``terminated[t]``; ``dones`` is ``terminated[T - 1]``; ``last_values`` is the
``bootstrap_value``). Two timings are reported:

* **full call**: what a drop-in buffer would do: ``torch.from_numpy`` of SB3's arrays (no
  copies), the shift of ``episode_starts`` into ``terminated`` (one ``[T, N]`` flag copy), and
  ``gae(..., backend="torch", out=...)`` writing advantages and returns straight into the
  buffer's numpy arrays. The ratio SB3 / ours uses this time;
* **gae only**: ``gae`` on tensors already in the contract's form.

Every shape is first checked for agreement (float32 tolerance) and only then timed: best of
``--repeats`` samples, each sample the mean of enough back-to-back calls to last >= ~20 ms,
the three timings interleaved so that they see the same machine load.
torch keeps its default thread count unless ``--threads`` is given. Prints a markdown table and
writes benchmarks/results/cpu_gae_vs_sb3.json (with the machine, versions, threads and load).

    python benchmarks/cpu_gae_vs_sb3.py                 # all shapes
    python benchmarks/cpu_gae_vs_sb3.py --shapes 2048x1 128x4096
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import rl_triton_core as rtc

try:
    import stable_baselines3
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer
except ImportError as e:  # pragma: no cover - message for people running it by hand
    raise SystemExit(
        f"{e}\nThis benchmark needs Stable-Baselines3: pip install -e '.[bench]' "
        "(or `make bench-cpu`)"
    ) from e

SHAPES = [
    (16, 1),
    (16, 8),
    (128, 1),
    (128, 8),
    (128, 64),
    (256, 1),
    (256, 16),
    (256, 64),
    (256, 256),
    (1024, 1),
    (1024, 64),
    (2048, 1),
    (2048, 16),
    (2048, 64),
    (128, 4096),
    (2048, 1024),
    (2048, 4096),
]
GAMMA, LAMBDA = 0.99, 0.95
RTOL, ATOL = 1e-4, 1e-4  # float32; both sides accumulate in float32
RESULTS = Path(__file__).resolve().parent / "results" / "cpu_gae_vs_sb3.json"


def make_buffer(T: int, N: int, seed: int, p_episode_start: float = 0.02):
    """An SB3 RolloutBuffer [T, N] filled with random rewards, values and episode starts."""
    box = spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=np.float32)
    buf = RolloutBuffer(T, box, box, device="cpu", gae_lambda=LAMBDA, gamma=GAMMA, n_envs=N)
    rng = np.random.default_rng(seed)
    buf.rewards[:] = rng.standard_normal((T, N), dtype=np.float32)
    buf.values[:] = rng.standard_normal((T, N), dtype=np.float32)
    buf.episode_starts[:] = rng.random((T, N)) < p_episode_start
    last_values = torch.from_numpy(rng.standard_normal((N, 1), dtype=np.float32))
    dones = rng.random(N) < p_episode_start  # bool, as VecEnv.step returns them
    return buf, last_values, dones


def ours_full_call(buf: RolloutBuffer, last_values: torch.Tensor, dones: np.ndarray) -> None:
    """What a drop-in ``compute_returns_and_advantage`` does: convert, compute, write back."""
    rewards = torch.from_numpy(buf.rewards)
    values = torch.from_numpy(buf.values)
    starts = torch.from_numpy(buf.episode_starts)
    terminated = torch.empty_like(starts)
    terminated[:-1] = starts[1:]
    terminated[-1] = torch.from_numpy(dones)
    rtc.gae(
        rewards,
        values,
        terminated,
        bootstrap_value=last_values.view(-1),
        gamma=GAMMA,
        lmbda=LAMBDA,
        backend="torch",
        out=(torch.from_numpy(buf.advantages), torch.from_numpy(buf.returns)),
    )


def contract_inputs(buf: RolloutBuffer, last_values: torch.Tensor, dones: np.ndarray):
    """The same data as independent contract tensors (for the gae-only timing)."""
    terminated = np.concatenate([buf.episode_starts[1:], dones[None].astype(np.float32)])
    return (
        torch.from_numpy(buf.rewards.copy()),
        torch.from_numpy(buf.values.copy()),
        torch.from_numpy(terminated),
        last_values.view(-1).clone(),
    )


def best_times(fns: list[Callable[[], object]], repeats: int, min_sample_s: float = 0.02):
    """Best of ``repeats`` samples of the mean seconds per call, for each of ``fns``.

    Each sample runs enough back-to-back calls to last >= ``min_sample_s``. The functions'
    samples are interleaved (a, b, c, a, b, c, ...) so that they all see the same machine load.
    """
    inner = []
    for fn in fns:
        fn()  # warm-up
        t0 = time.perf_counter()
        fn()
        once = max(time.perf_counter() - t0, 1e-7)
        inner.append(max(1, min(10_000, int(min_sample_s / once))))
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(inner[i]):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / inner[i])
    return best


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "rl_triton_core": getattr(rtc, "__version__", None),
        "git_commit": commit,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def parse_shape(s: str) -> tuple[int, int]:
    t, n = s.lower().split("x")
    return int(t), int(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", type=parse_shape, help="e.g. 2048x1 128x4096")
    parser.add_argument("--repeats", type=int, default=9, help="samples per timing (best of)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = args.shapes or SHAPES
    info = machine_info()
    print(
        f"torch {info['torch']} ({info['torch_threads']} threads), numpy {info['numpy']}, "
        f"SB3 {info['stable_baselines3']}, {info['cpu']} x{info['cpu_count']}"
    )

    rows, failures = [], []
    for T, N in shapes:
        buf, last_values, dones = make_buffer(T, N, args.seed)
        # Correctness gate: SB3's result first, then ours written into the same buffer.
        buf.compute_returns_and_advantage(last_values=last_values, dones=dones)
        sb3_adv, sb3_ret = buf.advantages.copy(), buf.returns.copy()
        buf.advantages[:] = np.nan
        buf.returns = np.full_like(sb3_ret, np.nan)
        ours_full_call(buf, last_values, dones)
        err = max(
            float(np.max(np.abs(buf.advantages - sb3_adv))),
            float(np.max(np.abs(buf.returns - sb3_ret))),
        )
        ok = np.allclose(buf.advantages, sb3_adv, rtol=RTOL, atol=ATOL) and np.allclose(
            buf.returns, sb3_ret, rtol=RTOL, atol=ATOL
        )
        if not ok:
            failures.append(f"[{T}, {N}]: ours and SB3 disagree (max abs diff {err:.3g})")
            print(failures[-1])
            continue
        r, v, term, boot = contract_inputs(buf, last_values, dones)

        def sb3_call(buf=buf, last_values=last_values, dones=dones):
            buf.compute_returns_and_advantage(last_values=last_values, dones=dones)

        def ours_call(buf=buf, last_values=last_values, dones=dones):
            ours_full_call(buf, last_values, dones)

        def gae_only(r=r, v=v, term=term, boot=boot):
            rtc.gae(r, v, term, bootstrap_value=boot, gamma=GAMMA, lmbda=LAMBDA, backend="torch")

        t_sb3, t_ours, t_gae = best_times([sb3_call, ours_call, gae_only], args.repeats)
        rows.append(
            {
                "T": T,
                "N": N,
                "sb3_ms": 1e3 * t_sb3,
                "ours_full_call_ms": 1e3 * t_ours,
                "ours_gae_only_ms": 1e3 * t_gae,
                "speedup_sb3_over_ours": t_sb3 / t_ours,
                "max_abs_diff": err,
            }
        )
        x = rows[-1]
        print(
            f"[{T}, {N}]: SB3 {x['sb3_ms']:.3f} ms, ours {x['ours_full_call_ms']:.3f} ms "
            f"(gae only {x['ours_gae_only_ms']:.3f} ms), {x['speedup_sb3_over_ours']:.2f}x",
            flush=True,
        )
        del buf, r, v, term, boot

    print()
    print(
        "| [T, N] | SB3 RolloutBuffer (ms) | ours, full call (ms) | SB3 / ours "
        "| ours, gae only (ms) | max abs diff |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for x in rows:
        print(
            f"| [{x['T']}, {x['N']}] | {x['sb3_ms']:.3f} | {x['ours_full_call_ms']:.3f} "
            f"| {x['speedup_sb3_over_ours']:.2f}x | {x['ours_gae_only_ms']:.3f} "
            f"| {x['max_abs_diff']:.1e} |"
        )

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps(
            {
                "benchmark": "cpu_gae_vs_sb3",
                "description": "GAE fp32 on the CPU: SB3 2.9.2 RolloutBuffer."
                "compute_returns_and_advantage vs rl_triton_core.gae(backend='torch'); "
                "best-of-N wall times per call",
                "gamma": GAMMA,
                "lambda": LAMBDA,
                "repeats": args.repeats,
                "machine": info,
                "results": rows,
                "failures": failures,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwrote {args.output}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
