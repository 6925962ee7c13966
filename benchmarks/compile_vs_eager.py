"""What torch.compile with our custom ops buys over eager, on CUDA at [T, N] = [128, 4096].

Workloads (float32, time-major, ~2% episode ends), each correctness-checked against eager
before it is timed:

* ``gae``: GAE alone, no gradient (one fused Triton kernel behind ``rl_triton::gae``);
* ``lambda_returns_grad``: differentiable TD(λ) returns of values that require grad, forward
  and backward (coefficients built with torch ops, ``rl_triton::linear_scan`` and its adjoint
  scan): Inductor fuses the elementwise part;
* ``ppo_step``: a PPO-style loss (MLP actor-critic on [T+1, N, 8] observations, GAE without
  gradient, advantage normalisation, clipped surrogate, value loss with a differentiable
  λ-return term) and its backward;
* ``gae_python_loop``: the LeanRL/CleanRL GAE loop (a Python ``for`` over T) compiled by
  Inductor, for comparison with compiling around our op (``--no-loop`` skips it: it takes a
  while to compile).

Modes: ``eager``; ``compiled`` (``torch.compile(fullgraph=True)``); ``compiled_cudagraphs``
(``mode="reduce-overhead"``). Times: ``host_us``, back-to-back calls with one synchronisation
at the end, divided by the count (what a training loop pays); ``device_us``, the median of
``triton.testing.do_bench`` (CUDA events around each call, L2 flushed). Compile times are
recorded too.

    python benchmarks/compile_vs_eager.py [--out benchmarks/results/compile_vs_eager_h200.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path

import torch
import triton
import triton.testing
from baselines import max_rel_err

import rl_triton_core as rtc

T, N, OBS, ACTIONS = 128, 4096, 8, 4


def inputs(device):
    g = torch.Generator(device=device).manual_seed(0)
    return dict(
        obs=torch.randn(T + 1, N, OBS, generator=g, device=device),
        actions=torch.randint(0, ACTIONS, (T, N), generator=g, device=device),
        old_logp=-torch.rand(T, N, generator=g, device=device) - 0.5,
        rewards=torch.randn(T, N, generator=g, device=device),
        values=torch.randn(T, N, generator=g, device=device),
        bootstrap=torch.randn(N, generator=g, device=device),
        terminated=torch.rand(T, N, generator=g, device=device) < 0.02,
    )


class ActorCritic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(OBS, 64), torch.nn.Tanh())
        self.pi = torch.nn.Linear(64, ACTIONS)
        self.v = torch.nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def workloads(d, net):
    """name -> (forward, leaves): ``forward()`` returns tensors, the first a scalar loss when
    ``leaves`` is not None; the timed step is the forward (compiled or not) plus, for those,
    the gradient of the loss with respect to ``leaves`` (AOTAutograd compiles that backward
    along with the forward)."""
    values_g = d["values"].clone().requires_grad_()

    def gae():
        return rtc.gae(d["rewards"], d["values"], d["terminated"], bootstrap_value=d["bootstrap"])

    def lambda_returns_grad():
        ret = rtc.lambda_returns(
            d["rewards"], values_g, d["terminated"], bootstrap_value=d["bootstrap"]
        )
        return ret.square().mean(), ret

    def ppo_step():
        logits, values = net(d["obs"])
        with torch.no_grad():
            adv, ret = rtc.gae(
                d["rewards"], values[:-1], d["terminated"], bootstrap_value=values[-1]
            )
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        lam = rtc.lambda_returns(
            d["rewards"], values[:-1], d["terminated"], bootstrap_value=values[-1]
        )
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, d["actions"][..., None])
        ratio = torch.exp(logp.squeeze(-1) - d["old_logp"])
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        loss = pg + 0.5 * ((values[:-1] - ret) ** 2).mean() + 0.05 * ((lam - ret) ** 2).mean()
        return (loss,)

    def gae_python_loop():  # CleanRL's ppo.py, with terminated[t] flags of the contract
        rewards, values, term = d["rewards"], d["values"], d["terminated"]
        adv = torch.zeros_like(rewards)
        last = torch.zeros_like(rewards[0])
        for t in reversed(range(T)):
            nv = d["bootstrap"] if t == T - 1 else values[t + 1]
            live = 1.0 - term[t].float()
            delta = rewards[t] + 0.99 * nv * live - values[t]
            cont = live if t < T - 1 else torch.zeros_like(live)
            last = delta + 0.99 * 0.95 * cont * last
            adv[t] = last
        return adv, adv + values

    return {
        "gae": (gae, None),
        "lambda_returns_grad": (lambda_returns_grad, [values_g]),
        "ppo_step": (ppo_step, list(net.parameters())),
        "gae_python_loop": (gae_python_loop, None),
    }


def step(forward, leaves):
    """The timed call: the forward, and the backward of its loss when ``leaves``."""
    if leaves is None:
        return forward

    def run():
        outs = forward()
        grads = torch.autograd.grad(outs[0], leaves)
        return (*(o.detach() for o in outs), *grads)

    return run


def host_time(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/compile_vs_eager_h200.json")
    parser.add_argument("--no-loop", action="store_true", help="skip the compiled Python loop")
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    d = inputs(device)
    net = ActorCritic().to(device)
    rows = []
    for name, (forward, leaves) in workloads(d, net).items():
        if name == "gae_python_loop" and args.no_loop:
            continue
        want = step(forward, leaves)()
        eager_host = None
        for mode in ("eager", "compiled", "compiled_cudagraphs"):
            if mode == "eager":
                call, compile_s = step(forward, leaves), 0.0
            else:
                torch._dynamo.reset()
                kw = {"mode": "reduce-overhead"} if mode == "compiled_cudagraphs" else {}
                call = step(torch.compile(forward, fullgraph=True, **kw), leaves)
                t0 = time.perf_counter()
                for _ in range(3):  # compile, then the cudagraph trees record and warm up
                    call()
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
            err = max_rel_err(call(), want)
            host_s = host_time(call)
            device_s = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
            row = dict(
                workload=name,
                mode=mode,
                T=T,
                N=N,
                max_rel_err=err,
                host_us=host_s * 1e6,
                device_us=device_s * 1e3,
                compile_s=compile_s,
            )
            if mode == "eager":
                eager_host = host_s
            row["host_speedup_vs_eager"] = eager_host / host_s
            rows.append(row)
            print(row, flush=True)
    meta = dict(
        gpu=torch.cuda.get_device_name(device),
        torch=torch.__version__,
        triton=triton.__version__,
        python=platform.python_version(),
        commit=commit(),
        shape=[T, N],
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    print(f"\n{meta}\n")
    print("| workload | mode | host us/call | device us | x eager (host) | compile s | err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workload']} | {r['mode']} | {r['host_us']:.1f} | {r['device_us']:.1f} |"
            f" {r['host_speedup_vs_eager']:.2f} | {r['compile_s']:.1f} | {r['max_rel_err']:.1e} |"
        )
    ok = all(r["max_rel_err"] < 1e-4 for r in rows)
    print("correctness:", "all timed configurations within 1e-4 of eager" if ok else "FAILED")


if __name__ == "__main__":
    main()
