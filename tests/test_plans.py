"""The Triton launcher's plans and mask choice on an H200 (132 SMs), computed on any machine:
``_plan`` and ``_full_tiles`` are host code, so CI checks them without a GPU (the kernels they
pick run in tests/test_gpu_triton.py)."""

import pytest
import torch

import rl_triton_core.triton_backend as tb
from rl_triton_core.triton_backend import kernels

H200 = torch.device("cuda", 0)  # (a device object only: nothing runs on it)


@pytest.fixture
def h200(monkeypatch):
    """The plans of a compiled (not interpreted) launch on a GPU of 132 SMs."""
    monkeypatch.setattr(tb, "_INTERPRETED", False)
    monkeypatch.setattr(tb, "_sm_count", lambda index: 132)


def test_16bit_unsplit_below_32768_sequences(h200):
    """Time-major 16384 <= N < 32768 (Retrace: < 20480) from T = 256: 16-bit values run the
    unsplit pipelined one-warp tiles (sweep 33; GAE's of sweep 48), float64 the split plans."""
    cases = [(kernels.GAE, (16, 32), 3), (kernels.LAMBDA, (16, 16), 4),
             (kernels.VTRACE, (8, 16), 4), (kernels.RETRACE, (8, 16), 4),
             (kernels.DISCOUNTED, (16, 16), 4)]  # fmt: skip
    for kind, tile, stages in cases:
        plan = tb._plan(kind.value, 300, 16_400, True, H200)  # (16-bit values)
        assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, stages), kind
        assert tb._plan(kind.value, 300, 16_400, True, H200, acc64=True).n_chunks > 1, kind
    # below 16384 sequences the plans are those of before (from 32768: the next test)
    assert tb._plan(kernels.GAE.value, 300, 16_383, True, H200).n_chunks > 1
    assert tb._plan(kernels.GAE.value, 300, 65_536, True, H200)[:2] == (8, 32)


def test_float32_tiles_below_32768_sequences(h200):
    """Time-major 16384 <= N < 32768 (Retrace: < 20480) from T = 256 in float32: one-warp
    tiles of sweep 48 (GAE 16 x 32, TD(lambda) 16 x 16 in 3 stages, Retrace 8 x 32 in 4, traces
    and the scan 32 x 32 in 3), discounted returns and V-trace as before; in aligned 16-bit rows
    GAE's and traces' too."""
    cases = [(kernels.GAE, (16, 32), 3), (kernels.LAMBDA, (16, 16), 3),
             (kernels.RETRACE, (8, 32), 4), (kernels.TRACES, (32, 32), 3),
             (kernels.SCAN, (32, 32), 3), (kernels.DISCOUNTED, (16, 16), 4),
             (kernels.VTRACE, (8, 16), 4)]  # fmt: skip
    for kind, tile, stages in cases:
        for T, N in ((256, 16_384), (4096, 16_400), (300, 20_479), (300, 32_767)):
            if kind == kernels.RETRACE and N >= 20_480:
                continue
            plan = tb._plan(kind.value, T, N, True, H200, four_byte=True)
            assert (plan[:2], plan.num_warps, plan.n_chunks, plan.stages) == (
                tile, 1, 1, stages), kind  # fmt: skip
        plan = tb._plan(kind.value, 300, 16_400, True, H200, four_byte=True, reverse=False)
        assert plan[:2] == tile, kind  # (either direction)
    gae, traces, scan = kernels.GAE.value, kernels.TRACES.value, kernels.SCAN.value
    assert tb._plan(gae, 300, 16_400, True, H200)[:2] == (16, 32)  # (16-bit rows)
    assert tb._plan(traces, 300, 16_400, True, H200, reverse=False)[:2] == (32, 32)
    assert tb._plan(traces, 300, 16_400, True, H200, reverse=False, aligned=False)[:2] == (16, 16)
    assert tb._plan(scan, 300, 16_400, True, H200)[:2] == (16, 16)
    # below T = 256 and from N = 32768 the plans of before (see the tests around)
    assert tb._plan(gae, 200, 16_400, True, H200, four_byte=True)[:2] == (8, 32)
    assert tb._plan(gae, 300, 32_768, True, H200, four_byte=True)[:2] == (8, 32)


