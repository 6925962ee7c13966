"""Triton backend: launchers for :mod:`.kernels` (canonical arguments: see ``_dispatch``).

The launcher reads strides (never copies the common layouts), collapses the batch axes into
one index, picks the tile shape from the layout and decides whether to split the time axis
across programs, then launches :func:`kernels.scan_kernel` once (two or three times when split,
or once, cooperatively, for a resident plan: see :func:`start`). Copies are made only for what a
kernel cannot address in place (``_needs_copies``): rare layouts and negative-bit views.
"""

from __future__ import annotations

import functools
import math
import os
import struct
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import _replay
from .._dispatch import accumulates_in_float64, triton_interpreted
from . import kernels

TRACE_IDS = {"retrace": 0, "tree_backup": 1, "q_lambda": 2, "importance_sampling": 3}


def _collapse(x: Tensor) -> tuple[int, int] | None:
    """(stride_t, stride_n) of a ``[T, *batch]`` view with the batch axes flattened row-major,
    or None when the batch axes cannot be addressed with a single stride."""
    stride_n = None
    inner = 1
    for size, stride in zip(reversed(x.shape[1:]), reversed(x.stride()[1:]), strict=True):
        if size == 1:
            continue
        if stride_n is None:
            stride_n = stride
        elif stride != stride_n * inner:
            return None
        inner *= size
    return (x.stride(0) if x.shape[0] > 1 else 0), (stride_n or 0)


def _group_pair(tensors) -> tuple[int, int] | None:
    """The (stride_t, stride_n) pair a group of per-step tensors read with the same offsets
    shares; (0, 0) for an empty group; None when there is none (mixed layouts, or a tensor
    whose batch axes need more than one stride)."""
    pairs = {_collapse(x) for x in tensors if x is not None}
    if not pairs:
        return (0, 0)
    return pairs.pop() if len(pairs) == 1 else None


def _shared_strides(tensors: list[Tensor | None]) -> tuple[list[Tensor | None], tuple[int, int]]:
    """The group and its shared stride pair. Common layouts already share one; otherwise (rare:
    mixed layouts in one call) the group is copied to time-major contiguous tensors."""
    pair = _group_pair(tensors)
    if pair is not None:
        return tensors, pair
    copied = [None if x is None else x.contiguous() for x in tensors]
    return copied, _group_pair(copied)


def _per_step(c) -> bool:
    """Whether a coefficient is a per-step tensor (not a Python float, nor one value broadcast
    to every step: see ``kernels.COEF_ONE``)."""
    return isinstance(c, Tensor) and _collapse(c) != (0, 0)


def _step_coefs(coefs) -> list:
    """The per-step coefficient tensors among ``coefs``, None in place of the others."""
    return [c if _per_step(c) else None for c in coefs]


def _coef_mode(c) -> int:
    """How the kernel reads coefficient ``c`` (``kernels.COEF_SCALAR``, ...)."""
    if not isinstance(c, Tensor):
        return kernels.COEF_SCALAR.value
    return kernels.COEF_STEPS.value if _per_step(c) else kernels.COEF_ONE.value


def _boundary_stride(x: Tensor | None) -> tuple[Tensor | None, int]:
    if x is None:
        return None, 0
    pair = _collapse(x.unsqueeze(0))
    if pair is None:
        x = x.contiguous()
        pair = _collapse(x.unsqueeze(0))
    return x, pair[1]


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


class Plan(NamedTuple):
    """How one call is cut into programs (see ``kernels.scan_kernel``)."""

    block_t: int  # steps scanned together in one tile
    block_n: int  # tile width: sequences per program, times segs
    unroll: int  # tiles per loop iteration
    chunk: int  # steps per chunk (T when not split)
    n_chunks: int  # chunks along time
    num_warps: int
    segs: int = 1  # chunks a program runs side by side (consecutive in time)
    prefetch: bool = False  # a tile's loads issued before the previous tile is written
    stages: int = 1  # the tile loop software-pipelined by Triton (tl.range num_stages)
    resident: bool = False  # split, one tile a chunk, one cooperative launch (every program
    # resident: each waits for the others' chunk composites)

    @property
    def cols(self) -> int:
        """Sequences per program (its tiles hold ``segs`` chunks of them side by side)."""
        return self.block_n // self.segs


# Estimator sets of the plan rules below; why each holds which estimators: docs/plans.md.
# The estimators with the fewest inputs: few long sequences run chunks side by side from
# T = 65536; batch-major rows of 65-128 steps run 128 x 4 tiles (_short_rows).
_SIDE_BY_SIDE = (kernels.DISCOUNTED.value, kernels.TRACES.value, kernels.SCAN.value)
# Prefetching: the wide one-warp tiles (time-major), and few long sequences.
_PREFETCH_WIDE = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                  kernels.VTRACE.value, kernels.TRACES.value, kernels.SCAN.value)  # fmt: skip
_PREFETCH_FEW_LONG = (kernels.GAE.value, kernels.VTRACE.value)
# Forward scans of float32 values from N = 65536 below T = 32: 8 x 128 tiles, a thread holding
# 8 rows of 4 columns (the scan in its registers).
_IN_THREAD_ROWS = (kernels.TRACES.value, kernels.SCAN.value)
# From N = 65536 and T = 64 (GAE aside: see _plan), wide time-major tiles of 8 rows and 16
# columns in place of a warp per 32 columns (below N = 65536 every estimator but Retrace).
_ONE_WARP_WIDE = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                  kernels.TRACES.value, kernels.SCAN.value)  # fmt: skip
# Time-major pairs and fours of sequences run resident (_resident_plan).
_RESIDENT_FEW = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                 kernels.VTRACE.value)  # fmt: skip
# Few long sequences: the most sequences run as 4- or 8-column chunks side by side in
# 64-column tiles.
_NARROW_SIDE_BY_SIDE = {kernels.GAE.value: 4, kernels.DISCOUNTED.value: 4,
                        kernels.LAMBDA.value: 8, kernels.RETRACE.value: 8}  # fmt: skip
# Few long sequences, 8 < N <= 16: 8 x 16 tiles pipelined in 3 stages from the T given.
_PIPELINED_FEW_LONG = {kernels.DISCOUNTED.value: 65536, kernels.TRACES.value: 65536,
                       kernels.SCAN.value: 65536, kernels.RETRACE.value: 131072}  # fmt: skip
# Time-major 16384 <= N < 32768 from T = 256, float32: one-warp tiles (block_t, block_n) in
# the stages given, in place of 16 x 16 (Retrace 8 x 16) in 4 stages; GAE's and traces'
# (episodic sums') in aligned 16-bit rows too (sweep 48).
_PIPELINED_FROM_16384 = {kernels.GAE.value: (16, 32, 3), kernels.LAMBDA.value: (16, 16, 3),
                         kernels.RETRACE.value: (8, 32, 4), kernels.TRACES.value: (32, 32, 3),
                         kernels.SCAN.value: (32, 32, 3)}  # fmt: skip
