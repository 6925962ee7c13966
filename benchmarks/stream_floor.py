"""The streaming floor: how fast a kernel with no scan moves an estimator's per-step bytes.

    python benchmarks/stream_floor.py [--graphs] [--shapes TxN ...] [--walk BTxBNxWxS ...]
                                      [--layouts time-major batch-major] [--out F.json]

The harness's bandwidth floor is the estimator's bytes (each input read once, each output
written once) over the bandwidth of a large copy. A copy reads and writes equal bytes of one
dtype; an estimator reads two to six inputs, bool flags among them, and writes one or two
outputs. This script asks what that byte mix costs by itself: an elementwise Triton kernel
reads every per-step input of the estimator's problem (the harness's inputs, flat: each is
contiguous in its layout) and writes as many outputs of the estimator's dtype, with no
recursion. Its time, under the harness's L2 flushes and back to back, is what this streaming
kernel reaches for those bytes (not a bound on every kernel); ours over it is roughly what
the scan costs. Side by side in one process: the copy, the streaming kernel (the better of
two block sizes) and ours. The [N] boundary tensors are not read (at most 0.17% of the bytes
at the default shapes).

With ``--walk`` it also times the same sums in our plans' access pattern: programs of BN
sequences walking all T steps in BT x BN tiles, W warps, the loop pipelined in S stages (e.g.
``--shapes 4096x16384 --layouts time-major --walk 16x16x1x3 8x16x1x4``, the tiles of that
row's plans). Where the walk is as slow as ours, the access pattern costs the time, not the
scan. With ``--graphs`` (small problems) it times CUDA-graph replays instead, as the
harness's graph-replay target does, beside an empty kernel's replay.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baselines as bl
import harness as h
from flush_effect import device_us

LARGE = ["256x65536", "1024x65536", "4096x16384"]
SMALL = ["16x1024", "256x1024", "128x4096", "32x16384"]  # the worst of the graph-replay target
FLAT = ((1024, 4), (4096, 8))  # the flat kernel's (BLOCK, warps): the better one is reported


@triton.jit
def _sum_store(x0, x1, x2, x3, x4, x5, o0, o1, off, m, NX: tl.constexpr, NO: tl.constexpr):
    """o0 = the sum of the NX inputs (as float32) at ``off``, o1 = 2 * o0 when NO == 2."""
    s = tl.load(x0 + off, mask=m, other=0).to(tl.float32)
    if NX > 1:
        s += tl.load(x1 + off, mask=m, other=0).to(tl.float32)
    if NX > 2:
        s += tl.load(x2 + off, mask=m, other=0).to(tl.float32)
    if NX > 3:
        s += tl.load(x3 + off, mask=m, other=0).to(tl.float32)
    if NX > 4:
        s += tl.load(x4 + off, mask=m, other=0).to(tl.float32)
    if NX > 5:
        s += tl.load(x5 + off, mask=m, other=0).to(tl.float32)
    tl.store(o0 + off, s.to(o0.dtype.element_ty), mask=m)
    if NO > 1:
        tl.store(o1 + off, (2 * s).to(o1.dtype.element_ty), mask=m)


@triton.jit
def _stream(x0, x1, x2, x3, x4, x5, o0, o1, n, NX: tl.constexpr, NO: tl.constexpr,
            BLOCK: tl.constexpr):  # fmt: skip
    """Flat: each program a BLOCK of contiguous elements."""
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    _sum_store(x0, x1, x2, x3, x4, x5, o0, o1, off, off < n, NX, NO)


@triton.jit
def _walk(x0, x1, x2, x3, x4, x5, o0, o1, T, N, s_t, s_n, NX: tl.constexpr, NO: tl.constexpr,
          BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr):  # fmt: skip
    """Our plans' access pattern without their scan: each program BLOCK_N sequences, walking
    all T steps in BLOCK_T x BLOCK_N tiles, the loop pipelined in STAGES stages."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_T)
    for i in tl.range(0, tl.cdiv(T, BLOCK_T), num_stages=STAGES):
        t = i * BLOCK_T + rows
        off = t[:, None].to(tl.int64) * s_t + cols[None, :].to(tl.int64) * s_n
        m = (t[:, None] < T) & (cols[None, :] < N)
        _sum_store(x0, x1, x2, x3, x4, x5, o0, o1, off, m, NX, NO)


def stream_call(p: bl.Problem, flat: tuple = FLAT[0], walk: tuple | None = None):
    """The streaming kernel over ``p``'s per-step inputs, fresh outputs each call (in the
    inputs' layout): flat in ``flat`` = (BLOCK, warps), or with ``walk`` = (block_t, block_n,
    warps, stages) the tile walk ``_walk``."""
    xs = [x for name, x in p.tensors.items() if name != "bootstrap"]
    n, n_out = p.T * p.N, bl.N_OUTPUTS.get(p.estimator, 1)
    args = xs + [xs[0]] * (6 - len(xs))
    s_t, s_n = xs[0].stride(p.time_dim), xs[0].stride(1 - p.time_dim)

    def call():
        o0 = torch.empty_like(xs[0], dtype=p.dtype)
        o1 = torch.empty_like(o0) if n_out > 1 else o0
        if walk is None:
            block, warps = flat
            grid = (triton.cdiv(n, block),)
            _stream[grid](*args, o0, o1, n, NX=len(xs), NO=n_out, BLOCK=block, num_warps=warps)
        else:
            bt, bn, w, stages = walk
            _walk[(triton.cdiv(p.N, bn),)](*args, o0, o1, p.T, p.N, s_t, s_n, NX=len(xs),
                                           NO=n_out, BLOCK_T=bt, BLOCK_N=bn, STAGES=stages,
                                           num_warps=w)  # fmt: skip
        return o0, o1

    o0, o1 = call()  # checked once, untimed: every input read, every output written
    want = sum(x.float() for x in xs)
    if not torch.allclose(o0.float(), want, atol=1e-5) or (
        n_out > 1 and not torch.equal(o1, 2 * o0)
    ):
        raise RuntimeError(f"the streaming kernel is wrong for {p.estimator}")
    return call


