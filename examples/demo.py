"""Demo: every estimator of rl_triton_core on one synthetic rollout, with every backend.

For each public function (the generic ``linear_scan`` and the seven estimators, Retrace with
all four traces) and each backend that ``rl_triton_core.available_backends(device)`` lists,
it prints the largest relative difference from ``backend="reference"`` (the float64 oracle)
and the time per call.

The rollout mixes everything the contract distinguishes: terminations, time-limit
truncations bootstrapped from ``next_values`` (the value of the final observation), an
off-policy behaviour policy for V-trace and Retrace, and a trailing feature axis for the
eligibility traces.

    python examples/demo.py                       # T=128, N=64 on CUDA if present, else CPU
    TRITON_INTERPRET=1 python examples/demo.py    # CPU: Triton kernels via the interpreter
    python examples/demo.py --T 1024 --N 256 --dtype float16
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import rl_triton_core as rtc

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass
class Rollout:
    """A synthetic rollout ``[T, N]`` (time-major) in the contract's terms."""

    rewards: torch.Tensor
    values: torch.Tensor
    terminated: torch.Tensor  # bool: s_{t+1} is terminal
    truncated: torch.Tensor  # bool: time limit after step t, bootstrap from next_values[t]
    next_values: torch.Tensor  # V(s_{t+1}); at a truncated step V(final observation)
    target_log_probs: torch.Tensor
    behavior_log_probs: torch.Tensor
    q_values: torch.Tensor
    next_expected_q: torch.Tensor
    features: torch.Tensor  # [T, N, F] for eligibility traces
    scan_a: torch.Tensor
    scan_b: torch.Tensor


def make_rollout(T: int, N: int, device: torch.device, dtype: torch.dtype, seed: int) -> Rollout:
    g = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    def coin(p: float, *shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g) < p

    values = randn(T + 1, N)  # V(s_0) .. V(s_T)
    terminated = coin(0.02, T, N)
    truncated = coin(0.01, T, N) & ~terminated
    next_values = values[1:].clone()
    # After a truncation s_{t+1} is the final observation of the old episode, whose value is
    # not values[t + 1] (that is the first state of the next episode).
    next_values[truncated] = randn(int(truncated.sum()))
    behavior = -randn(T, N).abs() - 0.1  # log mu(a_t|s_t) < 0
    target = (behavior + 0.3 * randn(T, N)).clamp(max=0.0)  # log pi(a_t|s_t) <= 0
    done = terminated | truncated
    scan_a = 0.95 * torch.rand(T, N, generator=g) * (~done)  # zero coefficient = hard cut
    tensors = {
        "rewards": randn(T, N),
        "values": values[:-1].contiguous(),
        "next_values": next_values,
        "target_log_probs": target,
        "behavior_log_probs": behavior,
        "q_values": randn(T, N),
        "next_expected_q": randn(T, N),
        "features": randn(T, N, 4),
        "scan_a": scan_a,
        "scan_b": randn(T, N),
    }
    tensors = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
    return Rollout(terminated=terminated.to(device), truncated=truncated.to(device), **tensors)


def cases() -> list[tuple[str, Callable[[Rollout, str], Outputs]]]:
    """(label, call) for each public function; ``call(rollout, backend)`` runs it once."""
    out: list[tuple[str, Callable[[Rollout, str], Outputs]]] = [
        (
            "linear_scan",
            lambda d, b: rtc.linear_scan(d.scan_a, d.scan_b, reverse=True, backend=b),
        ),
        (
            "gae",
            lambda d, b: rtc.gae(
                d.rewards,
                d.values,
                d.terminated,
                truncated=d.truncated,
                next_values=d.next_values,
                gamma=0.99,
                lmbda=0.95,
                backend=b,
            ),
        ),
        (
            "lambda_returns",
            lambda d, b: rtc.lambda_returns(
                d.rewards,
                d.values,
                d.terminated,
                truncated=d.truncated,
                next_values=d.next_values,
                gamma=0.99,
                lmbda=0.95,
                backend=b,
            ),
        ),
        (
            "discounted_returns",
            lambda d, b: rtc.discounted_returns(
                d.rewards,
                d.terminated,
                truncated=d.truncated,
                next_values=d.next_values,
                gamma=0.99,
                backend=b,
            ),
        ),
        (
            "vtrace",
            lambda d, b: rtc.vtrace(
                d.rewards,
                d.values,
                d.target_log_probs,
                d.behavior_log_probs,
                d.terminated,
                truncated=d.truncated,
                next_values=d.next_values,
                gamma=0.99,
                rho_bar=1.0,
                c_bar=1.0,
                backend=b,
            ),
        ),
    ]
    for trace in ("retrace", "tree_backup", "q_lambda", "importance_sampling"):
        out.append(
            (
                f"retrace[{trace}]",
                lambda d, b, trace=trace: rtc.retrace(
                    d.rewards,
                    d.q_values,
                    d.next_expected_q,
                    d.target_log_probs,
                    d.behavior_log_probs,
                    d.terminated,
                    truncated=d.truncated,
                    gamma=0.99,
                    lmbda=0.95,
                    c_bar=1.0,
                    trace=trace,
                    backend=b,
                ),
            )
        )
    out += [
        (
            "eligibility_traces",
            lambda d, b: rtc.eligibility_traces(
                d.features,
                (d.terminated | d.truncated).unsqueeze(-1),  # same rank, broadcasts over F
                gamma=0.99,
                lmbda=0.9,
                backend=b,
            ),
        ),
        (
            "episodic_cumsum",
            lambda d, b: rtc.episodic_cumsum(d.rewards, d.terminated | d.truncated, backend=b),
        ),
    ]
    return out


