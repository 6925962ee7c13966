"""GPU-only checks of the Triton backend at sizes the CPU interpreter cannot reach.

Large and long shapes in every layout and dtype (outputs poisoned with NaN first), indexing
past 2**31 elements, float32 accuracy at T = 100,000 with gamma*lambda close to 1, run-to-run
bit-identical outputs, and CUDA-graph capture and replay. The oracle for large shapes is the
torch backend in float64 (itself checked against the reference loop by the rest of the suite).
"""

from __future__ import annotations

import collections

import pytest
import torch
from _support import (
    as_float64,
    as_tuple,
    close_all_to_float64,
    close_to_float64,
    described_launch,
    forget_launches,
    random_step_inputs,
    run_every_estimator,
)

import rl_triton_core as rtc

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available"),
]
CUDA = torch.device("cuda")
LAYOUTS = {
    "time-major [T, N]": lambda T, N: ((T, N), 0),
    "batch-major [N, T]": lambda T, N: ((N, T), 1),
    "torchrl [B, N, T, 1]": lambda T, N: ((2, N // 2 or 1, T, 1), -2),
}
# (16_384, 100): time-major 16 < N < 1024 with T >= 16384 has its own split plan, and N is not
# a multiple of 16 (Triton specialises N, T and the chunk length on that); (8192, 5),
# (65_536, 3) and (131_072, 16): the few-long-sequences plan, in 256, 2048 and 2048 programs
# (two-level carry-in: a group pass); (131_072, 16): discounted returns, traces, the scan and
# Retrace run their 8 x 16 tiles in a pipelined loop (3 stages), but in float64 (8 chunks side
# by side; Retrace unpipelined); (65_536, 3): 32 side by side; (65_536, 3) and (8192, 5):
# GAE, discounted returns, TD(lambda) and Retrace (N <= 4), and TD(lambda) and Retrace
# (N <= 8) run 16 chunks of 4 columns and 8 of 8 side by side in 64-column tiles (in the
# torchrl layout 2 and 4 sequences); (1_000_000, 1): one long
# sequence in 1024-step tiles (V-trace included); (300, 1100) and (2048, 1024): time-major, a
# warp per 64 columns split to fill one wave (Retrace and V-trace from T = 512 only; with 132
# SMs 128 chunks at 2048: the group pass), and batch-major one-sequence tiles scanned backward
# by fours at N = 1100 (256-step tiles), one tile a sequence at N = 1024 (below 8 x SMs
# sequences: 132 SMs on the H200; V-trace: its 64 x 4 tiles); (120, 1500):
# time-major, one 128-step tile a program (a partial one), masked columns; (200_003, 2) and
# (262_144, 4): time-major, resident (one cooperative launch) for GAE, TD(lambda), discounted
# returns and V-trace (a partial last chunk at N = 2); V-trace at (1_000_000, 1) too;
# (64, 65_536), (70, 65_544), (100, 16_392) and (32, 16_392): time-major one-warp tiles,
# unsplit, 8 x 32 (V-trace 4 x 32) in a pipelined loop (3 stages), Retrace too (4 x 32 at
# N = 65536 and 65544), but 16-bit backward scans at N = 65544 and 16392 (a row stride not a
# multiple of 16) in unpipelined 4 x 32 tiles with prefetch (Retrace 8 x 16; TD(lambda)
# without); float64 in 8 x 16 (prefetching below N = 65536 only), at N >= 65536 GAE and
# V-trace in 4 x 32 (prefetching at N = 65536, not at 65544) (masked columns at N = 65544
# and 16392, partial tiles at T = 70 and 100); (20, 65_544): the plans of T < 32 there,
# 4 x 32 with prefetch (not Retrace's or TD(lambda)'s, nor any float64 backward scan's: a
# partial tile of columns), float32
# traces and the forward scan in a warp per 128 columns of 8-row tiles (a partial tile and a
# partial warp of columns);
# batch-major (and torchrl) short rows in one-warp tiles of whole sequences, a tile a program
# (sweep 45): (1, 4096) and (12, 1100) in 16 x 16 (Retrace 16 x 8), (20, 1100) in 32 x 8,
# (20, 65_544) and (32, 16_392) in 32 x 8 (V-trace 32 x 4), (64, 65_536) in 64 x 4; (70, 65_544)
# and (100, 16_392): discounted returns, traces and the scans in 128 x 4 tiles of 2 warps, the
# others a program a sequence; masked steps, and masked sequences at N = 1100 only (more in
# test_batch_major_short_rows_every_estimator); (100, 1000) and (120, 1500) (below N = 4096
# past T = 32) a program a sequence;
# batch-major V-trace in (64, 4) tiles of 4 warps at T <= 64 below N = 16384 and past T = 32,
# in float64 at any N (a program per sequence at T = 70; at (100, 1000), below 8 x SMs
# sequences, in one one-warp tile of 128 steps each);
# batch-major (and torchrl) (4096, 3), (8192, 5), (65_536, 3), (131_072, 16), (16_384, 100),
# (200_003, 2) and (262_144, 4), and (1_000_000, 1) in the torchrl layout (two sequences):
# backward scans in one-warp 256-step tiles (V-trace 128) scanned by fours, split in 16-1954
# chunks a sequence (partial last chunks and tiles; past 1024 chunks with a group pass: 1954 at
# (1_000_000, 1) in the torchrl layout, V-trace's 1563 at (200_003, 2)), forward scans of up
# to 64 sequences in 1024-step tiles of 8 warps, a tile or more a chunk, about 4 x SMs programs
# (4-489 chunks a sequence: partial last chunks at (200_003, 2) and (1_000_000, 1)), of 100
# sequences at (16_384, 100) in 512-step tiles of 4 warps;
# (20, 1100) and (12, 1100): time-major short rollouts in one-warp 16 x 8 tiles (partial tiles
# of 4 and 12 steps, masked columns; Retrace in them at T = 12 only, in 64 x 16 tiles at T =
# 20); (300, 16_400): time-major, unsplit one-warp 16 x 16 tiles (V-trace, Retrace 8 x 16;
# GAE 3 stages) in a 4-stage pipelined loop (a partial last tile), in float32 GAE 16 x 32,
# TD(lambda) 16 x 16 (3 stages), Retrace 8 x 32, traces and the scans 32 x 32 (3 stages), in
# 16-bit GAE's and traces' too, but float64: 4 x 64 tiles
# split in 15 chunks, V-trace walking rows in 10 chunks (masked columns); (120, 1500) and
# (300, 1100): batch-major V-trace, a program per sequence; (1000, 1): one sequence in one
# tile of 1024 steps (a partial one; two sequences in the torchrl layout); (600, 16),
# (2000, 100), (1500, 6) and (4096, 3): time-major few sequences from T = 512, one-warp 8 x 16
# tiles in chunks of 32 steps (partial last chunks; masked columns at N = 100 and 6; at N = 3
# and 6 chunks side by side as at (65_536, 3)); V-trace at (16_384, 100) in them too;
# (1500, 6), (600, 16), (2000, 100) and (700, 200) batch-major (and torchrl): one tile a
# sequence (2048, 1024, 2048 and 1024 steps; V-trace at (600, 16) and (700, 200) only: masked
# steps, and 17-255 sequences at (700, 200)); (3000, 100), (5000, 300) and (4100, 600)
# batch-major (and torchrl): each sequence walked unsplit by one program past T = 2048, forward
# scans (traces, the forward scan) in 2048-step tiles of 8 warps (512 x 4 at N = 600),
# backward ones at N = 600 in 1024-step tiles of 4 warps (partial last tiles; V-trace and the
# backward scans at N = 100 and 300 split; at (4100, 600) other dtypes than float32 run
# time-major only, as T x N > 2M)
SHAPES = [
    (1, 4096),
    (20, 1100),
    (12, 1100),
    (100, 16_392),
    (100, 1000),
    (120, 1500),
    (4096, 3),
    (8192, 5),
    (1_000_000, 1),
    (131_072, 16),
    (65_536, 3),
    (64, 65_536),
    (70, 65_544),
    (20, 65_544),
    (32, 16_392),
    (300, 16_400),
    (16_384, 100),
    (300, 1100),
    (2048, 1024),
    (200_003, 2),
    (262_144, 4),
    (1000, 1),
    (600, 16),
    (2000, 100),
    (1500, 6),
    (700, 200),
    (3000, 100),
    (5000, 300),
    (4100, 600),
]


@pytest.mark.parametrize("T,N", SHAPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_large_shapes_every_estimator(T, N, layout, dtype):
    if dtype != torch.float32 and T * N > 2_000_000 and layout != "time-major [T, N]":
        pytest.skip("one layout per non-float32 dtype at the largest sizes keeps the run short")
    shape, time_dim = LAYOUTS[layout](T, N)
    gen = torch.Generator(device=CUDA).manual_seed(T + N)
    d = random_step_inputs(shape, time_dim, dtype, gen)
    out_like = torch.empty(shape, dtype=dtype, device=CUDA)
    got = run_every_estimator(d, time_dim, "triton", out_like=out_like)
    close_all_to_float64(
        got, run_every_estimator(as_float64(d), time_dim, "torch"), dtype, f"{layout} {dtype}"
    )


def _against_float64(T, N, dtype, label, time_dim=0):
    """Every estimator on ``[T, N]`` inputs (``[N, T]`` with ``time_dim`` 1) of ``dtype`` into
    NaN-poisoned outputs, against the torch backend in float64."""
    shape = (T, N) if time_dim == 0 else (N, T)
    gen = torch.Generator(device=CUDA).manual_seed(T + N)
    d = random_step_inputs(shape, time_dim, dtype, gen)
    out_like = torch.full(shape, float("nan"), dtype=dtype, device=CUDA)
    got = run_every_estimator(d, time_dim, "triton", out_like=out_like)
    close_all_to_float64(got, run_every_estimator(as_float64(d), time_dim, "torch"), dtype, label)


def _launches_against_float64(T, N, dtype, label, time_dim=0):
    """``_against_float64`` from an empty launch table: the launches it described,
    as ``(kind, reverse, launch)``."""
    import rl_triton_core.triton_backend as tb

    forget_launches()
    _against_float64(T, N, dtype, label, time_dim)
    return [(L.meta["KIND"], L.meta["REVERSE"], L) for L in tb._LAUNCHES.values()]


@pytest.mark.parametrize("N", [49_160, 57_352, 65_552])
def test_wide_float32_tiles_every_estimator(N):
    """Time-major float32 from T = 256: Retrace in 4 x 64 tiles from N = 49152, GAE from
    57344 (sweep 43), V-trace from 65536 (the other estimators as below T = 256: see SHAPES);
    masked columns (at N = 49160 and 57352 rows of a multiple of 8, told so), a partial last
    tile."""
    from rl_triton_core.triton_backend import kernels

    first = {kernels.RETRACE.value: 49_152, kernels.GAE.value: 57_344, kernels.VTRACE.value: 65_536}
    launches = _launches_against_float64(260, N, torch.float32, f"wide float32 tiles N = {N}")
    assert {kind for kind, _, _ in launches} >= set(first)
    for kind, _, launch in launches:
        if kind in first:
            assert (launch.plan[:2] == (4, 64)) == (N >= first[kind]), (kind, N, launch.plan)
        assert launch.meta["ALIGN_N"] == (8 if N % 16 else 1), (kind, N)


@pytest.mark.parametrize(
    "T,N,dtype",
    [(128, 4096, torch.float32), (40, 3000, torch.float32), (512, 12_296, torch.float32),
     (200, 1032, torch.float32), (256, 8192, torch.bfloat16), (33, 2048, torch.float16)],
)  # fmt: skip
def test_ppo_sized_rollouts_every_estimator(T, N, dtype):
    """Time-major 1024 <= N < 16384 (a multiple of 8) at 32 < T <= 512 (16-bit to 256): one
    unsplit one-warp launch per call, 16 x 8 tiles in 4 stages from N = 4096, 64 x 4 in 3
    below (sweep 44): partial last tiles (T of 40, 200 and 33), columns of a multiple of 8
    only (N = 3000, 12296 and 1032, told so)."""
    launches = _launches_against_float64(T, N, dtype, f"PPO-sized rollouts {dtype}")
    tile, stages = ((16, 8), 4) if N >= 4096 else ((64, 4), 3)
    assert len(launches) >= 8
    for kind, _, launch in launches:
        got = (launch.plan[:2], launch.plan.n_chunks, launch.plan.num_warps, launch.plan.stages)
        assert got == (tile, 1, 1, stages), (kind, launch.plan)
        if dtype == torch.float32:
            assert launch.meta["ALIGN_N"] == (8 if N % 16 else 1), (kind, N)


@pytest.mark.parametrize("T,N", [(260, 32_784), (40, 131_088)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pipelined_wide_tiles_every_estimator(T, N, dtype):
    """Time-major one-warp tiles pipelined in 3 stages from N = 32768 at T >= 256 (8 x 32,
    V-trace 4 x 32, Retrace among them) and from N = 131072 (4 x 64 but V-trace's): masked
    columns (N a multiple of 16 only), a partial last 8-row tile at T = 260."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    tile = (8, 32) if N < 65_536 else (4, 64)
    for kind in (kernels.GAE, kernels.RETRACE, kernels.TRACES):
        plan = tb._plan(kind.value, T, N, True, CUDA, four_byte=dtype == torch.float32)
        assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, 3), kind
    _against_float64(T, N, dtype, f"pipelined wide tiles {dtype}")


@pytest.mark.parametrize("T,N", [(16, 16_384), (25, 16_384)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_short_wide_retrace_tiles_every_estimator(T, N, dtype):
    """Time-major below T = 32 from N = 16384: Retrace's one-warp 4 x 32 tiles prefetch and run
    unmasked where they are whole (T = 16; no prefetch in float64), neither where they are
    partial (T = 25, masked steps; sweep 36)."""
    from rl_triton_core.triton_backend import kernels

    launches = _launches_against_float64(T, N, dtype, f"short wide Retrace tiles {dtype}")
    (launch,) = [launch for kind, _, launch in launches if kind == kernels.RETRACE.value]
    whole = T % 4 == 0
    assert launch.plan[:2] == (4, 32) and launch.meta["FULL"] == whole, launch.plan
    assert launch.plan.prefetch == (whole and dtype != torch.float64), launch.plan


@pytest.mark.parametrize("T,N,dtype", [(300, 16_392, torch.bfloat16), (40, 65_544, torch.float16)])
def test_unaligned_16bit_rows_every_estimator(T, N, dtype):
    """Time-major 16-bit rows whose stride is not a multiple of 16 (no alignment hint for
    Triton): the backward scans run unpipelined tiles, prefetching but TD(lambda)'s (sweeps 35,
    37), the forward scans their pipelined ones; masked columns, a partial last tile of
    Retrace's 8 rows at T = 300."""
    from rl_triton_core.triton_backend import kernels

    launches = _launches_against_float64(T, N, dtype, f"unaligned 16-bit rows {dtype}")
    assert {reverse for _, reverse, _ in launches} == {False, True}
    for kind, reverse, launch in launches:
        plan = launch.plan
        assert plan.n_chunks == 1 and (plan.stages == 1) == reverse, plan
        assert plan.prefetch == (reverse and kind != kernels.LAMBDA.value), plan


@pytest.mark.parametrize("T,N,dtype", [(131_075, 12, torch.bfloat16), (262_144, 9, torch.float16)])
def test_unaligned_few_long_sequences_every_estimator(T, N, dtype):
    """Time-major 16-bit rows of 9-15 sequences (a stride not a multiple of 16) from T = 131072:
    discounted returns, traces, both scans and Retrace run their 8 x 16 tiles pipelined in 3
    stages, as aligned rows do (sweep 38: the forward scan's chunks side by side took
    1.12-2.51x the time where T does not split into whole chunks of a multiple of 16 steps);
    masked columns, a partial last chunk at T = 131075."""
    from rl_triton_core.triton_backend import kernels

    launches = _launches_against_float64(T, N, dtype, f"unaligned few long {dtype}")
    pipelined = {kernels.DISCOUNTED.value, kernels.TRACES.value, kernels.SCAN.value,
                 kernels.RETRACE.value}  # fmt: skip
    plans = [(kind, reverse, launch.plan) for kind, reverse, launch in launches
             if kind in pipelined]  # fmt: skip
    for kind, _, plan in plans:
        assert (plan[:2], plan.segs, plan.stages) == ((8, 16), 1, 3), (kind, plan)
    seen = {(kind, reverse) for kind, reverse, _ in plans}
    assert seen == {(kernels.DISCOUNTED.value, True), (kernels.TRACES.value, False),
                    (kernels.SCAN.value, True), (kernels.SCAN.value, False),
                    (kernels.RETRACE.value, True)}, seen  # fmt: skip


@pytest.mark.parametrize(
    "T,N,dtype,tile,segs,forward,backward",
    [
        (327_680, 12, torch.float64, (8, 128), 8, 48, 40),
        (327_680, 6, torch.bfloat16, (8, 128), 16, 32, 24),
        (131_075, 6, torch.float32, (8, 128), 16, 8, 8),
        (327_688, 6, torch.float32, (8, 128), 16, 32, 24),
        (200_000, 100, torch.float32, (8, 16), 1, 176, 168),
    ],
)
def test_forward_chunks_in_pairs_every_estimator(T, N, dtype, tile, segs, forward, backward):
    """Split time-major 8-step tiles: chunks side by side (8 x 128, few long sequences from
    T = 65536) and 8 x 16 tiles of 17-255 sequences from T = 16384. Forward scans (traces,
    episodic sums, the forward scan) take chunks of a multiple of 16 steps beyond one tile;
    backward ones (discounted returns, the backward scan) keep multiples of 8 (sweep 39); side
    by side also at T not a multiple of 16, forward chunks of a multiple of 16 steps with the
    tile loop compiled twice (T_TAIL: T = 327688, now paired to 32, not timed; not the one-tile
    chunks at T = 131075; sweep 41). A partial last chunk at N = 12 and 100 and T = 327688
    (T is not a multiple of chunk x segs), masked columns at N = 6, 12 and 100."""
    from rl_triton_core.triton_backend import kernels

    launches = _launches_against_float64(T, N, dtype, f"forward chunks in pairs {dtype}")
    for kind, reverse, launch in launches:
        plan = launch.plan
        side_by_side_forward = plan.segs > 1 and not reverse and plan.chunk % 16 == 0
        assert launch.meta["T_TAIL"] == (side_by_side_forward and T % 16 != 0), (kind, launch)
    checked = {kernels.DISCOUNTED.value, kernels.TRACES.value, kernels.SCAN.value}
    plans = [(kind, reverse, launch.plan) for kind, reverse, launch in launches
             if kind in checked]  # fmt: skip
    for kind, reverse, plan in plans:
        assert (plan[:2], plan.segs) == (tile, segs), plan
        assert plan.chunk == (backward if reverse else forward), (kind, reverse, plan)
    seen = {(kind, reverse) for kind, reverse, _ in plans}
    assert seen == {(kernels.DISCOUNTED.value, True), (kernels.TRACES.value, False),
                    (kernels.SCAN.value, True), (kernels.SCAN.value, False)}, seen  # fmt: skip


@pytest.mark.parametrize("T", [1_048_579, 1_048_584])
def test_tail_programs_of_one_sequence_every_estimator(T):
    """One long sequence (1024 x 1 tiles, split) at T not a multiple of 16: the tile loop is
    compiled twice (T_TAIL), masked at T only in the program holding step T - 1 (sweep 41, set
    X: 0.81-1.00x the time), and every estimator matches float64; at T = 1048584 too (a
    multiple of 8, not of 16; not timed with T_TAIL)."""
    launches = _launches_against_float64(T, 1, torch.float32, f"tail programs T = {T}")
    assert len(launches) >= 7
    for kind, _, launch in launches:
        assert launch.plan.block_n == 1 and launch.plan.n_chunks > 1, (kind, launch.plan)
        assert launch.meta["T_TAIL"] == (not launch.plan.resident), (kind, launch)


@pytest.mark.parametrize(
    "T,N,time_dim,dtype,align",
    [
        (1000, 256, 1, torch.float32, (8, 1)),
        (1004, 256, 1, torch.bfloat16, (4, 1)),
        (131_074, 16, 1, torch.float32, (2, 1)),
        (260, 32_776, 0, torch.float32, (1, 8)),
        (260, 32_776, 0, torch.bfloat16, (1, 1)),
        (260, 32_772, 0, torch.float32, (1, 1)),
    ],
)
def test_rows_tell_their_alignment_every_estimator(T, N, time_dim, dtype, align):
    """Rows of a multiple of 2, 4 or 8 elements, not of 16, in the GPU's plans (sweep 42,
    ``_alignment``): batch-major rows of T steps tell any (unsplit at T of 1000-1004; split at
    [16, 131074]: 257 chunks of 256 x 1 tiles, V-trace's 128 x 1, the forward scans' 33 of
    1024 x 1), time-major rows of N sequences only 8 in float32 (8 x 32 tiles, V-trace's
    4 x 32). The kernel rounds the integers down to what it is told: NaN-poisoned outputs, every
    estimator against float64."""
    import rl_triton_core.triton_backend as tb

    forget_launches()
    gen = torch.Generator(device=CUDA).manual_seed(T + N)
    shape = (N, T) if time_dim else (T, N)
    d = random_step_inputs(shape, time_dim, dtype, gen)
    out_like = torch.full(shape, float("nan"), dtype=dtype, device=CUDA)
    got = run_every_estimator(d, time_dim, "triton", out_like=out_like)
    close_all_to_float64(
        got, run_every_estimator(as_float64(d), time_dim, "torch"), dtype, f"aligned rows {shape}"
    )
    launches = list(tb._LAUNCHES.values())
    assert len(launches) >= 7
    for launch in launches:
        assert (launch.meta["ALIGN_T"], launch.meta["ALIGN_N"]) == align, launch


@pytest.mark.parametrize(
    "T,N,dtype",
    [
        (16, 65_544, torch.float64),
        (31, 65_544, torch.bfloat16),
        (31, 65_536, torch.bfloat16),
        (20, 65_536, torch.float32),
        (31, 65_536, torch.float64),
        (64, 65_536, torch.float64),
        (70, 65_544, torch.float64),
    ],
)
def test_wide_tile_prefetch_rules_every_estimator(T, N, dtype):
    """Time-major one-warp tiles from N = 65536 (sweep 37): the backward scans' 4 x 32 tiles
    prefetch in float64 only where N is a multiple of 32 (forward ones do anyway), TD(lambda)'s
    only there and not in float64, Retrace's where whole (T too) and not in float64; the 8 x 16
    tiles of float64 (TD(lambda), discounted returns, traces, the scans from T = 64) do not
    prefetch. Masked columns (N = 65544), a partial last tile (T = 31, 70)."""
    from rl_triton_core.triton_backend import kernels

    f64 = dtype == torch.float64
    for kind, reverse, launch in _launches_against_float64(T, N, dtype, f"wide prefetch {dtype}"):
        plan = launch.plan
        columns = N % plan.cols == 0  # (whole tiles of columns)
        if plan[:2] == (8, 16):
            want = not (f64 and N >= 65_536)
        elif kind == kernels.RETRACE.value:
            want = launch.meta["FULL"] and not f64
        elif kind == kernels.LAMBDA.value:
            want = columns and not f64
        else:
            want = columns or not (f64 and reverse)
        assert plan.prefetch == want, (kind, reverse, plan)


def test_batch_major_shapes_in_one_tile():
    """The batch-major SHAPES said above to run one tile a sequence do (no split), and V-trace
    keeps its 4-column tiles at (2048, 1024): the large-shape tests reach the rule's edges."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    cases = [
        (kernels.LAMBDA, 2000, 100, 2048),
        (kernels.RETRACE, 1500, 6, 2048),
        (kernels.VTRACE, 700, 200, 1024),
        (kernels.VTRACE, 600, 16, 1024),
        (kernels.TRACES, 1000, 1, 1024),
    ]
    if 1024 < 8 * tb._sm_count(CUDA.index or 0):  # (below 8 x SMs sequences: 132 on the H200)
        cases.append((kernels.GAE, 2048, 1024, 2048))
    for kind, T, N, tile in cases:
        plan = tb._plan(kind.value, T, N, False, CUDA, reverse=kind != kernels.TRACES)
        assert (plan.block_t, plan.block_n, plan.n_chunks) == (tile, 1, 1), (kind, T, N, plan)
    assert tb._plan(kernels.VTRACE.value, 2048, 1024, False, CUDA).block_n == 4


def test_batch_major_short_rows_in_tiles_of_sequences():
    """The batch-major SHAPES said above to run short rows in tiles of several sequences do,
    in the tiles said, and the others keep a program a sequence: the large-shape tests reach
    the rule's kinds on the GPU (its edges: tests/test_plans.py)."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    gae, retrace, vtrace, traces = kernels.GAE, kernels.RETRACE, kernels.VTRACE, kernels.TRACES
    discounted = kernels.DISCOUNTED
    cases = [(gae, 1, 4096, (16, 16, 1)), (retrace, 12, 1100, (16, 8, 1)),
             (gae, 20, 1100, (32, 8, 1)), (vtrace, 20, 65_544, (32, 4, 1)),
             (retrace, 32, 16_392, (32, 8, 1)), (gae, 64, 65_536, (64, 4, 1)),
             (traces, 70, 65_544, (128, 4, 2)), (kernels.SCAN, 70, 65_544, (128, 4, 2)),
             (discounted, 100, 16_392, (128, 4, 2))]  # fmt: skip
    for kind, T, N, tile in cases:
        plan = tb._plan(kind.value, T, N, False, CUDA, reverse=kind != traces)
        assert (plan.block_t, plan.block_n, plan.num_warps, plan.n_chunks) == (*tile, 1), (
            kind, T, N, plan)  # fmt: skip
    for kind, T, N in ((gae, 70, 65_544), (gae, 100, 1000), (gae, 120, 1500)):
        assert tb._plan(kind.value, T, N, False, CUDA).block_n == 1, (kind, T, N)
    assert tb._plan(vtrace.value, 20, 1100, False, CUDA)[:2] == (64, 4)
    assert tb._plan(vtrace.value, 32, 16_392, False, CUDA, eight_byte=True)[:2] == (64, 4)
    if 1000 < 8 * tb._sm_count(CUDA.index or 0):  # V-trace below 8 x SMs sequences at
        plan = tb._plan(vtrace.value, 100, 1000, False, CUDA)  # 64 < T <= 256: one one-warp
        assert (plan.block_t, plan.block_n, plan.num_warps, plan.n_chunks) == (128, 1, 1, 1)


@pytest.mark.parametrize("T,N", [(200, 1000), (20, 16_385), (100, 4099)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_major_short_rows_every_estimator(T, N, dtype):
    """Batch-major short rows in the tiles of sweep 45 where SHAPES has none: masked sequences
    in V-trace's 32 x 4 tiles (T = 20, not in float64) and in the 128 x 4 tiles of the lighter
    estimators (T = 100), and every estimator's one-warp 256-step tiles below 8 x SMs
    sequences, whose backward states compose by eights (T = 200); NaN-poisoned outputs against
    float64."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    launches = _launches_against_float64(T, N, dtype, f"short batch-major rows {dtype}", 1)
    tiles = {(kind, launch.plan[:2], launch.plan.num_warps) for kind, _, launch in launches}
    vtrace, traces = kernels.VTRACE.value, kernels.TRACES.value
    if T == 20:  # (float64 V-trace keeps its 64 x 4 tiles of 4 warps)
        want = (vtrace, (64, 4), 4) if dtype == torch.float64 else (vtrace, (32, 4), 1)
    elif T == 100:
        want = (traces, (128, 4), 2)
    elif N < 8 * tb._sm_count(CUDA.index or 0):  # (T = 200: one-warp tiles below 8 x SMs)
        want = (vtrace, (256, 1), 1)
        assert {tile[1:] for tile in tiles} == {((256, 1), 1)}, tiles
    else:
        want = (vtrace, (128, 1), 1)
    assert want in tiles, tiles
    assert all(launch.plan.n_chunks == 1 for _, _, launch in launches)


def test_batch_major_forward_scan_tiles():
    """The batch-major forward scans of SHAPES said above to run 1024-step tiles of 8 warps (up
    to 64 sequences, split in about 4 x SMs programs) do, and (16_384, 100) keeps the 512-step
    tiles of 4 warps: the large-shape tests reach both sides of the rule."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    most = 4 * tb._sm_count(CUDA.index or 0)
    for kind, T, N in ((kernels.TRACES, 131_072, 16), (kernels.SCAN, 200_003, 2),
                       (kernels.TRACES, 4096, 3), (kernels.TRACES, 1_000_000, 1)):  # fmt: skip
        plan = tb._plan(kind.value, T, N, False, CUDA, reverse=False)
        assert (plan.block_t, plan.num_warps) == (1024, 8), (kind, T, N, plan)
        assert plan.chunk % 1024 == 0 and N * plan.n_chunks <= most, (kind, T, N, plan)
    plan = tb._plan(kernels.TRACES.value, 16_384, 100, False, CUDA, reverse=False)
    assert (plan.block_t, plan.num_warps) == (512, 4), plan


def test_batch_major_unsplit_walks():
    """The batch-major SHAPES said above to walk each sequence unsplit do, in the tiles said, and
    V-trace at (4100, 600) and the backward scans at (5000, 300) stay split."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    sms = tb._sm_count(CUDA.index or 0)
    if not 4 * sms < 600 < 8 * sms:
        pytest.skip("the shapes sit on the rule's sides with 76-149 SMs (132 on the H200)")
    cases = [(kernels.TRACES, 3000, 100, False, 2048, 8), (kernels.SCAN, 5000, 300, False, 2048, 8),
             (kernels.TRACES, 4100, 600, False, 512, 4), (kernels.GAE, 4100, 600, True, 1024, 4),
             (kernels.SCAN, 4100, 600, True, 1024, 4)]  # fmt: skip
    for kind, T, N, reverse, block_t, warps in cases:
        plan = tb._plan(kind.value, T, N, False, CUDA, reverse=reverse)
        assert (plan.block_t, plan.num_warps, plan.n_chunks) == (block_t, warps, 1), (kind, plan)
    assert tb._plan(kernels.VTRACE.value, 4100, 600, False, CUDA).n_chunks > 1
    for kind in (kernels.GAE, kernels.SCAN):
        assert tb._plan(kind.value, 5000, 300, False, CUDA, reverse=True).n_chunks > 1, kind


# (300, 1100) batch-major: unsplit 256-step one-warp tiles (a partial last one), backward by
# eights (V-trace's 128-step tiles by fours); (131_072, 16) batch-major: the same tiles split
# (the totals pass by fours); time-major: (131_072, 16) split 8 x 16 tiles, (65_536, 3) chunks
# side by side, (200_003, 2) resident, (2048, 1024) one wave of 4 x 64 tiles; (1_000_000, 1)
# one sequence split in 1024-step tiles of 8 warps. Unsplit scans load bootstrap_value once a
# program, the passes of split and resident ones in a load a tile masked to the last step
# (kernels.scan_kernel; at (65_536, 3) by lanes of chunks side by side)
BOOTSTRAP_SHAPES = [(300, 1100, 1), (131_072, 16, 1), (131_072, 16, 0), (65_536, 3, 0),
                    (200_003, 2, 0), (2048, 1024, 0), (1_000_000, 1, 0)]  # fmt: skip


@pytest.mark.parametrize("T,N,time_dim", BOOTSTRAP_SHAPES)
def test_bootstrap_value_and_backward_tiles_by_eights(T, N, time_dim):
    """The estimators that take ``bootstrap_value`` (no next_values) match the float64 torch
    backend with poisoned outputs in every plan kind above, and batch-major backward scans take
    the tiles by eights or fours said there."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    shape = (T, N) if time_dim == 0 else (N, T)
    gen = torch.Generator(device=CUDA).manual_seed(T + N + time_dim)
    d = random_step_inputs(shape, time_dim, torch.float32, gen)
    boot = torch.randn(N, generator=gen, device=CUDA)
    f64 = dict(as_float64(d), boot=boot.double())
    inputs = {  # the per-step inputs of the estimators that take a bootstrap value
        "gae": ("rewards", "values", "term"),
        "lambda_returns": ("rewards", "values", "term"),
        "discounted_returns": ("rewards", "term"),
        "vtrace": ("rewards", "values", "tlp", "blp", "term"),
    }
    forget_launches()
    for name, keys in inputs.items():
        fn = getattr(rtc, name)
        n_out = 2 if name in ("gae", "vtrace") else 1
        outs = tuple(torch.full(shape, float("nan"), device=CUDA) for _ in range(n_out))
        got = fn(*(d[k] for k in keys), bootstrap_value=boot, time_dim=time_dim,
                 backend="triton", out=outs if n_out > 1 else outs[0])  # fmt: skip
        want = fn(*(f64[k] for k in keys), bootstrap_value=f64["boot"], time_dim=time_dim,
                  backend="torch")  # fmt: skip
        for i, (g, w) in enumerate(zip(as_tuple(got), as_tuple(want), strict=True)):
            close_to_float64(g, w, torch.float32, f"{name}[{i}] {shape} time_dim {time_dim}")
    a, r = d["values"].sigmoid(), d["rewards"]  # the backward scan (its initial state)
    out = torch.full_like(r, float("nan"))
    rtc.linear_scan(a, r, initial=boot, reverse=True, out=out, time_dim=time_dim, backend="triton")
    want = rtc.linear_scan(a.double(), r.double(), initial=boot.double(), reverse=True,
                           time_dim=time_dim, backend="torch")  # fmt: skip
    close_to_float64(out, want, torch.float32, f"linear_scan {shape}")
    sms = tb._sm_count(CUDA.index or 0)  # (N = 1100 runs these tiles from 8 x SMs sequences)
    if time_dim == 1 and (N == 16 or 8 * sms <= N):
        by = {launch.meta["KIND"]: launch.meta["BY"] for launch in tb._LAUNCHES.values()}
        assert by[kernels.VTRACE.value] == 4, by
        for kind in (kernels.GAE, kernels.LAMBDA, kernels.DISCOUNTED, kernels.SCAN):
            assert by[kind.value] == 8, (kind, by)


@pytest.mark.parametrize(
    "T,N", [(130, 4096), (1_000_000, 1), (131_072, 16), (200_003, 2), (262_144, 4)]
)
def test_long_horizon_float32_large_shapes(T, N):
    """float32 with gamma = 0.9995 and lambda = 1 accumulates in float64 past T = 128
    (``_dispatch.accumulates_in_float64``) in every plan kind: unsplit, split in chunks with a
    group pass, resident (200003 x 2 and 262144 x 4; V-trace of one sequence); within 1e-6 of
    float64 (outputs poisoned). (At T = 100 it accumulates in float32: 1.04e-6 off at N =
    1000 on the H200.)"""
    gen = torch.Generator(device=CUDA).manual_seed(T + N + 1)
    d = random_step_inputs((T, N), 0, torch.float32, gen)
    out_like = torch.empty((T, N), dtype=torch.float32, device=CUDA)
    got = run_every_estimator(d, 0, "triton", out_like=out_like, long_horizon=True)
    want = run_every_estimator(as_float64(d), 0, "torch", long_horizon=True)
    for name, g in got.items():
        for i, (gi, wi) in enumerate(zip(as_tuple(g), as_tuple(want[name]), strict=True)):
            scale = wi.abs().max().clamp_min(1.0)
            err = ((gi.double() - wi).abs().max() / scale).item()
            assert err <= 1e-6, f"{name}[{i}] [{T}, {N}]: max relative error {err:.3g}"


@pytest.mark.parametrize("flag_dtype", [torch.uint8, torch.int64, torch.float32])
def test_flag_dtypes_large(flag_dtype):
    gen = torch.Generator(device=CUDA).manual_seed(3)
    d = random_step_inputs((512, 2048), 0, torch.float32, gen, flag_dtype=flag_dtype)
    got, want = run_every_estimator(d, 0, "triton"), run_every_estimator(as_float64(d), 0, "torch")
    close_all_to_float64(got, want, torch.float32, f"flags {flag_dtype}")


def test_strided_views_read_in_place():
    gen = torch.Generator(device=CUDA).manual_seed(4)
    base = torch.randn(300, 2, 700, generator=gen, device=CUDA)
    rewards = base[:, 0, ::2]  # non-contiguous view [300, 350]
    values = base[:, 1, 1::2]
    term = torch.rand(300, 350, generator=gen, device=CUDA) < 0.05
    got = rtc.gae(rewards, values, term, bootstrap_value=values[0], backend="triton")
    want = rtc.gae(
        rewards.double(), values.double(), term, bootstrap_value=values[0].double(), backend="torch"
    )
    for g, w in zip(got, want, strict=True):
        close_to_float64(g, w, torch.float32, "strided gae")


def test_indexing_beyond_2_31_elements():
    T, N = 32_768, 65_536 + 64  # 2**31 + 2**21 elements per tensor
    if torch.cuda.get_device_properties(CUDA).total_memory < 60 * 2**30:
        pytest.skip("needs ~50 GB of GPU memory")
    gen = torch.Generator(device=CUDA).manual_seed(5)
    rewards = torch.randn(T, N, generator=gen, device=CUDA)
    term = torch.zeros(T, N, dtype=torch.bool, device=CUDA)
    term[::97] = True
    adv = torch.full_like(rewards, float("nan"))
    ret = torch.full_like(rewards, float("nan"))
    rtc.gae(rewards, rewards, term, bootstrap_value=rewards[0], out=(adv, ret), backend="triton")
    cols = slice(N - 40, N)  # the columns whose offsets pass 2**31
    want, want_ret = rtc.gae(
        rewards[:, cols].double(),
        rewards[:, cols].double(),
        term[:, cols],
        bootstrap_value=rewards[0, cols].double(),
        backend="torch",
    )
    close_to_float64(adv[:, cols], want, torch.float32, "gae past 2**31")
    close_to_float64(ret[:, cols], want_ret, torch.float32, "gae returns past 2**31")
    assert not torch.isnan(adv[-1]).any() and not torch.isnan(ret[-1]).any()
    del rewards, term, adv, ret
    torch.cuda.empty_cache()


def test_output_views_whose_offsets_pass_2_31():
    """Small inputs, outputs written into views of a wide buffer, at element offsets past
    2**31 (each output in turn): the launcher takes 64-bit offsets from every tensor's strides
    (it once paired them off by one and missed the outputs'), nothing outside the view is
    written."""
    T, N, width = 2304, 16, 2**20  # the last row of a view starts at (T - 1) * 2**20 > 2**31
    if torch.cuda.get_device_properties(CUDA).total_memory < 24 * 2**30:
        pytest.skip("needs ~10 GB of GPU memory")
    gen = torch.Generator(device=CUDA).manual_seed(6)
    rewards, values = torch.randn(2, T, N, generator=gen, device=CUDA)
    term = torch.rand(T, N, generator=gen, device=CUDA) < 0.05
    boot = values[-1]
    args = (rewards, values, term)
    want = rtc.gae(rewards.double(), values.double(), term, bootstrap_value=boot.double(),
                   backend="torch")  # fmt: skip
    wide = torch.empty(T, width, device=CUDA)
    for k in range(2):
        wide.fill_(float("nan"))
        outs = [torch.full_like(rewards, float("nan")) for _ in range(2)]
        outs[k] = wide[:, N : 2 * N]
        _, launch = described_launch(
            rtc.gae, *args, bootstrap_value=boot, out=tuple(outs), backend="triton"
        )
        assert launch.meta["IDX64"], launch.meta
        for g, w in zip(outs, want, strict=True):
            close_to_float64(g, w, torch.float32, f"gae, output {k} a view past 2**31")
        assert wide[:, :N].isnan().all() and wide[:, 2 * N : 3 * N].isnan().all()
    del wide
    torch.cuda.empty_cache()


def test_long_horizon_float32_accuracy():
    T, N = 100_000, 8
    gen = torch.Generator(device=CUDA).manual_seed(6)
    r = torch.randn(T, N, generator=gen, device=CUDA)
    v = torch.randn(T, N, generator=gen, device=CUDA)
    term = torch.rand(T, N, generator=gen, device=CUDA) < 1e-4
    boot = torch.randn(N, generator=gen, device=CUDA)
    for gamma, lmbda in [(0.9999, 0.999), (1.0, 1.0)]:
        got = rtc.gae(r, v, term, bootstrap_value=boot, gamma=gamma, lmbda=lmbda, backend="triton")
        want = rtc.gae(
            r.double(),
            v.double(),
            term,
            bootstrap_value=boot.double(),
            gamma=gamma,
            lmbda=lmbda,
            backend="reference" if T * N < 10_000 else "torch",
        )
        for g, w in zip(got, want, strict=True):
            close_to_float64(g, w, torch.float32, f"gae T=1e5 gamma={gamma} lambda={lmbda}")


@pytest.mark.parametrize("T,N", [(65_536, 24), (200_003, 2)])
def test_deterministic_bit_identical(T, N):
    gen = torch.Generator(device=CUDA).manual_seed(7)
    d = random_step_inputs((T, N), 0, torch.float32, gen)
    first = run_every_estimator(d, 0, "triton")
    for _ in range(3):
        again = run_every_estimator(d, 0, "triton")
        for name in first:
            a = first[name] if isinstance(first[name], tuple) else (first[name],)
            b = again[name] if isinstance(again[name], tuple) else (again[name],)
            for x, y in zip(a, b, strict=True):
                assert torch.equal(x, y), f"{name}: outputs differ between identical runs"


@pytest.mark.parametrize("T,N", [(128, 4096), (131_072, 16), (200_003, 2), (262_144, 4)])
def test_cuda_graph_capture_and_replay(T, N):
    gen = torch.Generator(device=CUDA).manual_seed(8)
    r = torch.randn(T, N, generator=gen, device=CUDA)
    v = torch.randn(T, N, generator=gen, device=CUDA)
    term = torch.rand(T, N, generator=gen, device=CUDA) < 0.05
    boot = torch.randn(N, generator=gen, device=CUDA)
    adv = torch.empty_like(r)
    ret = torch.empty_like(r)

    def step():
        rtc.gae(r, v, term, bootstrap_value=boot, out=(adv, ret), backend="triton")
        return rtc.vtrace(r, v, -v.abs(), -r.abs(), term, bootstrap_value=boot)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vs, _ = step()
    for _ in range(2):  # new data in the same buffers, then replay
        r.copy_(torch.randn(T, N, generator=gen, device=CUDA))
        term.copy_(torch.rand(T, N, generator=gen, device=CUDA) < 0.05)
        adv.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want_adv, _ = rtc.gae(
            r.double(), v.double(), term, bootstrap_value=boot.double(), backend="torch"
        )
        want_vs, _ = rtc.vtrace(
            r.double(),
            v.double(),
            -v.abs().double(),
            -r.abs().double(),
            term,
            bootstrap_value=boot.double(),
            backend="torch",
        )
        close_to_float64(adv, want_adv, torch.float32, "graph gae")
        close_to_float64(vs, want_vs, torch.float32, "graph vtrace")


def test_resident_plans_where_the_tests_expect_them():
    """The shapes above that test the resident plan get it (and the others do not)."""
    from rl_triton_core import triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    resident = {
        (kind, T, N): tb._plan(kind.value, T, N, N > 1, CUDA).resident
        for kind in (kernels.GAE, kernels.LAMBDA, kernels.DISCOUNTED, kernels.VTRACE)
        for T, N in ((200_003, 2), (262_144, 4), (1_000_000, 1))
    }
    want = {key: key[2] > 1 or key[0] == kernels.VTRACE for key in resident}
    assert resident == want
    assert not tb._plan(kernels.RETRACE.value, 262_144, 4, True, CUDA).resident
    assert not tb._plan(kernels.GAE.value, 131_072, 16, True, CUDA).resident


@pytest.mark.parametrize(
    "T,N,time_dim", [(300, 70, 0), (131_072, 16, 0), (4096, 3, 1), (200_003, 2, 0)]
)
def test_direct_launch_agrees_with_the_jit_bit_for_bit(T, N, time_dim, monkeypatch):
    """Every estimator three times with every launch through Triton's JIT, then three times
    with direct launches on (the default: the first call compiles through the JIT and records,
    the two replayed calls launch directly): bit-identical outputs, a split call with groups
    ((131072, 16)) included."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core import _replay

    gen = torch.Generator(device=CUDA).manual_seed(11)
    shape = (T, N) if time_dim == 0 else (N, T)
    d = random_step_inputs(shape, time_dim, torch.float32, gen)
    results = {}
    for direct in (False, True):
        monkeypatch.setattr(tb, "DIRECT_LAUNCH", direct)
        tb._LAUNCHES.clear()
        _replay._PLANS.clear()
        results[direct] = [
            run_every_estimator(d, time_dim, "triton", out_like=d["rewards"]) for _ in range(3)
        ]
    directs = [f for launch in tb._LAUNCHES.values() for f in launch.direct.values()]
    assert directs and all(directs), "a launch did not get a direct launcher"
    want = results[False][0]
    for direct, runs in results.items():
        for run in runs:
            for name, w in want.items():
                for gi, wi in zip(as_tuple(run[name]), as_tuple(w), strict=True):
                    assert torch.equal(gi, wi), f"{name}: direct={direct} differs from the JIT"


@pytest.mark.parametrize("T,N,time_dim", [(300, 70, 0), (4096, 3, 1)])
def test_misaligned_call_after_an_aligned_one(T, N, time_dim):
    """The same call signature (shapes, strides, dtypes) with tensors 16-byte aligned, then
    offset by one element, then aligned again: Triton compiles per pointer alignment, so the
    direct launcher must key on it (a kernel compiled for aligned pointers vectorises its
    accesses). Every estimator right each time, and a second direct launcher recorded."""
    import rl_triton_core.triton_backend as tb
    from rl_triton_core import _replay

    gen = torch.Generator(device=CUDA).manual_seed(12)
    shape = (T, N) if time_dim == 0 else (N, T)
    d = random_step_inputs(shape, time_dim, torch.float32, gen)

    def misaligned(x):
        buf = torch.empty(x.numel() + 16, dtype=x.dtype, device=CUDA)
        y = buf[1 : 1 + x.numel()].view(x.shape)
        assert y.stride() == x.stride() and y.data_ptr() % 16 != 0
        return y.copy_(x)

    tb._LAUNCHES.clear()
    _replay._PLANS.clear()
    want = run_every_estimator(as_float64(d), time_dim, "torch")
    for label, inputs in (("aligned", d), ("misaligned", {k: misaligned(v) for k, v in d.items()}),
                          ("aligned again", d)):  # fmt: skip
        for _ in range(2):  # (a first call records; the second replays)
            got = run_every_estimator(inputs, time_dim, "triton", out_like=d["rewards"])
            close_all_to_float64(got, want, torch.float32, label)
    # (a direct launcher's key: the launch phase, then each pointer's alignment)
    per_phase = [
        collections.Counter(key[0] for key in launch.direct) for launch in tb._LAUNCHES.values()
    ]
    assert per_phase and all(c and min(c.values()) >= 2 for c in per_phase), per_phase


@pytest.mark.parametrize(
    "T,N,n_phases",
    [(128, 4096, 1), (4096, 1, 2), (131_072, 16, 3), (200_003, 2, 1)],
    ids=["unsplit", "split", "split-groups", "resident"],
)
@pytest.mark.parametrize("with_out", [False, True])
def test_replay_launches_by_address_unless_misaligned_or_hooked(
    with_out, T, N, n_phases, monkeypatch
):
    """A replayed call hands its tensors' addresses straight to Triton's launcher (no
    ``start``, no ``_run``), for each of its launches (unsplit; a split call's totals, group
    pass and carried scan, on chunk totals the replay allocates; a resident plan's
    cooperative launch on zeroed totals); the same call with any one tensor misaligned
    (input, flag or ``out=``), or while a profiler hooks Triton's launches (enter or exit
    hook), goes through ``_run`` (the kernel compiled for that alignment; the JIT, which calls
    the hooks). Outputs NaN-poisoned before every call, checked every time."""
    import types

    import rl_triton_core.triton_backend as tb
    from rl_triton_core import _replay

    runs = []
    real_run = tb._run
    monkeypatch.setattr(tb, "_run", lambda *a: (runs.append(a[3]), real_run(*a))[1])
    tb._LAUNCHES.clear()
    _replay._PLANS.clear()
    gen = torch.Generator(device=CUDA).manual_seed(13)
    d = random_step_inputs((T, N), 0, torch.float32, gen)
    want = rtc.gae(
        d["rewards"].double(), d["values"].double(), d["term"], truncated=d["trunc"],
        next_values=d["next_values"].double(), gamma=0.99, lmbda=0.95, backend="torch",
    )  # fmt: skip
    aligned_outs = (torch.empty(T, N, device=CUDA), torch.empty(T, N, device=CUDA))

    def call(inputs, outs=aligned_outs):
        for o in outs:
            o.fill_(float("nan"))
        got = rtc.gae(
            inputs["rewards"], inputs["values"], inputs["term"], truncated=inputs["trunc"],
            next_values=inputs["next_values"], gamma=0.99, lmbda=0.95, backend="triton",
            **({"out": outs} if with_out else {}),
        )  # fmt: skip
        for g, w, name in zip(got, want, ("advantages", "returns"), strict=True):
            close_to_float64(g, w, torch.float32, name)

    def through_run(label, *args):
        before = len(runs)
        call(*args)
        assert len(runs) == before + n_phases, f"a replay with {label} did not go through _run"

    call(d)  # records
    (launch,) = tb._LAUNCHES.values()
    assert len(launch.phases) == n_phases and tb.direct_launches(launch) is not None
    assert launch.plan.resident == (N == 2)
    assert len(runs) == n_phases
    call(d)
    call({k: v.clone() for k, v in d.items()})
    assert len(runs) == n_phases, "a replay went through _run"

    def misaligned(x):
        buf = torch.empty(x.numel() + 16, dtype=x.dtype, device=CUDA)
        return buf[1 : 1 + x.numel()].view(x.shape).copy_(x)

    # (each a replay of the same recording: same shapes, strides, dtypes)
    for name in ("rewards", "values", "term", "trunc", "next_values"):
        through_run(f"{name} misaligned", {**d, name: misaligned(d[name])})
    if with_out:
        through_run("out[1] misaligned", d, (aligned_outs[0], misaligned(aligned_outs[1])))
    for hook in ("launch_enter_hook", "launch_exit_hook"):
        knobs = {"launch_enter_hook": None, "launch_exit_hook": None, hook: lambda *a: None}
        monkeypatch.setattr(tb, "_RUNTIME_KNOBS", types.SimpleNamespace(**knobs))
        through_run(f"a {hook} set", d)  # (as if a profiler had set it)
    monkeypatch.setattr(tb, "_RUNTIME_KNOBS", None)
    before = len(runs)
    call(d)
    assert len(runs) == before, "a replay went through _run"


def test_same_call_on_two_streams_at_once():
    """The same split call (one launch description, a group pass) running concurrently on two
    streams: each call has its own chunk totals, so both results are right."""
    gen = torch.Generator(device=CUDA).manual_seed(10)
    T, N = 131_072, 16
    data = [random_step_inputs((T, N), 0, torch.float32, gen) for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(3):
        outs = []
        for d, s in zip(data, streams, strict=True):
            with torch.cuda.stream(s):
                outs.append(
                    rtc.gae(
                        d["rewards"], d["values"], d["term"], next_values=d["next_values"],
                        backend="triton",
                    )
                )  # fmt: skip
        torch.cuda.synchronize()
        for d, (adv, _) in zip(data, outs, strict=True):
            want, _ = rtc.gae(
                d["rewards"].double(), d["values"].double(), d["term"],
                next_values=d["next_values"].double(), backend="torch",
            )  # fmt: skip
            close_to_float64(adv, want, torch.float32, "gae on two streams")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensors_on_a_device_other_than_the_current_one():
    """Inputs on cuda:1 while cuda:0 is current: the kernels run on cuda:1 (Triton launches on
    the current device unless the launcher switches), so the result equals the cuda:0 one."""
    gen = torch.Generator(device=CUDA).manual_seed(9)
    d0 = random_step_inputs((300, 70), 0, torch.float32, gen)
    d1 = {k: v.to("cuda:1") for k, v in d0.items()}
    torch.cuda.set_device(0)
    want = run_every_estimator(d0, 0, "triton", out_like=d0["rewards"])
    got = run_every_estimator(d1, 0, "triton", out_like=d1["rewards"])
    torch.cuda.synchronize("cuda:1")
    assert torch.cuda.current_device() == 0, "the launcher left another device current"
    for name, g in got.items():
        g, w = (
            (g if isinstance(g, tuple) else (g,)),
            (want[name] if isinstance(want[name], tuple) else (want[name],)),
        )
        for gi, wi in zip(g, w, strict=True):
            assert gi.device == torch.device("cuda:1"), f"{name}: output moved off cuda:1"
            assert torch.equal(gi.cpu(), wi.cpu()), f"{name}: cuda:1 result differs from cuda:0"
