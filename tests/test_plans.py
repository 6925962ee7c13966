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


def test_16bit_unsplit_below_65536_sequences(h200):
    """Time-major 16384 <= N < 65536 from T = 256: 16-bit values run the unsplit pipelined
    one-warp tiles of float32 (sweep 33), float64 the split plans."""
    cases = [(kernels.GAE, (16, 16), 3), (kernels.LAMBDA, (16, 16), 4),
             (kernels.VTRACE, (8, 16), 4), (kernels.RETRACE, (8, 16), 4)]  # fmt: skip
    for kind, tile, stages in cases:
        for four_byte in (False, True):  # (16-bit values, float32)
            plan = tb._plan(kind.value, 300, 16_400, True, H200, four_byte=four_byte)
            assert (plan[:2], plan.n_chunks, plan.stages) == (tile, 1, stages), kind
        assert tb._plan(kind.value, 300, 16_400, True, H200, acc64=True).n_chunks > 1, kind
    # below 16384 sequences and from 65536 the plans are those of before
    assert tb._plan(kernels.GAE.value, 300, 16_383, True, H200).n_chunks > 1
    assert tb._plan(kernels.GAE.value, 300, 65_536, True, H200)[:2] == (8, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_retrace_bfloat16_keeps_masks_in_full_tiles(h200, dtype):
    """An unsplit time-major Retrace call whose tiles all fit ([1024, 65536]: 4 x 32 tiles)
    drops its masks but with bfloat16 values (sweep 33: 1.28-1.29x the time without them);
    the other estimators drop them in bfloat16 too."""
    x = [torch.empty(1024, 65_536, dtype=dtype, device="meta")] * 5
    plan = tb._plan(kernels.RETRACE.value, 1024, 65_536, True, H200)
    assert (plan.n_chunks, plan.chunk, plan.cols) == (1, 1024, 32)
    full = tb._full_tiles(plan, 1024, 65_536, True, kernels.RETRACE.value, x)
    assert full == (dtype != torch.bfloat16)
    assert tb._full_tiles(plan, 1024, 65_536, True, kernels.VTRACE.value, x)