def test_pipelined_tiles_from_32768_sequences(h200):
    """Time-major from N = 32768 at T >= 256: the one-warp tiles pipelined in 3 stages of
    N >= 65536, 8 x 32 (V-trace 4 x 32; sweep 34), Retrace's from N = 20480 (sweep 35); below,
    the tiles of the two tests above; float64 keeps its split plans."""
    cases = [(kernels.GAE, (8, 32)), (kernels.LAMBDA, (8, 32)), (kernels.VTRACE, (4, 32)),
             (kernels.RETRACE, (8, 32)), (kernels.TRACES, (8, 32)),
             (kernels.SCAN, (8, 32))]  # fmt: skip
    for kind, tile in cases:
        first = 20_480 if kind == kernels.RETRACE else 32_768
        for four_byte in (False, True):
            plan = tb._plan(kind.value, 300, first, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, 3), kind
        plan = tb._plan(kind.value, 300, first - 1, True, H200)  # (16-bit; float32: above)
        want = {kernels.GAE: (32, 3), kernels.TRACES: (32, 3)}.get(kind, (16, 4))  # (sweep 48)
        assert (plan.block_n, plan.stages) == want, kind
        assert tb._plan(kind.value, 300, first, True, H200, acc64=True).n_chunks > 1, kind


def test_retrace_and_wide_tiles_from_65536_sequences(h200):
    """Retrace pipelined from N = 65536 at T >= 32 (4 x 32 tiles, 4 x 64 from T = 256; sweep
    34), and in 8 x 32 tiles from N = 16384 below T = 256 (sweep 35); below T = 32 in 4 x 32
    tiles, unpipelined; every estimator but V-trace in 4 x 64 tiles from N = 131072, V-trace
    in float32 in 4 x 32 there (4 x 64 from [256, 65536])."""
    retrace = kernels.RETRACE.value
    for T, N, tile, stages in ((64, 65_536, (4, 32), 3), (256, 65_536, (4, 64), 3),
                               (64, 131_072, (4, 64), 3), (16, 65_536, (4, 32), 1),
                               (128, 32_768, (8, 32), 3), (32, 16_384, (8, 32), 3),
                               (31, 16_384, (4, 32), 1)):  # fmt: skip
        plan = tb._plan(retrace, T, N, True, H200)
        assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, stages), (T, N)
    for kind in (kernels.GAE, kernels.LAMBDA, kernels.DISCOUNTED, kernels.TRACES, kernels.SCAN):
        for T, four_byte in ((64, False), (1024, True)):
            plan = tb._plan(kind.value, T, 131_072, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.stages) == ((4, 64), 3), kind
            assert tb._plan(kind.value, T, 65_536, True, H200)[:2] == (8, 32), kind
    vtrace = kernels.VTRACE.value
    assert tb._plan(vtrace, 1024, 131_072, True, H200, four_byte=True)[:2] == (4, 32)
    assert tb._plan(vtrace, 1024, 65_536, True, H200, four_byte=True)[:2] == (4, 64)


def test_float32_gae_and_retrace_in_4x64_tiles_below_65536_sequences(h200):
    """Time-major float32 from T = 256 (sweep 43): GAE in 4 x 64 tiles from N = 57344 (on to
    131072, where every estimator but V-trace takes them), Retrace from 49152; below those N,
    below T = 256 and in 16-bit values the tiles of before (V-trace's unchanged)."""
    gae, retrace, vtrace = kernels.GAE.value, kernels.RETRACE.value, kernels.VTRACE.value
    f32, bf16 = True, False  # (four_byte)
    cases = [(gae, 256, 57_344, f32, (4, 64)), (gae, 1024, 98_304, f32, (4, 64)),
             (gae, 1024, 57_336, f32, (8, 32)), (gae, 255, 65_528, f32, (8, 32)),
             (gae, 256, 65_528, bf16, (8, 32)), (retrace, 256, 49_152, f32, (4, 64)),
             (retrace, 1024, 65_528, f32, (4, 64)), (retrace, 1024, 49_144, f32, (8, 32)),
             (retrace, 255, 65_528, f32, (8, 32)), (retrace, 256, 65_528, bf16, (8, 32)),
             (vtrace, 1024, 65_528, f32, (4, 32)), (vtrace, 1024, 65_536, f32, (4, 64))]  # fmt: skip
    for kind, T, N, four_byte, tile in cases:
        plan = tb._plan(kind, T, N, True, H200, four_byte=four_byte)
        assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, 3), (kind, T, N, four_byte)