_PIPELINED_16BIT_FROM_16384 = (kernels.GAE.value, kernels.TRACES.value)


def _unsplit_walk(kind: int, T: int, N: int, reverse: bool, sms: int) -> tuple[int, int] | None:
    """``(block_t, num_warps)`` where a batch-major call (the caller's branch) runs each
    sequence in one program, unsplit, instead of the plans of few sequences; None elsewhere
    (docs/plans.md#a-program-a-sequence-unsplit-_unsplit_walk, sweeps 27, 28, 30, 45, 46):

    * 128 < T <= 256 (V-trace: 64 < T), 2 to 8 x SMs - 1 sequences: one one-warp tile of
      next_pow2(T) steps;
    * up to T = 2048 (V-trace 1024) and 8 x SMs - 1 sequences (V-trace 256): one tile of
      next_pow2(T) steps, up to 8 warps;
    * past T = 2048, below 8 x SMs sequences, a walk of several tiles: forward scans of more
      than 64 sequences up to T = 4096, of 256 or more past it, in 2048-step tiles of 8 warps
      (512-step tiles of 4 warps beyond 4 x SMs sequences); backward scans (not V-trace's) of
      more than 4 x SMs sequences from T = 4096 in 1024-step tiles of 4 warps."""
    vtrace = kind == kernels.VTRACE.value
    if (64 if vtrace else 128) < T <= 256 and 1 < N < 8 * sms:
        return triton.next_power_of_2(T), 1
    if 256 < T <= (1024 if vtrace else 2048) and N <= (256 if vtrace else 8 * sms - 1):
        block_t = triton.next_power_of_2(T)
        return block_t, min(8, block_t // 128)
    if T <= 2048 or N >= 8 * sms:
        return None
    if not reverse and N > 64 and (T <= 4096 or N >= 256):
        return (2048, 8) if N <= 4 * sms else (512, 4)
    if reverse and not vtrace and N > 4 * sms and T >= 4096:
        return 1024, 4
    return None


def _short_rows(kind: int, T: int, N: int, eight_byte: bool) -> tuple[int, int, int] | None:
    """``(block_t, block_n, num_warps)`` where a batch-major call (the caller's branch) of
    short rows runs tiles of several whole sequences, one tile a program; None elsewhere
    (docs/plans.md#short-rows-_short_rows, sweep 45):

    * up to T = 64 (V-trace to 32, from N = 16384, not in float64), from N = 1024 (4096 past
      T = 32): one-warp tiles of next_pow2(T) steps (at least 16) and 256 elements (V-trace,
      and Retrace to T = 16: 128);
    * 65-128 steps from N = 4096, the estimators of ``_SIDE_BY_SIDE``: 128 x 4 tiles of 2
      warps."""
    vtrace = kind == kernels.VTRACE.value
    if T <= 64 and N >= (1024 if T <= 32 else 4096):
        if vtrace and (T > 32 or N < 16384 or eight_byte):
            return None
        block_t = max(16, triton.next_power_of_2(T))
        narrow = vtrace or (kind == kernels.RETRACE.value and T <= 16)
        return block_t, (128 if narrow else 256) // block_t, 1
    if 64 < T <= 128 and N >= 4096 and kind in _SIDE_BY_SIDE:
        return 128, 4, 2
    return None


# Devices that refused a resident plan's cooperative launch (see _launch): none from then on.
_NO_RESIDENT: set[torch.device] = set()


def _resident_plan(kind: int, T: int, N: int, time_major: bool, sms: int) -> Plan | None:
    """A split scan in one cooperative launch (``Plan.resident``) where sweep 19 timed it
    faster than the plans of ``_plan`` (docs/plans.md#resident-plans-_resident_plan):
    time-major pairs and fours of sequences with 131072 < T <= 262144 for ``_RESIDENT_FEW``;
    V-trace of one sequence of more than 524288 steps. None elsewhere.
    A program of w warps uses at most 255 registers a thread, so 8 / w of them fit on an SM
    whatever the kernel: the launch has at most 8 / w x SMs programs, all resident."""
    if time_major and N in (2, 4) and 131072 < T <= 262144 and kind in _RESIDENT_FEW:
        block_t, warps = (512, 1) if N == 2 else (1024, 4)
    elif not time_major and N == 1 and T > 524288 and kind == kernels.VTRACE.value:
        block_t, warps = 1024, 1
    else:
        return None
    n_chunks = triton.cdiv(T, block_t)
    if n_chunks > 8 // warps * sms:  # (one program along the sequences: block_n = N)
        return None
    return Plan(block_t, N, 1, block_t, n_chunks, warps, resident=True)


def _columns_allow_prefetch(kind: int, N: int, cols: int, reverse: bool, eight_byte: bool) -> bool:
    """Whether a one-warp 4 x 32 tile of ``cols`` columns may prefetch, as far as its columns
    go: TD(lambda)'s and float64's backward scans do not where N is not a multiple of ``cols``
    (a partial tile of columns; sweep 37, docs/plans.md#prefetch-in-partial-tiles-of-columns).
    Float64 is ``eight_byte`` (float64 outputs): float32 calls that accumulate in float64
    follow float32's."""
    return N % cols == 0 or not (reverse and (eight_byte or kind == kernels.LAMBDA.value))


def _plan(
    kind: int,
    T: int,
    N: int,
    time_major: bool,
    device: torch.device,
    *,
    reverse: bool = True,
    four_byte: bool = False,
    acc64: bool = False,
    eight_byte: bool = False,
    aligned: bool = True,
) -> Plan:
    """Tile orientation from the layout; split time when there are too few sequences.
    ``reverse``: a backward scan; ``four_byte``: every value and per-step coefficient tensor
    4-byte, with float32 arithmetic; ``acc64``: float64 arithmetic; ``eight_byte``: float64
    outputs (float64 calls, not float32 ones that accumulate in float64); ``aligned``: no 16-bit
    value or per-step coefficient tensor of contiguous rows has a time stride that is not a
    multiple of 16 elements (computed in ``_describe``).

    The rules come from sweeps on an H200 (benchmarks/sweep_tiles.py and sweep_plans.py,
    results in benchmarks/results/sweep_tiles_h200.txt); docs/plans.md gives each rule's
    measurements, in this order. Where no sweep covered a case, the previous choice stays.
    """
    max_chunks = 4096  # (the two-level carry-in keeps the fold short; see _group_size)
    vtrace = kind == kernels.VTRACE.value
    retrace = kind == kernels.RETRACE.value
    segs, prefetch, stages = 1, False, 1
    paired = False  # round chunks longer than one tile up to two tiles' multiple (forward
    # scans side by side: see the few-long branch)
    one_wave = False  # target: at most this many programs (else at least; see the split below)
    whole_only = False  # prefetch only where the tiles need no masks (see _full_tiles)
    resident_ok = device not in _NO_RESIDENT
    if _INTERPRETED and resident_ok and T > 8 and ((time_major and N == 7) or (N == 1 and vtrace)):
        # resident (see _resident_plan): 8-step chunks, in 8-column tiles (one masked) at N = 7
        return Plan(8, 8 if N == 7 else 1, 1, 8, triton.cdiv(T, 8), 1, resident=True)
    if _INTERPRETED:  # tiny tiles so that CPU tests reach every code path: time-major N <= 3
        # runs two chunks side by side, N of 4-5 two-row tiles (flipped in reverse scans), more
        # one-row tiles (N = 7 only up to 8 steps, then resident, as V-trace of one sequence
        # is: above); batch-major four-row tiles of two sequences (a masked one for odd N),
        # for N = 3 eight-row tiles of one (scanned by fours in reverse scans), for N = 1
        # sixteen-row tiles one at a time (by eights); odd N prefetch
        prefetch = N % 2 == 1
        block_t, block_n, unroll, warps = (2, 4, 2, 1) if time_major else (4, 2, 2, 1)
        if not time_major and N in (1, 3):
            block_t, block_n, unroll = (16, 1, 1) if N == 1 else (8, 1, 2)
        min_chunk, target = 8, 16  # up to 16 chunks: groups, partial groups, several folds
        if time_major and N <= 3:
            block_n, segs, min_chunk = 8, 2, 16
        elif time_major and N >= 6:
            block_t, unroll = 1, 4
    else:
        sms = _sm_count(device.index or 0)
        resident = _resident_plan(kind, T, N, time_major, sms) if resident_ok else None
        if resident is not None:
            return resident
        many = N >= 65536 or (N >= 16384 and T < 256)  # one-warp tiles without a split
        wide = time_major and N > 16 and (not vtrace or many)
        heavy = vtrace or retrace
        long_enough = 512 if heavy and N < 16384 else 256
        min_chunk = None  # default: 4 tiles (2 along a contiguous time axis)
        if time_major and N >= 16384 and T >= 32 and reverse and not aligned and not acc64:
            # backward scans of 16-bit rows of unknown alignment, where the pipelined tiles
            # below could not copy them asynchronously: one-warp 4 x 32 tiles (Retrace 8 x 16),
            # prefetching, unpipelined, no split (sweep 35: 0.40-0.99x the time)
            block_t, block_n, unroll, warps, target = 4, 32, 1, 1, 0
            prefetch = _columns_allow_prefetch(kind, N, block_n, reverse, eight_byte)
            if retrace:
                block_t, block_n = 8, 16
        elif (
            time_major
            and (many or N >= 32768 or (retrace and N >= 20480))
            and T >= 32
            and not acc64
        ):
            # many sequences: one-warp 8 x 32 tiles (V-trace 4 x 32) in a tile loop
            # software-pipelined by Triton in 3 stages, no split (sweeps 26, 27, 34 and 35:
            # 0.61-1.07x the time); 4 x 64 tiles from N = 131072 (V-trace 4 x 32), for Retrace
            # from 65536 (from T = 256; 4 x 32 below) and, in float32 from T = 256, for V-trace
            # from 65536, GAE from 57344 and Retrace from 49152 (sweeps 27, 34 and 43)
            block_t, block_n, unroll, warps, target, stages = 4 if vtrace else 8, 32, 1, 1, 0, 3
            if retrace and N >= 65536:
                block_t, block_n = 4, 64 if T >= 256 else 32
            if N >= 131072:
                block_t, block_n = 4, 32 if vtrace else 64
            elif four_byte and T >= 256:
                if vtrace and N >= 65536:
                    block_n = 64
                elif (kind == kernels.GAE.value and N >= 57344) or (retrace and N >= 49152):
                    block_t, block_n = 4, 64
        elif wide and N >= 65536 and four_byte and not reverse and kind in _IN_THREAD_ROWS:
            # a warp per 128 columns, each thread holding 8 rows of 4 (sweep 22), no split
            block_t, block_n, unroll, warps, target, prefetch = 8, 128, 1, 1, 0, True
        elif wide and many:  # one-warp tiles, no split: a warp per 32 columns, or 8 x 16 tiles
            block_t, block_n, unroll, warps, target = 4, 32, 1, 1, 0
            # prefetching (sweep 12) where the columns allow it, but not float64 TD(lambda)
            # (sweep 37)
            lambda64 = eight_byte and kind == kernels.LAMBDA.value
            prefetch = (
                kind in _PREFETCH_WIDE
                and not lambda64
                and _columns_allow_prefetch(kind, N, block_n, reverse, eight_byte)
            )
            if retrace:  # (below T = 32, or accumulating in float64) prefetching in whole
                # tiles only, which then run unmasked, but not in float64 (sweeps 35-37)
                prefetch = whole_only = not acc64
            if (not retrace and N < 65536) or (
                T >= 64 and kind in _ONE_WARP_WIDE and kind != kernels.GAE.value
            ):
                # 8 x 16 tiles (sweep 23), prefetching in partial tiles too, but not in float64
                # from N = 65536 (sweep 37)
                block_t, block_n, prefetch = 8, 16, not (eight_byte and N >= 65536)
        elif time_major and 16384 <= N < 32768 and not acc64:  # (T >= 256: not `many`)
            # one-warp 16 x 16 tiles (V-trace, Retrace: 8 x 16) pipelined in 4 stages, no split
            # (sweeps 26, 27 and 33: 0.47-1.00x the time of the plans before); in float32 (GAE
            # and traces: in aligned 16-bit rows too, GAE's being aligned here: the unaligned
            # ones took the branch above) those of _PIPELINED_FROM_16384
            block_t, block_n, unroll, warps, target, stages = 8 if heavy else 16, 16, 1, 1, 0, 4
            if kind in _PIPELINED_FROM_16384 and (
                four_byte or (aligned and kind in _PIPELINED_16BIT_FROM_16384)
            ):  # (sweep 48: 0.76-1.00x the time of the tiles above on an H200)
                block_t, block_n, stages = _PIPELINED_FROM_16384[kind]
        elif (
            time_major
            and 1024 <= N < 16384
            and N % 8 == 0
            and 32 < T <= (512 if four_byte else 256)
            and aligned
            and not acc64
        ):
            # PPO-sized rollouts: narrow one-warp tiles pipelined in 4 stages (16 x 8) or, below
            # N = 4096, 3 stages (64 x 4), no split (sweep 44: 0.49-0.99x the time of the 8-warp
            # and split plans, but 1.08x and 1.03x at two shapes)
            block_t, block_n, unroll, warps, target, stages = 16, 8, 1, 1, 0, 4
            if N < 4096:
                block_t, block_n, stages = 64, 4, 3
        elif time_major and N >= 256 and T >= long_enough and (N < 16384 or not vtrace):
            # a warp per 64 columns in 4-step tiles (two rows of 4 columns a thread), split
            # along time into as many programs as the GPU runs at once (32 one-warp programs an
            # SM) and no more: a second, partial wave cost up to 1.25x (sweep 14)
            block_t, block_n, unroll, warps, target, one_wave = 4, 64, 1, 1, 32 * sms, True
        elif wide and N < 1024 and T >= 16384:  # a warp per 16 columns, split in chunks of
            block_t, block_n, unroll, warps, target, min_chunk = 8, 16, 1, 1, 64 * sms, 128
            paired = not reverse  # forward chunks in pairs of tiles (sweep 39, set T)
        elif time_major and N >= 16384:  # V-trace, T >= 256 below N = 65536: each thread
            block_t, block_n, unroll, warps, target = 1, 128, 8, 2, 16 * sms  # walks its column
        elif time_major and N < 256 and T >= 512:
            # few long sequences: one-warp programs of 8 x 16 tiles in chunks of 32 steps (64
            # past T = 65536), at most 4096 programs along time (sweeps 13 and 27); chunks side
            # by side in wider tiles for some estimators (sweeps 11, 16), pipelined for others
            # (sweep 26)
            min_chunk = 32 if T <= 65536 else 64
            block_t, block_n, unroll, warps, target = 8, 16, 1, 1, 32 * sms
            prefetch = kind in _PREFETCH_FEW_LONG
            cols = max(4, triton.next_power_of_2(N))
            if N <= _NARROW_SIDE_BY_SIDE.get(kind, 0):  # at most 8 sequences: 64-column
                block_n, target, segs = 64, 8 * sms, 64 // cols  # tiles of chunks side by side
            elif 8 < N <= 16 and not acc64 and T >= _PIPELINED_FEW_LONG.get(kind, math.inf):
                stages = 3
            elif T >= 65536 and kind in _SIDE_BY_SIDE:
                block_n, target, segs = 128, 8 * sms, 128 // cols
                # forward chunks rounded up to a multiple of 16 steps at any T (sweeps 39-41;
                # at other T _tail_programs gives the other programs the fast code)
                paired = not reverse
        elif time_major and N <= 16:  # few sequences below T = 512: tall, narrow tiles
            block_t, block_n, unroll, warps, target = 128, 16, 1, 8, 8 * sms
        elif time_major and N < 1024:  # (16 < N < 256 below T = 512; to N = 1024 below 256,
            # V-trace and Retrace below 512)
            block_t, block_n, unroll, warps, target = 32, 32, 1, 8, 8 * sms
        elif time_major and 1 < T <= (16 if retrace else 32):
            # short rollouts (1024 <= N < 16384): one-warp 16 x 8 tiles (sweep 23)
            block_t, block_n, unroll, warps, target = 16, 8, 1, 1, 0
        elif time_major:  # 65-128 steps: one 128-step tile a program (sweep 18), but for
            # V-trace (sweep 22)
            block_t = 128 if 64 < T <= 128 and not vtrace else 64
            block_n, unroll, warps, target = 16, 1, 8, 8 * sms
        elif rows := _short_rows(kind, T, N, eight_byte):
            # batch-major rows of at most 128 steps: tiles of several whole sequences, no split
            (block_t, block_n, warps), unroll, target = rows, 1, 0
        elif walk := _unsplit_walk(kind, T, N, reverse, sms):
            # batch-major: a program a sequence, in one tile up to T = 2048, else walking tiles
            # (see _unsplit_walk), no split
            (block_t, warps), block_n, unroll, target = walk, 1, 1, 0
        elif vtrace and N > 1 and (T <= 64 or (N < 8 * sms and T <= 2048)):  # its vs_{t+1}
            # shuffle is cheap in short tiles (sweep 22)
            block_t, block_n, unroll, warps, target = 64, 4, 1, 4, 8 * sms
        elif N >= 8 * sms:  # time is contiguous: a parallel scan along it, one sequence per
            # program (a warp); V-trace in 128-step tiles; forward scans prefetch (sweeps
            # 12, 30)
            block_t = 128 if T <= 128 or vtrace else 256
            block_n, unroll, warps, target = 1, 1, 1, 0
            prefetch = kind == kernels.TRACES.value or (kind == kernels.SCAN.value and not reverse)
        else:  # program (a warp); with few sequences, programs split along time
            block_n, unroll, target = 1, 1, 8 * sms
            if T <= 2048:  # (T <= 128; one sequence to T = 256, or V-trace's from 1025)
                block_t, warps = 128, 2
            elif not reverse and N <= 64:  # forward scans of few sequences: 1024-step tiles
                # of 8 warps in about 4 x SMs programs (one wave), a tile or more each (sweep 29)
                block_t, warps, target, min_chunk = 1024, 8, 4 * sms, 1024
            elif N == 1 and T >= 524288:  # one long sequence, backward: 1024-step tiles
                # of 8 warps in 2-tile chunks (sweep 13; sweep 29's faster one-warp tiles need
                # a third launch there)
                block_t, warps = 1024, 8
            elif not reverse:  # forward scans (65-255 sequences past T = 4096; sweep 25)
                block_t, warps = 512, 4
            else:  # backward scans: one-warp tiles of 256 steps (V-trace 128) scanned by
                # fours, about 32 x SMs programs of a tile or more (sweep 25)
                block_t, warps, target = (128 if vtrace else 256), 1, 32 * sms
                min_chunk = block_t
        min_chunk = min_chunk or (4 if time_major else 2) * block_t * unroll
    plan = Plan(block_t, block_n, unroll, T, 1, warps, segs, prefetch, stages)  # (not split yet)
    programs = triton.cdiv(N, plan.cols)
    step = block_t * unroll
    spans = 1  # programs along time, each min_chunk steps or more
    if programs < target and T > min_chunk:
        along_time = target // programs if one_wave else triton.cdiv(target, programs)
        spans = min(along_time, triton.cdiv(T, min_chunk), max_chunks)
    chunk = triton.cdiv(triton.cdiv(T, spans * segs), step) * step
    if paired and chunk > step:
        chunk = triton.cdiv(chunk, 2 * step) * 2 * step
    plan = plan._replace(chunk=chunk, n_chunks=triton.cdiv(T, chunk * segs) * segs)
    return plan._replace(prefetch=_full_tiles(plan, T, N, reverse)) if whole_only else plan


class _Phase(NamedTuple):
    """Which part of a split scan a launch runs (``scan_kernel``'s constexprs of that name)."""

    WRITE_TOTALS: bool = False  # each chunk's composite, nothing else
    READ_TOTALS: bool = False  # the carry-in from the totals, then the scan and the outputs
    GROUP_PASS: bool = False  # in-group prefixes and group totals (two-level carry-in)
    RESIDENT: bool = False  # the whole split scan in one cooperative launch


_WHOLE, _TOTALS, _GROUPS, _CARRIED, _RESIDENT = (
    _Phase(),
    _Phase(WRITE_TOTALS=True),
    _Phase(GROUP_PASS=True),
    _Phase(READ_TOTALS=True),
    _Phase(RESIDENT=True),
)


class _Launch(NamedTuple):
    """Everything about a launch that depends only on shapes, strides and dtypes."""

    tail: tuple[int, ...]  # T, N, chunk, then the strides s_t, s_n, f_t, f_n, k_t, k_n, b_n,
    # o0_t, o0_n, o1_t, o1_n
    plan: Plan
    phases: tuple  # ((_Phase, grid), ...): the kernel launches of a call, in order
    meta: dict
    totals_shape: tuple[int, int, int]
    totals_stride: tuple[int, int, int]  # (contiguous: kept so that a call does no arithmetic)
    totals_dtype: torch.dtype
    pointers: tuple[int, ...]  # positions of the launch's tensors among its arguments (then
    # the chunk totals' position, when split)
    device: torch.device
    direct: dict  # (phase, pointer alignment) -> direct launcher, after a first launch


# Direct launches (see `_direct_launcher`): on by default since they passed the GPU suite on an
# H200 (Triton 3.6), graph capture included; RL_TRITON_DIRECT_LAUNCH=0 sends every launch
# through Triton's own JIT dispatch.
DIRECT_LAUNCH = os.environ.get("RL_TRITON_DIRECT_LAUNCH", "1") != "0"
_INTERPRETED = triton_interpreted()
_RUNTIME_KNOBS = getattr(getattr(triton, "knobs", None), "runtime", None)


def _launch_hooks_set() -> bool:
    """Whether a profiler (Proton, ...) has hooked Triton's launches: those hooks are called by
    the JIT's launch only, so direct launches step aside while they are set."""
    if _RUNTIME_KNOBS is None:  # Triton < 3.3 has no knobs; it has no direct launches either
        return False
    enter = _RUNTIME_KNOBS.launch_enter_hook
    exit_ = getattr(_RUNTIME_KNOBS, "launch_exit_hook", None)
    return bool(getattr(enter, "calls", enter)) or bool(getattr(exit_, "calls", exit_))


def _direct_launcher(compiled, meta: dict, phase: dict) -> tuple | None:
    """How to launch a kernel Triton already compiled through its C launcher, without the JIT
    dispatcher in front of it (argument binding, specialisation, cache key and launch hooks:
    most of the 17-40 µs a Python-side launch costs): ``(run, head, constexprs)``, launched as
    ``run(grid_x, grid_y, 1, stream, *head, *args, *constexprs)``, the same launch
    ``JITFunction.run`` makes (``head`` is the kernel's function handle and packed metadata,
    then no launch metadata or hooks). None where this Triton's compiled kernel lacks the
    attributes used (the ordinary launch is used then)."""
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None
    if tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 3):
        return None  # before 3.3 the launcher takes the runtime arguments alone
    params = kernels.scan_kernel.params
    runtime = sum(not p.is_constexpr for p in params)
    if any(p.is_constexpr for p in params[:runtime]):
        return None  # the launcher takes the constexprs after the runtime arguments
    constexprs = {**meta, **phase}
    return (
        run,
        (function, packed, None, None, None),
        tuple(constexprs[p.name] for p in params[runtime:]),
    )


