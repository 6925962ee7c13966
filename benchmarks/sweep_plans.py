"""Developer tool: every estimator at one shape under candidate plans, timed in rounds.

Where ``sweep_tiles.py`` times one estimator a candidate, this times all of them, each
candidate's CUDA graph recorded first and then replayed in ``--rounds`` rounds taken in turns
(L2 flushed before each replay; do_bench medians, the flush subtracted), so that slow drifts
of the GPU hit every candidate alike. Each call is checked against the float64 torch backend
before it is timed. Candidates: ``default`` (the plans of this checkout, always first), the
``sweep_tiles.py`` syntax (``16x8x1x1x1:stages=4``), or ``before``: the plans of the commit
``--before`` names, the launcher and kernels staying this checkout's. Prints, per estimator,
each candidate's median (min-max over the rounds), its ratio to the default, and its error;
for scale, the replay of two plain copies of a ``[T, N]`` input.

    python benchmarks/sweep_plans.py --shape 128x4096 [--layout tm|bm] [--dtype bfloat16]
        [--estimators gae vtrace ...] [--rounds 3] [--forward]
        [--candidates [before] 16x8x1x1x1:stages=4 ...] [--before REV (with "before")]
"""

from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from baselines import ESTIMATORS, max_rel_err
from sweep_tiles import (
    estimator_calls,
    fixed_plan,
    float64_call,
    flush_us,
    graph_us,
    parse_candidate,
    random_inputs,
    record,
    replay_us,
)

import rl_triton_core as rtc
from rl_triton_core import _replay, triton_backend

REPO = Path(__file__).resolve().parent.parent


def plans_of(rev: str):
    """``_plan`` of the package at git revision ``rev`` (imported under another name from an
    archive of it), returning this checkout's ``Plan``."""
    where = Path(tempfile.mkdtemp(prefix="plans_"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "rl_triton_core"],
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    (where / "rl_triton_core").rename(where / "rl_triton_core_before")
    sys.path.insert(0, str(where))
    before = importlib.import_module("rl_triton_core_before.triton_backend")
    return lambda *args, **kw: triton_backend.Plan(**before._plan(*args, **kw)._asdict())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", required=True, help="TxN")
    ap.add_argument("--layout", default="tm", choices=["tm", "bm"])
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"]
    )
    ap.add_argument("--estimators", nargs="*", default=ESTIMATORS, choices=ESTIMATORS)
    ap.add_argument("--candidates", nargs="*", default=[], help="before | BTxBNxUxWxSPLIT[:F=V]")
    ap.add_argument("--before", help="the git revision whose plans the candidate 'before' runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--forward", action="store_true", help="linear_scan forward (else backward)")
    args = ap.parse_args()
    if "before" in args.candidates and not args.before:
        ap.error("the candidate 'before' needs --before REV")
    T, N = map(int, args.shape.split("x"))
    batch_major = args.layout == "bm"
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)
    torch.manual_seed(0)
    shape = (N, T) if batch_major else (T, N)
    r, v, term, boot = random_inputs(shape, N, dtype, dev)
    calls = estimator_calls(r, v, term, boot, int(batch_major), reverse_scan=not args.forward)
    own = triton_backend._plan
    cands = ["default", *args.candidates]
    plans = {c: own if c == "default" else plans_of(args.before) if c == "before"
             else fixed_plan(parse_candidate(c)) for c in cands}  # fmt: skip
    us_flush = flush_us(flush)
    copies = [torch.empty_like(r), torch.empty_like(v)]  # for scale: two plain copies
    us_copies = graph_us(lambda: (copies[0].copy_(r), copies[1].copy_(v)), flush, us_flush)

    graphs = {}  # (estimator, candidate) -> (graph, error)
    for est in args.estimators:
        fn_args, kw = calls[est]
        want = float64_call(est, fn_args, kw, int(batch_major))
        call = functools.partial(getattr(rtc, est), *fn_args, **kw, time_dim=int(batch_major),
                                 backend="triton")  # fmt: skip
        for cand in cands:
            triton_backend._plan = plans[cand]
            triton_backend._LAUNCHES.clear()
            _replay._PLANS.clear()
            try:
                err = max_rel_err(call(), want)
                graphs[est, cand] = record(call), err
            except Exception as e:  # a sweep skips plans that do not compile
                print(f"skip {est} {cand}: {type(e).__name__} {str(e)[:120]}", flush=True)
        triton_backend._plan = own

    times = {key: [] for key in graphs}
    for _ in range(args.rounds):
        for key, (graph, _) in graphs.items():
            times[key].append(replay_us(graph, flush, us_flush, warmup=3, rep=25))
    print(f"[{T}, {N}] {args.layout} {args.dtype}: graph replay (L2 flushed) us, median of "
          f"{args.rounds} rounds (min-max); x = of default; two copies of a [T, N] tensor "
          f"{us_copies:.1f}")  # fmt: skip
    for est in args.estimators:
        base = statistics.median(times.get((est, "default"), [float("nan")]))
        cells = []
        for cand in cands:
            if (est, cand) not in times:
                cells.append(f"{cand} -")
                continue
            t, err = times[est, cand], graphs[est, cand][1]
            m = statistics.median(t)
            cells.append(f"{cand} {m:.1f} ({min(t):.1f}-{max(t):.1f}) {m / base:.2f}x e{err:.0e}")
        print(f"  {est:18s} " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
