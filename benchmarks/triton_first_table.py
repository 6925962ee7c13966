"""First timing table of the Triton backend on a CUDA GPU (issue 3; the full harness is issue 4).

For GAE and V-trace at a few shapes, both layouts, float32, each configuration is first checked
against a float64 oracle (the torch backend in float64, itself tested against the reference),
then timed three ways:

* device time: CUDA events, L2 flushed before every repetition (``triton.testing.do_bench``,
  median);
* full-call host time: many back-to-back calls of the public function, one synchronisation,
  divided by the count (what a training loop pays);
* CUDA-graph replay of one call (median of replays).

The bandwidth floor is the bytes the estimator must move (each input read once, each output
written once) over the device-to-device copy bandwidth measured in the same run.

    python benchmarks/triton_first_table.py [--out benchmarks/results/triton_first_table.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from pathlib import Path

import torch
import triton
import triton.testing

import rl_triton_core as rtc

SHAPES = [(128, 4096), (1024, 65536), (131072, 16)]  # [T, N]


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    n = 1 << 28  # 1 GiB of float32
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="median")
    return 2 * n * 4 / (ms * 1e-3)


def make_inputs(estimator: str, T: int, N: int, batch_major: bool, device):
    g = torch.Generator(device=device).manual_seed(T * 7 + N)

    def per_step(dtype=torch.float32):
        x = torch.randn((N, T) if batch_major else (T, N), generator=g, device=device)
        return x.to(dtype)

    time_dim = 1 if batch_major else 0
    term = per_step() > 1.6  # ~5% episode ends, bool
    rewards, values = per_step(), per_step()
    boot = torch.randn(N, generator=g, device=device)
    if estimator == "gae":
        args = (rewards, values, term)
        kwargs = dict(bootstrap_value=boot, gamma=0.99, lmbda=0.95)
        nbytes = T * N * (4 + 4 + 1 + 4 + 4) + N * 4
    else:
        tlp, blp = -per_step().abs(), -per_step().abs()
        args = (rewards, values, tlp, blp, term)
        kwargs = dict(bootstrap_value=boot, gamma=0.99)
        nbytes = T * N * (4 * 4 + 1 + 4 + 4) + N * 4
    return args, dict(kwargs, time_dim=time_dim), nbytes


def max_rel_err(got, want) -> float:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return max(
        ((g.double() - w).abs().max() / w.abs().max().clamp_min(1)).item()
        for g, w in zip(got, want, strict=True)
    )


def host_time(fn, calls: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def graph_time(fn) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm up (compile) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=20, rep=200, return_mode="median") * 1e-3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/triton_first_table.json")
    args = parser.parse_args()
    device = torch.device("cuda")
    bw = copy_bandwidth(device)
    rows = []
    for estimator in ("gae", "vtrace"):
        fn = getattr(rtc, estimator)
        for T, N in SHAPES:
            for batch_major in (False, True):
                inputs, kwargs, nbytes = make_inputs(estimator, T, N, batch_major, device)
                oracle_inputs = [x.double() if x.is_floating_point() else x for x in inputs]
                oracle_kwargs = dict(kwargs, bootstrap_value=kwargs["bootstrap_value"].double())
                want = fn(*oracle_inputs, backend="torch", **oracle_kwargs)
                got = fn(*inputs, backend="triton", **kwargs)
                err = max_rel_err(got, want)
                del want, got, oracle_inputs
                call = functools.partial(fn, *inputs, backend="triton", **kwargs)
                device_s = (
                    triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median") * 1e-3
                )
                host_s = host_time(call, 200 if T * N < 1 << 24 else 20)
                graph_s = graph_time(call)
                floor_s = nbytes / bw
                row = dict(
                    estimator=estimator,
                    T=T,
                    N=N,
                    layout="batch-major" if batch_major else "time-major",
                    max_rel_err=err,
                    device_us=device_s * 1e6,
                    host_us=host_s * 1e6,
                    graph_us=graph_s * 1e6,
                    floor_us=floor_s * 1e6,
                    pct_of_floor=100 * floor_s / device_s,
                )
                rows.append(row)
                print(row, flush=True)
                torch.cuda.empty_cache()
    meta = dict(
        gpu=torch.cuda.get_device_name(device),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        copy_bandwidth_TBps=bw / 1e12,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"\n{meta}\n")
    print(
        "| estimator | [T, N] | layout | err | device us | full call us | graph us |"
        " floor us | % of floor |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['estimator']} | [{r['T']}, {r['N']}] | {r['layout']} | {r['max_rel_err']:.1e} |"
            f" {r['device_us']:.1f} | {r['host_us']:.1f} | {r['graph_us']:.1f} |"
            f" {r['floor_us']:.1f} | {r['pct_of_floor']:.0f}% |"
        )
    ok = all(r["max_rel_err"] < 1e-5 for r in rows)
    print("correctness:", "all timed configurations within 1e-5" if ok else "FAILED")


if __name__ == "__main__":
    main()