def direct_launches(launch: _Launch) -> tuple | None:
    """The direct launchers (see `_direct_launcher`) of every phase of a launch with every
    tensor 16-byte aligned, if a call made them: what a replay needs to launch without
    `start`, ``((run, grid, head, tail), ...)`` in phase order, each launched as
    ``run(*grid, 1, stream, *head, *args, totals, *tail)`` with the call's arguments as `start`
    takes them and the call's own chunk totals (`new_totals`; None unsplit)."""
    aligned = (True,) * len(launch.pointers)
    launches = []
    for phase, grid in launch.phases:
        direct = launch.direct.get((phase, *aligned))
        if direct is None:
            return None
        run, head, constexprs = direct
        launches.append((run, grid, head, (*launch.tail, *constexprs)))
    return tuple(launches)


# Launch descriptions by call signature: a training loop calls with the same shapes every
# step, so after the first call a launch costs a dict lookup plus Triton's own dispatch.
_LAUNCHES: dict[tuple, _Launch] = {}


def _signature(t: Tensor | None):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.is_neg())


def _offsets_need_int64(T: int, N: int, pairs, b_n: int) -> bool:
    """Whether a load or store can form an element offset of 2**31 or more: ``t + 1`` steps
    (the next step's inputs) of a tensor's time stride plus N of its sequence stride, for each
    ``(time, sequence)`` stride pair (inputs, flags, per-step coefficients, outputs), and N of
    the bootstrap value's stride."""
    reach = max((T + 1) * abs(st) + N * abs(sn) for st, sn in pairs)
    return max(reach, N * abs(b_n)) >= 2**31


