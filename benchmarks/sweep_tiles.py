"""Developer tool: sweep tile shapes / warps / time splits of the Triton backend on one GPU.

Monkeypatches ``triton_backend._plan`` and times GAE (CUDA-graph replay, L2 flushed by a large
write before each replay) for each candidate; prints the best per shape and layout.

    python benchmarks/sweep_tiles.py
"""

from __future__ import annotations

import functools
import itertools

import torch
import triton
import triton.testing

import rl_triton_core as rtc
from rl_triton_core import triton_backend

SHAPES = [(1024, 65536), (128, 4096), (131072, 16), (4096, 1024)]


def candidates(T, N, time_major):
    """(block_t, block_n, unroll, num_warps, split) to try."""
    if time_major:
        grid = itertools.product([1], (128, 256, 512), (8, 16), (1, 2, 4), (1, 16))
    else:
        grid = itertools.product((128, 512, 1024, 2048), [1], [1], (2, 4, 8), (1, 16))
    for bt, bn, unroll, warps, split in grid:
        if bt * bn < 32 * warps or (split > 1 and split * bt * unroll * 2 > T) or bt > 2 * T:
            continue
        yield bt, bn, unroll, warps, split


def main():
    dev = torch.device("cuda")
    flush = torch.empty(64 << 20, dtype=torch.int32, device=dev)

    def replay(graph):
        flush.zero_()
        graph.replay()

    for (T, N), batch_major in itertools.product(SHAPES, (False, True)):
        shape = (N, T) if batch_major else (T, N)
        r = torch.randn(shape, device=dev)
        v = torch.randn(shape, device=dev)
        term = torch.rand(shape, device=dev) < 0.05
        boot = torch.randn(N, device=dev)
        want, _ = rtc.gae(
            r.double(),
            v.double(),
            term,
            bootstrap_value=boot.double(),
            time_dim=int(batch_major),
            backend="torch",
        )
        results = []
        for bt, bn, unroll, warps, split in candidates(T, N, not batch_major):

            def plan(
                kind, T_, N_, tm, device, bt=bt, bn=bn, unroll=unroll, warps=warps, split=split
            ):
                step = bt * unroll
                chunk = triton.cdiv(triton.cdiv(T_, split), step) * step
                return triton_backend.Plan(bt, bn, unroll, chunk, triton.cdiv(T_, chunk), warps)

            triton_backend._plan = plan
            adv = torch.empty_like(r)
            ret = torch.empty_like(r)

            call = functools.partial(
                rtc.gae,
                r,
                v,
                term,
                bootstrap_value=boot,
                out=(adv, ret),
                time_dim=int(batch_major),
                backend="triton",
            )

            try:
                call()
                err = ((adv.double() - want).abs().max() / want.abs().max()).item()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    call()
                ms = triton.testing.do_bench(
                    functools.partial(replay, g), warmup=5, rep=40, return_mode="median"
                )
                ms_flush = triton.testing.do_bench(
                    flush.zero_, warmup=5, rep=40, return_mode="median"
                )
                results.append((ms - ms_flush, bt, bn, unroll, warps, split, err))
            except Exception as e:  # a sweep skips configs that do not compile
                print("skip", bt, bn, unroll, warps, split, type(e).__name__, str(e)[:100])
        results.sort()
        floor_us = r.numel() * 17 / 4.2e6
        print(f"[T={T}, N={N}] {'batch' if batch_major else 'time'}-major floor {floor_us:.1f} us")
        for ms, bt, bn, unroll, warps, split, err in results[:6]:
            print(
                f"   {ms * 1e3:8.1f} us  BLOCK_T={bt} BLOCK_N={bn} UNROLL={unroll} warps={warps}"
                f" split={split}"
                f" err={err:.1e}"
            )
        print(f"   worst {results[-1][0] * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    main()
