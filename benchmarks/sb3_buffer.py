"""``compute_returns_and_advantage``: rl_triton_sb3's buffer against Stable-Baselines3's.

Times the method SB3's training loop calls once per rollout, on real buffers: SB3's
``RolloutBuffer`` (its numpy loop) and ``rl_triton_sb3.TritonRolloutBuffer`` with
``advantage_device="cpu"`` (the torch path) and, with ``--device cuda``, ``"cuda"`` (one copy
to the GPU, Triton, one copy back). Each sample is what one rollout costs: the buffer is
``reset()`` and refilled with the same random rollout (not timed), then one call is timed;
the result is the median of ``--repeats`` samples, the variants interleaved so that they see
the same machine load. Every shape is first checked for agreement with SB3 (float32
tolerance); a disagreement is reported and that shape is not timed.

``--device`` is the model's device (SB3's ``device=``; ``last_values`` arrive there). With
``cuda`` it also reports, per shape, whether the CPU or the GPU computation is faster and the
smallest ``n_steps * n_envs`` from which the GPU wins at every larger measured shape: the
value for ``rl_triton_sb3.CUDA_MIN_ELEMENTS`` (``advantage_device="auto"``).

    python benchmarks/sb3_buffer.py                     # CPU, writes results/sb3_buffer_cpu.json
    python benchmarks/sb3_buffer.py --device cuda       # writes results/sb3_buffer_cuda.json
    python benchmarks/sb3_buffer.py --shapes 2048x64 1024x1024 --repeats 31
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

try:
    import stable_baselines3
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    import rl_triton_sb3
    from rl_triton_sb3 import TritonRolloutBuffer
except ImportError as e:  # pragma: no cover - message for people running it by hand
    raise SystemExit(f"{e}\nThis benchmark needs the sb3 extra: pip install -e '.[sb3]'") from e

SHAPES = [(2048, 1), (2048, 16), (256, 256), (128, 4096)]  # n_steps x n_envs
CROSSOVER_SHAPES = [(2048, 64), (1024, 1024), (2048, 4096)]  # added with --device cuda
GAMMA, LAMBDA = 0.99, 0.95
RTOL, ATOL = 1e-4, 1e-4
RESULTS = Path(__file__).resolve().parent / "results"
BOX = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)


def rollout(T: int, N: int, device: str, seed: int = 0) -> dict:
    """A random rollout: rewards, values, episode starts (2%), last_values on the model's
    device, dones."""
    rng = np.random.default_rng(seed)
    return dict(
        rewards=rng.standard_normal((T, N), dtype=np.float32),
        values=rng.standard_normal((T, N), dtype=np.float32),
        episode_starts=(rng.random((T, N)) < 0.02).astype(np.float32),
        last_values=torch.from_numpy(rng.standard_normal((N, 1), dtype=np.float32)).to(device),
        dones=rng.random(N) < 0.02,
    )


def refill(buffer: RolloutBuffer, data: dict) -> None:
    """What a rollout leaves in the buffer: reset(), then the rollout's arrays."""
    buffer.reset()
    buffer.rewards[:] = data["rewards"]
    buffer.values[:] = data["values"]
    buffer.episode_starts[:] = data["episode_starts"]
    buffer.full = True


def call(buffer: RolloutBuffer, data: dict) -> float:
    """Seconds of one compute_returns_and_advantage on a freshly refilled buffer."""
    refill(buffer, data)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    buffer.compute_returns_and_advantage(last_values=data["last_values"], dones=data["dones"])
    return time.perf_counter() - start  # the results are in numpy: nothing left in flight


def machine_info(device: str) -> dict:
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
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "cuda_min_elements": rl_triton_sb3.CUDA_MIN_ELEMENTS,
        "git_commit": commit,
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


def parse_shape(s: str) -> tuple[int, int]:
    t, n = s.lower().split("x")
    return int(t), int(n)