def _full_tiles(plan: Plan, T: int, N: int, reverse: bool) -> bool:
    """Whether the kernel may load and store without masks: an unsplit call whose tiles all lie
    inside ``[T, N]`` (T a whole number of tile steps, N of program columns) and no forward
    prefetch past its end. Sweep 32 (graph replay, L2 flushed), against the same kernels with
    masks: discounted returns batch-major [1024, 65536] 0.97x the time, V-trace time-major
    0.89x, bfloat16 time-major 0.94-0.96x, 0.97-1.00x elsewhere but GAE batch-major (1.02x);
    split plans 0.97-1.06x (GAE [65536, 256] time-major 1.06x: its totals pass then needs 66
    registers, and one wave of 32 one-warp programs an SM no longer fits), so they keep them.
    (Until sweep 35 Retrace with bfloat16 values kept them in one-warp 4 x 32 tiles that
    neither prefetch nor pipeline: unmasked, ptxas issued two of a tile's six loads after the
    importance weights' exp, 1.10-1.43x the time. Those tiles now prefetch where they are whole,
    which issues every load early; its other unpipelined tiles measured 0.82-1.04x without
    masks.)"""
    return (
        plan.n_chunks == 1
        and plan.chunk == T
        and N % plan.cols == 0
        and (reverse or not plan.prefetch)
    )