def test_ppo_sized_rollouts_in_narrow_pipelined_tiles(h200):
    """Time-major 1024 <= N < 16384 (a multiple of 8) at 32 < T <= 512 (16-bit values: 256),
    every estimator (sweep 44): unsplit one-warp 16 x 8 tiles in 4 stages from N = 4096, 64 x 4
    in 3 below; outside those bounds, in float64 arithmetic and in 16-bit rows of unknown
    alignment (contiguous 16-bit rows of N = 3000: `aligned` is false), the plans of before."""
    f32, bf16 = True, False  # (four_byte)
    cases = [(128, 4096, f32, (16, 8), 4), (512, 16_376, f32, (16, 8), 4),
             (33, 4096, f32, (16, 8), 4), (256, 8192, bf16, (16, 8), 4),
             (128, 1024, f32, (64, 4), 3), (512, 4088, f32, (64, 4), 3),
             (256, 3008, bf16, (64, 4), 3)]  # fmt: skip
    before = [(32, 4096, f32), (513, 4096, f32), (257, 4096, bf16), (128, 1016, f32),
              (128, 16_384, f32), (128, 4095, f32), (128, 4092, f32)]  # fmt: skip
    kinds = (kernels.GAE, kernels.LAMBDA, kernels.DISCOUNTED, kernels.VTRACE, kernels.RETRACE,
             kernels.TRACES, kernels.SCAN)  # fmt: skip
    for kind in kinds:
        for reverse in (True, False):
            for T, N, four_byte, tile, stages in cases:
                plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, four_byte=four_byte)
                want = (*tile, 1, 1, stages, False)
                got = (plan.block_t, plan.block_n, plan.n_chunks, plan.num_warps, plan.stages,
                       plan.prefetch)  # fmt: skip
                assert got == want, (kind, T, N, four_byte)
            for T, N, four_byte in before:
                plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, four_byte=four_byte)
                assert plan.block_n not in (4, 8) or plan.stages == 1, (kind, T, N, four_byte)
            for kw in dict(acc64=True), dict(aligned=False), dict(eight_byte=True, acc64=True):
                plan = tb._plan(kind.value, 128, 4096, True, H200, reverse=reverse, **kw)
                assert plan[:2] != (16, 8), (kind, kw)
    assert tb._plan(kernels.GAE.value, 128, 4096, False, H200)[:2] != (16, 8)  # batch-major


def test_retrace_prefetches_unmasked_below_32_steps(h200):
    """Retrace's unpipelined 4 x 32 tiles (T < 32 from N = 16384) prefetch where they are whole,
    except in float64 (sweep 35: 1.07-1.13x the time), and every unsplit tile that fits runs
    without masks in every dtype: the bfloat16 exception of sweep 33 is gone (without prefetch
    its loads came late; with it, 0.96-1.10x the time of the masked tiles). Partial tiles,
    masked either way, do not prefetch (sweep 36: 1.12-1.27x the time in 16-bit at T of 25
    and 31)."""
    retrace = kernels.RETRACE.value
    for T, N in ((16, 65_536), (8, 16_384), (28, 24_576)):
        plan = tb._plan(retrace, T, N, True, H200)
        assert (plan[:2], plan.n_chunks, plan.chunk, plan.stages, plan.prefetch) == (
            (4, 32), 1, T, 1, True), (T, N)  # fmt: skip
        assert tb._full_tiles(plan, T, N, True)
        assert not tb._plan(retrace, T, N, True, H200, acc64=True).prefetch
    assert not tb._full_tiles(plan, 28, 24_576 + 4, True)  # (a partial tile of columns)
    for T, N in ((25, 24_576), (31, 65_536), (2, 16_384), (16, 16_400)):  # partial tiles
        plan = tb._plan(retrace, T, N, True, H200)
        assert (plan[:2], plan.n_chunks, plan.prefetch) == ((4, 32), 1, False), (T, N)
        assert not tb._full_tiles(plan, T, N, True)