def crossover(rows: list[dict]) -> int | None:
    """Smallest n_steps * n_envs from which the GPU path wins at every larger measured size."""
    best = None
    for row in sorted(rows, key=lambda r: r["elements"], reverse=True):
        if row["ours_cuda_ms"] >= row["ours_cpu_ms"]:
            break
        best = row["elements"]
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="model device")
    parser.add_argument("--shapes", nargs="*", type=parse_shape, help="e.g. 2048x1 128x4096")
    parser.add_argument("--repeats", type=int, default=21, help="samples per timing (median)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--output", type=Path, help="default: results/sb3_buffer_<device>.json")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    shapes = args.shapes or (SHAPES + CROSSOVER_SHAPES if cuda else SHAPES)
    info = machine_info(args.device)
    print(
        f"model on {args.device}; torch {info['torch']} ({info['torch_threads']} threads), "
        f"SB3 {info['stable_baselines3']}, {info['cpu']} x{info['cpu_count']}"
        + (f", {info['gpu']}" if cuda else "")
    )

    variants = {
        "sb3": (RolloutBuffer, {}),
        "ours_cpu": (TritonRolloutBuffer, {"advantage_device": "cpu"}),
    }
    if cuda:
        variants["ours_cuda"] = (TritonRolloutBuffer, {"advantage_device": "cuda"})
    rows, failures = [], []
    for T, N in shapes:
        data = rollout(T, N, args.device)
        buffers = {
            name: cls(T, BOX, BOX, args.device, LAMBDA, GAMMA, N, **kw)
            for name, (cls, kw) in variants.items()
        }
        # correctness gate: every variant against SB3's result
        call(buffers["sb3"], data)
        expected = buffers["sb3"].advantages.copy(), buffers["sb3"].returns.copy()
        err, bad = 0.0, []
        for name, buffer in buffers.items():
            call(buffer, data)
            for got, want in zip((buffer.advantages, buffer.returns), expected):
                err = max(err, float(np.max(np.abs(got - want))))
                if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
                    bad.append(name)
        if bad:
            failures.append(f"[{T}, {N}] {bad}: disagree with SB3 (max abs diff {err:.3g})")
            print(failures[-1])
            continue
        samples: dict[str, list[float]] = {name: [] for name in buffers}
        for _ in range(args.repeats):
            for name, buffer in buffers.items():
                samples[name].append(call(buffer, data))
        ms = {name: 1e3 * statistics.median(s) for name, s in samples.items()}
        auto = TritonRolloutBuffer(T, BOX, BOX, args.device, LAMBDA, GAMMA, N)
        row = {
            "n_steps": T,
            "n_envs": N,
            "elements": T * N,
            "sb3_ms": ms["sb3"],
            "ours_cpu_ms": ms["ours_cpu"],
            "sb3_over_ours_cpu": ms["sb3"] / ms["ours_cpu"],
            "auto_device": auto._rl_triton_plan.device.type,
            "max_abs_diff": err,
            "min_ms": {name: 1e3 * min(s) for name, s in samples.items()},
        }
        if cuda:
            row.update(ours_cuda_ms=ms["ours_cuda"], sb3_over_ours_cuda=ms["sb3"] / ms["ours_cuda"])
        rows.append(row)
        line = f"[{T}, {N}]: SB3 {ms['sb3']:.3f} ms, ours cpu {ms['ours_cpu']:.3f} ms"
        line += f" ({row['sb3_over_ours_cpu']:.2f}x)"
        if cuda:
            line += f", ours cuda {ms['ours_cuda']:.3f} ms ({row['sb3_over_ours_cuda']:.2f}x)"
        print(line + f", auto -> {row['auto_device']}", flush=True)
        del buffers, auto, data

    print()
    cuda_cols = " ours cuda (ms) | SB3 / ours cuda |" if cuda else ""
    print(f"| n_steps x n_envs | SB3 (ms) | ours cpu (ms) | SB3 / ours cpu |{cuda_cols} auto |")
    print("|---|---:|---:|---:|" + ("---:|---:|" if cuda else "") + "---|")
    for r in rows:
        cells = [
            f"{r['n_steps']} x {r['n_envs']}",
            f"{r['sb3_ms']:.3f}",
            f"{r['ours_cpu_ms']:.3f}",
            f"{r['sb3_over_ours_cpu']:.2f}x",
        ]
        if cuda:
            cells += [f"{r['ours_cuda_ms']:.3f}", f"{r['sb3_over_ours_cuda']:.2f}x"]
        print("| " + " | ".join([*cells, r["auto_device"]]) + " |")
    summary = {}
    if cuda and rows:
        summary["measured_cuda_min_elements"] = crossover(rows)
        print(
            f"\nGPU faster from n_steps * n_envs = {summary['measured_cuda_min_elements']} "
            f"(CUDA_MIN_ELEMENTS is {rl_triton_sb3.CUDA_MIN_ELEMENTS})"
        )

    output = args.output or RESULTS / f"sb3_buffer_{args.device}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "sb3_buffer",
        "description": "RolloutBuffer.compute_returns_and_advantage, SB3 2.9.2 vs "
        "rl_triton_sb3.TritonRolloutBuffer; fp32; median wall time of one call on a freshly "
        "reset and refilled buffer",
        "model_device": args.device,
        "gamma": GAMMA,
        "lambda": LAMBDA,
        "repeats": args.repeats,
        "machine": info,
        "results": rows,
        **summary,
        "failures": failures,
    }
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {output}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
