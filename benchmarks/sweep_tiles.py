"""Developer tool: sweep tile shapes / warps / time splits of the Triton backend on one GPU.

Monkeypatches ``triton_backend._plan`` (clearing the launch and replay caches for every
candidate) and times one estimator, GAE unless ``--estimator`` names another (CUDA-graph
replay, L2 flushed by a large write before each replay), for each candidate; checks each
against the float64 torch backend; prints the best per shape and layout.

    python benchmarks/sweep_tiles.py [--shapes 128x4096 131072x16] [--layouts tm bm]
        [--estimator vtrace] [--forward-scan] [--dtype bfloat16]
        [--candidates 32x128x1x4x1 ...] [--check-all]

``--candidates`` replaces the built-in grid (block_t x block_n x unroll x warps x split, then
other ``Plan`` fields by name, e.g. ``8x64x1x1x16:segs=4``; with no values, only the default
plan runs); split is the number of programs along time, i.e. ``Plan.n_chunks / segs`` (a
default plan printed with n_chunks 8192 and segs 8 is ``...x1024:segs=8``);
``--check-all`` also runs every other estimator at each candidate against the float64 torch
backend (a tile shape must compile and be right for all of them, not only the timed one);
``--forward-scan`` runs ``linear_scan`` forward (reverse by default).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import time

import torch
import triton
import triton.testing
from baselines import ESTIMATORS, max_rel_err

import rl_triton_core as rtc
from rl_triton_core import _replay, triton_backend

SHAPES = ["1024x65536", "128x4096", "131072x16", "4096x1024"]


def candidates(T, N, time_major):
    """(block_t, block_n, unroll, num_warps, split) to try."""
    if time_major:  # per-thread columns, then 2-D tiles scanned along time
        grid = [*itertools.product([1], (128, 256), (8, 16), (2, 4), (1, 16, 64)),
                *itertools.product((32, 64, 128, 256), (16, 32, 64), [1], (4, 8), (1, 16, 64))]  # fmt: skip
    else:
        grid = itertools.product((256, 512, 1024, 2048), [1], [1], (2, 4, 8), (1, 16, 64, 128))
    for bt, bn, unroll, warps, split in grid:
        if bt * bn < 32 * warps or (split > 1 and split * bt * unroll * 2 > T) or bt > 2 * T:
            continue
        if bn > 2 * triton.next_power_of_2(N):
            continue
        yield bt, bn, unroll, warps, split


def parse_candidate(text: str) -> tuple:
    """``BTxBNxUNROLLxWARPSxSPLIT[:FIELD=VALUE ...]`` as (bt, bn, unroll, warps, split, (field,
    value) ...): the fields by name are other ``Plan`` fields (integers; ``prefetch=1``)."""
    sizes, *fields = text.split(":")
    named = tuple((k, int(v)) for k, v in (f.split("=") for f in fields))
    return (*map(int, sizes.split("x")), *named)


def fixed_plan(cand: tuple):
    """A ``_plan`` returning candidate ``cand`` (:func:`parse_candidate`) whatever the call."""
    bt, bn, unroll, warps, split, *fields = cand

    def plan(kind, T, N, time_major, device, **_):
        extra = dict(fields)
        step, segs = bt * unroll, extra.get("segs", 1)
        chunk = triton.cdiv(triton.cdiv(T, split * segs), step) * step
        n_chunks = triton.cdiv(T, chunk * segs) * segs
        return triton_backend.Plan(bt, bn, unroll, chunk, n_chunks, warps, **extra)

    return plan


def random_inputs(shape, N, dtype, device):
    """Rewards, values (normal), terminated flags (5% of steps) of ``shape`` and a bootstrap
    value (or initial state) for ``N`` sequences."""
    r = torch.randn(shape, device=device, dtype=dtype)
    v = torch.randn(shape, device=device, dtype=dtype)
    term = torch.rand(shape, device=device) < 0.05
    return r, v, term, torch.randn(N, device=device, dtype=dtype)


def flush_us(flush) -> float:
    """``flush.zero_()``, the L2 flush before each replay, in us: a do_bench median."""
    return triton.testing.do_bench(flush.zero_, warmup=5, rep=40, return_mode="median") * 1e3


def record(call) -> torch.cuda.CUDAGraph:
    """``call`` captured in a CUDA graph."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def replay_us(graph, flush, us_flush: float, warmup: int = 5, rep: int = 40) -> float:
    """Replay of ``graph`` with L2 flushed before each (``flush.zero_()``), minus the flush
    (``us_flush``: :func:`flush_us`), in us: a do_bench median."""

    def replay():
        flush.zero_()
        graph.replay()

    return triton.testing.do_bench(replay, warmup, rep, return_mode="median") * 1e3 - us_flush


def graph_us(call, flush, us_flush: float) -> float:
    """CUDA-graph replay of ``call``, L2 flushed (:func:`replay_us`)."""
    return replay_us(record(call), flush, us_flush)


