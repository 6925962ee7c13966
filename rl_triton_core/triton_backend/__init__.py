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


# Estimators whose few-long-sequence plan runs several chunks side by side in a program
# (sweep 11: faster there for these three, slower for the estimators that read more inputs).
_SIDE_BY_SIDE = (kernels.DISCOUNTED.value, kernels.TRACES.value, kernels.SCAN.value)
# Estimators whose plans prefetch (sweep 12): time-major with a warp per 32 columns
# 0.92-0.98x the time (V-trace, in that plan since sweep 22, 0.65x at [1024, 65536]; Retrace
# 1.0x, and since sweep 35 in whole tiles: see _plan), few long sequences (8 x 16
# tiles) 0.78x for V-trace and 0.95x for GAE (GAE's values tile is carried for its returns),
# batch-major one-sequence programs 0.90x for eligibility traces / episodic sums; elsewhere
# 0.98-1.7x, no gain beyond noise. (Since sweep 37 not TD(lambda)'s partial tiles of columns,
# nor float64's: see _plan.)
_PREFETCH_WIDE = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                  kernels.VTRACE.value, kernels.TRACES.value, kernels.SCAN.value)  # fmt: skip
_PREFETCH_FEW_LONG = (kernels.GAE.value, kernels.VTRACE.value)
# Estimators whose forward scans of float32 values run time-major tiles of 8 rows and 128
# columns from N = 65536 (below T = 32 since sweep 26), each thread holding 8 rows of 4 columns
# (the scan in its registers, 16-byte accesses; a warp per 128 columns), prefetching (sweep 22:
# 0.86-0.91x the time of the 4 x 32 tiles at [64 .. 1024, 65536], 0.93-1.00x at T = 16; the
# reverse scan 1.03-1.05x and discounted returns 1.19x at N = 65536; bfloat16 traces 1.10x, a
# bfloat16 tile of 128 columns spanning two rows of lanes, though the bfloat16 forward scan
# measured 0.94x: one rule, by element size).
_IN_THREAD_ROWS = (kernels.TRACES.value, kernels.SCAN.value)
# Estimators whose wide time-major plans (below) run one-warp tiles of 8 rows and 16 columns,
# prefetching, in place of a warp per 32 columns in 4-row tiles, from N = 65536 and T = 64
# (sweep 23: 0.79-0.97x the time at T = 64 .. 1024; TD(lambda) 1.02x at T = 64; 0.95-1.09x
# at T = 16 and 32), GAE only with 4-byte values (bfloat16 1.03-1.04x); V-trace (1.19-1.36x)
# and Retrace (1.09-1.16x) keep 4 x 32. At 16384 <= N < 65536 (T < 256) every estimator but
# Retrace (1.08-1.11x; bfloat16 0.93x) runs them: 0.54-0.95x the time, TD(lambda) 1.01x at
# [16, 16384]. (Ratios: best of two rounds each; see the sweep.) Since sweep 26 the pipelined
# tiles take every call from T = 32 but Retrace's and float64 ones (since sweep 34 Retrace's
# too from N = 65536): these tiles now run float64 calls (from N = 65536 from T = 64, not
# GAE's) and, at 16384 <= N < 65536, the other calls below T = 32. (Since sweep 37 float64's
# do not prefetch from N = 65536: see _plan.)
_ONE_WARP_WIDE = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                  kernels.TRACES.value, kernels.SCAN.value)  # fmt: skip
# Estimators whose time-major plans at N = 2 and 4 run resident (sweep 19; the scan, traces and
# Retrace measured 0.98-1.27x the time of the plans they keep).
_RESIDENT_FEW = (kernels.GAE.value, kernels.LAMBDA.value, kernels.DISCOUNTED.value,
                 kernels.VTRACE.value)  # fmt: skip
