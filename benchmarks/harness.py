"""rl-triton benchmark harness (issue 4): every estimator, ours against the baselines.

    python benchmarks/harness.py --device cuda [--grid quick|full] [--out benchmarks/results]
    python benchmarks/harness.py --device cpu            # CPU mode: torch backend vs SB3/TorchRL
    python benchmarks/harness.py --device cpu --smoke    # the whole pipeline on tiny shapes
    python benchmarks/harness.py --self-check            # quick correctness of the harness itself
    python benchmarks/harness.py --from-json F.json      # redo markdown, plots and summary

For every configuration (estimator, [T, N], layout, dtype) the harness builds one set of
inputs (:mod:`baselines`), computes the float64 oracle (the ``reference`` backend on the CPU
for small shapes, the ``torch`` backend in float64 on the device for large ones), and then,
for each method of :data:`baselines.METHODS` that applies: prepares it (compiling included),
checks its result against the oracle (a failure is reported, never timed), and times it:

* **device time**: CUDA events around one call, the L2 cache flushed before each repetition
  by writing a 256 MB buffer (``--flush read``: by reading it, a lower bound; see
  :class:`Clock`), then a short ``torch.cuda._sleep`` so that the host has queued
  the call before the GPU reaches the start event (the events then see GPU time, not Python
  launch overhead, unless the host needs longer than the sleep: eager loops); median of
  repetitions. On the CPU: ``perf_counter`` around one call, median.
* **full-call time**: k back-to-back calls and one synchronisation, divided by k: what a
  training loop pays, host path included. Median of samples on CUDA, best of samples on the CPU.
* **CUDA-graph replay**: ours captured in a CUDA graph, device time of one replay (as above).
  The empty-kernel replay measured the same way is the reference for the graph target.
* **bandwidth floor**: bytes the estimator must move (each input read once, each output written
  once; flags by their dtype; Python-scalar coefficients cost nothing) over the copy bandwidth
  measured in the same run (large device-to-device copy, read + write bytes).

Results: ``<device>_results.json`` (every row), ``<device>_results.md`` (targets, headline and
full tables), ``<device>_gae_time.png`` and ``<device>_pct_of_floor.png`` under ``--out``.
Methodology and grids: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import importlib.metadata
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

START = time.monotonic()
HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(1, str(HERE.parent))

import baselines as bl
import report
import torch

import rl_triton_core as rtc

TM, BM = "time-major", "batch-major"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOL = {"float32": 1e-4, "bfloat16": 3e-2}  # max |got - want| / max(1, max |want|)
OURS = ("ours-triton", "ours-torch")
NO_COMPILE = tuple(m.name for m in bl.METHODS if not m.compiled)
FLUSH_BYTES = 256 << 20
FLUSHES = ("write", "read")  # how the L2 is flushed before each timed repetition (Clock)
SLOW_CALL_S = 0.25  # a call this slow gets one full-call sample (and 3 device repetitions)


# -- grids ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    estimator: str
    T: int
    N: int
    layout: str
    dtype: str = "float32"
    family: str = "parallel"  # parallel | long | large | cpu
    methods: tuple[str, ...] | None = None  # None: every method that applies


class Grid(list):
    """A list of configurations, most important first."""

    def add(
        self, estimator, T, N, layouts=(TM, BM), dtype="float32", family="parallel", methods=None
    ):
        for layout in layouts:
            self.append(Config(estimator, T, N, layout, dtype, family, methods))


def but(*names: str) -> tuple[str, ...]:
    """Every method except ``names``."""
    return tuple(m.name for m in bl.METHODS if m.name not in names)


def quick_grid() -> Grid:
    """About 6-7 minutes on an H200, compile time included; most important configurations
    first (a time budget skips what does not fit). Every estimator at [1024, 65536],
    [128, 4096] and [131072, 16] in both layouts, one bf16 row per estimator, and GAE over a
    thinned version of every family with its baselines. Compiled baselines only where they
    answer a target (each compile costs seconds)."""
    g = Grid()
    no_doubling = but("doubling-compiled")
    for est in bl.ESTIMATORS:
        g.add(est, 1024, 65536, family="large")
    for est in bl.ESTIMATORS:
        g.add(est, 1024, 65536, (TM,), "bfloat16", "large", OURS)
    for est in bl.ESTIMATORS:
        g.add(est, 128, 4096, methods=None if est == "gae" else no_doubling)
    for est in bl.ESTIMATORS:
        g.add(est, 131072, 16, (TM,), family="long", methods=None if est == "gae" else no_doubling)
        g.add(est, 131072, 16, (BM,), family="long", methods=no_doubling)
    g.add("gae", 4096, 16384, (TM,), family="large")
    g.add("gae", 4096, 16384, (BM,), family="large", methods=no_doubling)
    # (the two that answer a target first: few long sequences, large problems)
    g.add("gae", 1048576, 1, (TM,), family="long", methods=NO_COMPILE)
    g.add("gae", 65536, 256, (TM,), family="long", methods=no_doubling)
    g.add("gae", 16, 1024, (TM,))
    g.add("gae", 64, 16384, (TM,), methods=NO_COMPILE)
    g.add("gae", 256, 65536, (TM,), methods=NO_COMPILE)
    g.add("gae", 1024, 1, (TM,), family="long", methods=NO_COMPILE)
    g.add("gae", 16384, 16, (TM,), family="long", methods=NO_COMPILE)
    return g


def full_grid() -> Grid:
    """The issue's complete grid: every estimator, both layouts, every shape of the three
    families, every baseline that applies; bf16 at [1024, 65536]. Hours with the compiled
    baselines: use --estimators/--families/--methods to run it in pieces."""
    g = Grid()
    large = [(1024, 65536), (4096, 16384)]
    parallel = [(T, N) for N in (1024, 4096, 16384, 65536) for T in (16, 32, 64, 128, 256)]
    long_ = [
        (T, N) for T in (1024, 4096, 16384, 65536, 131072, 262144, 1048576) for N in (1, 16, 256)
    ]
    for est in bl.ESTIMATORS:
        for family, shapes in (("large", large), ("parallel", parallel), ("long", long_)):
            for T, N in shapes:
                g.add(est, T, N, family=family)
        g.add(est, 1024, 65536, dtype="bfloat16", family="large", methods=OURS)
    return g


CPU_SHAPES = [
    (16, 1), (16, 8), (16, 64), (16, 256), (16, 1024), (16, 4096), (32, 8), (64, 4096),
    (128, 1), (128, 8), (128, 64),
    (256, 1), (256, 16),
    (256, 64), (256, 256),
    (1024, 1), (1024, 64), (2048, 1), (2048, 16), (2048, 64), (128, 4096), (2048, 1024),
    (2048, 4096),
]  # fmt: skip


def cpu_grid() -> Grid:
    """CPU mode: GAE at CPU-sized shapes against SB3's numpy loop, TorchRL and CleanRL; TD(λ)
    and V-trace against TorchRL at a few shapes. No compiled baselines (compiling on a small
    CPU takes longer than the whole benchmark)."""
    g = Grid()
    for T, N in CPU_SHAPES:
        g.add("gae", T, N, (TM,), family="cpu", methods=NO_COMPILE)
    for est in ("lambda_returns", "vtrace"):
        for T, N in ((128, 8), (2048, 16), (256, 256), (128, 4096)):
            g.add(est, T, N, (TM,), family="cpu", methods=NO_COMPILE)
    return g


def smoke_grid() -> Grid:
    """Tiny shapes that still take every code path: every estimator and method (compiled ones
    at a single shape), both layouts, bf16, the T > 4096 loop skip and the float64-torch
    oracle."""
    g = Grid()
    for est in bl.ESTIMATORS:
        compiled = est == "gae" or est == "linear_scan"
        g.add(est, 16, 8, (TM,), methods=None if compiled else NO_COMPILE)
        g.add(est, 16, 8, (BM,), methods=None if est == "gae" else NO_COMPILE)
        g.add(est, 16, 8, (TM,), "bfloat16", methods=OURS)
    g.add("gae", 64, 512, (TM,), family="large", methods=NO_COMPILE)
    g.add("gae", 4100, 2, (TM,), family="long", methods=NO_COMPILE)
    return g


# -- measurement ----------------------------------------------------------------------------------


@dataclass
class Effort:
    """How long each measurement may take (seconds of measured calls) and repetition bounds."""

    device_s: float = 0.1
    full_s: float = 0.1
    graph_s: float = 0.05
    min_reps: int = 5
    max_reps: int = 100
    samples: int = 3  # full-call samples: median on CUDA, best on the CPU
    min_sample_s: float = 0.0  # CPU: each full-call sample lasts at least this long

    def reps(self, target_s: float, one_s: float) -> int:
        lo = 3 if one_s > 0.02 else self.min_reps
        return max(lo, min(self.max_reps, int(target_s / max(one_s, 1e-7))))


EFFORT = {
    "quick": Effort(),
    "full": Effort(device_s=0.25, full_s=0.2, graph_s=0.1, max_reps=200, samples=5),
    "cpu": Effort(device_s=0.1, full_s=0.1, min_reps=5, max_reps=50, samples=5, min_sample_s=0.02),
    "smoke": Effort(device_s=0.005, full_s=0.005, graph_s=0.005, min_reps=2, max_reps=5, samples=2),
}


class Clock:
    """Device-aware timers: CUDA events with an L2 flush and a lead sleep, or perf_counter.

    The flush evicts the timed call's data from the L2 so that every repetition starts cold.
    ``"write"`` (the default, ``triton.testing.do_bench``'s flush) zeroes a 256 MB buffer:
    the call pays for writing back up to an L2 of the flush's dirty lines and leaves its own
    last dirty lines unpaid, as back-to-back calls do (the harness's large rows: the same time
    within 1%, geomean). ``"read"`` sums the buffer instead: the call starts among clean
    lines and still leaves its last outputs unwritten, so it is timed for fewer bytes than it
    moves, a lower bound (docs/benchmarks.md, "The L2 flush"; ``benchmarks/flush_effect.py``
    times both)."""

    def __init__(self, device: torch.device, flush: str = "write"):
        self.device = device
        self.cuda = device.type == "cuda"
        self.cycles_per_us = None
        if flush not in FLUSHES:
            raise ValueError(f"flush must be one of {FLUSHES}, got {flush!r}")
        self.flush_mode = flush
        if self.cuda:
            self.cache = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device=device)
            self._sink = torch.empty((), dtype=torch.int64, device=device)
            self.cycles_per_us = self._calibrate_sleep()

    def flush(self) -> None:
        """Evict the L2 (CUDA; see the class docstring)."""
        if self.flush_mode == "write":
            self.cache.zero_()
        else:
            torch.sum(self.cache, dim=0, out=self._sink)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _calibrate_sleep(self) -> float | None:
        """GPU clock cycles per microsecond of ``torch.cuda._sleep`` (None: unavailable)."""
        try:
            torch.cuda._sleep(1000)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(2_000_000)
            end.record()
            self.sync()
            return 2_000_000 / (start.elapsed_time(end) * 1e3)
        except Exception as e:
            print(f"note: no torch.cuda._sleep ({e}); device times include host launch gaps")
            return None

    def device_times(self, fn: Callable, reps: int, lead_us: float = 0.0) -> list[float]:
        """Seconds of each of ``reps`` single calls (see the module docstring)."""
        if not self.cuda:
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(reps)
        ]
        cycles = int(min(lead_us, 2000.0) * self.cycles_per_us) if self.cycles_per_us else 0
        for start, end in events:
            self.flush()  # the call starts cold
            if cycles:
                torch.cuda._sleep(cycles)  # hold the GPU while the host queues the call
            start.record()
            fn()
            end.record()
        self.sync()
        return [start.elapsed_time(end) * 1e-3 for start, end in events]

    def per_call(self, fn: Callable, k: int) -> float:
        """Seconds per call of ``k`` back-to-back calls followed by one synchronisation."""
        self.sync()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / k


def capture_graph(fn: Callable):
    """``fn`` captured in a CUDA graph (warmed up on a side stream first, so that no
    compilation or autotuning happens during capture). The returned replay function keeps
    the graph alive and returns the outputs the graph writes."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fn()

    def replay():
        graph.replay()
        return static

    return replay


def host_time(clock: Clock, fn: Callable, n: int = 5) -> float:
    """Seconds the host spends in one call before it returns (no synchronisation inside;
    the device is idle when each call starts): the Python-side cost of queueing the work."""
    times = []
    for _ in range(n):
        clock.sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    clock.sync()
    return statistics.median(times)


def time_call(clock: Clock, fn: Callable, effort: Effort) -> dict:
    """Host, full-call and device time of ``fn`` (already warm), in microseconds."""
    one = clock.per_call(fn, 1)
    host = host_time(clock, fn, 5 if one < 0.02 else 1)
    k = max(1, min(1000, int(effort.full_s / effort.samples / max(one, 1e-7))))
    if effort.min_sample_s:
        k = max(k, int(effort.min_sample_s / max(one, 1e-7)))
    n_samples = effort.samples if one < SLOW_CALL_S else 1  # bounded cost of slow baselines
    samples = [clock.per_call(fn, k) for _ in range(n_samples)]
    full = statistics.median(samples) if clock.cuda else min(samples)
    flush_s = 1e-4 if clock.cuda else 0.0
    reps = effort.reps(effort.device_s, max(one, full) + flush_s + host)
    lead_us = 1.5 * host * 1e6 + 10  # the GPU sleeps while the host queues the call
    device = statistics.median(clock.device_times(fn, reps, lead_us))
    return {
        "host_us": host * 1e6,
        "full_call_us": full * 1e6,
        "device_us": device * 1e6,
        "reps": reps,
        "calls": k,
    }


def graph_time(clock: Clock, replay: Callable, effort: Effort) -> float:
    one = clock.per_call(replay, 1)
    reps = effort.reps(effort.graph_s, one + 1e-4)
    return statistics.median(clock.device_times(replay, reps, lead_us=20.0)) * 1e6


def copy_bandwidth(clock: Clock, nbytes: int) -> float:
    """Bytes/s of a large copy on the device, read + write counted."""
    src = torch.randn(nbytes // 4, device=clock.device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    reps = 20 if clock.cuda else 5
    seconds = statistics.median(clock.device_times(lambda: dst.copy_(src), reps, lead_us=20.0))
    return 2 * nbytes / seconds


try:
    import triton
    import triton.language as tl

    @triton.jit
    def _empty_kernel(x_ptr, n, BLOCK: tl.constexpr):
        pass

except ImportError:  # pragma: no cover - the CPU-only torch path needs no Triton
    triton = None


def triton_own_ptxas() -> str | None:
    """The ptxas bundled with the installed Triton (None without Triton)."""
    if triton is None:
        return None
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas")


def pin_triton_ptxas() -> dict:
    """Every Triton kernel of the run, ours and the compiled baselines', built by one ptxas:
    Triton's own (unless ``TRITON_PTXAS_PATH`` is set already: the user's choice stays).
    Without the pin, torch.compile's first compile of a Triton kernel sets that variable to
    torch's bundled ptxas (``torch._inductor.codecache._set_triton_ptxas_path``), so that our
    kernels compiled before it used Triton's ptxas (CUDA 12.8's with Triton 3.6) and those
    compiled after it torch's: V-trace time-major [1024, 65536] measured 560.7 us compiled after
    a compiled function, 503.8 us before (H200, torch 2.11+cu130; ``.dev`` probe of the
    twentieth session). Returns the path and release for the metadata."""
    key = "TRITON_PTXAS_PATH"
    own = triton_own_ptxas()
    if own is not None and key not in os.environ and os.access(own, os.X_OK):
        os.environ[key] = own
    path = os.environ.get(key)
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        release = text.rsplit("release ", 1)[1].split(",")[0]
    except (TypeError, OSError, IndexError):  # (no path, not runnable, no release line)
        release = None
    return {"triton_ptxas": path, "triton_ptxas_release": release}


def empty_kernel_reference(clock: Clock) -> dict:
    """An empty Triton kernel: Python launch cost, and one CUDA-graph replay's device and
    full-call time (the reference of the graph-replay target)."""
    if not clock.cuda or triton is None:
        return {}
    x = torch.empty(1, device=clock.device)

    def launch():
        _empty_kernel[(1,)](x, 1, BLOCK=128)

    launch()
    clock.sync()
    replay = capture_graph(launch)
    return {
        "empty_launch_us": clock.per_call(launch, 2000) * 1e6,
        "empty_graph_us": graph_time(clock, replay, Effort(graph_s=0.05, min_reps=100)),
        "empty_graph_full_call_us": clock.per_call(replay, 2000) * 1e6,
    }


# -- correctness ----------------------------------------------------------------------------------


def oracle(p: bl.Problem) -> tuple[torch.Tensor, ...]:
    """Float64 results: the reference loop on the CPU when it is cheap (T <= 4096 and
    T*N <= 1M), else the torch backend in float64 on the problem's device."""
    if p.T <= 4096 and p.T * p.N <= 1 << 20:
        q = p.to(torch.float64, torch.device("cpu"))
        return tuple(x.to(p.device) for x in bl.as_tuple(q.call("reference")))
    return bl.as_tuple(p.to(torch.float64).call("torch"))


# -- running --------------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


@dataclass
class Context:
    device: torch.device
    clock: Clock
    effort: Effort
    bandwidth: float
    deadline: float | None  # time.monotonic() after which nothing new starts
    compile_reserve_s: float = 40.0  # a compiled baseline starts only with this much time left
    methods: tuple[str, ...] | None = None  # --methods filter

    def remaining(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()


def plan(cfg: Config, p: bl.Problem, ctx: Context) -> list[tuple[bl.Method, str | None]]:
    """The methods of a configuration and, for each, why it is skipped (None: it runs)."""
    out = []
    for m in bl.METHODS:
        if p.device.type not in m.devices or p.estimator not in m.estimators:
            continue
        if ctx.methods is not None and m.name not in ctx.methods:
            continue
        if cfg.methods is not None and m.name not in cfg.methods:
            continue
        out.append((m, bl.skip_reason(m, p)))
    return out


ROW_VALUES = (
    "status",
    "reason",
    "max_err",
    "tol",
    "device_us",
    "full_call_us",
    "host_us",
    "graph_us",
    "graph_status",
    "bytes",
    "floor_us",
    "ratio_to_floor",
    "pct_of_floor",
    "reps",
    "calls",
    "prepare_s",
)


def base_row(cfg: Config, m: bl.Method, p: bl.Problem, ctx: Context) -> dict:
    nbytes = p.bytes_moved()
    return {
        "estimator": cfg.estimator,
        "method": m.name,
        "kind": m.kind,
        "T": cfg.T,
        "N": cfg.N,
        "shape": f"[{cfg.T}, {cfg.N}]",
        "layout": cfg.layout,
        "dtype": cfg.dtype,
        "family": cfg.family,
        **{k: None for k in ROW_VALUES},
        "tol": TOL[cfg.dtype],
        "bytes": nbytes,
        "floor_us": nbytes / ctx.bandwidth * 1e6,
    }


def run_method(m: bl.Method, p: bl.Problem, want, ctx: Context, row: dict) -> None:
    """Prepare, check, time one method; fills ``row``."""
    t0 = time.perf_counter()
    fn = m.build(p)
    if m.graph:
        fn = capture_graph(fn)
    got = fn()
    ctx.clock.sync()
    row["prepare_s"] = time.perf_counter() - t0
    err = bl.max_rel_err(got, want)
    row["max_err"] = err
    del got
    if not err <= row["tol"]:
        row.update(status="failed", reason=f"wrong result: max rel err {err:.2e} > {row['tol']:g}")
        return
    row.update(time_call(ctx.clock, fn, ctx.effort))
    if m.graph:
        row["graph_us"], row["graph_status"] = row["device_us"], "ok"
    elif m.name == "ours-triton":
        graph_row(fn, want, ctx, row)
    row["status"] = "ok"
    row["ratio_to_floor"] = row["device_us"] / row["floor_us"]
    row["pct_of_floor"] = 100 * row["floor_us"] / row["device_us"]


def graph_row(fn: Callable, want, ctx: Context, row: dict) -> None:
    """CUDA-graph replay time of ours, its result checked too."""
    try:
        replay = capture_graph(fn)
        err = bl.max_rel_err(replay(), want)
        if not err <= row["tol"]:
            row["graph_status"] = f"wrong result after replay: {err:.2e}"
            return
        row["graph_us"] = graph_time(ctx.clock, replay, ctx.effort)
        row["graph_status"] = "ok"
    except Exception as e:
        row["graph_status"] = f"capture failed: {type(e).__name__}: {str(e)[:200]}"


def run_config(cfg: Config, ctx: Context, seed: int) -> list[dict]:
    """Every method of one configuration: one problem, one oracle, a row per method."""
    try:
        dtype = DTYPES[cfg.dtype]
        p = bl.make_problem(cfg.estimator, cfg.T, cfg.N, cfg.layout, dtype, ctx.device, seed)
    except Exception as e:  # e.g. out of memory: the configuration is reported, not timed
        traceback.print_exc(limit=3)
        row = dict(asdict(cfg), method="*", kind="config", shape=f"[{cfg.T}, {cfg.N}]")
        row.update(status="failed", reason=f"inputs: {type(e).__name__}: {str(e)[:300]}")
        row.update({k: None for k in ROW_VALUES})
        print(row_line(row), flush=True)
        return [row]
    methods = plan(cfg, p, ctx)
    if any(m.compiled and why is None for m, why in methods):
        torch._dynamo.reset()  # no compiled object is reused across shapes
    want, no_oracle = None, None
    if any(why is None for _, why in methods):
        try:
            want = oracle(p)
        except Exception as e:
            traceback.print_exc(limit=3)
            no_oracle = f"no float64 oracle: {type(e).__name__}: {str(e)[:300]}"
    rows = []
    for m, why in methods:
        row = base_row(cfg, m, p, ctx)
        if why is None and ctx.remaining() < (ctx.compile_reserve_s if m.compiled else 0.0):
            why = "time budget: not started"
        if why is not None:
            row.update(status="skipped", reason=why)
        elif no_oracle is not None:
            row.update(status="failed", reason=no_oracle)
        else:
            try:
                run_method(m, p, want, ctx, row)
            except Interrupted:
                raise
            except Exception as e:
                row.update(status="failed", reason=f"{type(e).__name__}: {str(e)[:300]}")
                traceback.print_exc(limit=3)
            finally:
                gc.collect()
                if ctx.clock.cuda:
                    torch.cuda.empty_cache()
        print(row_line(row), flush=True)
        rows.append(row)
    del p, want
    gc.collect()
    if ctx.clock.cuda:
        torch.cuda.empty_cache()
    return rows


def row_line(r: dict) -> str:
    head = (
        f"{r['estimator']:<18} {r['method']:<24} {r['shape']:<15} {r['layout']:<11} {r['dtype']:<8}"
    )
    if r["status"] != "ok":
        return f"{head} {r['status'].upper()}: {r['reason']}"
    graph = f", graph {r['graph_us']:.1f}" if r["graph_us"] is not None else ""
    return (
        f"{head} device {r['device_us']:.1f} us, full {r['full_call_us']:.1f} us{graph}, "
        f"floor {r['floor_us']:.1f} us ({r['pct_of_floor']:.0f}%), err {r['max_err']:.1e}"
    )


# -- machine and versions -------------------------------------------------------------------------


def _version(dist: str, module: str | None = None) -> str | None:
    """A package's version from its metadata (no import), else from ``module.__version__``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.import_module(module or dist).__version__
    except Exception:
        return None


def _git(*args: str, env: dict | None = None) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=True, cwd=HERE.parent,
            env=None if env is None else {**os.environ, **env},
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None


def _git_tree() -> str | None:
    """The git tree of the files as they are (tracked and untracked, ignored ones aside),
    through a temporary index: equal to the tree of the commit whose files were run, also
    where HEAD is stale (a copy of a working tree with its original git metadata). ``git log
    --format='%h %T'`` names that commit."""
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": os.path.join(tmp, "index")}
        if _git("add", "-A", env=index) is None:
            return None
        return _git("write-tree", env=index)


def _tree_commit(tree: str | None) -> str | None:
    """The newest commit (of any ref) whose files are exactly ``tree``, or None (uncommitted
    files, or git metadata older than them)."""
    log = _git("log", "--all", "--format=%H %T") if tree else None
    return next(
        (c for c, t in (line.split() for line in (log or "").splitlines()) if t == tree), None
    )


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "torchrl": _version("torchrl"),
        "stable_baselines3": _version("stable-baselines3", "stable_baselines3"),
        "numpy": _version("numpy"),
        "rl_triton_core": getattr(rtc, "__version__", None),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,  # tracked files changed
        "git_tree": (tree := _git_tree()),
        "git_tree_commit": _tree_commit(tree),  # (the commit of the files run, HEAD or not)
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }


# -- self-check -----------------------------------------------------------------------------------


def self_check() -> int:
    """Checks the harness without timing anything: every method (compiled ones through
    dynamo's eager backend) against the reference on small CPU problems in both layouts, the
    byte count, the skip rules, the target evaluation and the reports on synthetic rows."""
    bl.COMPILE.clear()
    bl.COMPILE["backend"] = "eager"
    cpu = torch.device("cpu")
    results: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        results.append((name, bool(ok), detail))

    for est in bl.ESTIMATORS:
        for layout in (TM, BM):
            for dtype in ("float32", "bfloat16"):
                p = bl.make_problem(est, 13, 3, layout, DTYPES[dtype], cpu, seed=1)
                want = oracle(p)
                for m in bl.METHODS:
                    if cpu.type not in m.devices or bl.skip_reason(m, p) is not None:
                        continue
                    torch._dynamo.reset()
                    err = bl.max_rel_err(m.build(p)(), want)
                    check(f"{m.name} {est} {layout} {dtype}", err <= TOL[dtype], f"err {err:.2e}")
    p = bl.make_problem("gae", 10, 4, TM, torch.float32, cpu)
    check("bytes gae fp32", p.bytes_moved() == 10 * 4 * 17 + 4 * 4, str(p.bytes_moved()))
    p = bl.make_problem("vtrace", 10, 4, BM, torch.bfloat16, cpu)
    check(
        "bytes vtrace bf16",
        p.bytes_moved() == 10 * 4 * (4 * 2 + 1 + 2 * 2) + 4 * 2,
        str(p.bytes_moved()),
    )
    long_ = bl.make_problem("gae", bl.LOOP_MAX_T + 1, 1, TM, torch.float32, cpu)
    check("loop skip T > 4096", bl.skip_reason(bl.BY_NAME["cleanrl-eager"], long_) is not None)
    check("unroll skip T > 256", bl.skip_reason(bl.BY_NAME["unrolled-compiled"], long_) is not None)
    check(
        "sb3 skip batch-major",
        bl.skip_reason(
            bl.BY_NAME["sb3-numpy"], bl.make_problem("gae", 4, 2, BM, torch.float32, cpu)
        ),
    )
    check("padded elements", bl.padded_elements(long_) >= long_.T, str(bl.padded_elements(long_)))
    saved = os.environ.pop("TRITON_PTXAS_PATH", None)
    try:  # the ptxas pin: Triton's own when unset, the user's choice kept
        got = pin_triton_ptxas()["triton_ptxas"]
        own = triton_own_ptxas()
        check("ptxas pinned to Triton's own", got == own or not os.access(own, os.X_OK), str(got))
        os.environ["TRITON_PTXAS_PATH"] = "/a/user/ptxas"
        got = pin_triton_ptxas()
        check("ptxas of the user kept", got["triton_ptxas"] == "/a/user/ptxas", str(got))
    finally:
        os.environ.pop("TRITON_PTXAS_PATH", None)
        if saved is not None:
            os.environ["TRITON_PTXAS_PATH"] = saved
    check("wrong result is caught", bl.max_rel_err((want[0] + 1,), want[:1]) > 1e-3)
    check("nan is caught", not bl.max_rel_err((want[0] * math.nan,), want[:1]) <= 1.0)

    rows = report.synthetic_rows()
    meta = {
        "device": "cuda",
        "empty_graph_us": 4.0,
        "bandwidth_GBps": 4000.0,
        "date": "x",
        "grid": "synthetic",
    }
    targets = {t["target"]: t for t in report.evaluate_targets(rows, meta)}
    check(
        "target large PASS", targets["gae: device <= 1.15x floor at T*N >= 16M"]["status"] == "PASS"
    )
    check(
        "target large MISS",
        targets["vtrace: device <= 1.3x floor at T*N >= 16M"]["status"] == "MISS",
    )
    check("target N/A", targets["retrace: device <= 1.3x floor at T*N >= 16M"]["status"] == "N/A")
    check(
        "target baseline",
        targets["faster than doubling-compiled (device), ours/baseline < 1"]["status"] == "PASS",
    )
    check(
        "target 10x",
        targets[">= 10x the compiled doubling scan at [1024, 65536]"]["status"] == "MISS",
    )
    check(
        "target bf16",
        targets["gae: bf16 device time < fp32 (bytes ratio 0.53)"]["status"] == "PASS",
    )
    tree = _git_tree()
    check(
        "git tree",
        tree is None  # (not a git checkout)
        or (
            _git("cat-file", "-t", tree) == "tree"
            and (bool(_git("status", "--porcelain")) or tree == _git("rev-parse", "HEAD^{tree}"))
        ),
        str(tree),
    )
    check("tree commit", tree is None or _tree_commit(_git("rev-parse", "HEAD^{tree}")) is not None)
    fake = {**meta, "git_commit": "f" * 40, "git_tree": "0123456789abcdef", "git_tree_commit": None}
    text = report.markdown(rows, fake, list(targets.values()))
    check(
        "markdown",
        "## Headline" in text
        and "vs doubling-compiled" in text
        and "| gae |" in text
        and "uncommitted files (tree 0123456789; HEAD ffffffffff" in text
        and ", commit 0123456789 (tree 0123456789);"
        in report.markdown(
            rows,
            {**fake, "git_commit": fake["git_tree"], "git_tree_commit": fake["git_tree"]},
            list(targets.values()),
        ),
    )
    clock = Clock(cpu)
    check(
        "clock",
        len(clock.device_times(lambda: None, 3)) == 3 and clock.per_call(lambda: None, 5) >= 0,
    )
    try:
        import plots

        with tempfile.TemporaryDirectory() as d:
            paths = plots.plot_all(rows, meta, Path(d), "selfcheck")
            check("plots", all(Path(x).stat().st_size > 0 for x in paths) and len(paths) == 2)
    except ImportError as e:
        check("plots (matplotlib missing)", True, str(e))
    failed = [r for r in results if not r[1]]
    for name, _, detail in failed:
        print(f"FAILED {name} {detail}")
    print(f"self-check: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument(
        "--grid", choices=("quick", "full"), default="quick", help="CUDA grid (CPU mode has one)"
    )
    ap.add_argument("--smoke", action="store_true", help="tiny shapes through the whole pipeline")
    ap.add_argument(
        "--out", type=Path, default=None, help="results folder (default benchmarks/results)"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget from start; configurations that do not fit are skipped "
        "(default 420 for the CUDA quick grid, none otherwise; 0: none)",
    )
    ap.add_argument("--estimators", nargs="*", choices=bl.ESTIMATORS, help="only these estimators")
    ap.add_argument(
        "--methods", nargs="*", choices=[m.name for m in bl.METHODS], help="only these methods"
    )
    ap.add_argument(
        "--families", nargs="*", choices=("parallel", "long", "large", "cpu"), help="only these"
    )
    ap.add_argument(
        "--compile-backend", default="inductor", help="torch.compile backend of the baselines"
    )
    ap.add_argument(
        "--flush",
        choices=FLUSHES,
        default="write",
        help="how the L2 is flushed before each timed repetition (default: write; read gives "
        "a lower bound; see Clock)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--self-check", action="store_true", help="check the harness itself and exit")
    ap.add_argument(
        "--from-json", type=Path, help="rebuild markdown/plots/summary from a results JSON"
    )
    return ap.parse_args(argv)


def select_grid(args) -> tuple[str, Grid, Effort]:
    if args.smoke:
        name, grid, effort = "smoke", smoke_grid(), EFFORT["smoke"]
    elif args.device == "cpu":
        name, grid, effort = "cpu", cpu_grid(), EFFORT["cpu"]
    else:
        name, grid, effort = (
            args.grid,
            quick_grid() if args.grid == "quick" else full_grid(),
            EFFORT[args.grid],
        )
    grid = Grid(
        c
        for c in grid
        if (not args.estimators or c.estimator in args.estimators)
        and (not args.families or c.family in args.families)
    )
    return name, grid, effort


def _on_sigterm(signum, frame):
    raise Interrupted(f"signal {signum}")


def references(clock: Clock, cpu_copy_bytes: int) -> dict:
    """The run's reference measurements: copy bandwidth, lead-sleep calibration, and (CUDA)
    the empty Triton kernel."""
    bandwidth = copy_bandwidth(clock, (1 << 30) if clock.cuda else cpu_copy_bytes)
    out = {
        "bandwidth_GBps": bandwidth / 1e9,
        "sleep_cycles_per_us": clock.cycles_per_us,
        "flush_bytes": FLUSH_BYTES if clock.cuda else 0,
    }
    line = f"copy bandwidth {bandwidth / 1e9:.0f} GB/s"
    try:
        out.update(empty_kernel_reference(clock))
        if "empty_graph_us" in out:
            line += (
                f"; empty Triton kernel: launch {out['empty_launch_us']:.1f} us, "
                f"graph replay {out['empty_graph_us']:.1f} us"
            )
    except Exception as e:  # the graph-replay target then reads N/A
        traceback.print_exc(limit=3)
        out["empty_kernel_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(line, flush=True)
    return out


def run_grid(grid: Grid, ctx: Context, seed: int, meta: dict, json_path: Path) -> list[dict]:
    """Every configuration in order until the time budget is spent; the JSON is rewritten
    after each one, and SIGTERM/Ctrl-C stop the loop with what was measured so far."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    rows: list[dict] = []
    meta["skipped_for_budget"] = 0
    try:
        for i, cfg in enumerate(grid):
            if ctx.remaining() <= 0:
                meta["skipped_for_budget"] = len(grid) - i
                print(f"time budget spent: {len(grid) - i} configurations not started")
                break
            rows += run_config(cfg, ctx, seed)
            meta["wall_s"] = time.monotonic() - START
            report.write_json(json_path, meta, rows)
    except (Interrupted, KeyboardInterrupt) as e:
        meta["interrupted"] = f"interrupted ({type(e).__name__} {e})"
        print(meta["interrupted"])
    meta["wall_s"] = time.monotonic() - START
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.self_check:
        return self_check()
    if args.from_json:
        data = json.loads(args.from_json.read_text())
        # cuda_results.json -> cuda; a kept run's cuda_results_544ecba.json -> cuda_544ecba (its
        # reports beside it, not over the committed run's)
        prefix = args.from_json.stem.replace("_results", "", 1)
        out = args.out or args.from_json.parent
        out.mkdir(parents=True, exist_ok=True)
        report.write_reports(out, prefix, data["meta"], data["rows"])
        return 0
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device here (use --device cpu [--smoke])")
        device = torch.device("cuda", torch.cuda.current_device())
    bl.COMPILE["backend"] = args.compile_backend
    if args.threads:
        torch.set_num_threads(args.threads)
    name, grid, effort = select_grid(args)
    prefix = f"smoke-{args.device}" if args.smoke else args.device
    out_dir = args.out or (
        Path(tempfile.gettempdir()) / "rl-triton-bench-smoke" if args.smoke else HERE / "results"
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = args.budget_s
    if budget is None:
        budget = 420.0 if (name == "quick" and device.type == "cuda") else 0.0
    report_reserve_s = 20.0  # markdown, plots
    deadline = START + budget - report_reserve_s if budget else None

    meta = machine_info(device)
    if device.type == "cuda":
        meta.update(pin_triton_ptxas())
    meta.update(grid=name, command=" ".join(sys.argv), budget_s=budget or None, configs=len(grid))
    print(
        f"rl-triton benchmark: {name} grid, {len(grid)} configurations on {meta['gpu'] or meta['cpu']}"
    )
    print(
        f"torch {meta['torch']}, triton {meta['triton']}, torchrl {meta['torchrl']}, SB3 {meta['stable_baselines3']}"
    )
    clock = Clock(device, args.flush)
    meta["flush"] = args.flush if device.type == "cuda" else None
    meta.update(references(clock, 8 << 20 if args.smoke else 64 << 20))
    meta["effort"] = asdict(effort)
    methods = tuple(args.methods) if args.methods else None
    ctx = Context(device, clock, effort, meta["bandwidth_GBps"] * 1e9, deadline, methods=methods)
    rows = run_grid(grid, ctx, args.seed, meta, out_dir / f"{prefix}_results.json")
    report.write_reports(out_dir, prefix, meta, rows)
    failed = [r for r in rows if r["status"] == "failed"]
    print(
        f"\n{len(rows)} rows: {sum(r['status'] == 'ok' for r in rows)} timed, {len(failed)} failed, "
        f"{sum(r['status'] == 'skipped' for r in rows)} skipped; {meta['wall_s']:.0f} s"
    )
    ours_failed = [r for r in failed if r["kind"] == "ours"]
    return 1 if ours_failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