def _tail_programs(plan: Plan, T: int, reverse: bool) -> bool:
    """Whether the tile loop is compiled twice (``T_TAIL``, see ``scan_kernel``): masked at T in
    the programs holding step T - 1 only, so that the others, whose chunks end at multiples of
    16, get the code whose loads are issued up front. Only for split scans that are not
    resident (those have no tile loop) at T not a multiple of 16 (otherwise Triton knows T is
    one), and only in the plan families where it won (sweep 41, set X, T of 1048579, 1000003
    and 1000008, against b051bb9's plans without it):

    * one-column tiles: timed at one sequence, 0.81-1.00x the time over 9 calls (V-trace
      1.00x); the batch-major plans of a few sequences take it untimed;
    * forward chunks side by side of a multiple of 16 steps (timed 8 and 16 side by side):
      0.95-0.97x in float32, 0.82-0.83x in float64 with the chunks paired (one-tile chunks,
      8 steps, cannot get the fast code: left out, untimed).

    Left out: backward chunks side by side (float64 discounted returns 1.06x: the second loop
    spills) and the 8 x 16 tiles (0.91-1.17x: the forward scan 1.17x at [1000003, 100], not
    understood)."""
    if plan.n_chunks == 1 or plan.resident or T % 16 == 0:
        return False
    side_by_side_forward = plan.segs > 1 and not reverse and plan.chunk % 16 == 0
    return plan.block_n == 1 or side_by_side_forward


