"""A short learning-curve parity check: CleanRL PPO on CartPole-v1, reference vs ours.

The short version of pair 1 of the parity study (docs/parity.md): 2 seeds per side, 25k steps
each, the float64 ``reference`` backend against ``auto`` (Triton with CUDA, the torch path on
the CPU), our side with the shadow check. Prints the largest shadow-check difference, both
sides' final returns and the verdict, and writes the plot (a few minutes on a 2-core CPU).

    python examples/parity/quick.py
    python examples/parity/quick.py --seeds 3 --total-timesteps 50000 --out runs/parity_quick
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import analyze
import run


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--total-timesteps", type=int, default=25_000)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    parser.add_argument("--out", default="runs/parity_quick", help="results, table and plots")
    parser.add_argument("--backend-b", default="auto")
    opts = parser.parse_args(argv)

    start = time.perf_counter()
    out = Path(opts.out)
    args = run.parse_args(
        [
            "--pair", "ppo", "--seeds", str(opts.seeds),
            "--total-timesteps", str(opts.total_timesteps), "--workers", str(opts.workers),
            "--results", str(out), "--backend-b", opts.backend_b,
        ]
    )  # fmt: skip
    print(
        f"CleanRL PPO, CartPole-v1: {opts.seeds} seeds x {opts.total_timesteps} steps per side, "
        f"reference vs {opts.backend_b}, {opts.workers} runs at a time",
        flush=True,
    )
    run.run_pair(args)
    (result,) = analyze.analyze(out, out, pairs=["ppo"])
    final = result["final"]
    print()
    print(
        f"shadow check: max relative difference {result['shadow_max']:.2e} over every update "
        f"({'OK' if result['shadow_ok'] else 'FAILED'}, limit {analyze.SHADOW_LIMIT:g})"
    )
    for side, key in (("A", "ref_mean"), ("B", "ours_mean")):
        print(
            f"final return (last 10% of steps), {side} {result['sides'][side]:>9}: "
            f"{final[key]:6.1f} (mean of {len(final['seeds'])} seeds)"
        )
    lo, hi = final["ci"]
    print(
        f"paired difference B - A: final {final['mean_diff']:+.1f} [95% CI {lo:.1f}, {hi:.1f}], "
        f"AUC {result['auc']['mean_diff']:+.1f}; verdict: {result['verdict']}"
    )
    print(f"plot: {out / 'ppo.png'} (first updates: {out / 'ppo_first_updates.png'})")
    print(f"table: {out / 'parity.md'}; {time.perf_counter() - start:.0f} s")
    return result


if __name__ == "__main__":
    main()
