"""float32 calls accumulating in float32 vs float64 (``_dispatch.accumulates_in_float64``),
side by side on one GPU: what float64 accumulation costs and what it buys.

For each shape and estimator three configurations, each checked against the float64 torch
backend: ``default`` (gamma 0.99, lambda 0.95: float32 accumulation), ``long`` (gamma 0.9995,
lambda 1 where the estimator takes one: float64 accumulation past T = 128) and ``long-f32``
(the same coefficients with float64 accumulation forced off). Prints the accumulation dtype
(``*``: a resident plan), CUDA-graph replay time with L2 flushed (us, do_bench median:
``sweep_tiles.graph_us``), full call host time for small shapes (best of 3 x 200 back-to-back
calls: ``launch_overhead.per_call``) and the max relative error. Results: sweep 20 in
results/sweep_tiles_h200.txt.

    python benchmarks/wide_accumulation.py
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.testing
from baselines import max_rel_err
from launch_overhead import per_call
from sweep_tiles import estimator_calls, float64_call, flush_us, graph_us

import rl_triton_core as rtc
from rl_triton_core import _replay
from rl_triton_core import triton_backend as tb

LONG = dict(gamma=0.9995)
WITH_LAMBDA = {"gae", "lambda_returns", "eligibility_traces"}  # (V-trace's default lambda: 1)
CASES = [
    ((1024, 65536), 0, ["gae", "discounted_returns", "vtrace", "eligibility_traces"]),
    ((1024, 65536), 1, ["gae", "discounted_returns", "vtrace"]),
    ((131072, 16), 0, ["gae", "discounted_returns", "vtrace"]),
    ((262144, 4), 0, ["gae", "discounted_returns", "vtrace"]),
    ((1048576, 1), 0, ["gae", "vtrace"]),
    ((128, 4096), 0, ["gae", "discounted_returns", "vtrace"]),
]


def main() -> None:
    dev = torch.device("cuda")
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)
    us_flush = flush_us(flush)
    real = tb.accumulates_in_float64
    for (T, N), td, ests in CASES:
        shape = (T, N) if td == 0 else (N, T)
        r, v = torch.randn(shape, device=dev), torch.randn(shape, device=dev)
        term, boot = torch.rand(shape, device=dev) < 0.002, torch.randn(N, device=dev)
        for est in ests:
            args, kw0 = estimator_calls(r, v, term, boot, td)[est]
            long = {**LONG, **({"lmbda": 1.0} if est in WITH_LAMBDA else {})}
            res = []
            for name, extra, wide in (
                ("default", {}, real),
                ("long", long, real),
                ("long-f32", long, lambda *_: False),
            ):
                kw = {**kw0, **extra}
                tb.accumulates_in_float64 = wide
                tb._LAUNCHES.clear()
                _replay._PLANS.clear()
                call = functools.partial(getattr(rtc, est), *args, **kw, time_dim=td,
                                         backend="triton")  # fmt: skip
                err = max_rel_err(call(), float64_call(est, args, kw, td))
                launch = next(iter(tb._LAUNCHES.values()))
                acc = "f64" if launch.meta["ACC"] == triton.language.float64 else "f32"
                acc += "*" if launch.plan.resident else ""
                host = f" full {per_call(call, k=200):.1f}" if T * N <= 1 << 19 else ""
                us = graph_us(call, flush, us_flush)
                res.append(f"{name} {acc} {us:.1f}{host} err {err:.1e}")
            tb.accumulates_in_float64 = real
            layout = "tm" if td == 0 else "bm"
            print(f"[{T}, {N}] {layout} {est:18s} " + " | ".join(res), flush=True)


if __name__ == "__main__":
    main()