def _alignment(values) -> int:
    """What the kernel may be told of ``values`` (see ``scan_kernel``'s ALIGN_T and ALIGN_N):
    the largest power of two up to 8 dividing them all, where Triton's own hint (multiples of
    16) does not already cover them all; else 1 (a unit stride, the axis along the rows, makes
    it 1).

    Sweep 42 (graph replay, L2 flushed, against the same kernel told nothing), float32 time per
    element against rows of 1024 or 65536:

    * batch-major [65536, T], rows of T = 1016 and 1000 (8): every estimator 1.13-1.81x before,
      1.02-1.08x (linear scan 1.02x either way); bfloat16 GAE and V-trace 1.54-1.98x before,
      1.03-1.18x at 8 and 4. Rows of 1004 (4) and 1002 (2), timed for GAE, V-trace, discounted
      returns and eligibility traces: 1.18-1.86x before, 1.05-1.15x at 4, 1.11-1.42x at 2.
      Taken at any of 8, 4, 2, float64 included (untimed there).
    * time-major [1024, N], rows of N = 65528 (8): 1.23-1.82x before, 1.05-1.35x. At 65524 (4)
      and 65522 (2) 0.65-1.25x the time of before (at 4: GAE 1.24-1.25x, V-trace 1.13-1.16x,
      eligibility traces 1.14-1.15x), bfloat16 at 8 0.94-1.03x: taken at 8 only, with 4-byte
      values accumulated in float32 (rows of 32 bytes; a float32 call accumulating in float64
      gets 1; why rows of 16 bytes lose is not understood: the SASS at 4 and 8 is the same).
    * few long sequences: batch-major [16, 131080] 0.57-0.83x the time of before, one sequence
      at T = 1048584 0.99-1.01x (V-trace 0.74x); time-major rows of 8 and 24 sequences at T of
      128-131072 0.46-1.02x, but at [128, 24] GAE and discounted returns 1.09x, traces 1.08x,
      episodic sums 1.05x, the scan 1.17x, and TD(lambda) 1.15x at [2048, 8] (at most 2.4
      us)."""
    if all(v % 16 == 0 for v in values):
        return 1
    return next((a for a in (8, 4, 2) if all(v % a == 0 for v in values)), 1)


