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
    """Time-major 16384 <= N < 32768 from T = 256: 16-bit values run the unsplit pipelined
    one-warp tiles of float32 (sweep 33), float64 the split plans."""
    cases = [(kernels.GAE, (16, 16), 3), (kernels.LAMBDA, (16, 16), 4),
             (kernels.VTRACE, (8, 16), 4), (kernels.RETRACE, (8, 16), 4)]  # fmt: skip
    for kind, tile, stages in cases:
        for four_byte in (False, True):  # (16-bit values, float32)
            plan = tb._plan(kind.value, 300, 16_400, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, stages), kind
        assert tb._plan(kind.value, 300, 16_400, True, H200, acc64=True).n_chunks > 1, kind
    # below 16384 sequences the plans are those of before (from 32768: the next test)
    assert tb._plan(kernels.GAE.value, 300, 16_383, True, H200).n_chunks > 1
    assert tb._plan(kernels.GAE.value, 300, 65_536, True, H200)[:2] == (8, 32)


def test_pipelined_tiles_from_32768_sequences(h200):
    """Time-major from N = 32768 at T >= 256: the one-warp tiles pipelined in 3 stages of
    N >= 65536, 8 x 32 (V-trace 4 x 32; sweep 34), Retrace included; below, the 16-column
    tiles stay; float64 keeps its split plans."""
    cases = [(kernels.GAE, (8, 32)), (kernels.LAMBDA, (8, 32)), (kernels.VTRACE, (4, 32)),
             (kernels.RETRACE, (8, 32)), (kernels.TRACES, (8, 32)), (kernels.SCAN, (8, 32))]  # fmt: skip
    for kind, tile in cases:
        for four_byte in (False, True):
            plan = tb._plan(kind.value, 300, 32_768, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, 3), kind
            plan = tb._plan(kind.value, 300, 32_767, True, H200, four_byte=four_byte)
            assert (plan.block_n, plan.stages) == (16, 4 if kind != kernels.GAE else 3), kind
        assert tb._plan(kind.value, 300, 32_768, True, H200, acc64=True).n_chunks > 1, kind


def test_retrace_and_wide_tiles_from_65536_sequences(h200):
    """Retrace pipelined from N = 65536 at T >= 32 (4 x 32 tiles, 4 x 64 from T = 256; sweep
    34), below T = 32 unpipelined as before; every estimator but V-trace in 4 x 64 tiles from
    N = 131072, V-trace in float32 in 4 x 32 there (4 x 64 from [256, 65536])."""
    retrace = kernels.RETRACE.value
    for T, N, tile, stages in ((64, 65_536, (4, 32), 3), (256, 65_536, (4, 64), 3),
                               (64, 131_072, (4, 64), 3), (16, 65_536, (4, 32), 1),
                               (128, 32_768, (4, 32), 1)):  # fmt: skip
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_retrace_bfloat16_keeps_masks_in_unpipelined_tiles(h200, dtype):
    """An unsplit time-major Retrace call whose tiles all fit drops its masks, but with
    bfloat16 values in tiles that neither pipeline nor prefetch ([16, 65536]: 4 x 32 tiles;
    sweep 33 timed these tiles without masks at 1.28-1.29x at [256, 65536] and [1024, 65536],
    sweep 34 at 1.12x at [16, 65536]); in pipelined tiles (at [1024, 65536] and [1024, 16384])
    it drops them too (sweep 34); the other estimators drop them."""
    x = [torch.empty(16, 65_536, dtype=dtype, device="meta")] * 5
    retrace = kernels.RETRACE.value
    plan = tb._plan(retrace, 16, 65_536, True, H200)
    assert (plan.n_chunks, plan.chunk, plan.cols, plan.stages, plan.prefetch) == (
        1, 16, 32, 1, False)  # fmt: skip
    assert tb._full_tiles(plan, 16, 65_536, True, retrace, x) == (dtype != torch.bfloat16)
    assert tb._full_tiles(plan, 16, 65_536, True, kernels.VTRACE.value, x)
    for T, N in ((1024, 65_536), (1024, 16_384)):
        plan = tb._plan(retrace, T, N, True, H200)
        assert plan.stages > 1 and tb._full_tiles(plan, T, N, True, retrace, x), (T, N)