def as_tuple(x: Outputs) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def max_rel_diff(got: Outputs, ref: Outputs) -> float:
    """max over outputs of ||got - ref||_inf / max(||ref||_inf, 1), in float64."""
    worst = 0.0
    for g, r in zip(as_tuple(got), as_tuple(ref)):
        g, r = g.double(), r.double()
        if g.shape != r.shape:
            return math.inf
        if g.numel() == 0:
            continue
        err = (g - r).abs().max().item()
        scale = max(r.abs().max().item(), 1.0)
        worst = max(worst, err / scale if math.isfinite(err) else math.inf)
    return worst


def time_call(
    fn: Callable[[], Outputs], device: torch.device, budget_s: float, min_calls: int = 3
) -> float:
    """Median seconds per call over repeats within ``budget_s`` (at least ``min_calls``, at
    most 50), after one warm-up call (the caller has already made one: it checked the result)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 50 and (len(times) < min_calls or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def print_table(rows: list[tuple[str, str, str, str, str]], title: str) -> None:
    header = ("function", "backend", "[T, N]", "max rel diff vs reference", "ms / call")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        print(title)
        for i, r in enumerate([header, *rows]):
            print(
                "  ".join(
                    c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))
                )
            )
            if i == 0:
                print("  ".join("-" * w for w in widths))
        return
    table = Table(title=title)
    for j, h in enumerate(header):
        table.add_column(h, justify="left" if j < 3 else "right")
    for r in rows:
        table.add_row(*r)
    Console().print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--T", type=int, default=128, help="rollout length")
    parser.add_argument("--N", type=int, default=64, help="number of environments")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", default="float32", choices=["float16", "bfloat16", "float32", "float64"]
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--interpreted-shape",
        type=int,
        nargs=2,
        default=(16, 4),
        metavar=("T", "N"),
        help="smaller [T, N] for Triton on CPU (the interpreter is slow)",
    )
    parser.add_argument("--budget", type=float, default=0.2, help="timing seconds per cell")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    backends = rtc.available_backends(device)
    interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[
        dtype
    ]

    def shape_for(backend: str) -> tuple[int, int]:
        if backend == "triton" and device.type == "cpu":
            return tuple(args.interpreted_shape)
        return (args.T, args.N)

    rollouts = {s: make_rollout(*s, device, dtype, args.seed) for s in map(shape_for, backends)}
    print(
        f"rl_triton_core {getattr(rtc, '__version__', '?')} | torch {torch.__version__} | "
        f"device {device} | dtype {args.dtype} | backends {backends}"
        + (
            " | Triton through the interpreter (its times are not kernel times)"
            if interpreted
            else ""
        )
    )
    if device.type == "cpu" and "triton" not in backends:
        if interpreted:
            print("(TRITON_INTERPRET=1 is set but the Triton backend cannot be imported here)")
        else:
            print("(Triton runs on CUDA; on the CPU set TRITON_INTERPRET=1 to run its kernels too)")

    rows: list[tuple[str, str, str, str, str]] = []
    failures: list[str] = []
    for name, call in cases():
        refs = {s: call(d, "reference") for s, d in rollouts.items()}
        for backend in backends:
            shape = shape_for(backend)
            data = rollouts[shape]
            try:
                got = call(data, backend)
                diff = max_rel_diff(got, refs[shape])
                slow = backend == "triton" and interpreted  # ~0.5 s a call: time it once
                ms = 1e3 * time_call(
                    lambda: call(data, backend),  # noqa: B023
                    device,
                    0.0 if slow else args.budget,
                    min_calls=1 if slow else 3,
                )
            except Exception as e:  # report and go on: the demo shows every cell
                rows.append((name, backend, str(list(shape)), f"ERROR {type(e).__name__}", "-"))
                failures.append(f"{name}/{backend}: {type(e).__name__}: {e}")
                continue
            ok = diff <= tol or backend == "reference"
            if not ok:
                failures.append(f"{name}/{backend}: max rel diff {diff:.2e} > {tol:.0e}")
            rows.append(
                (
                    name,
                    backend,
                    str(list(shape)),
                    f"{diff:.1e}" + ("" if ok else " (!)"),
                    f"{ms:.3f}" + (" (interpreted)" if backend == "triton" and interpreted else ""),
                )
            )
    print_table(rows, f"Every estimator x backend ({args.dtype}, tolerance {tol:.0e})")
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nAll backends agree with the float64 reference.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