def test_unaligned_16bit_rows_run_unpipelined_tiles(h200):
    """Backward scans of 16-bit rows whose stride is not a multiple of 16 run one-warp 4 x 32
    tiles (Retrace 8 x 16), prefetching but TD(lambda) (partial columns; sweep 37), unpipelined,
    where aligned rows run pipelined tiles (sweep 35); forward scans and float64 keep their
    plans."""
    for kind, tile in ((kernels.GAE, (4, 32)), (kernels.VTRACE, (4, 32)),
                       (kernels.RETRACE, (8, 16)), (kernels.SCAN, (4, 32)),
                       (kernels.LAMBDA, (4, 32))):  # fmt: skip
        prefetch = kind != kernels.LAMBDA
        for T, N in ((512, 33_000), (1024, 16_392), (64, 20_008), (128, 65_544)):
            plan = tb._plan(kind.value, T, N, True, H200, aligned=False)
            assert (plan[:2], plan.n_chunks, plan.stages, plan.prefetch) == (tile, 1, 1, prefetch)
            assert tb._plan(kind.value, T, N, True, H200).stages > 1, (kind, T, N)
        # below T = 32 and N = 16384 the plans do not pipeline: unchanged
        for T, N in ((16, 33_000), (512, 16_376)):
            assert tb._plan(kind.value, T, N, True, H200, aligned=False) == tb._plan(
                kind.value, T, N, True, H200
            )
    for kind in (kernels.TRACES, kernels.SCAN):  # forward scans (traces, episodic sums, ...)
        plan = tb._plan(kind.value, 512, 33_000, True, H200, reverse=False, aligned=False)
        assert plan.stages == 3, kind
    assert (
        tb._plan(kernels.GAE.value, 512, 33_000, True, H200, acc64=True, aligned=False).n_chunks > 1
    )


def test_unaligned_few_long_sequences_keep_pipelined_tiles(h200):
    """9-15 sequences of unaligned 16-bit rows from T = 131072 run the few-long plans of aligned
    rows: discounted returns, traces, both scans and Retrace pipeline their 8 x 16 tiles in 3
    stages. Chunks side by side for the forward scan took 0.85-0.99x the time where T splits
    into whole chunks of a multiple of 16 steps, 1.12-2.51x elsewhere (sweep 38: not taken)."""
    for T, N in ((131_072, 9), (131_075, 12), (327_680, 12), (1_000_000, 15)):
        for kind, reverse in ((kernels.SCAN, False), (kernels.TRACES, False),
                              (kernels.SCAN, True), (kernels.DISCOUNTED, True),
                              (kernels.RETRACE, True)):  # fmt: skip
            plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, aligned=False)
            assert plan == tb._plan(kind.value, T, N, True, H200, reverse=reverse), (kind, T, N)
            assert (plan[:2], plan.segs, plan.stages) == ((8, 16), 1, 3), (kind, T, N)