def _describe(kind, trace, reverse, has_next, has_values, acc64, x, flags, coefs, boot, outs):
    """Strides, plan and compile-time flags (a ``_Launch``) of a call whose tensors need no
    copies; ``acc64``: float64 accumulation (``accumulates_in_float64``)."""
    out0 = outs[0]
    T, N = out0.shape[0], math.prod(out0.shape[1:])
    acc = tl.float64 if acc64 else tl.float32
    (s_t, s_n), (f_t, f_n) = _shared_strides(x)[1], _shared_strides(flags)[1]
    steps = _step_coefs(coefs)
    k_t, k_n = _shared_strides(steps)[1]
    g_t, l_t, k0_t, k1_t, k2_t = map(_coef_mode, coefs)
    b_n = _boundary_stride(boot)[1]
    (o0_t, o0_n) = _collapse(out0)
    (o1_t, o1_n) = _collapse(outs[1]) if outs[1] is not None else (0, 0)
    # Tiles run along the contiguous axis: time-major tiles when sequences are adjacent in
    # memory, a scan along time when time is (batch-major layouts; a single sequence).
    time_major = N > 1 and (abs(s_t) >= abs(s_n) if s_n else True)
    four_byte = not acc64 and all(v.element_size() == 4 for v in (*x, *steps) if v is not None)
    # Rows of contiguous 16-bit elements whose stride Triton cannot hint (it hints multiples of
    # 16): see _plan's unaligned tiles (a coefficient broadcast over the sequences, column
    # stride 0, is one value a row either way)
    aligned = all(
        stride % 16 == 0
        for stride, col, group in ((s_t, s_n, x), (k_t, k_n, steps))
        if col == 1 and any(v is not None and v.element_size() == 2 for v in group)
    )
    plan = _plan(
        kind,
        T,
        N,
        time_major,
        out0.device,
        reverse=reverse,
        four_byte=four_byte,
        acc64=acc64,
        eight_byte=out0.element_size() == 8,
        aligned=aligned,
    )
    cols = plan.cols
    flip = reverse and time_major and plan.block_t > 1  # (see kernels._tile_offsets)
    # One-column backward tiles (a sequence's steps in a tile, time contiguous) are composed
    # by groups of rows in registers (see kernels._tile_states): their states by eights in
    # 256-step tiles of one warp (a thread holds 8 consecutive steps; 16-step tiles under the
    # interpreter; the totals pass and resident scans compose them by fours), else by fours
    # up to 256 steps (sweep 14: 0.75-0.86x the time of tl.associative_scan's reverse
    # scan at [1024, 65536], 1.02x in 128-step tiles of two warps; tiles split over several
    # warps and V-trace's 4-column tiles measured up to 1.35x slower that way); 0: neither
    by = 0
    if reverse and not flip and plan.block_n == 1 and plan.block_t % 4 == 0:
        if plan.block_t == (16 if _INTERPRETED else 256) and plan.num_warps == 1:
            by = 8
        elif plan.block_t <= 256:
            by = 4
    strides = (s_t, s_n, f_t, f_n, k_t, k_n, b_n, o0_t, o0_n, o1_t, o1_n)
    pairs = ((s_t, s_n), (f_t, f_n), (k_t, k_n), (o0_t, o0_n), (o1_t, o1_n))
    meta = dict(
        KIND=kind,
        TRACE=trace,
        REVERSE=reverse,
        FLIP=flip,
        ACC=acc,
        HAS_TERM=flags[0] is not None,
        HAS_TRUNC=flags[1] is not None,
        HAS_NEXT=has_next,
        HAS_VALUES=has_values,
        HAS_BOOT=boot is not None,
        G_T=g_t,
        L_T=l_t,
        K0_T=k0_t,
        K1_T=k1_t,
        K2_T=k2_t,
        IDX64=_offsets_need_int64(T, N, pairs, b_n),
        FULL=_full_tiles(plan, T, N, reverse),
        T_TAIL=_tail_programs(plan, T, reverse),
        BLOCK_T=plan.block_t,
        BLOCK_N=plan.block_n,
        BY=by,
        SEGS=plan.segs,
        UNROLL=plan.unroll,
        # chunk composites folded per load when the time axis is split: 8 per thread (more
        # registers would cost the tile loop occupancy); 2 under the interpreter so that CPU
        # tests fold several groups
        FOLD=(fold := 2 if _INTERPRETED else min(1024, max(2, 256 * plan.num_warps // cols))),
        # chunks per group of the two-level carry-in (1: none): enough that the scan pass folds
        # at most FOLD group totals, as far as the group's own scan keeps <= 32 totals a thread
        # (past that, more groups)
        GROUP=1 if plan.resident else _group_size(plan, fold),
        PREFETCH=plan.prefetch,
        STAGES=plan.stages,
        ALIGN_T=_alignment((T, plan.chunk, *(n for _, n in pairs))),
        ALIGN_N=8 if four_byte and _alignment((N, *(t for t, _ in pairs))) == 8 else 1,
        num_warps=plan.num_warps,
        **({"launch_cooperative_grid": True} if plan.resident else {}),
    )
    grid = (triton.cdiv(N, cols), plan.n_chunks // plan.segs)
    totals_dtype = torch.float64 if acc == tl.float64 else torch.float32
    tail = (T, N, plan.chunk, *strides)
    n_groups = triton.cdiv(plan.n_chunks, meta["GROUP"])
    totals = (2, plan.n_chunks if meta["GROUP"] == 1 else 2 * plan.n_chunks + n_groups, N)
    if plan.resident:  # the chunk totals, then the barrier's counter
        totals = (1, 1, 2 * plan.n_chunks * N + 1)
    stride = (totals[1] * totals[2], totals[2], 1)
    if plan.n_chunks == 1:
        phases = ((_WHOLE, grid),)
    elif plan.resident:
        phases = ((_RESIDENT, grid),)
    else:  # totals, the group pass with many chunks (two-level carry-in), the carried scan
        groups = ((_GROUPS, (grid[0], n_groups)),) if meta["GROUP"] > 1 else ()
        phases = ((_TOTALS, grid), *groups, (_CARRIED, grid))
    # where the tensors are among the arguments `start` passes (`args`, totals, tail)
    args = (*x, *flags, *coefs, boot, *outs)
    pointers = tuple(i for i, a in enumerate(args) if isinstance(a, Tensor))
    pointers += (len(args),) * (plan.n_chunks > 1)
    return _Launch(
        tail, plan, phases, meta, totals, stride, totals_dtype, pointers, out0.device, {}
    )


def _group_size(plan: Plan, fold: int) -> int:
    """Chunks per group (a power of two) for the two-level carry-in; 1 (none) when folding the
    chunk totals takes at most 8 round trips (2 under the interpreter, so that CPU tests take
    both paths): at 17 chunks the group step (sweep 9, then part of the totals launch) measured
    up to 17% slower than the fold. One-warp programs of one sequence fold at most 4 round
    trips (1024 chunks): with 1172-1758 chunks a sequence, the group pass took 0.56-0.92x the
    time of folding up to 8 (sweep 26: GAE, V-trace, discounted returns, batch-major)."""
    trips = 4 if plan.cols == 1 and plan.num_warps == 1 else 8
    if plan.n_chunks <= (2 if _INTERPRETED else trips) * fold:
        return 1
    # at most 32 totals a thread in the group pass's scan (64 a thread took 238 registers in
    # sweep 11)
    rows = 32 * 32 * plan.num_warps // plan.cols
    most = 2 * plan.segs if _INTERPRETED else max(2, rows)  # (interpreter: 2 programs a group)
    # (a program's chunks stay in one group)
    return max(plan.segs, min(triton.next_power_of_2(triton.cdiv(plan.n_chunks, fold)), most))


def _needs_copies(x, flags, coefs, boot, outs) -> bool:
    """Rare layouts that the kernel cannot address in place (see ``_shared_strides``), and
    negative-bit views (``z.conj().imag``), whose memory holds minus their values (flags
    aside: only whether they are non-zero counts, which the sign does not change)."""
    tensor_coefs = [c for c in coefs if isinstance(c, Tensor)]
    if any(t is not None and t.is_neg() for t in (*x, *tensor_coefs, boot, *outs)):
        return True
    if any(_group_pair(group) is None for group in (x, flags, _step_coefs(coefs))):
        return True
    return (boot is not None and _collapse(boot.unsqueeze(0)) is None) or any(
        o is not None and _collapse(o) is None for o in outs
    )


def _exact_in_f32(c: float) -> bool:
    """Whether a Python float survives Triton's float32 scalar argument unchanged (0.0 padding,
    0.5, 1.0, ...): those need no float64 tensor."""
    return struct.unpack("f", struct.pack("f", c))[0] == c


@functools.lru_cache(maxsize=256)
def _f64_scalar(c: float, device: torch.device) -> Tensor:
    """A cached float64 device scalar for a coefficient float32 cannot hold: one host-to-device
    copy per value and device, not one per call (a first use inside CUDA-graph capture would
    still copy: call once before capturing)."""
    return torch.tensor(c, dtype=torch.float64, device=device)


def _launch(
    kind,
    out0,
    out1=None,
    *,
    x=(),
    flags=(),
    coefs=(),
    boot=None,
    reverse=True,
    trace=0,
    has_next=False,
    has_values=False,
):
    x = (*x, *(None,) * (5 - len(x)))
    flags = (*flags, *(None,) * (2 - len(flags)))
    coefs = (*coefs, *(0.0,) * (5 - len(coefs)))
    outs = results = (out0, out1)
    # (the factor of a_t that repeats: gamma lmbda; gamma for discounted returns; none for the scan)
    factors = (
        () if kind == kernels.SCAN.value else coefs[: 1 if kind == kernels.DISCOUNTED.value else 2]
    )
    acc64 = accumulates_in_float64(out0.dtype, out0.shape[0], factors, coefs)
    if acc64:  # float64 coefficients (Triton passes Python floats as float32), each read as one
        # value for every step (kernels.COEF_ONE; in place beside a per-step coefficient tensor
        # of a float64 call)
        coefs = tuple(
            _f64_scalar(c, out0.device).expand(out0.shape)
            if isinstance(c, float) and not _exact_in_f32(c)
            else c
            for c in coefs
        )
    key = (
        kind,
        trace,
        reverse,
        has_next,
        has_values,
        acc64,
        out0.device,
        *map(_signature, (*x, *flags, boot, out0, out1)),
        *(_signature(c) if isinstance(c, Tensor) else None for c in coefs),
    )
    launch = _LAUNCHES.get(key)
    copies = False
    if launch is None:
        copies = _needs_copies(x, flags, coefs, boot, outs)
        if copies:  # the slow, uncached path (negative bits resolved: a no-op without one)
            x = [None if t is None else t.resolve_neg() for t in x]
            x, flags = _shared_strides(x)[0], _shared_strides(list(flags))[0]
            coefs = [c.resolve_neg() if isinstance(c, Tensor) else c for c in coefs]
            steps = _shared_strides(_step_coefs(coefs))[0]
            coefs = [c if t is None else t for c, t in zip(coefs, steps, strict=True)]
            boot = _boundary_stride(None if boot is None else boot.resolve_neg())[0]
            outs = tuple(
                torch.empty(o.shape, dtype=o.dtype, device=o.device)
                if o is not None and (o.is_neg() or _collapse(o) is None)
                else o
                for o in outs
            )
        launch = _describe(
            kind, trace, reverse, has_next, has_values, acc64, x, flags, coefs, boot, outs
        )
        if not copies:
            if len(_LAUNCHES) >= 4096:  # many distinct shapes: start afresh
                _LAUNCHES.clear()
            _LAUNCHES[key] = launch
    args = (*x, *flags, *coefs, boot, *outs)
    recording = _replay.recording()
    if recording is not None:  # (a replay may skip everything above, not the copies)
        recording.append(None if copies else (launch, args))
    try:
        start(launch, args)
    except RuntimeError as e:  # a resident plan's cooperative launch refused: the GPU runs
        # fewer programs at once than its SM count promises (MPS limits, ...); plan without
        if not launch.plan.resident or "cooperative" not in str(e):
            raise
        _NO_RESIDENT.add(launch.device)
        launch = _describe(
            kind, trace, reverse, has_next, has_values, acc64, x, flags, coefs, boot, outs
        )
        if not copies:
            _LAUNCHES[key] = launch
            if recording is not None:
                recording[-1] = (launch, args)
        start(launch, args)
    for o, r in zip(outs, results, strict=True):
        if o is not r:
            r.copy_(o)


def new_totals(launch: _Launch) -> Tensor | None:
    """The chunk totals a call's launches share: none unsplit; zeroed for a resident plan
    (they end in the grid barrier's counter); else uninitialised."""
    if launch.plan.n_chunks == 1:
        return None
    if launch.plan.resident:
        return torch.zeros(launch.totals_shape, dtype=launch.totals_dtype, device=launch.device)
    return _replay.empty(
        launch.totals_shape, launch.totals_stride, launch.totals_dtype, launch.device
    )


def start(launch: _Launch, args: tuple) -> None:
    """Run a described launch on the call's tensors and scalars: once, or when the time axis is
    split, a first launch that writes each chunk's totals, with many chunks a second that scans
    them by groups, and a last that folds them in and scans; a resident plan's split scan in
    one cooperative launch."""
    device = launch.device
    if device.type == "cuda" and device.index != torch._C._cuda_getDevice():
        with torch.cuda.device(device):  # Triton launches on the current device's stream
            return start(launch, args)
    args = (*args, new_totals(launch), *launch.tail)
    for phase, grid in launch.phases:
        _run(launch, args, grid, phase)


def _run(launch: _Launch, args: tuple, grid: tuple[int, int], phase: _Phase) -> None:
    """One launch of ``scan_kernel``: the direct launcher once the kernel is compiled and
    loaded (on a GPU), else through Triton's JIT (compiles on first use; the interpreter; and
    whenever a profiler has set Triton's launch hooks, which only the JIT calls)."""
    device = launch.device
    if not DIRECT_LAUNCH or device.type != "cuda" or _INTERPRETED or _launch_hooks_set():
        kernels.scan_kernel[grid](*args, **phase._asdict(), **launch.meta)
        return
    # A compiled kernel also depends on which pointers are 16-byte aligned (Triton
    # specialises them); the launch description (shapes, strides, dtypes) does not.
    key = (phase, *[args[i].data_ptr() & 15 == 0 for i in launch.pointers])
    direct = launch.direct.get(key)
    if direct is not None:
        run, head, constexprs = direct
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        run(grid[0], grid[1], 1, stream, *head, *args, *constexprs)
        return
    compiled = kernels.scan_kernel[grid](*args, **phase._asdict(), **launch.meta)
    launch.direct[key] = _direct_launcher(compiled, launch.meta, phase._asdict())


def linear_scan(a, b, initial, reverse, out):
    _launch(0, out, x=(b,), coefs=(0.0, 0.0, a), boot=initial, reverse=reverse)


def gae(rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out):
    _launch(
        1,
        out[0],
        out[1],
        x=(rewards, values, next_values),
        flags=(terminated, truncated),
        coefs=(gamma, lmbda),
        boot=bootstrap_value,
        has_next=next_values is not None,
        has_values=True,
    )


def lambda_returns(
    rewards, values, terminated, truncated, next_values, bootstrap_value, gamma, lmbda, out
):
    _launch(
        2,
        out,
        x=(rewards, values, next_values),
        flags=(terminated, truncated),
        coefs=(gamma, lmbda),
        boot=bootstrap_value,
        has_next=next_values is not None,
        has_values=values is not None,
    )


def discounted_returns(rewards, terminated, truncated, next_values, bootstrap_value, gamma, out):
    _launch(
        3,
        out,
        x=(rewards, None, next_values),
        flags=(terminated, truncated),
        coefs=(gamma,),
        boot=bootstrap_value,
        has_next=next_values is not None,
    )


def vtrace(
    rewards,
    values,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    next_values,
    bootstrap_value,
    gamma,
    lmbda,
    rho_bar,
    c_bar,
    pg_rho_bar,
    out,
):
    _launch(
        4,
        out[0],
        out[1],
        x=(rewards, values, next_values, target_log_probs, behavior_log_probs),
        flags=(terminated, truncated),
        coefs=(gamma, lmbda, rho_bar, c_bar, pg_rho_bar),
        boot=bootstrap_value,
        has_next=next_values is not None,
        has_values=True,
    )


def retrace(
    rewards,
    q_values,
    next_expected_q,
    target_log_probs,
    behavior_log_probs,
    terminated,
    truncated,
    gamma,
    lmbda,
    c_bar,
    trace,
    out,
):
    _launch(
        5,
        out,
        x=(rewards, q_values, next_expected_q, target_log_probs, behavior_log_probs),
        flags=(terminated, truncated),
        coefs=(gamma, lmbda, 0.0, c_bar),
        trace=TRACE_IDS[trace],
    )


def eligibility_traces(x, done, gamma, lmbda, initial, out):
    _launch(6, out, x=(x,), flags=(done,), coefs=(gamma, lmbda), boot=initial, reverse=False)
