"""Developer tool: how much full-call times of identical calls move within one process.

Times three host-bound calls on CUDA (GAE [128, 4096] time-major with fresh outputs,
eligibility traces batch-major with fresh outputs, and one eager torch op as a control), 15
samples of 1000 back-to-back calls and one synchronisation each, in three phases: garbage
collector on, off, and on with a large heap of tracked objects. Prints min / median / max per
call of each phase. Run it in several processes to see the levels a machine switches between:

    for i in 1 2 3; do python benchmarks/host_noise.py; done

Results on the H200: benchmarks/results/host_noise_h200.txt.
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

import rl_triton_core as rtc

T, N = 128, 4096


def per_call(fn, k: int = 1000) -> float:
    """Microseconds per call of ``k`` back-to-back calls followed by one synchronisation."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / k * 1e6


def main() -> None:
    dev = torch.device("cuda")
    r, v = torch.randn(T, N, device=dev), torch.randn(T, N, device=dev)
    d = torch.rand(T, N, device=dev) < 0.05
    bv = torch.randn(N, device=dev)
    rb, db = r.T.contiguous(), d.T.contiguous()
    adv = torch.empty_like(r)
    fns = {
        "gae tm fresh": lambda: rtc.gae(r, v, d, bootstrap_value=bv),
        "traces bm fresh": lambda: rtc.eligibility_traces(rb, db, initial=bv, time_dim=1),
        "eager add_": lambda: adv.add_(1.0),
    }
    for fn in fns.values():
        for _ in range(200):
            fn()

    def report(phase: str) -> None:
        for name, fn in fns.items():
            s = [per_call(fn) for _ in range(15)]
            print(f"{phase:12s} {name:16s} min {min(s):5.1f} med {statistics.median(s):5.1f} "
                  f"max {max(s):5.1f} us", flush=True)  # fmt: skip

    report("gc on")
    gc.disable()
    report("gc off")
    gc.enable()
    heap = [(i, str(i)) for i in range(3_000_000)]  # tracked containers: costly full collections
    gc.collect()
    report("big heap")
    del heap


if __name__ == "__main__":
    main()
