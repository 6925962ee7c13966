"""torch.compile and the custom ops (issue 9).

* ``torch.library.opcheck`` of every op (schema, autograd registration, fake implementation,
  AOT dispatch with dynamic shapes), on the torch and reference backends (Triton on CUDA).
* ``torch.compile(fullgraph=True)`` of a function calling each estimator, with and without
  gradients, matches eager (``aot_eager`` on the CPU: it traces exactly what Inductor gets,
  without a C++ build per test; one Inductor compile of all estimators at once; every
  estimator through Inductor on CUDA, and a ``mode="reduce-overhead"`` PPO loss).

Kept small for the CPU (each compile costs seconds on a 2-core machine); set
``RL_TRITON_SLOW_COMPILE=1`` to add the Inductor compile of a backward pass on the CPU.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch
from _support import as_tuple, call
from conftest import assert_close
from test_autograd import (
    CASES,
    ESTIMATORS,
    _ActorCritic,
    _id,
    as_function,
    make_case,
    ppo_batch,
)

import rl_triton_core as rtc
from rl_triton_core import ops

HAS_CUDA = torch.cuda.is_available()
SLOW = os.environ.get("RL_TRITON_SLOW_COMPILE", "0") not in ("", "0")
HAS_CXX = any(shutil.which(c) for c in ("g++", "c++", "clang++"))
needs_cxx = pytest.mark.skipif(not HAS_CXX, reason="Inductor on the CPU needs a C++ compiler")
# One case per function for the CPU compile tests (the richer variant); every case on CUDA.
CPU_CASES = [c for c in CASES if c[1] in ("next", "retrace")]
assert {c[0] for c in CPU_CASES} == set(ESTIMATORS)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh (the tests' closures share code objects, and Dynamo's
    recompile limit would otherwise send later cases to eager)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------- opcheck


def op_call(fn: str, inp: dict, backend: str):
    """The custom op and its arguments for a public call with inputs ``inp``."""
    g = inp.get
    boot = (g("terminated"), g("truncated"), g("next_values"), g("bootstrap_value"))
    gl = (*ops.split(fn, "gamma", g("gamma", 0.99)), *ops.split(fn, "lmbda", g("lmbda", 0.95)))
    tail = (0, backend)
    if fn == "linear_scan":
        return ops.linear_scan_op, (g("a"), g("b"), g("initial"), g("reverse"), *tail)
    if fn == "gae":
        return ops.gae_op, (g("rewards"), g("values"), *boot, *gl, *tail)
    if fn == "lambda_returns":
        return ops.lambda_returns_op, (g("rewards"), g("values"), *boot, *gl, *tail)
    if fn == "discounted_returns":
        return ops.discounted_returns_op, (
            g("rewards"),
            *boot,
            *ops.split(fn, "gamma", g("gamma")),
            *tail,
        )
    if fn == "vtrace":
        rho = g("rho_bar", 1.0)
        coefs = (
            *gl,
            *ops.split(fn, "rho_bar", rho),
            *ops.split(fn, "c_bar", g("c_bar", 1.0)),
            *ops.split(fn, "pg_rho_bar", g("pg_rho_bar", rho)),
        )
        logp = (g("target_log_probs"), g("behavior_log_probs"))
        return ops.vtrace_op, (g("rewards"), g("values"), *logp, *boot, *coefs, *tail)
    if fn == "retrace":
        q = (g("rewards"), g("q_values"), g("next_expected_q"))
        logp = (g("target_log_probs"), g("behavior_log_probs"))
        flags = (g("terminated"), g("truncated"))
        coefs = (*gl, *ops.split(fn, "c_bar", g("c_bar", 1.0)), g("trace", "retrace"))
        return ops.retrace_op, (*q, *logp, *flags, *coefs, *tail)
    if fn in ("eligibility_traces", "episodic_cumsum"):
        if fn == "episodic_cumsum":
            gl = (None, 1.0, None, 1.0)
        return ops.eligibility_traces_op, (g("x"), g("done"), *gl, g("initial"), *tail)
    raise ValueError(fn)


@pytest.mark.parametrize(
    "variant", ["forward", "reverse", "no_initial", "broadcast", "batch_major"]
)
def test_opcheck_linear_scan(device, variant):
    """The differentiable op: inputs that require grad exercise its autograd formula."""
    inp, _ = make_case("linear_scan", "reverse" if variant == "reverse" else "forward", T=6)
    inp = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}
    time_dim = 0
    if variant == "no_initial":
        inp["initial"] = None
    elif variant == "broadcast":
        inp["a"] = inp["a"][:, :1].contiguous()
    elif variant == "batch_major":
        inp["a"], inp["b"], time_dim = inp["a"].T, inp["b"].T, 1
    for k in ("a", "b", "initial"):
        if inp[k] is not None:
            inp[k] = inp[k].detach().requires_grad_()
    backends = ["torch"] + (["reference"] if variant == "forward" else [])
    for backend in backends + (["triton"] if device.type == "cuda" else []):
        op, args = op_call("linear_scan", inp, backend)
        args = (*args[:4], time_dim, backend)
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_opcheck_estimator(device, case):
    fn, variant = case
    inp, _ = make_case(fn, variant, dtype=torch.float32, device=device)
    backend = "triton" if device.type == "cuda" else "torch"
    op, args = op_call(fn, inp, backend)
    torch.library.opcheck(op, args)
    want = as_tuple(call(fn, inp, backend=backend))
    got = as_tuple(op(*args))
    for w, o in zip(want, got, strict=True):
        assert torch.equal(w, o)


def test_fake_implementations_validate():
    """Errors surface while tracing, from the fake implementation."""
    inp, _ = make_case("gae", "boot", dtype=torch.float32)
    inp = {**inp, "values": inp["values"][:, :2]}
    with pytest.raises(Exception, match="mismatched shapes"):
        torch.compile(lambda: call("gae", inp), fullgraph=True, backend="aot_eager")()


@pytest.mark.parametrize("bad", [True, "0.9", None], ids=repr)
@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_coefficient_types(bad, fullgraph):
    """A bool, a string or None for a coefficient is refused while tracing too (it was read
    as ``float(c)``: ``gamma=True`` ran as 1.0 under torch.compile only): a TypeError naming
    it (with ``fullgraph=True`` wrapped by Dynamo, whose message keeps ours)."""
    inp, _ = make_case("gae", "boot", dtype=torch.float32)
    inp = {**inp, "gamma": bad}
    f = torch.compile(lambda: call("gae", inp), fullgraph=fullgraph, backend="eager")
    with pytest.raises(Exception, match="`gamma` must be a float or a tensor") as info:
        f()
    assert fullgraph or info.type is TypeError


@pytest.mark.parametrize("fullgraph", [False, True])
def test_compiled_coefficient_too_large(fullgraph):
    """An int past float64's range: a ValueError naming it, as in eager calls (an
    OverflowError from ``float(c)`` before)."""
    inp, _ = make_case("gae", "boot", dtype=torch.float32)
    inp = {**inp, "gamma": 10**400}
    f = torch.compile(lambda: call("gae", inp), fullgraph=fullgraph, backend="eager")
    with pytest.raises(Exception, match="`gamma` is too large") as info:
        f()
    assert fullgraph or info.type is ValueError


def test_compiled_numpy_float_coefficient():
    """A numpy float64 ``gamma`` traces with ``fullgraph=True`` (Dynamo cannot trace
    ``getattr(numpy_scalar, "requires_grad")``, which the graph-path test once used)."""
    inp, _ = make_case("gae", "boot", dtype=torch.float32)
    f = torch.compile(lambda g: call("gae", {**inp, "gamma": g}), fullgraph=True, backend="eager")
    for o, w in zip(f(np.float64(0.9)), call("gae", {**inp, "gamma": 0.9}), strict=True):
        assert torch.equal(o, w)


# ---------------------------------------------------------------- compiled vs eager


def _check_compiled(fn, variant, device, backend, compile_backend, mode=None):
    """The compiled function equals eager: outputs without grad; outputs and gradients with
    (compiled with ``fullgraph=True``: a graph break fails)."""
    inp, diff = make_case(fn, variant, T=9, N=4, dtype=torch.float32, device=device)
    f, leaves = as_function(fn, inp, diff, backend=backend)
    cf = torch.compile(f, fullgraph=True, backend=compile_backend, mode=mode)
    with torch.no_grad():
        want, got = f(*leaves), cf(*leaves)
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        assert_close(o, w, torch.float32, name=f"{fn} no-grad output {i}")
    want = f(*leaves)
    w_grads = torch.autograd.grad(sum(o.sum() for o in want), leaves, materialize_grads=True)
    got = cf(*leaves)
    g_grads = torch.autograd.grad(sum(o.sum() for o in got), leaves, materialize_grads=True)
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        assert_close(o, w, torch.float32, name=f"{fn} output {i}")
    for name, g, w in zip(diff, g_grads, w_grads, strict=True):
        assert_close(g, w, torch.float32, name=f"{fn} grad {name}")


@pytest.mark.parametrize("case", CPU_CASES, ids=_id)
def test_compiled_matches_eager_cpu(case):
    _check_compiled(*case, "cpu", "torch", "aot_eager")


@pytest.mark.parametrize("variant", ["forward", "reverse"])
def test_compiled_linear_scan_cpu(variant):
    """``linear_scan`` traces whole too (its backend check is left to the op's fake: Dynamo
    cannot trace the backend module's import, a graph break before)."""
    _check_compiled("linear_scan", variant, "cpu", "torch", "aot_eager")


@needs_cxx
def test_compiled_all_estimators_inductor_cpu():
    """One Inductor compile of a function that calls every estimator (no gradient)."""
    cases = [(fn, *make_case(fn, v, dtype=torch.float32)) for fn, v in CPU_CASES]

    def f():
        return [as_tuple(call(fn, inp, backend="torch")) for fn, inp, _ in cases]

    got = torch.compile(f, fullgraph=True)()
    want = f()
    for (fn, _, _), g, w in zip(cases, got, want, strict=True):
        for i, (o, e) in enumerate(zip(g, w, strict=True)):
            assert_close(o, e, torch.float32, name=f"{fn} output {i}")


@needs_cxx
@pytest.mark.skipif(not SLOW, reason="set RL_TRITON_SLOW_COMPILE=1 (a C++ build of a backward)")
def test_compiled_gae_inductor_cpu_backward():
    _check_compiled("gae", "next", "cpu", "torch", "inductor")


def test_compile_with_out_and_time_dim():
    """``out=`` and a TorchRL layout under compile."""
    inp, _ = make_case("lambda_returns", "boot", dtype=torch.float32)
    lay = {
        k: (v.T.unsqueeze(-1).contiguous() if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
        for k, v in inp.items()
    }
    lay["bootstrap_value"] = inp["bootstrap_value"][:, None]
    out = torch.full_like(lay["rewards"], float("nan"))  # poisoned: every element written

    def f(out):
        return call("lambda_returns", lay, time_dim=-2, out=out)

    res = torch.compile(f, fullgraph=True, backend="aot_eager")(out)
    assert res is out or res.data_ptr() == out.data_ptr()
    want = call("lambda_returns", lay, time_dim=-2, backend="reference")
    assert_close(out, want, torch.float32)


def test_export_keeps_the_ops():
    """``torch.export`` records the estimators as ``rl_triton`` ops (graph-level, portable)."""

    class Returns(torch.nn.Module):
        def forward(self, rewards, values, terminated, bootstrap):
            adv, _ = rtc.gae(rewards, values, terminated, bootstrap_value=bootstrap)
            lam = rtc.lambda_returns(rewards, values, terminated, bootstrap_value=bootstrap)
            return adv, lam

    inp, _ = make_case("gae", "boot", dtype=torch.float32)
    args = (inp["rewards"], inp["values"], inp["terminated"], inp["bootstrap_value"])
    ep = torch.export.export(Returns(), args)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"rl_triton.gae.default", "rl_triton.lambda_returns.default"} <= targets
    for got, want in zip(ep.module()(*args), Returns()(*args), strict=True):
        assert torch.equal(got, want)


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gpu_compiled_matches_eager_inductor(case):
    _check_compiled(*case, "cuda", "auto", "inductor")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("variant", ["forward", "reverse"])
def test_gpu_compiled_linear_scan_inductor(variant):
    _check_compiled("linear_scan", variant, "cuda", "auto", "inductor")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
def test_gpu_reduce_overhead_ppo_loss():
    """A PPO-style loss (GAE without grad, λ-returns with grad) compiled with CUDA graphs
    (``mode="reduce-overhead"``): loss and gradients match eager over several steps."""
    torch.manual_seed(0)
    net = _ActorCritic(8, 4).cuda()

    def loss_fn(obs, actions, old_logp, rewards, terminated):
        logits, values = net(obs)
        with torch.no_grad():
            adv, ret = rtc.gae(rewards, values[:-1], terminated, bootstrap_value=values[-1])
        lam = rtc.lambda_returns(rewards, values[:-1], terminated, bootstrap_value=values[-1])
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, actions[..., None]).squeeze(-1)
        ratio = torch.exp(logp - old_logp)
        pg = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        return pg + ((values[:-1] - ret) ** 2).mean() + 0.1 * ((lam - ret) ** 2).mean()

    compiled = torch.compile(loss_fn, fullgraph=True, mode="reduce-overhead")
    params = list(net.parameters())
    for seed in range(4):
        batch = ppo_batch(256, 32, 8, 4, "cuda", seed=seed)
        want = loss_fn(*batch)
        w_grads = torch.autograd.grad(want, params)
        got = compiled(*batch)
        g_grads = torch.autograd.grad(got, params)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for g, w in zip(g_grads, w_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
