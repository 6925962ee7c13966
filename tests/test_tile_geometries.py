"""Every tile geometry the H200's plans pick, shrunk to a small shape, on any machine.

``_plan`` picks, on a GPU, tiles that the interpreter's own plans (tiny tiles, so that CPU
tests reach every code path) never run: 256-step one-warp tiles composed by eights, 128-column
tiles of 16 chunks side by side, 1024-step resident chunks ... Their kernels are checked on
the GPU at full size (tests/test_gpu_triton.py); these tests run the same kernel code in CI,
and every plan branch added later is picked up by them.

The geometries are collected from ``_plan`` itself, emulating an H200 (132 SMs, compiled plans),
over a grid of shapes, both layouts, each scan kind and direction and three dtype classes
(float32, bfloat16, float64), asked as the launcher asks (a time-major plan only for N and T
above 1; 16-bit rows aligned or not from N). A geometry is a plan's tile (``block_t``,
``block_n``, ``unroll``, warps, ``segs``, prefetch, pipeline stages), whether it splits time
(and how: carried or resident) and the two code variants the launcher picks from the shape:
unmasked tiles (``FULL``) and the tile loop compiled twice (``T_TAIL``). Each runs at a small
shape that keeps what the kernel's code depends on: whether the last tile (of steps, of
sequences) is partial, whether T, N and the chunk length are multiples of 16 (Triton specialises
on that), the power of two N is a multiple of (the alignment the kernel is told); a few
programs' sequences, at most three tiles unsplit (four where 16 needs it), three chunks of at
most two tiles split (more where 16 needs it; with ``segs`` chunks side by side two programs'
worth, the last one with as many chunks wholly past T as the original's last). The forced plan's
one estimator runs into NaN-poisoned outputs, against the torch backend in float64.

Under the interpreter warps and pipeline stages do not change the arithmetic, and a resident
plan's grid barrier is a no-op (the interpreter runs the programs one after another, in an
order where each finds what it reads): the cooperative synchronisation itself is checked on
the GPU only. On a GPU (``make test-gpu``, ``.ci/gpu-check geometry``) the geometries run
compiled. Not reached here: the two-level carry-in of very many chunks (its group pass runs
under the interpreter's own plans, tests/test_replay.py::test_two_level_carry_in_repeated, and
at full size on the GPU).
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
import triton
from _support import (
    as_float64,
    close_all_to_float64,
    described_launch,
    forget_launches,
    random_step_inputs,
    run_every_estimator,
)

import rl_triton_core.triton_backend as tb
from rl_triton_core.triton_backend import Plan, kernels

# scan kind, direction -> the output of run_every_estimator that runs it
ESTIMATOR = {
    ("GAE", True): "gae",
    ("LAMBDA", True): "lambda",
    ("DISCOUNTED", True): "disc",
    ("VTRACE", True): "vtrace",
    ("RETRACE", True): "retrace",
    ("TRACES", False): "traces",
    ("SCAN", True): "scan",
    ("SCAN", False): "scan_forward",
}
# dtype class -> (the value dtype of the call, _plan's keywords but `aligned`). Not collected:
# float32 calls with float64 arithmetic (a long horizon past T = 128): their plans (acc64) added
# no geometry of their own, and a small shape cannot keep their arithmetic
DTYPES = {
    "float32": (torch.float32, dict(four_byte=True)),
    "bfloat16": (torch.bfloat16, {}),
    "float64": (torch.float64, dict(acc64=True, eight_byte=True)),
}
STEPS = (1, 12, 16, 20, 32, 50, 64, 100, 128, 200, 256, 300, 512, 1000, 1024, 2048, 4096,
         16_384, 65_536, 65_539, 131_072, 262_144, 1_000_003, 1_048_576)  # fmt: skip
SEQUENCES = (1, 2, 3, 4, 6, 7, 16, 100, 256, 1000, 1024, 1100, 2048, 4096, 8192, 16_384,
             16_392, 20_480, 32_768, 49_152, 57_344, 65_536, 65_544, 131_072)  # fmt: skip


class Geometry(NamedTuple):
    estimator: str  # (run_every_estimator's name)
    reverse: bool
    time_major: bool
    dtype: torch.dtype
    plan: Plan  # the H200's plan at (T, N)
    T: int
    N: int

    @property
    def id(self) -> str:
        p = self.plan
        split = ", resident" if p.resident else ", split" if p.n_chunks > 1 else ""
        extra = "".join(
            (f", {p.segs} side by side" * (p.segs > 1), f", unroll {p.unroll}" * (p.unroll > 1),
             ", prefetch" * p.prefetch, f", {p.stages} stages" * (p.stages > 1),
             ", unmasked" * tb._full_tiles(p, self.T, self.N, self.reverse),
             ", T_TAIL" * tb._tail_programs(p, self.T, self.reverse))
        )  # fmt: skip
        layout = "tm" if self.time_major else "bm"
        return f"{self.estimator} {layout} {p.block_t}x{p.block_n}w{p.num_warps}{extra}{split}"


def _asked_as(T: int, N: int, time_major: bool) -> bool:
    """Whether the launcher plans a contiguous ``[T, N]`` (time-major) or ``[N, T]`` call with
    that orientation (``_describe``): a time-major call of one sequence, or of one step, is
    planned batch-major."""
    return (N > 1 and T > 1) if time_major else True


def h200_geometries() -> list[Geometry]:
    """The distinct geometries of ``_plan`` on an H200 over the grid, each with the first
    shape (and dtype class) that picked it."""
    saved = tb._INTERPRETED, tb._sm_count
    tb._INTERPRETED, tb._sm_count = False, (lambda index: 132)
    found: dict[tuple, Geometry] = {}
    try:
        for (kind, reverse), name in ESTIMATOR.items():
            for dtype, options in DTYPES.values():
                grid = itertools.product(STEPS, SEQUENCES, (True, False))
                for T, N, time_major in grid:
                    if T * N > 1 << 28 or not _asked_as(T, N, time_major):
                        continue
                    aligned = dtype.itemsize != 2 or not time_major or N % 16 == 0
                    plan = tb._plan(
                        getattr(kernels, kind).value, T, N, time_major,
                        torch.device("cuda", 0), reverse=reverse, aligned=aligned, **options,
                    )  # fmt: skip
                    full = tb._full_tiles(plan, T, N, reverse)
                    tail = tb._tail_programs(plan, T, reverse)
                    key = (name, time_major, *plan[:3], *plan[5:], plan.n_chunks > 1, full, tail)
                    found.setdefault(key, Geometry(name, reverse, time_major, dtype, plan, T, N))
    finally:
        tb._INTERPRETED, tb._sm_count = saved
    return list(found.values())


def _first(start: int, every: int, like: int) -> int:
    """The first ``x = start + k * every`` (k >= 0) that is a multiple of 16 if ``like`` is,
    and not one if ``like`` is not (``like`` itself, reachable from ``start``, at the latest)."""
    x = start
    while (x % 16 == 0) != (like % 16 == 0):
        x += every
    assert x <= like, (start, every, like)
    return x


def _n_class(N: int, cols: int) -> tuple[int, int]:
    """What the kernel's code depends on in N: the last program's sequences, and the largest
    power of two dividing N up to 16 (Triton specialises integers divisible by 16; a four-byte
    call's kernel is told whether N is a multiple of 8: ALIGN_N; ALIGN_T, told of T, the
    chunk and the strides, follows from T, the chunk and N)."""
    return N % cols, min(16, N & -N)


def shrunk(g: Geometry) -> tuple[Plan, int, int]:
    """The plan's tile at a small shape that keeps what the kernel's code depends on (see the
    module's docstring). N: the same modulo the program's sequences and divisible by the same
    power of two up to 16, the smallest such N above one program's (or N itself). T: the same
    modulo the tile's steps, and a multiple of 16 if T was. Unsplit: at most three tiles (four
    where 16 needs it). Split: chunks of at most two tiles (a chunk of one tile stays one; a
    multiple of 16 steps if the chunk was, up to four tiles then), three of them (more where 16
    needs it); with chunks side by side, two programs' worth, the last program with as many
    chunks holding steps as the original's last (the others wholly past T)."""
    p = g.plan
    cols, step = p.cols, p.block_t * p.unroll
    N = g.N if g.N <= cols else cols + 1
    while _n_class(N, cols) != _n_class(g.N, cols):
        N += 1
    tail = g.T % step or step  # (the last tile's steps)
    if p.n_chunks == 1:
        T = g.T if g.T <= 3 * step else _first(2 * step + tail, step, g.T)
        return p._replace(chunk=triton.cdiv(T, step) * step), T, N
    chunk = _first(min(p.chunk, 2 * step), step, p.chunk)  # (<= p.chunk, which qualifies)
    # chunks holding steps: 3, or with chunks side by side a program's and the original last
    # program's
    held = 3 if p.segs == 1 else p.segs + triton.cdiv(g.T, p.chunk) - (p.n_chunks - p.segs)
    T = _first(chunk * (held - 1) + tail, step, g.T)
    return p._replace(chunk=chunk, n_chunks=triton.cdiv(T, chunk * p.segs) * p.segs), T, N