# The most sequences at which an estimator's few-long plan runs 4- or 8-column chunks side by
# side in 64-column tiles (sweep 16: 0.58-0.97x the time of 8 x 16 tiles, which leave 12 of 16
# columns idle at N = 4, for these four; V-trace, traces and the scan no faster; GAE and
# discounted returns slower at N = 8, TD(lambda) and Retrace 0.83-0.97x there).
_NARROW_SIDE_BY_SIDE = {kernels.GAE.value: 4, kernels.DISCOUNTED.value: 4,
                        kernels.LAMBDA.value: 8, kernels.RETRACE.value: 8}  # fmt: skip
# Estimators whose few-long plan (time-major, 8 < N <= 16) pipelines its tile loop in 8 x 16
# one-warp tiles in 3 stages from the T given (sweep 26: 0.72-0.98x the time of chunks side by
# side at [65536 .. 1048576, 16]; Retrace 0.92-0.94x that of its 8 x 16 tiles unpipelined at
# [131072, 16], 1.02-1.05x at [65536, 16]; GAE, TD(lambda) and V-trace 0.98-1.08x at
# [131072, 16], not taken)
_PIPELINED_FEW_LONG = {kernels.DISCOUNTED.value: 65536, kernels.TRACES.value: 65536,
                       kernels.SCAN.value: 65536, kernels.RETRACE.value: 131072}  # fmt: skip


