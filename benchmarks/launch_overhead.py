"""Host cost of one small call on a CUDA GPU, with and without the direct launch path.

Prints the full-call time (back-to-back calls, one synchronisation) of ``gae`` at [128, 4096]
through the public function, with ``out=``, and at the backend entry point, each with Triton's
JIT dispatch and with the direct launcher (``RL_TRITON_DIRECT_LAUNCH``); the same for an empty
Triton kernel, a pair of ``torch.empty`` and one eager op; checks the direct path against the
torch backend in float64, also inside a captured CUDA graph.

    python benchmarks/launch_overhead.py
"""

import time

import torch
import triton

import rl_triton_core as rtc
import rl_triton_core.triton_backend as tb


def per_call(fn, k=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(k):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / k * 1e6


T, N = 128, 4096
dev = torch.device("cuda")
r, v = torch.randn(T, N, device=dev), torch.randn(T, N, device=dev)
d = torch.rand(T, N, device=dev) < 0.05
bv = torch.randn(N, device=dev)
adv, ret = torch.empty(T, N, device=dev), torch.empty(T, N, device=dev)
res = {}
for direct in (False, True):
    tb.DIRECT_LAUNCH = direct
    tb._LAUNCHES.clear()
    res[f"public gae direct={direct}"] = per_call(
        lambda: rtc.gae(r, v, terminated=d, bootstrap_value=bv, gamma=0.99, lmbda=0.95)
    )
    tb._LAUNCHES.clear()
    res[f"public gae out= direct={direct}"] = per_call(
        lambda: rtc.gae(
            r, v, terminated=d, bootstrap_value=bv, gamma=0.99, lmbda=0.95, out=(adv, ret)
        )
    )
    tb._LAUNCHES.clear()
    res[f"backend gae direct={direct}"] = per_call(
        lambda: tb.gae(r, v, d, None, None, bv, 0.99, 0.95, (adv, ret))
    )
res["torch.empty x2"] = per_call(
    lambda: (torch.empty(T, N, device=dev), torch.empty(T, N, device=dev))
)


@triton.jit
def empty_kernel(x):
    pass


res["empty triton kernel (JIT path)"] = per_call(lambda: empty_kernel[(1,)](adv))
res["torch add_ (one eager op)"] = per_call(lambda: adv.add_(1.0))
# correctness of the direct path vs reference
tb.DIRECT_LAUNCH = True
tb._LAUNCHES.clear()
ref = rtc.gae(
    r.cpu().double(),
    v.cpu().double(),
    terminated=d.cpu(),
    bootstrap_value=bv.cpu().double(),
    gamma=0.99,
    lmbda=0.95,
    backend="torch",
)
for i in range(3):
    got = rtc.gae(r, v, terminated=d, bootstrap_value=bv, gamma=0.99, lmbda=0.95)
    print(
        "direct call",
        i,
        "max err",
        max((g.cpu().double() - w).abs().max().item() for g, w in zip(got, ref)),
    )
# CUDA graph with the direct path
g = torch.cuda.CUDAGraph()
adv.fill_(float("nan"))
ret.fill_(float("nan"))
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    rtc.gae(r, v, terminated=d, bootstrap_value=bv, gamma=0.99, lmbda=0.95, out=(adv, ret))
torch.cuda.current_stream().wait_stream(s)
with torch.cuda.graph(g):
    rtc.gae(r, v, terminated=d, bootstrap_value=bv, gamma=0.99, lmbda=0.95, out=(adv, ret))
adv.fill_(float("nan"))
g.replay()
torch.cuda.synchronize()
print("graph replay max err", (adv.cpu().double() - ref[0]).abs().max().item())
res["graph replay"] = per_call(g.replay)
for k, val in res.items():
    print(f"{k:40s} {val:8.1f} us")