def test_forward_chunks_in_pairs_of_tiles(h200):
    """Forward scans whose chunks run side by side (time-major, from T = 65536) take chunks of
    a multiple of 16 steps beyond one 8-step tile where T is a multiple of 16; backward scans keep
    chunks of a multiple of 8 (sweep 39: forward chunks of 24-360 steps took up to 2.5x the time
    of 32-368; backward ones took 1.04-1.17x rounded, one-tile chunks 1.09-1.21x). Where T is
    not a multiple of 16, so too, with the tile loop compiled twice (T_TAIL) in forward plans
    only (sweep 41, set X: rounded with T_TAIL 0.82-0.83x the time of unrounded without it in
    float64; sweep 40, set V: rounded without it 1.04-1.13x)."""
    cases = [(327_680, 12, dict(acc64=True, eight_byte=True), 48, 40),
             (1_000_000, 12, dict(acc64=True), 128, 120), (327_680, 6, {}, 32, 24),
             (3_000_000, 16, dict(acc64=True, eight_byte=True), 368, 360),
             (131_075, 6, dict(four_byte=True), 8, 8), (200_000, 6, {}, 16, 16),
             (1_000_008, 12, dict(acc64=True, eight_byte=True), 128, 120),
             (327_688, 6, dict(four_byte=True), 32, 24),
             (1_000_003, 12, dict(acc64=True), 128, 120)]  # fmt: skip
    for T, N, kw, forward, backward in cases:
        for kind in (kernels.TRACES, kernels.SCAN):
            plan = tb._plan(kind.value, T, N, True, H200, reverse=False, **kw)
            assert (plan.segs > 1, plan.chunk) == (True, forward), (kind, T, N)
            assert plan.n_chunks == -(-T // (forward * plan.segs)) * plan.segs, (kind, T, N)
            tail = T % 16 != 0 and forward % 16 == 0  # (not one-tile chunks)
            assert tb._tail_programs(plan, T, False) == tail, (kind, T, N)
        for kind in (kernels.SCAN, kernels.DISCOUNTED):
            plan = tb._plan(kind.value, T, N, True, H200, **kw)
            assert (plan.segs > 1, plan.chunk) == (True, backward), (kind, T, N)
            assert not tb._tail_programs(plan, T, True), (kind, T, N)
    # 8 x 16 tiles of 17-255 sequences from T = 16384 (sweep 39, sets S and T), at any T (not
    # timed where T is not a multiple of 16)
    for T, N, forward, backward in ((200_000, 100, 176, 168), (1_000_000, 17, 256, 248),
                                    (1_000_003, 17, 256, 248)):  # fmt: skip
        for kind, reverse in ((kernels.TRACES, False), (kernels.SCAN, False),
                              (kernels.SCAN, True), (kernels.DISCOUNTED, True)):  # fmt: skip
            plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, four_byte=True)
            assert (plan[:2], plan.segs) == ((8, 16), 1), (kind, T, N)
            assert plan.chunk == (backward if reverse else forward), (kind, T, N)
            assert not tb._tail_programs(plan, T, reverse), (kind, T, N)  # (1.17x, set X)


def test_lambda_prefetches_only_in_whole_columns(h200):
    """TD(lambda)'s one-warp 4 x 32 tiles (time-major, N >= 65536 below T = 32, float64 below
    T = 64, unaligned 16-bit rows) prefetch where N is a multiple of 32, whatever T, never in
    float64 (float32 calls that accumulate in float64 follow float32's column rule, though at
    T > 128, where they occur, its tiles are 8 x 16); its 8 x 16 tiles prefetch partial too
    (sweep 37)."""
    lam = kernels.LAMBDA.value
    for four_byte in (False, True):
        for T, N, whole in ((16, 65_536, True), (24, 131_072, True), (31, 65_536, True),
                            (17, 65_536, True), (16, 65_544, False), (31, 65_544, False),
                            (20, 98_312, False)):  # fmt: skip
            plan = tb._plan(lam, T, N, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.n_chunks, plan.prefetch) == ((4, 32), 1, whole), (T, N)
        for N, whole in ((33_000, False), (65_536, True)):  # (the second a view of whole columns)
            plan = tb._plan(lam, 512, N, True, H200, four_byte=four_byte, aligned=False)
            assert (plan[:2], plan.stages, plan.prefetch) == ((4, 32), 1, whole), N
        plan = tb._plan(lam, 25, 16_392, True, H200, four_byte=four_byte)
        assert (plan[:2], plan.prefetch) == ((8, 16), True)
    for T, N in ((16, 65_536), (48, 65_536), (17, 65_536), (16, 65_544)):
        plan = tb._plan(lam, T, N, True, H200, acc64=True, eight_byte=True)
        assert (plan[:2], plan.prefetch) == ((4, 32), False), (T, N)
        plan = tb._plan(lam, T, N, True, H200, acc64=True)  # (float32, float64 arithmetic)
        assert (plan[:2], plan.prefetch) == ((4, 32), N == 65_536), (T, N)
    plan = tb._plan(lam, 200, 65_544, True, H200, acc64=True)  # (such calls: T > 128)
    assert (plan[:2], plan.prefetch) == ((8, 16), True)