def _unsplit_walk(kind: int, T: int, N: int, reverse: bool, sms: int) -> tuple[int, int] | None:
    """``(block_t, num_warps)`` where a batch-major call (the caller's branch) of more than 256
    steps (below 8 x SMs sequences: 128; V-trace: 64) runs each sequence in one program,
    unsplit, instead of the plans of few sequences (split one-sequence tiles; unsplit 128-step
    tiles of 2 warps at 128 < T <= 256; V-trace's 4-sequence tiles); None elsewhere.
    * V-trace at 64 < T <= 256, 2 to 8 x SMs - 1 sequences: one one-warp tile of next_pow2(T)
      steps (sweep 45, set AL, against its 64 x 4 tiles of 4 warps, split in two launches past
      T = 128: 0.40-0.50x the time at T of 129-256 and N of 64-1055, 0.63-0.84x at T of 65-128;
      bfloat16 and float64 0.54x and 0.55x at [256, 1024]; 2 warps 0.43-0.98x).
    * The other estimators at 128 < T <= 256, 2 to 8 x SMs - 1 sequences: the same 256-step
      one-warp tile (sweep 46, set AN, float32, against two 128-step tiles of 2 warps:
      0.71-0.96x the time at T of 200 and 256 and N of 32-1024, eligibility traces 1.02x at
      [200, 32]; 2 warps 0.69-1.07x; bfloat16 0.70-0.92x at [256, 1024] and [200, 64],
      float64 0.76-0.97x at [256, 1024]; T of 129-199 not timed). At T = 128 one warp took
      0.88-1.04x: not taken.
    * Up to T = 2048 (V-trace 1024) and 8 x SMs - 1 sequences (V-trace 256): one tile of
      next_pow2(T) steps, up to 8 warps (sweep 27: one sequence 0.44-0.63x the time of the
      split 128-step tiles from T = 300 to 2048, V-trace 0.79x at T = 1000, 1.27x at 2048; 2-16
      sequences 0.39-0.69x at [600 .. 2048, 2 .. 16]. Sweep 28: 32-1000 sequences 0.43-0.78x
      at [300 .. 2048, 32 .. 1000]; V-trace 0.59-0.98x the time of its 4-column tiles at
      [512 .. 1024, 4 .. 256], 1.18-1.25x at T = 2048 and 1.31x at [1024, 512]; from N = 8 x
      SMs 0.97-1.99x that of the one-warp 256-step tiles).
    * Past T = 2048, below 8 x SMs sequences, a walk of several tiles (sweep 30, H200,
      float32; 8-warp programs fit 4 an SM, 4-warp ones 8):
      - forward scans of up to 4 x SMs sequences (65 or more up to T = 4096, 256 or more at
        any T): 2048-step tiles of 8 warps, 0.60-0.98x the time at [2049 .. 131072, 65 .. 528]
        (at N = 528 and T of 2049-3000 0.98-1.05x; below N = 256 past T = 4096 0.89-2.16x, not
        taken); of more, 512-step tiles of 4 warps, 0.61-0.86x at [2049 .. 65536, 600 .. 1000]
        (2048-step tiles there 0.97-1.13x at T = 2049: a second tile of one step);
      - backward scans of more than 4 x SMs sequences from T = 4096, V-trace's aside (1.6-4.0x
        in unsplit tiles of 4-8 warps at N = 300-1000): 1024-step tiles of 4 warps, 0.55-0.98x
        at [4096 .. 65536, 600 .. 1000] (at T = 2049 0.95-1.76x; at N = 300 and 528 unsplit
        8-warp tiles 0.61-1.59x: not taken)."""
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
    short rows runs tiles of several whole sequences, one tile a program; None elsewhere.
    Before, each sequence was a program of its own, whose 128-step tile had 112 masked steps
    at T = 16: the time was that of the number of programs (at N = 65536 44-46 us at any T up
    to 128 for GAE, TD(lambda), discounted returns, traces and the scans, Retrace 45-48 to
    T = 64; two copies of a [16, 65536] tensor take 10.8).
    * Up to T = 64 (V-trace to 32, from N = 16384, not in float64), from N = 1024 (4096 past
      T = 32): one-warp tiles of next_pow2(T) steps (at least 16) and 256 elements (V-trace,
      and Retrace to T = 16: 128). Sweep 45 (graph replay, L2 flushed, against the plans
      before; set AJ): float32 at 16 shapes of T 1-64 and N 4096-100000, 0.17-0.99x the time
      ([16, 65536] 0.18-0.52x, [64, 4096] 0.75-0.94x; each the new median over the one
      before); at T of 16-32 and N of 1024-2048 0.69-1.02x; bfloat16 and float16 at
      [16, 65536], [32, 16384] and [64, 4096] 0.18-0.90x; float64 at [32, 16384] 0.56-0.87x,
      but V-trace 1.08x (not taken). Not taken either: [64, 2048] (0.85-1.12x); V-trace at
      [16, 4096] (1.07x in 16 x 8 tiles, set AI) and at T = 64 (1.00-1.34x).
    * 65-128 steps, discounted returns, eligibility traces, episodic sums and the scans (the
      estimators with the fewest inputs), from N = 4096: 128 x 4 tiles of 2 warps (set AK:
      0.54-0.81x the time at [96 .. 128, 65536], 0.71-0.93x at [128, 16384], 0.86-1.00x at
      [128, 4096]; GAE 0.94-1.13x and TD(lambda) 0.90-1.07x in these or 128 x 2 tiles: not
      taken; the forward scan untimed: traces and episodic sums, forward scans too, were)."""
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
    faster than the plans of ``_plan`` on an H200: time-major pairs and fours of sequences
    with 131072 < T <= 262144 (timed at 200003 and 262144) for GAE, TD(lambda), discounted
    returns and V-trace, 0.48-0.72x the time; one sequence of 524288 < T steps (timed at
    10^6 and 2^20) for V-trace, 0.69x. None elsewhere: at N = 8 and 16 it measured 1.0-5.0x
    the time; one sequence of the other estimators 0.87-1.07x at 2^20 and some 0.85-0.88x at
    131072, one sample each (not taken).
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
    (a partial tile of columns). Sweep 37 (graph replay, L2 flushed; each plan against itself
    with prefetch flipped): TD(lambda) without prefetch 0.86-0.96x the time in float32 and
    16-bit at T of 8-4096 (on unaligned 16-bit rows 0.91-0.95x, where the other estimators took
    1.03-2.18x; whole columns 0.98-1.06x, T = 31 included); float64 V-trace 0.49-0.64x, GAE
    0.86-0.95x, discounted returns 0.91-0.96x, the backward scan 0.99-1.03x at T of 16-128 and
    N of 65544-131080 (partial only in steps: not timed). Float64 is ``eight_byte`` (float64
    outputs): float32 calls that accumulate in float64 were not timed and follow float32's."""
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

    The shapes come from sweeps of GAE on an H200 (benchmarks/sweep_tiles.py, results in
    benchmarks/results/sweep_tiles_h200.txt); where no sweep covered a case, the previous
    choice stays.
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
        # Enough sequences for one-warp tiles without a split. V-trace's plans there (sweep 22,
        # timed to T = 1024: 0.52-0.80x the time of its row-walking plan below in float32,
        # 0.96x in bfloat16; 1.3-1.6x at N = 16384 and 32768 from T = 256, which keep it;
        # sweep 23: 0.54-0.86x the time of its plans before at N >= 16384 below T = 256)
        many = N >= 65536 or (N >= 16384 and T < 256)
        wide = time_major and N > 16 and (not vtrace or many)
        heavy = vtrace or retrace
        long_enough = 512 if heavy and N < 16384 else 256
        min_chunk = None  # default: 4 tiles (2 along a contiguous time axis)
        if time_major and N >= 16384 and T >= 32 and reverse and not aligned and not acc64:
            # backward scans of 16-bit rows whose time stride is not a multiple of 16
            # elements (no divisibility hint), where the pipelined tiles below would run:
            # one-warp 4 x 32 tiles (Retrace 8 x 16), prefetching, unpipelined, no split.
            # Triton's pipelined loads (cp.async, 4 bytes or more) cannot copy 2-byte elements
            # at rows of unknown alignment: offline (sm_90 SASS, Triton 3.6) GAE's 8 x 32 tile
            # at [512, 33000] in bfloat16 issues no asynchronous copy at all, 4 plain loads an
            # element. Sweep 35, bfloat16 and float16 at [512, 33000], [256, 65000],
            # [1024, 16392], [128, 65544] and [64, 20008], against the plans before (pipelined
            # but Retrace's at [64, 20008]): GAE 0.40-0.60x the time, TD(lambda) 0.52-0.84x,
            # discounted returns 0.45-0.99x, V-trace 0.50-0.79x, Retrace 0.59-0.86x (bfloat16
            # in 4 x 32 tiles at the first four shapes 0.99-1.16x), the backward scan
            # 0.73-0.97x. Forward scans (eligibility traces, episodic sums) took 1.21-2.12x in
            # these tiles, and float32 rows 0.54-2.21x across estimators in either tile: they
            # stay pipelined. TD(lambda) prefetches only in whole columns (contiguous rows of
            # unknown alignment have partial ones: N is not a multiple of 16).
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
            # one-warp 8 x 32 tiles (V-trace 4 x 32) in a tile loop software-pipelined by
            # Triton in 3 stages (its loads issued asynchronously, stages ahead), no split
            # (sweep 26: 0.71-0.99x the time of the plans below at [32 .. 1024, 65536] and
            # [128, 16384], bfloat16 0.70-0.93x at [1024, 65536]; at T = 16 0.90-1.13x, and
            # Retrace 1.03-1.09x in 8 x 32 tiles then: not taken).
            # From [256, 65536] in float32, GAE in 4 x 32 tiles (4 x 64 since sweep 43, below) and
            # V-trace in 4 x 64 (sweep 27: 0.94-0.98x and 0.98-0.99x the time at T of 256-1024,
            # V-trace 0.98x in three harness rounds at [1024, 65536] against one outlier at 1.08x;
            # 1.00-1.01x at T = 64; 1.15x and 1.47x at [128, 16384]; in bfloat16 1.08x and 1.19x;
            # the other estimators 1.02-1.19x in 4 x 32 tiles).
            # Sweep 34 (float32 and bfloat16, against the plans before):
            # * from N = 32768 at T >= 256 too (below T = 256 these shapes ran these tiles
            #   already), in 8 x 32 tiles (V-trace 4 x 32), not the 4 x 32 or 4 x 64 that
            #   float32 GAE and V-trace run from [256, 65536]; before, the 16-column tiles of
            #   the branch below: 0.65-0.98x the time at [512, 32768], [2048, 32768] and
            #   [1024, 49152] (discounted returns, traces and episodic sums 1.07x at
            #   [512, 32768] in float32), V-trace 0.71-0.88x, linear_scan 0.75-1.00x. At
            #   N = 16384 these tiles took 1.11-1.56x, at 24576 0.98-1.27x: not taken (Retrace
            #   there 0.84-1.01x and 0.73-0.89x: not validated, a lead);
            # * Retrace from N = 65536 (4 x 32 tiles unpipelined before) in 4 x 32 tiles,
            #   4 x 64 from T = 256: bfloat16 0.82-0.92x at T of 32-128, 0.73x at [1024, 65536],
            #   0.81-0.95x at N = 131072; float32 0.94-1.01x (its time at [1024, 65536] was
            #   1.03x the floor); float16 0.82-0.92x at T of 32-128, 0.76-0.79x at 256-1024;
            # * from N = 131072 in 4 x 64 tiles (8 x 32 before; float32 GAE from T = 256 4 x 32,
            #   Retrace 4 x 32 unpipelined): 0.76-0.94x at T of 256 and 1024, 0.86-1.02x at
            #   T of 32 and 128 (float32 traces 1.01x, the scan 1.02x at T = 32); V-trace in
            #   float32 back in 4 x 32 tiles there: 0.85x and 0.91x.
            # Sweep 35 (Retrace, float32, bfloat16 and float16, against the plans before):
            # * at 16384 <= N < 65536 from T = 32 (4 x 32 tiles unpipelined before) in 8 x 32
            #   tiles: 0.63-0.91x the time at T of 32-200;
            # * from N = 20480 at T >= 256 (8 x 16 tiles in 4 stages before) in 8 x 32 tiles:
            #   0.61-0.99x at N of 20480-28672 (at N = 16384 bfloat16 took 1.09-1.17x).
            block_t, block_n, unroll, warps, target, stages = 4 if vtrace else 8, 32, 1, 1, 0, 3
            # Sweep 43 (float32, T of 256 and 1024, N of 32768-65536, against 8 x 32): 4 x 64
            # tiles from N = 57344 for GAE (0.96x and 1.00x the time there, 0.82x and 0.94x at
            # 65528, 1.06-1.24x below 57344; at 65536 0.99-1.00x its 4 x 32 tiles of before)
            # and from 49152 for Retrace (0.92-0.98x, 0.79-0.89x at 65528; 1.05x at 32768); the
            # new rule against the plans before at T of 256-2048: GAE 0.80-1.01x, Retrace
            # 0.77-1.00x. V-trace's unchanged (4 x 64 at N = 65528: 0.88x at T = 1024, 1.07x at
            # T = 256).
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
        elif wide and many:  # one-warp tiles, no split:
            block_t, block_n, unroll, warps, target = 4, 32, 1, 1, 0  # a warp per 32 columns,
            # or 8 x 16 tiles (see _ONE_WARP_WIDE); float64 TD(lambda) never prefetches (sweep
            # 37: without 0.84-1.01x the time in partial tiles of columns, 0.86-0.94x whole)
            lambda64 = eight_byte and kind == kernels.LAMBDA.value
            prefetch = (
                kind in _PREFETCH_WIDE
                and not lambda64
                and _columns_allow_prefetch(kind, N, block_n, reverse, eight_byte)
            )
            if retrace:  # (below T = 32, or accumulating in float64) prefetching in whole
                # tiles (T and N multiples of 4 and 32), which then run unmasked, but not in
                # float64 (1.07-1.13x the time; sweep 35). Bfloat16 needed masks without
                # prefetch (see _full_tiles); with it 0.96-1.10x the time of the masked tiles
                # at T of 8-28 and N of 16384-131072, unmasked without it 1.07-1.29x; float32
                # and float16 0.96-1.06x (sweeps 35-36). Partial tiles (masked either way) do
                # not prefetch: with it 1.12-1.27x the time in 16-bit at T of 25 and 31,
                # 1.00-1.04x in float32 (sweep 36), 1.04-1.14x in partial tiles of columns (sweep
                # 37, float32 and 16-bit).
                prefetch = whole_only = not acc64
            if (not retrace and N < 65536) or (
                T >= 64 and kind in _ONE_WARP_WIDE and kind != kernels.GAE.value
            ):
                # prefetching, partial tiles too (TD(lambda) without: 1.20-1.27x the time in
                # 16-bit at [25, 16392] and [16, 33000]), but not in float64 from N = 65536
                # (sweep 37: TD(lambda) 0.71-0.80x the time at T of 64-1024, discounted returns
                # 0.85-0.91x, traces and episodic sums 0.86-1.01x, the scans 0.99-1.02x; but
                # TD(lambda) 1.23x at [128, 65544], partial in columns)
                block_t, block_n, prefetch = 8, 16, not (eight_byte and N >= 65536)
        elif time_major and 16384 <= N < 32768 and not acc64:  # (T >= 256: not `many`)
            # one-warp 16 x 16 tiles (V-trace, Retrace: 8 x 16) pipelined in 4 stages (GAE 3),
            # no split (sweep 26: 0.58-0.88x the time of the split plans below at [256 ..
            # 4096, 16384], discounted returns 0.92-1.00x; GAE's 3 stages 0.94-0.97x the time
            # of 4 at [512, 16384] and [4096, 16384] in sweep 27, 0.94-0.98x in sweep 26).
            # 16-bit values too since sweep 33: in bfloat16 0.47-0.92x the time of the plans
            # below at [256, 16384], [2048, 32768] and [4096, 16384] (GAE 0.77-0.86x), but
            # Retrace 1.00x at [2048, 32768]; float16 not timed; float64 keeps the plans below.
            # (From N = 32768 the pipelined branch above takes these calls since sweep 34,
            # Retrace's from N = 20480 since sweep 35.)
            block_t, block_n, unroll, warps, target, stages = 8 if heavy else 16, 16, 1, 1, 0, 4
            if kind == kernels.GAE.value:
                stages = 3
        elif (
            time_major
            and 1024 <= N < 16384
            and N % 8 == 0
            and 32 < T <= (512 if four_byte else 256)
            and aligned
            and not acc64
        ):
            # PPO-sized rollouts: narrow one-warp tiles in a loop software-pipelined in 3-4
            # stages, no split, so that there are N / 8 (from N = 4096: 16 x 8 tiles, 4 stages)
            # or N / 4 programs (64 x 4 tiles, 3 stages). Sweep 44 (graph replay, L2 flushed),
            # against the plans before (64 x 16 or 128 x 16 tiles of 8 warps; from T = 256 the
            # split 4 x 64 tiles, V-trace and Retrace from 512), every estimator (the forward
            # linear_scan untimed: traces and episodic sums are forward scans), float32 at 15
            # shapes of T 40-512 and N 1024-12288: 0.49-0.99x the time ([128, 4096] 0.71-0.89x,
            # [256, 1024] 0.49-0.69x), but discounted returns 1.08x at [64, 4096] and Retrace
            # 1.03x at [48, 4096]; bfloat16 at [64, 8192], [128, 4096] and [256, 1024]
            # 0.55-0.99x (contiguous 16-bit rows are `aligned` at N a multiple of 16 only). Not
            # taken: bfloat16 V-trace at [512, 4096] took 1.28x; N not a multiple of 8
            # ([128, 4095]: Retrace 1.23x, GAE 1.06x); T = 1024 (mixed, 0.53-1.50x).
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
            paired = not reverse  # forward chunks in pairs of tiles (sweep 39, set T: traces
            # and episodic sums 0.66-1.02x the time, the forward scan 0.87-1.02x at 9 shapes
            # of [200000 .. 10^6, 17 .. 200]; see the side-by-side few-long tiles below)
        elif time_major and N >= 16384:  # V-trace, T >= 256 below N = 65536: each thread
            block_t, block_n, unroll, warps, target = 1, 128, 8, 2, 16 * sms  # walks its column
        elif time_major and N < 256 and T >= 512:
            # few sequences (up to T = 16384 beyond 16 of them, but for V-trace: see above;
            # V-trace's from T = 16384 took 0.55-0.93x the time of the split 8 x 16 tiles
            # above, sweep 28): one-warp programs of 8 x 16 tiles in chunks of 32 steps (64
            # past T = 65536), at most 4096 programs along time (the two-level carry-in keeps
            # many chunks cheap; sweep 13). Sweep 27 took these from T = 512 (they ran from
            # T = 8192 at N <= 16 before): 0.27-0.63x the time of the 128 x 16 tiles of 8 warps
            # below at [512 .. 4096, 2 .. 16] for every estimator (at T = 256 0.62-1.06x, at
            # T = 128 1.11-1.49x: not taken), and 0.43-0.76x that of the 32 x 32 tiles of 8
            # warps at [512 .. 8192, 32 .. 200] (Retrace 0.94x at [2048, 200]). From T = 65536,
            # the estimators with the fewest inputs run 128 / cols chunks side by side in a
            # program instead, so that each thread scans its own columns in registers (GAE,
            # TD(lambda), V-trace and Retrace measured slower that way at N = 16); with at most
            # 4 or 8 sequences (see _NARROW_SIDE_BY_SIDE) 64 / cols chunks side by side at any
            # such T (sweep 16)
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
                # Forward scans there (traces, episodic sums, the forward scan) in chunks of
                # an odd number of 8-step tiles beyond one took up to 2.5x the time of chunks
                # rounded up to a multiple of 16 steps (sweep 39, set R: 0.40-1.02x the time
                # rounded at every one of 112 such plans, N of 5-16 and T of 200000 .. 3*10^6
                # in float64, float32, float32 accumulating in float64, bfloat16 and float16;
                # N = 3 at 655360; 16-bit 0.49-1.02x, float32 0.40-0.99x). One-tile chunks stay
                # (1.09-1.21x rounded, set Q), as do backward scans' (1.04-1.17x, set Q).
                # Pipelined 8 x 16 tiles (N of 9-16) were mixed rounded (0.83-1.03x, set S).
                # Sweep 40 paired them only where T is a multiple of 16: the fast code needs
                # Triton's specialisation of both T and the chunk as such (otherwise ptxas spreads
                # a tile's loads among its arithmetic, 12.7 against 2.6 cycles of long-scoreboard
                # stall an instruction at T = 1000000 in chunks of 120 against 128; float64
                # traces 307 us at [1000008, 12] in chunks of 128 against 135 at [1000000, 12];
                # the 8 plans left unrounded took 0.89-0.96x the time of rounded ones at T of
                # 327688, 1000003 and 1000008). Where T is not, T_TAIL (_tail_programs) gives
                # the fast code back to the programs not holding step T - 1: rounded, float64
                # traces and the forward scan at [1000008, 12] took 0.82-0.83x the time of
                # unrounded 120-step chunks without T_TAIL (sweep 41, set X).
                paired = not reverse
        elif time_major and N <= 16:  # few sequences below T = 512: tall, narrow tiles
            block_t, block_n, unroll, warps, target = 128, 16, 1, 8, 8 * sms
        elif time_major and N < 1024:  # (16 < N < 256 below T = 512; to N = 1024 below 256,
            # V-trace and Retrace below 512)
            block_t, block_n, unroll, warps, target = 32, 32, 1, 8, 8 * sms
        elif time_major and 1 < T <= (16 if retrace else 32):
            # short rollouts (1024 <= N < 16384): one-warp 16 x 8 tiles (sweep 23: the 64 x 16
            # tiles of 8 warps below took 1.07-2.14x their time at T of 16-32 and N of 1024-8192;
            # discounted returns 0.96x at [32, 4096]; Retrace 1.14-1.24x at T = 16 but
            # 0.79-0.95x at T of 24-32; 0.85-0.89x at T = 1)
            block_t, block_n, unroll, warps, target = 16, 8, 1, 1, 0
        elif time_major:  # 65-128 steps: one 128-step tile a program, 0.86-1.01x the time
            # of two 64-step tiles at [128, 4096] (sweep 18: T = 128 only), but for V-trace
            # (1.36x at [128, 16384], sweep 22)
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
            # shuffle is cheap in short tiles (one sequence: 3 of their 4 columns would be
            # padding). Sweep 22, N >= 8 x SMs: to T = 64 these tiles take 0.81-0.88x the time of
            # a program per sequence (below); that takes 0.78-0.98x theirs from T = 128 (T of
            # 65-127 not timed); few long sequences: see the split one-warp tiles below. Since
            # sweep 45 _short_rows takes T <= 32 from N = 16384 (not float64), _unsplit_walk
            # 64 < T <= 256 below 8 x SMs sequences (N > 1)
            block_t, block_n, unroll, warps, target = 64, 4, 1, 4, 8 * sms
        elif N >= 8 * sms:  # time is contiguous: a parallel scan along it, one sequence per
            # program (a warp); V-trace in 128-step tiles (0.95-0.99x of 256 from T = 256)
            block_t = 128 if T <= 128 or vtrace else 256
            block_n, unroll, warps, target = 1, 1, 1, 0
            # (the forward scan too since sweep 30: 0.45-1.04x the time without at [16 ..
            # 65536, 1056 .. 65536])
            prefetch = kind == kernels.TRACES.value or (kind == kernels.SCAN.value and not reverse)
        else:  # program (a warp); with few sequences, programs split along time
            block_n, unroll, target = 1, 1, 8 * sms
            if T <= 2048:  # (T <= 128; one sequence to T = 256, or V-trace's from 1025)
                block_t, warps = 128, 2
            elif not reverse and N <= 64:  # forward scans (traces, episodic sums, the
                # forward scan) of few sequences: 1024-step tiles of 8 warps in about 4 x SMs
                # programs (one wave), a tile or more each (sweep 29: 0.74-1.03x the time of
                # the plans before at [8192 .. 2097152, 1 .. 64]: the 512-step 4-warp tiles
                # in 8 x SMs programs below, for one sequence from 2^19 1024-step tiles in
                # 2-tile chunks; in 8 x SMs programs 0.98-1.07x, in one-tile chunks up to 1.56x)
                block_t, warps, target, min_chunk = 1024, 8, 4 * sms, 1024
            elif N == 1 and T >= 524288:  # one long sequence, backward: 1024-step tiles
                # of 8 warps in 2-tile chunks (sweep 13). The one-warp tiles below took
                # 0.71-0.98x the device time at [2^19 .. 2^21, 1] for GAE, TD(lambda) and
                # discounted returns (sweep 29; Retrace, the backward scan 0.97-1.05x to 2^20,
                # V-trace 0.35x at 2^21), but in 2048-4096 chunks, with a group pass: a third
                # launch, which costs a full call more host time than that saves
                block_t, warps = 1024, 8
            elif not reverse:  # forward scans (65-255 sequences past T = 4096 since sweep 30;
                # more: _unsplit_walk): in the one-warp tiles below traces took 1.12-1.18x the
                # time at [131072 .. 1048576, 16] and [65536, 256], 0.82-1.02x at smaller
                # shapes (sweep 25)
                block_t, warps = 512, 4
            else:  # backward scans: one-warp tiles of 256 steps (V-trace 128) scanned by
                # fours, about 32 x SMs programs of a tile or more (sweep 25: 0.70-0.97x the
                # time of 4-warp 512-step tiles in 8 x SMs programs from [4096, 16] to
                # [1048576, 16] and [4096, 1000], which _unsplit_walk takes since sweep 30;
                # V-trace 0.52-0.79x that of its 4-column tiles, of one sequence 0.81x and
                # 1.07x at [131072, 1] and [262144, 1])
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