GEOMETRIES = h200_geometries()


@pytest.fixture
def device():
    if tb._INTERPRETED:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    pytest.skip("needs the Triton interpreter or a GPU")


def test_the_grid_finds_the_geometries_of_each_branch():
    """The collection is not empty-handed: every estimator in both layouts, split and unsplit
    plans, resident ones, chunks side by side, pipelined and prefetching tiles, the tiles of
    sweep 45 (a 256-step one-warp tile of batch-major V-trace, 128 x 4 tiles of 2 warps), both
    code variants (unmasked, T_TAIL); and each geometry's test has its own id."""
    plans = [(g.estimator, g.time_major, g.plan) for g in GEOMETRIES]
    assert {(e, tm) for e, tm, _ in plans} == set(
        itertools.product(ESTIMATOR.values(), (True, False))
    )
    assert any(p.n_chunks > 1 and not p.resident for _, _, p in plans)
    assert any(p.resident for _, _, p in plans)
    assert any(p.segs > 1 for _, _, p in plans)
    assert any(p.stages > 1 for _, _, p in plans) and any(p.prefetch for _, _, p in plans)
    assert ("vtrace", False, (256, 1), 1) in {(e, tm, p[:2], p.num_warps) for e, tm, p in plans}
    assert any(p[:2] == (128, 4) and p.num_warps == 2 for _, _, p in plans)
    ids = [g.id for g in GEOMETRIES]
    assert any("unmasked" in i for i in ids) and any("T_TAIL" in i for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("g", GEOMETRIES, ids=[g.id for g in GEOMETRIES])
def test_h200_tile_geometry(g, device, monkeypatch):
    plan, T, N = shrunk(g)
    asked = []

    def forced(kind, T_, N_, time_major, device, **options):
        asked.append((T_, N_, time_major))
        return plan

    monkeypatch.setattr(tb, "_INTERPRETED", False)  # (the launch metadata of compiled plans)
    monkeypatch.setattr(tb, "_plan", forced)
    shape, time_dim = ((T, N), 0) if g.time_major else ((N, T), 1)
    gen = torch.Generator(device=device).manual_seed(T + N)
    d = random_step_inputs(shape, time_dim, g.dtype, gen)
    run = dict(only={g.estimator})
    out_like = torch.empty(shape, dtype=g.dtype, device=device)
    try:
        got, launch = described_launch(
            run_every_estimator, d, time_dim, "triton", out_like=out_like, **run
        )
    finally:
        forget_launches()  # (launches described with the forced plan)
    assert asked == [(T, N, g.time_major)], "the launcher planned another orientation"
    assert launch.plan == plan
    assert (launch.meta["FULL"], launch.meta["T_TAIL"]) == (
        tb._full_tiles(g.plan, g.T, g.N, g.reverse),
        tb._tail_programs(g.plan, g.T, g.reverse),
    ), "the small shape changed the code variant"
    want = run_every_estimator(as_float64(d), time_dim, "torch", **run)
    close_all_to_float64(got, want, g.dtype, f"{g.id} at {shape} (H200 plan at ({g.T}, {g.N}))")
