"""Host cost of one small call on a CUDA GPU: what each layer of the launch path costs.

Full-call time (back-to-back calls, one synchronisation, divided by the count) of ``gae`` at
[128, 4096] (float32, time-major; the GPU needs a few microseconds, so the host decides), or the
shape given (``--shape 2048x1``: a call split along time, several launches), through the
public function, with fresh outputs and with ``out=``, in three configurations:

* ``jit``: every launch through Triton's JIT dispatch, no replay (RL_TRITON_DIRECT_LAUNCH=0
  RL_TRITON_REPLAY=0);
* ``direct``: the compiled kernel's launcher called directly, no replay (RL_TRITON_REPLAY=0);
* ``direct+replay``: the default: a repeated call replays its recorded launch
  (rl_triton_core/_replay.py) after a lookup and a check of its tensors.

The three configurations take turns, five rounds, best round each (this host's timings
drift); the rows for scale are best of three rounds.

For scale: two ``torch.empty``, an empty Triton kernel through the JIT, one eager op, and the
replay of a CUDA graph holding the call. Every configuration's result is checked against the
torch backend in float64, also the graph's.

    python benchmarks/launch_overhead.py [--shape TxN] [--json F]
"""

import argparse
import json
import time

import torch
import triton

import rl_triton_core as rtc
import rl_triton_core.triton_backend as tb
from rl_triton_core import _replay


def per_call(fn, k=3000, rounds=3):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(k):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / k * 1e6)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="128x4096", help="TxN (time-major)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    T, N = map(int, args.shape.split("x"))
    dev = torch.device("cuda")
    r, v = torch.randn(T, N, device=dev), torch.randn(T, N, device=dev)
    d = torch.rand(T, N, device=dev) < 0.05
    bv = torch.randn(N, device=dev)
    adv, ret = torch.empty(T, N, device=dev), torch.empty(T, N, device=dev)
    kw = dict(bootstrap_value=bv, gamma=0.99, lmbda=0.95)
    want = rtc.gae(r.double(), v.double(), d, **{**kw, "bootstrap_value": bv.double()},
                   backend="torch")  # fmt: skip

    def check(got, label):
        err = max((g.double() - w).abs().max().item() for g, w in zip(got, want, strict=True))
        if not err < 1e-4:
            raise SystemExit(f"{label}: max error {err:.3g}")

    configs = {"jit": (False, False), "direct": (True, False), "direct+replay": (True, True)}
    settings = tb.DIRECT_LAUNCH, _replay.ENABLED  # (from the environment; restored below)
    res = {}
    for _ in range(5):
        for label, (direct, replay) in configs.items():
            tb.DIRECT_LAUNCH, _replay.ENABLED = direct, replay
            tb._LAUNCHES.clear()
            _replay._PLANS.clear()
            check(rtc.gae(r, v, d, **kw), label)
            check(rtc.gae(r, v, d, **kw), label)  # (a replay, where enabled)
            adv.fill_(float("nan"))
            check(rtc.gae(r, v, d, **kw, out=(adv, ret)), label + " out=")
            for key, fn in (
                (f"gae public, fresh outputs, {label}", lambda: rtc.gae(r, v, d, **kw)),
                (f"gae public, out=, {label}", lambda: rtc.gae(r, v, d, **kw, out=(adv, ret))),
            ):
                res[key] = min(res.get(key, float("inf")), per_call(fn, rounds=1))
    tb.DIRECT_LAUNCH, _replay.ENABLED = settings

    res["torch.empty x2"] = per_call(
        lambda: (torch.empty(T, N, device=dev), torch.empty(T, N, device=dev))
    )

    @triton.jit
    def empty_kernel(x):
        pass

    res["empty Triton kernel (JIT)"] = per_call(lambda: empty_kernel[(1,)](adv))
    res["one eager op (add_)"] = per_call(lambda: adv.add_(1.0))

    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rtc.gae(r, v, d, **kw, out=(adv, ret))
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        rtc.gae(r, v, d, **kw, out=(adv, ret))
    adv.fill_(float("nan"))
    graph.replay()
    check((adv, ret), "graph replay")
    res["CUDA graph replay of the call"] = per_call(graph.replay)

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    tb._LAUNCHES.clear()
    _replay._PLANS.clear()
    rtc.gae(r, v, d, **kw)
    (launch,) = tb._LAUNCHES.values()
    print(f"gae [{T}, {N}] float32 time-major, {launch.plan.n_chunks} chunk(s), full-call time:")
    for k, val in res.items():
        print(f"  {k:45s} {val:7.1f} us")
    if args.json:
        meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                    triton=triton.__version__, shape=[T, N],
                    n_chunks=launch.plan.n_chunks)  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, full_call_us=res), f, indent=1)


if __name__ == "__main__":
    main()