def test_float64_wide_tiles_prefetch_in_whole_columns(h200):
    """Float64 backward scans in the one-warp 4 x 32 tiles prefetch only where N is a multiple
    of 32 (TD(lambda) never: above); the 8 x 16 tiles do not prefetch in float64 from N = 65536
    (forward scans too), below it they do (sweep 37). Float32 calls that accumulate in float64
    (T > 128) keep their plans."""
    for kind in (kernels.GAE, kernels.VTRACE, kernels.DISCOUNTED, kernels.SCAN):
        for T, N, whole in ((16, 65_536, True), (48, 131_072, True), (31, 65_536, True),
                            (16, 65_544, False), (31, 65_544, False), (24, 131_080, False)):  # fmt: skip
            plan = tb._plan(kind.value, T, N, True, H200, acc64=True, eight_byte=True)
            assert (plan[:2], plan.n_chunks, plan.prefetch) == ((4, 32), 1, whole), (kind, T, N)
            assert tb._plan(kind.value, T, N, True, H200, acc64=True).prefetch, (kind, T, N)
    plan = tb._plan(kernels.SCAN.value, 16, 65_544, True, H200, reverse=False, acc64=True,
                    eight_byte=True)  # fmt: skip
    assert plan.prefetch  # (a forward scan)
    for kind, reverse in ((kernels.LAMBDA, True), (kernels.DISCOUNTED, True),
                          (kernels.SCAN, True), (kernels.SCAN, False), (kernels.TRACES, False)):  # fmt: skip
        for T, N, prefetch in ((64, 65_536, False), (1024, 65_536, False), (128, 65_544, False),
                               (64, 16_384, True)):  # fmt: skip
            plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, acc64=True,
                            eight_byte=True)  # fmt: skip
            assert (plan[:2], plan.prefetch) == ((8, 16), prefetch), (kind, T, N)
            plan = tb._plan(kind.value, T, N, True, H200, reverse=reverse, acc64=True)
            assert (plan[:2], plan.prefetch) == ((8, 16), True), (kind, T, N)
        plan = tb._plan(kind.value, 16, 65_536, True, H200, reverse=reverse, acc64=True)
        assert plan[:2] == (4, 32), kind  # (the 8 x 16 tiles from T = 64 only)
    # the 4-byte plans there keep prefetching, and float32 calls accumulating in float64
    for kind in (kernels.GAE, kernels.VTRACE, kernels.DISCOUNTED):
        assert tb._plan(kind.value, 16, 65_544, True, H200, four_byte=True).prefetch, kind
        plan = tb._plan(kind.value, 200, 65_544, True, H200, acc64=True)
        assert plan.prefetch, kind