def times(clocks: dict, fn, reps: int = 40) -> dict:
    """Median device time under each flush and the best back-to-back time per call, in us."""
    out = {m: device_us(c, fn, reps) for m, c in clocks.items()}
    out["b2b"] = min(clocks["write"].per_call(fn, 100) for _ in range(3)) * 1e6
    return out


def _fmt(t: dict, floor: float) -> str:
    return f"{t['write']:6.1f} ({t['read']:6.1f}, {t['b2b']:6.1f}) {t['write'] / floor:4.2f}x"


def graph_us(clock: h.Clock, fn) -> float:
    """Median device time of a CUDA-graph replay of ``fn`` (the harness's graph timing)."""
    return h.graph_time(clock, h.capture_graph(fn), h.Effort(graph_s=0.05, min_reps=100))


def graphs(clock: h.Clock, shapes: list[str], estimators: list[str], layouts) -> list[dict]:
    """Graph replays of the empty kernel, the streaming kernel and ours at small shapes."""
    empty = h.empty_kernel_reference(clock)["empty_graph_us"]
    print(f"graph replay, device us; x: over the empty kernel's replay ({empty:.1f} us)")
    rows = []
    for shape in shapes:
        T, N = map(int, shape.split("x"))
        for est in estimators:
            for layout in layouts:
                p = bl.make_problem(est, T, N, layout, torch.float32, clock.device)
                stream = min(graph_us(clock, stream_call(p, flat)) for flat in FLAT)
                ours = graph_us(clock, bl._ours("triton")(p))
                rows.append(dict(estimator=est, T=T, N=N, layout=layout, empty_us=empty,
                                 stream_graph_us=stream, ours_graph_us=ours))  # fmt: skip
                print(
                    f"{est:18s} [{T}, {N}] {layout:11s} stream {stream:5.1f} {stream / empty:4.2f}x"
                    f" | ours {ours:5.1f} {ours / empty:4.2f}x",
                    flush=True,
                )
    return rows


def device_rows(
    clocks: dict, copy_bps: float, shapes: list[str], estimators: list[str], layouts, walks
):
    """Device times of the streaming kernel, each tile walk of ``walks`` and ours against the
    copy floor."""
    print("device us under the write flush (read flush, back to back); x: over the copy floor")
    rows = []
    for shape in shapes:
        T, N = map(int, shape.split("x"))
        for est in estimators:
            for layout in layouts:
                p = bl.make_problem(est, T, N, layout, torch.float32, clocks["write"].device)
                floor = p.bytes_moved() / copy_bps * 1e6
                streams = [times(clocks, stream_call(p, flat)) for flat in FLAT]
                stream = min(streams, key=lambda t: t["write"])
                walked = {
                    "x".join(map(str, w)): times(clocks, stream_call(p, walk=w)) for w in walks
                }
                ours = times(clocks, bl._ours("triton")(p))
                rows.append(dict(estimator=est, T=T, N=N, layout=layout, bytes=p.bytes_moved(),
                                 floor_us=floor, stream=stream, walks=walked, ours=ours))  # fmt: skip
                ratio = {m: ours[m] / stream[m] for m in ("write", "read", "b2b")}
                print(
                    f"{est:18s} [{T}, {N}] {layout:11s} floor {floor:6.1f}"
                    f" | stream {_fmt(stream, floor)} | ours {_fmt(ours, floor)}"
                    f" | ours/stream {ratio['write']:4.2f} ({ratio['read']:4.2f}, {ratio['b2b']:4.2f})"
                    + "".join(f" | walk {k} {_fmt(t, floor)}" for k, t in walked.items()),
                    flush=True,
                )
                del p
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", help="TxN; default: LARGE, with --graphs SMALL")
    ap.add_argument("--estimators", nargs="*", default=list(bl.ESTIMATORS))
    ap.add_argument("--graphs", action="store_true", help="CUDA-graph replays (small shapes)")
    ap.add_argument("--layouts", nargs="*", default=[h.TM, h.BM], choices=[h.TM, h.BM])
    ap.add_argument(
        "--walk", nargs="*", default=[], metavar="BTxBNxWxS",
        help="also time the tile walk (_walk) in BT x BN tiles, W warps, S stages",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, help="JSON of every row")
    args = ap.parse_args(argv)
    shapes = args.shapes or (SMALL if args.graphs else LARGE)
    device = torch.device("cuda", torch.cuda.current_device())
    clocks = {mode: h.Clock(device, mode) for mode in h.FLUSHES}
    copy_bps = h.copy_bandwidth(clocks["write"], 1 << 30)
    meta = dict(
        gpu=torch.cuda.get_device_name(device), torch=torch.__version__,
        triton=triton.__version__, copy_gbps=copy_bps / 1e9,
    )  # fmt: skip
    print(meta, flush=True)
    if args.graphs:
        rows = graphs(clocks["write"], shapes, args.estimators, args.layouts)
    else:
        walks = [tuple(map(int, w.split("x"))) for w in args.walk]
        rows = device_rows(clocks, copy_bps, shapes, args.estimators, args.layouts, walks)
    if args.out:
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