def estimator_calls(r, v, term, boot, time_dim, reverse_scan=True) -> dict[str, tuple[tuple, dict]]:
    """Every estimator's (args, kwargs) on rewards ``r``, values ``v``, terminated flags and a
    bootstrap value (or initial state), laid out along ``time_dim``; ``linear_scan`` runs
    backward unless ``reverse_scan`` is false."""
    lp = -r.abs()
    return dict(
        gae=((r, v, term), dict(bootstrap_value=boot)),
        lambda_returns=((r, v, term), dict(bootstrap_value=boot)),
        discounted_returns=((r, term), dict(bootstrap_value=boot)),
        vtrace=((r, v, lp, -v.abs(), term), dict(bootstrap_value=boot)),
        retrace=((r, v, v.roll(1, time_dim), lp, -v.abs(), term), {}),
        eligibility_traces=((r, term), dict(initial=boot)),
        episodic_cumsum=((r, term), dict(initial=boot)),
        linear_scan=((v.sigmoid(), r), dict(initial=boot, reverse=reverse_scan)),
    )


def float64_call(fn, args, kw, time_dim):
    """Estimator ``fn``'s result from the torch backend in float64."""

    def up(x):
        return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return getattr(rtc, fn)(*map(up, args), **{k: up(x) for k, x in kw.items()},
                            time_dim=time_dim, backend="torch")  # fmt: skip


def check_all(r, v, term, boot, time_dim, timed: str, reverse_scan=True) -> str:
    """Every estimator but the timed one at the current plan against the torch backend in
    float64."""
    worst = 0.0
    calls = estimator_calls(r, v, term, boot, time_dim, reverse_scan)
    del calls[timed]
    for fn, (args, kw) in calls.items():
        got = getattr(rtc, fn)(*args, **kw, time_dim=time_dim, backend="triton")
        worst = max(worst, max_rel_err(got, float64_call(fn, args, kw, time_dim)))
    return f"ok (max rel err {worst:.1e})" if worst < 1e-4 else f"FAILED (max rel err {worst:.1e})"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=SHAPES, help="TxN")
    ap.add_argument("--layouts", nargs="*", default=["tm", "bm"], choices=["tm", "bm"])
    ap.add_argument("--budget-s", type=float, default=120, help="per shape and layout")
    ap.add_argument("--candidates", nargs="*", help="BTxBNxUNROLLxWARPSxSPLIT[:FIELD=V ...]")
    ap.add_argument("--check-all", action="store_true", help="every estimator per candidate")
    ap.add_argument("--estimator", default="gae", choices=ESTIMATORS, help="the one timed")
    ap.add_argument("--forward-scan", action="store_true", help="linear_scan forward, not reverse")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="values")
    args = ap.parse_args()
    reverse_scan = not args.forward_scan
    dtype = getattr(torch, args.dtype)
    dev = torch.device("cuda")
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)
    real_plan = triton_backend._plan
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes]
    for (T, N), layout in itertools.product(shapes, args.layouts):
        batch_major = layout == "bm"
        shape = (N, T) if batch_major else (T, N)
        r, v, term, boot = random_inputs(shape, N, dtype, dev)
        calls = estimator_calls(r, v, term, boot, int(batch_major), reverse_scan)
        fn_args, fn_kw = calls[args.estimator]
        want = float64_call(args.estimator, fn_args, fn_kw, int(batch_major))
        call = functools.partial(getattr(rtc, args.estimator), *fn_args, **fn_kw,
                                 time_dim=int(batch_major), backend="triton")  # fmt: skip
        us_flush = flush_us(flush)
        default = []  # the plan the code chooses, as its first candidate's call records it

        def spy(*plan_args, default=default, **plan_kw):
            default.append(real_plan(*plan_args, **plan_kw))
            return default[-1]

        results = []
        start = time.monotonic()
        own = [parse_candidate(c) for c in args.candidates or []]
        cands = [None, *(own if args.candidates is not None else candidates(T, N, not batch_major))]
        for cand in cands:
            if time.monotonic() - start > args.budget_s:
                print(f"   (budget spent: {len(cands) - len(results)} candidates not run)")
                break
            if cand is None:
                triton_backend._plan = spy
            else:
                triton_backend._plan = fixed_plan(cand)
            triton_backend._LAUNCHES.clear()
            _replay._PLANS.clear()
            try:
                err = max_rel_err(call(), want)  # (fresh outputs: nothing left to poison)
                us = graph_us(call, flush, us_flush)
                label = "default " + str(tuple(default[0])) if cand is None else str(cand)
                if args.check_all:
                    label += " all estimators " + check_all(
                        r, v, term, boot, int(batch_major), args.estimator, reverse_scan
                    )
                results.append((us, label, err))
                print(f"     {us:8.1f} us  [{T}x{N} {layout}] {label}", flush=True)
            except Exception as e:  # a sweep skips configs that do not compile
                print("   skip", cand, type(e).__name__, str(e)[:100])
        triton_backend._plan = real_plan
        results.sort()
        floor_us = r.numel() * 17 / 4.2e6
        print(f"[T={T}, N={N}] {layout} floor {floor_us:.1f} us "
              "(block_t, block_n, unroll, warps, split)")  # fmt: skip
        for us, label, err in [*results[:6], *[x for x in results if "default" in x[1]]]:
            print(f"   {us:8.1f} us  {label}  err={err:.1e}")
        print(f"   worst {results[-1][0]:.1f} us of {len(results)}", flush=True)


if __name__ == "__main__":
    main()