@pytest.fixture
def plan_seen(monkeypatch):
    """The device of a real launch (the interpreter's CPU, else the GPU) and the list of the
    keyword arguments the launcher passes to ``_plan`` from then on."""
    if not (tb._INTERPRETED or torch.cuda.is_available()):
        pytest.skip("needs the Triton interpreter or a GPU")
    seen, real = [], tb._plan

    def plan(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(tb, "_plan", plan)
    tb._LAUNCHES.clear()
    return ("cpu" if tb._INTERPRETED else "cuda"), seen


@pytest.mark.parametrize(
    "dtype,shape,cols,aligned",
    [
        (torch.bfloat16, (4, 24), 24, False),
        (torch.float16, (4, 24), 24, False),
        (torch.bfloat16, (4, 32), 32, True),
        (torch.bfloat16, (4, 32), 24, True),  # a view of 24 columns in rows of 32
        (torch.float32, (4, 24), 24, True),  # (only 16-bit rows count)
    ],
)
def test_rows_aligned_from_strides(plan_seen, dtype, shape, cols, aligned):
    """The launcher tells ``_plan`` whether every 16-bit value tensor's time stride is a
    multiple of 16 elements (the rows Triton can copy asynchronously), from the strides, not N."""
    import rl_triton_core as rtc

    device, seen = plan_seen
    r, v = (torch.randn(shape, device=device).to(dtype)[:, :cols] for _ in range(2))
    done = torch.zeros(shape, dtype=torch.bool, device=device)[:, :cols]
    rtc.gae(r, v, done, bootstrap_value=v[0], backend="triton")
    assert [kwargs["aligned"] for kwargs in seen] == [aligned]


@pytest.mark.parametrize(
    "gamma_shape,aligned",
    [((4, 24), False), ((4, 32), True), ((4, 1), True)],  # ([4, 1]: broadcast, column stride 0)
)
def test_rows_aligned_counts_step_coefficients(plan_seen, gamma_shape, aligned):
    """A per-step bfloat16 gamma beside float32 values counts as 16-bit rows when its own rows
    are contiguous: unaligned at a row stride of 24, aligned at 32 (a view of 24 columns of it)
    and when broadcast over the sequences."""
    import rl_triton_core as rtc

    device, seen = plan_seen
    r, v = (torch.randn(4, 24, device=device) for _ in range(2))
    done = torch.zeros(4, 24, dtype=torch.bool, device=device)
    gamma = torch.full(gamma_shape, 0.9, device=device).to(torch.bfloat16)[:, :24]
    rtc.gae(r, v, done, bootstrap_value=v[0], gamma=gamma, backend="triton")
    assert [kwargs["aligned"] for kwargs in seen] == [aligned]


@pytest.mark.parametrize(
    "dtype,gamma,acc64,eight_byte",
    [
        (torch.float64, 0.99, True, True),
        (torch.float32, 0.999, True, False),
        (torch.float32, 0.99, False, False),
    ],
)
def test_float64_calls_told_from_float64_accumulation(plan_seen, dtype, gamma, acc64, eight_byte):
    """The launcher tells ``_plan`` float64 calls (``eight_byte``) apart from float32 ones that
    accumulate in float64 (gamma lambda = 0.999 over 130 steps: ``acc64`` only), since sweep
    37's float64 rules were timed on float64 data only."""
    import rl_triton_core as rtc

    device, seen = plan_seen
    r, v = (torch.randn(130, 2, device=device, dtype=dtype) for _ in range(2))
    done = torch.zeros(130, 2, dtype=torch.bool, device=device)
    rtc.gae(r, v, done, bootstrap_value=v[0], gamma=gamma, lmbda=1.0, backend="triton")
    assert [(kwargs["acc64"], kwargs["eight_byte"]) for kwargs in seen] == [(acc64, eight_byte)]


def test_short_batch_major_rows_in_tiles_of_whole_sequences(h200):
    """Batch-major rows of up to 64 steps from N = 1024 (33-64 steps from 4096): one-warp tiles
    of next_pow2(T) steps, at least 16, and 256 elements (V-trace, and Retrace to 16 steps:
    128), one tile a program; V-trace to 32 steps from N = 16384 and not in float64. 65-128
    steps from N = 4096: discounted returns, traces and the scans in 128 x 4 tiles of 2 warps
    (sweep 45). Elsewhere, and time-major, the plans of before (one sequence a program, or
    V-trace's 64 x 4 tiles of 4 warps)."""
    gae, retrace, vtrace = kernels.GAE, kernels.RETRACE, kernels.VTRACE
    side = (kernels.DISCOUNTED, kernels.TRACES, kernels.SCAN)
    cases = [(gae, 1, 4096, (16, 16, 1)), (gae, 16, 1024, (16, 16, 1)),
             (gae, 17, 1024, (32, 8, 1)), (gae, 32, 1024, (32, 8, 1)),
             (gae, 33, 4096, (64, 4, 1)), (gae, 64, 100_000, (64, 4, 1)),
             (kernels.LAMBDA, 8, 3000, (16, 16, 1)), (retrace, 16, 16_384, (16, 8, 1)),
             (retrace, 17, 16_384, (32, 8, 1)), (retrace, 64, 4096, (64, 4, 1)),
             (vtrace, 1, 16_384, (16, 8, 1)), (vtrace, 32, 65_536, (32, 4, 1)),
             *((kind, T, 4096, (128, 4, 2)) for kind in side for T in (65, 128)),
             *((kind, 64, 4096, (64, 4, 1)) for kind in side)]  # fmt: skip
    for kind, T, N, want in cases:
        for reverse in (True, False):
            for eight_byte in (False, True) if kind != vtrace else (False,):
                plan = tb._plan(kind.value, T, N, False, H200, reverse=reverse,
                                eight_byte=eight_byte)  # fmt: skip
                got = (plan.block_t, plan.block_n, plan.num_warps, plan.n_chunks, plan.stages,
                       plan.prefetch)  # fmt: skip
                assert got == (*want, 1, 1, False), (kind, T, N, reverse, eight_byte)
    before = [(gae, 16, 1023), (gae, 33, 4095), (gae, 65, 65_536), (kernels.LAMBDA, 128, 4096),
              (retrace, 65, 65_536), (vtrace, 16, 16_383), (vtrace, 33, 65_536),
              (kernels.DISCOUNTED, 129, 65_536), (kernels.TRACES, 128, 4095),
              (kernels.SCAN, 65, 4095)]  # fmt: skip
    for kind, T, N in before:
        plan = tb._plan(kind.value, T, N, False, H200)
        assert plan.block_n == 1 or (kind == vtrace and plan[:2] == (64, 4)), (kind, T, N, plan)
    assert tb._plan(vtrace.value, 16, 16_384, False, H200, eight_byte=True)[:2] == (64, 4)
    assert tb._plan(gae.value, 16, 65_536, True, H200)[:2] != (16, 16)  # time-major


def test_batch_major_few_sequences_in_one_warp_tiles(h200):
    """Batch-major calls of 2 to 8 x SMs - 1 sequences at 64 < T <= 256 for V-trace (sweep 45,
    set AL) and 128 < T <= 256 for the other estimators (sweep 46, set AN): one one-warp tile of
    next_pow2(T) steps a sequence, unsplit; outside, the plans of before (V-trace's 64 x 4 tiles
    of 4 warps, split past T = 128; the others' 128-step tiles of 2 warps; a program a sequence
    from 8 x SMs)."""
    vtrace = kernels.VTRACE.value
    for T, N, block_t in ((65, 1024, 128), (128, 2, 128), (129, 1055, 256), (256, 64, 256)):
        plan = tb._plan(vtrace, T, N, False, H200)
        assert (plan.block_t, plan.block_n, plan.num_warps, plan.n_chunks) == (block_t, 1, 1, 1)
    for T, N in ((64, 1024), (257, 1024)):
        assert tb._plan(vtrace, T, N, False, H200)[:2] == (64, 4), (T, N)
    plan = tb._plan(vtrace, 256, 1, False, H200)  # (one sequence: not timed)
    assert (plan.block_t, plan.num_warps) == (128, 2)
    assert tb._plan(vtrace, 256, 1056, False, H200)[:2] == (128, 1)  # (from 8 x SMs)
    others = (kernels.SCAN, kernels.GAE, kernels.LAMBDA, kernels.DISCOUNTED, kernels.RETRACE,
              kernels.TRACES)  # fmt: skip
    for kind in others:
        for T, N in ((129, 1055), (200, 2), (256, 1024)):
            plan = tb._plan(kind.value, T, N, False, H200, reverse=kind != kernels.TRACES)
            got = (plan.block_t, plan.block_n, plan.num_warps, plan.n_chunks)
            assert got == (256, 1, 1, 1), (kind, T, N, plan)
    for T, N in ((128, 1024), (256, 1)):  # (T = 128: 0.88-1.04x, not taken; one sequence)
        plan = tb._plan(kernels.GAE.value, T, N, False, H200, reverse=True)
        assert (plan.block_t, plan.num_warps) == (128, 2), (T, N)
    assert tb._plan(kernels.GAE.value, 257, 1024, False, H200)[:2] == (512, 1)
