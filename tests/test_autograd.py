"""Autograd: gradients of linear_scan and of every estimator (issue 9).

* ``gradcheck`` (float64, finite differences: an oracle independent of our backward) of
  ``linear_scan`` and of each estimator on the reference and torch paths (and Triton on CUDA);
  ``gradgradcheck`` of ``linear_scan``.
* The backward of ``linear_scan`` against autograd through a naive loop, and the identity
  "the backward pass is a scan in the other direction".
* Triton (the interpreter on the CPU, the GPU under the ``gpu`` marker) against the reference
  backend's gradients in float32; the autograd path's forward against the direct path.
* Gradient NaN locality, layouts, dtypes, ``out=``, ``T = 0``, and the routing (a call that
  needs no gradient never enters the autograd path).
* On CUDA: CUDA-graph capture and replay of a PPO-style update that includes GAE.
"""

from __future__ import annotations

import pytest
import torch
from _support import as_tuple, call
from conftest import assert_close, interpreted

import rl_triton_core as rtc
from rl_triton_core import autograd as rtc_autograd

F64 = torch.float64
NAN = float("nan")
HAS_CUDA = torch.cuda.is_available()
ESTIMATORS = (
    "gae",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_cumsum",
)
# (function, variant): "boot" bootstraps from values + bootstrap_value with float gamma/lmbda;
# "next" passes next_values, truncation and per-step tensor coefficients that require grad.
CASES = [
    *((fn, v) for fn in ESTIMATORS if fn != "retrace" for v in ("boot", "next")),
    *(("retrace", t) for t in ("retrace", "tree_backup", "q_lambda", "importance_sampling")),
]

# Under the Triton interpreter (seconds a launch) the richer variant of each function.
INTERPRETED_CASES = {
    *((fn, "next") for fn in ESTIMATORS if fn != "retrace"),
    *(("retrace", t) for t in ("retrace", "tree_backup")),
}


def _id(case):
    return f"{case[0]}-{case[1]}"


def make_case(fn: str, variant: str, T=5, N=3, *, seed=0, dtype=F64, device="cpu"):
    """Inputs of ``fn`` (``{name: value}``) and the names of those that require grad."""
    g = torch.Generator().manual_seed(seed)

    def u(lo=-1.0, hi=1.0, shape=(T, N)):
        x = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=F64)
        return x.to(device=device, dtype=dtype)

    def flag(p):
        return (torch.rand((T, N), generator=g) < p).to(device)

    inp: dict = {}
    rich = variant != "boot"
    if fn in ("gae", "lambda_returns", "discounted_returns", "vtrace"):
        inp["rewards"] = u()
        if fn != "discounted_returns":
            inp["values"] = u()
        if fn == "vtrace":
            tlp = u(-2.0, 0.0)
            inp["target_log_probs"] = tlp
            inp["behavior_log_probs"] = tlp - u(-1.0, 0.3)
        inp["terminated"] = flag(0.25)
        if rich:
            inp["truncated"] = flag(0.2)
            inp["next_values"] = u()
            inp["gamma"] = u(0.5, 1.0, (T, 1))
        else:
            inp["bootstrap_value"] = u(shape=(N,))
            inp["gamma"] = 0.9
        if fn in ("gae", "lambda_returns", "vtrace"):
            inp["lmbda"] = u(0.3, 1.0) if rich else 0.8
        if fn == "vtrace" and rich:
            inp["rho_bar"] = u(0.5, 1.2, (1, N))
            inp["c_bar"] = u(0.5, 1.2, (1, N))
            inp["pg_rho_bar"] = u(0.5, 1.2, (1, N))
    elif fn == "retrace":
        inp["rewards"] = u()
        inp["q_values"] = u()
        inp["next_expected_q"] = u()
        tlp = u(-2.0, 0.0)
        inp["target_log_probs"] = tlp
        inp["behavior_log_probs"] = tlp - u(-1.0, 0.2)
        inp["terminated"] = flag(0.2)
        inp["truncated"] = flag(0.2)
        inp["gamma"] = u(0.5, 1.0, (T, 1))
        inp["lmbda"] = u(0.3, 1.0)
        inp["c_bar"] = u(0.5, 1.2, (1, N))
        inp["trace"] = variant
    elif fn in ("eligibility_traces", "episodic_cumsum"):
        inp["x"] = u()
        inp["done"] = flag(0.3)
        inp["initial"] = u(shape=(N,))
        if fn == "eligibility_traces":
            inp["gamma"] = u(0.5, 1.0, (T, 1)) if rich else 0.9
            inp["lmbda"] = u(0.3, 1.0) if rich else 0.8
    elif fn == "linear_scan":
        a = u()
        a[torch.rand((T, N), generator=g) < 0.25] = 0.0  # cuts
        inp["a"], inp["b"], inp["initial"] = a, u(), u(shape=(N,))
        inp["reverse"] = variant == "reverse"
    else:
        raise ValueError(fn)
    diff = [k for k, v in inp.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    diff = [k for k in diff if k not in ("terminated", "truncated", "done")]
    return inp, diff


def as_function(fn: str, inp: dict, diff: list, **kwargs):
    """``f(*diff_tensors) -> outputs`` and the leaf tensors to differentiate."""

    def f(*xs):
        d = dict(inp)
        d.update(zip(diff, xs, strict=True))
        return as_tuple(call(fn, d, **kwargs))

    leaves = tuple(inp[k].detach().clone().requires_grad_() for k in diff)
    return f, leaves


def grads(fn: str, inp: dict, diff: list, seed=1, weights=None, **kwargs):
    """Outputs and the gradients of a random linear function of them (``weights``: a map
    from the outputs' layout to the canonical one, where the weights are drawn)."""
    f, leaves = as_function(fn, inp, diff, **kwargs)
    outs = f(*leaves)
    g = torch.Generator().manual_seed(seed)
    loss = 0
    for o in outs:
        canon = o if weights is None else weights(o)
        w = torch.randn(canon.shape, generator=g, dtype=F64).to(o)
        loss = loss + (canon * w).sum()
    return outs, torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)


def gradcheck_backends(device) -> list[str]:
    """Backends for float64 gradcheck: not the Triton interpreter (a launch per evaluation)."""
    return [b for b in rtc.available_backends(device) if not interpreted(b)]


# ---------------------------------------------------------------- linear_scan


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "form", ["plain", "batch_major", "broadcast_a", "keepdim_initial", "no_initial"]
)
def test_linear_scan_gradcheck(device, reverse, form):
    g = torch.Generator().manual_seed(3)
    T, N = 6, 3
    a = torch.rand(T, N, generator=g, dtype=F64) * 2 - 1
    a[torch.rand(T, N, generator=g) < 0.25] = 0.0
    b = torch.randn(T, N, generator=g, dtype=F64)
    init = torch.randn(N, generator=g, dtype=F64)
    time_dim = 0
    if form == "batch_major":
        a, b, time_dim = a.T.contiguous(), b.T.contiguous(), 1
    elif form == "broadcast_a":
        a = a[:, :1].contiguous()
    elif form == "keepdim_initial":
        init = init[None]
    args = [a.to(device), b.to(device)] + ([] if form == "no_initial" else [init.to(device)])
    leaves = tuple(x.requires_grad_() for x in args)
    for backend in gradcheck_backends(device):

        def f(*xs, backend=backend):
            initial = xs[2] if len(xs) > 2 else None
            return rtc.linear_scan(
                xs[0], xs[1], initial=initial, reverse=reverse, time_dim=time_dim, backend=backend
            )

        assert torch.autograd.gradcheck(f, leaves), backend


@pytest.mark.parametrize("cut_first", [False, True], ids=["", "cut_first"])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_gradgradcheck(device, reverse, cut_first):
    """``cut_first``: a = 0 at the step that reads ``initial``, where dL/dinitial = a g is
    exactly 0 but its derivative in a is not (a torch.where on the product blocked it)."""
    g = torch.Generator().manual_seed(4)
    T, N = 5, 2
    a = torch.rand(T, N, generator=g, dtype=F64) * 2 - 1
    if cut_first:
        a[-1 if reverse else 0, 0] = 0.0
    a = a.to(device).requires_grad_()
    b = torch.randn(T, N, generator=g, dtype=F64).to(device).requires_grad_()
    init = torch.randn(N, generator=g, dtype=F64).to(device).requires_grad_()
    for backend in gradcheck_backends(device):

        def f(a, b, init, backend=backend):
            return rtc.linear_scan(a, b, initial=init, reverse=reverse, backend=backend)

        assert torch.autograd.gradgradcheck(f, (a, b, init)), backend


def naive_scan(a, b, initial, reverse):
    """The recurrence as a Python loop of differentiable torch ops."""
    T = a.shape[0]
    x = torch.zeros_like(b[0]) if initial is None else initial
    rows = [None] * T
    for t in reversed(range(T)) if reverse else range(T):
        x = b[t] + a[t] * x
        rows[t] = x
    return torch.stack(rows)


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_backward_matches_naive_loop(backend, device, reverse):
    """float32 gradients of every backend against autograd through the naive loop, with
    cuts (``a_t = 0``; the one that reads ``initial`` too)."""
    g = torch.Generator().manual_seed(5)
    T, N = 9, 4
    a = torch.rand(T, N, generator=g) * 2 - 1
    a[torch.rand(T, N, generator=g) < 0.3] = 0.0
    a[T - 1 if reverse else 0, 0] = 0.0
    b, w = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    init = torch.randn(N, generator=g)
    leaves64 = [t.to(F64).requires_grad_() for t in (a, b, init)]
    x64 = naive_scan(*leaves64, reverse)
    want = torch.autograd.grad((x64 * w.to(F64)).sum(), leaves64)
    leaves = [t.to(device).requires_grad_() for t in (a, b, init)]
    x = rtc.linear_scan(*leaves[:2], initial=leaves[2], reverse=reverse, backend=backend)
    assert_close(x, x64.detach(), torch.float32, name="x")
    got = torch.autograd.grad((x * w.to(device)).sum(), leaves)
    for name, gg, ww in zip(("a", "b", "initial"), got, want, strict=True):
        assert_close(gg, ww, torch.float32, name=f"grad {name}")


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_backward_nan_behind_a_cut(backend, device, reverse):
    """Column 1: a NaN in ``b`` between cuts; the gradients of ``b`` and ``initial`` stay
    finite, those of ``a`` everywhere but next to the NaN (d x_t / d a_t = x_{t-1}, the NaN).
    Column 2: a NaN output gradient behind a cut reaches nothing across it."""
    T, N, mid = 8, 3, 4
    a = torch.full((T, N), 0.5)
    a[mid - 1 : mid + 2, 1] = 0.0
    a[mid, 2] = 0.0
    b = torch.ones(T, N)
    b[mid, 1] = NAN
    w = torch.ones(T, N)
    w[mid, 2] = NAN
    leaves = [t.to(device).requires_grad_() for t in (a, b, torch.ones(N))]
    x = rtc.linear_scan(*leaves[:2], initial=leaves[2], reverse=reverse, backend=backend)
    assert torch.isnan(x).sum() == 1
    ga, gb, gi = torch.autograd.grad((x * w.to(device)).nansum(), leaves)
    assert torch.isfinite(gb[:, :2]).all() and torch.isfinite(gi[:2]).all()
    assert set(torch.isnan(ga[:, 1]).nonzero().flatten().tolist()) <= {mid - 1, mid, mid + 1}
    assert torch.isfinite(ga[:, 0]).all()
    for g in (ga, gb):  # column 2: NaN at the step of the NaN output gradient only
        assert torch.isnan(g[:, 2]).nonzero().flatten().tolist() == [mid]
    assert torch.isfinite(gi).all()


def test_linear_scan_backward_is_a_scan_in_the_other_direction(backend, device):
    """d<w, scan(a, b)>/db = scan(a shifted by one step, w) in the other direction."""
    g = torch.Generator().manual_seed(6)
    T, N = 7, 3
    a = (torch.rand(T, N, generator=g) * 2 - 1).to(device)
    b = torch.randn(T, N, generator=g).to(device).requires_grad_()
    w = torch.randn(T, N, generator=g).to(device)
    x = rtc.linear_scan(a, b, backend=backend)
    (gb,) = torch.autograd.grad((x * w).sum(), b)
    shifted = torch.cat((a[1:], torch.zeros_like(a[:1])))
    with torch.no_grad():
        want = rtc.linear_scan(shifted, w, reverse=True, backend="reference")
    assert_close(gb, want, torch.float32)


# ---------------------------------------------------------------- estimators


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_estimator_gradcheck(device, case):
    fn, variant = case
    inp, diff = make_case(fn, variant, device=device)
    for backend in gradcheck_backends(device):
        f, leaves = as_function(fn, inp, diff, backend=backend)
        assert torch.autograd.gradcheck(f, leaves), f"{fn} {variant} {backend}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_autograd_path_forward_matches_direct_path(backend, device, case):
    """Outputs with grad required equal the fused no-grad outputs of the same backend
    (under the Triton interpreter the next test compares them with the reference)."""
    if interpreted(backend):
        pytest.skip("slow under the interpreter; covered by the reference comparison")
    fn, variant = case
    inp, diff = make_case(fn, variant, dtype=torch.float32, device=device)
    f, leaves = as_function(fn, inp, diff, backend=backend)
    got = f(*leaves)
    assert all(o.requires_grad for o in got)
    with torch.no_grad():
        want = f(*leaves)
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        assert o.dtype == w.dtype and o.shape == w.shape
        assert_close(o, w, torch.float32, name=f"{fn} output {i}")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_gradients_match_reference_float32(backend, device, case):
    """float32 gradients of every backend against the reference backend's (float64 loop)."""
    if backend == "reference":
        pytest.skip("the oracle itself")
    if interpreted(backend) and case not in INTERPRETED_CASES:
        pytest.skip("a launch costs seconds under the interpreter: the richer variants only")
    fn, variant = case
    inp, diff = make_case(fn, variant, T=7, N=3, seed=2, dtype=torch.float32, device=device)
    outs, got = grads(fn, inp, diff, backend=backend)
    ref_inp = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inp.items()}
    ref_outs, want = grads(fn, ref_inp, diff, backend="reference")
    for i, (o, w) in enumerate(zip(outs, ref_outs, strict=True)):
        assert_close(o, w, torch.float32, rtol=1e-5, name=f"{fn} output {i}")
    for name, gg, ww in zip(diff, got, want, strict=True):
        assert_close(gg, ww, torch.float32, rtol=2e-5, name=f"{fn} grad {name}")


@pytest.mark.parametrize(
    "fn, drop",
    [
        ("lambda_returns", ("values",)),  # next_values only
        ("discounted_returns", ("next_values", "truncated")),  # no bootstrap: 0
        ("gae", ("terminated",)),
        ("eligibility_traces", ("done", "initial")),
        ("vtrace", ("terminated", "truncated")),
    ],
)
def test_optional_inputs_gradcheck(fn, drop):
    inp, diff = make_case(fn, "next", seed=14)
    inp = {k: (None if k in drop else v) for k, v in inp.items()}
    diff = [k for k in diff if k not in drop]
    for backend in ("reference", "torch"):
        f, leaves = as_function(fn, inp, diff, backend=backend)
        assert torch.autograd.gradcheck(f, leaves), backend


def test_errors_on_the_autograd_path():
    """The autograd path validates like the direct one, naming the public function."""
    inp, _ = make_case("episodic_cumsum", "next", seed=15)
    x = inp["x"].clone().requires_grad_()
    with pytest.raises(ValueError, match="episodic_cumsum"):
        rtc.episodic_cumsum(x, inp["done"][:, :2])
    with pytest.raises(ValueError, match="backend"):
        rtc.episodic_cumsum(x, inp["done"], backend="nope")
    with pytest.raises(ValueError, match=r"gae.*bootstrap_value"):
        rtc.gae(x, x, None)
    with pytest.raises(ValueError, match="time_dim"):
        rtc.linear_scan(x, x, time_dim=2)


def test_vtrace_detached_importance_weights():
    """With detached log-probabilities (IMPALA, rlax) the gradients in rewards, values and
    the bootstrap value are those of the formula with the importance weights held fixed
    (gradcheck: finite differences of the call, the log-probabilities constants)."""
    inp, diff = make_case("vtrace", "boot", seed=7)
    inp = dict(inp)
    diff = ["rewards", "values", "bootstrap_value"]
    for backend in ("reference", "torch"):
        f, leaves = as_function("vtrace", inp, diff, backend=backend)
        assert torch.autograd.gradcheck(f, leaves)


def test_gradient_nan_locality():
    """A NaN in one environment, or in a term the formulas switch off, leaves every other
    gradient finite (the NaN's own gradient may be anything)."""
    T, N = 6, 3
    g = torch.Generator().manual_seed(8)
    r = torch.randn(T, N, generator=g, dtype=F64)
    v = torch.randn(T, N, generator=g, dtype=F64)
    nv = torch.randn(T, N, generator=g, dtype=F64)
    term = torch.zeros(T, N, dtype=torch.bool)
    term[2, 0] = True
    nv[2, 0] = NAN  # switched off: s_3 is terminal for environment 0
    v[:, 2] = NAN  # environment 2 is all NaN
    gamma = torch.full((T, N), 0.9, dtype=F64)
    for backend in ("reference", "torch"):
        leaves = [x.clone().requires_grad_() for x in (r, v, nv, gamma)]
        adv, ret = rtc.gae(
            leaves[0], leaves[1], term, next_values=leaves[2], gamma=leaves[3], backend=backend,
        )  # fmt: skip
        (adv[:, :2].sum() + ret[:, :2].sum()).backward()
        gr, gv, gnv, gg = (x.grad for x in leaves)
        assert torch.isfinite(gr).all() and torch.isfinite(gnv).all(), backend
        assert torch.isfinite(gv[:, :2]).all() and torch.isfinite(gg[:, :2]).all(), backend
        assert gnv[2, 0] == 0  # the terminated step does not read nv
        # (gamma of environment 2 multiplies its NaN advantages: 0 * NaN there, as with any
        # PyTorch product, so a gamma shared across environments would be NaN too)


def test_layouts_and_dtypes():
    """TorchRL [B, T, 1] with time_dim=-2 and float16 inputs: gradients of the inputs' dtype
    and shape, equal to the float64 time-major ones."""
    inp, diff = make_case("gae", "next", T=6, N=4, seed=9)
    _, want = grads("gae", inp, diff, backend="reference")
    for dtype in (torch.float16, torch.float32):
        lay = {}
        for k, x in inp.items():
            if isinstance(x, torch.Tensor):
                y = x.T.unsqueeze(-1).contiguous()  # [N, T, 1]
                lay[k] = y.to(dtype) if y.is_floating_point() else y
            else:
                lay[k] = x
        _, got = grads(
            "gae", lay, diff, backend="torch", time_dim=-2, weights=lambda o: o[..., 0].T
        )
        for name, gg, ww in zip(diff, got, want, strict=True):
            assert gg.dtype == dtype and gg.shape == lay[name].shape
            ww = ww.T.unsqueeze(-1)
            assert_close(gg, ww, dtype, rtol=2e-2 if dtype == torch.float16 else 1e-5)


def test_out_with_grad():
    inp, diff = make_case("lambda_returns", "boot", seed=10)
    f, leaves = as_function("lambda_returns", inp, diff, backend="torch")
    d = dict(inp)
    d.update(zip(diff, leaves, strict=True))
    out = torch.full_like(inp["rewards"], NAN)
    res = call("lambda_returns", d, backend="torch", out=out)
    assert res is out and out.requires_grad
    (want,) = f(*leaves)
    assert_close(out, want.detach(), F64)
    g1 = torch.autograd.grad(out.sum(), leaves, retain_graph=True)
    g2 = torch.autograd.grad(want.sum(), leaves)
    for a, b in zip(g1, g2, strict=True):
        assert_close(a, b, F64)
    with pytest.raises(ValueError, match="out"):
        call("lambda_returns", d, backend="torch", out=torch.empty(2, 2, dtype=F64))


@pytest.mark.parametrize("name", ["a", "b", "initial", "rewards"])
def test_out_sharing_memory_with_an_input_with_grad(name):
    """On the gradient path, as on the direct one, an out= tensor that shares memory with an
    input is refused (not written over the input, nor left for backward to fail on)."""
    a = torch.full((4, 2), 0.5, dtype=F64, requires_grad=True)
    inputs = {"a": a * 1, "b": torch.ones(4, 2, dtype=F64), "initial": torch.zeros(4, 2, dtype=F64)}
    if name == "rewards":
        r = torch.zeros(4, 2, dtype=F64)
        with pytest.raises(ValueError, match="`out` tensor for `advantages` shares memory"):
            rtc.gae(r, a, None, bootstrap_value=torch.zeros(2, dtype=F64), out=(r, r * 1))
        return
    out = inputs[name]
    inputs["initial"] = inputs["initial"][0]
    before = out.detach().clone()
    with pytest.raises(ValueError, match=f"`out` tensor for `x` shares memory with `{name}`"):
        rtc.linear_scan(inputs["a"], inputs["b"], initial=inputs["initial"], out=out)
    assert torch.equal(out.detach(), before)


def test_empty_time_axis_backward():
    a = torch.zeros(0, 3, requires_grad=True)
    b = torch.zeros(0, 3, requires_grad=True)
    x = rtc.linear_scan(a, b)
    assert x.shape == (0, 3)
    ga, gb = torch.autograd.grad(x.sum(), (a, b))
    assert ga.shape == gb.shape == (0, 3)
    r = torch.zeros(0, 3, requires_grad=True)
    adv, _ = rtc.gae(r, r, None, bootstrap_value=torch.zeros(3))
    assert adv.shape == (0, 3) and adv.requires_grad


def test_empty_batch_backward(backend, device):
    """T > 0 steps of an empty batch: empty gradients (no launch on the Triton backend)."""
    shape = (2, 0, 5, 1)  # (TorchRL's layout, time_dim=-2: its planner divided by the batch)
    a = torch.zeros(shape, device=device, requires_grad=True)
    b = torch.zeros(shape, device=device, requires_grad=True)
    x = rtc.linear_scan(a, b, time_dim=-2, backend=backend)
    ga, gb = torch.autograd.grad(x.sum(), (a, b))
    assert ga.shape == gb.shape == shape
    r = torch.zeros(shape, device=device, requires_grad=True)
    boot = torch.zeros(2, 0, 1, device=device)
    adv, ret = rtc.gae(r, r, None, bootstrap_value=boot, time_dim=-2, backend=backend)
    assert adv.shape == ret.shape == shape
    (g,) = torch.autograd.grad((adv + ret).sum(), r)
    assert g.shape == shape


def test_no_grad_calls_take_the_direct_path(monkeypatch):
    """Under no_grad, or with no input requiring grad, the autograd path is never entered;
    with an input requiring grad (and grad mode on) it is."""
    inp, _ = make_case("gae", "boot", seed=11, dtype=torch.float32)

    def fail(*args, **kwargs):
        raise AssertionError("the autograd path was entered")

    monkeypatch.setattr(rtc_autograd, "gae", fail)
    call("gae", inp)  # nothing requires grad
    v = inp["values"].clone().requires_grad_()
    with torch.no_grad():
        adv, _ = call("gae", {**inp, "values": v})
    assert adv.grad_fn is None and not adv.requires_grad
    with torch.inference_mode():
        call("gae", {**inp, "values": v})
    with pytest.raises(AssertionError, match="autograd path"):
        call("gae", {**inp, "values": v})


def test_flags_and_detached_inputs_get_no_gradient():
    inp, _ = make_case("gae", "next", seed=12)
    term = inp["terminated"].to(F64).requires_grad_()  # a float flag
    r = inp["rewards"].clone().requires_grad_()
    adv, _ = call("gae", {**inp, "rewards": r, "terminated": term})
    gr, gt = torch.autograd.grad(adv.sum(), (r, term), allow_unused=True)
    assert gt is None and torch.isfinite(gr).all()


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("layout", ["time_major", "batch_major"])
def test_gpu_triton_gradients_large(case, layout):
    """Triton on the GPU at a size the interpreter cannot reach, against the torch backend
    in float64 (itself checked above by gradcheck)."""
    fn, variant = case
    inp, diff = make_case(fn, variant, T=1000, N=64, seed=13, dtype=torch.float32, device="cuda")
    kw: dict = {}
    if layout == "batch_major":
        inp = {
            k: (v.T.contiguous().T if isinstance(v, torch.Tensor) and v.dim() == 2 else v)
            for k, v in inp.items()
        }
    outs, got = grads(fn, inp, diff, backend="triton", **kw)
    inp64 = {
        k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
        for k, v in inp.items()
    }
    ref_outs, want = grads(fn, inp64, diff, backend="torch", **kw)
    for i, (o, w) in enumerate(zip(outs, ref_outs, strict=True)):
        assert_close(o, w, torch.float32, rtol=1e-4, name=f"{fn} output {i}")
    for name, gg, ww in zip(diff, got, want, strict=True):
        assert_close(gg, ww, torch.float32, rtol=1e-4, name=f"{fn} grad {name}")


class _ActorCritic(torch.nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(obs_dim, 64), torch.nn.Tanh())
        self.pi = torch.nn.Linear(64, n_actions)
        self.v = torch.nn.Linear(64, 1)

    def forward(self, obs):
        h = self.body(obs)
        return self.pi(h), self.v(h).squeeze(-1)


def ppo_update(net, opt, batch, *, backend="auto", clip=0.2):
    """One PPO step: GAE (no grad) for the advantages and value targets, plus a
    differentiable λ-return term (Dreamer-style) that backpropagates through our scan."""
    obs, actions, old_logp, rewards, terminated = batch
    logits, values = net(obs)  # values: [T + 1, N]
    with torch.no_grad():
        adv, ret = rtc.gae(
            rewards, values[:-1], terminated, bootstrap_value=values[-1], backend=backend
        )
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    lam_ret = rtc.lambda_returns(
        rewards, values[:-1], terminated, bootstrap_value=values[-1], backend=backend
    )
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, actions[..., None]).squeeze(-1)
    ratio = torch.exp(logp - old_logp)
    pg = -torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
    v_loss = ((values[:-1] - ret) ** 2).mean() + 0.1 * ((lam_ret - ret) ** 2).mean()
    loss = pg + 0.5 * v_loss
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    return loss.detach()


def ppo_batch(T, N, obs_dim, n_actions, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (
        torch.randn(T + 1, N, obs_dim, generator=g, device=device),
        torch.randint(0, n_actions, (T, N), generator=g, device=device),
        -torch.rand(T, N, generator=g, device=device) - 0.5,
        torch.randn(T, N, generator=g, device=device),
        torch.rand(T, N, generator=g, device=device) < 0.02,
    )


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
@pytest.mark.parametrize("T, N", [(128, 64), (2048, 8)])
def test_cuda_graph_ppo_update(T, N):
    """Capture a whole PPO update (forward, GAE, λ-returns with grad, backward, Adam) in a
    CUDA graph; replays match the same steps run eagerly."""
    torch.manual_seed(0)
    obs_dim, n_actions = 8, 4
    eager_net = _ActorCritic(obs_dim, n_actions).cuda()
    graph_net = _ActorCritic(obs_dim, n_actions).cuda()
    graph_net.load_state_dict(eager_net.state_dict())
    eager_opt = torch.optim.Adam(eager_net.parameters(), lr=1e-3, capturable=True)
    graph_opt = torch.optim.Adam(graph_net.parameters(), lr=1e-3, capturable=True)
    batches = [ppo_batch(T, N, obs_dim, n_actions, "cuda", seed=s) for s in range(4)]
    static = tuple(x.clone() for x in batches[0])

    # warm up on a side stream (Triton compiles, the allocator settles), then capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            ppo_update(graph_net, graph_opt, static)
            ppo_update(eager_net, eager_opt, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = ppo_update(graph_net, graph_opt, static)
    for batch in batches:
        for s, x in zip(static, batch, strict=True):
            s.copy_(x)
        graph.replay()
        want = ppo_update(eager_net, eager_opt, batch)
        torch.testing.assert_close(static_loss, want, rtol=1e-4, atol=1e-5)
    torch.cuda.synchronize()
    for p, q in zip(graph_net.parameters(), eager_net.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_exact_gradient_where_a_coefficient_cuts(backend):
    """At lambda = 1 (lambda_returns drops nv_t) and lambda = 0 (Retrace drops q_{t+1}) the
    dropped term's coefficient still has its exact gradient (the formulas are polynomials)."""
    g = torch.Generator().manual_seed(5)
    T, N = 6, 3
    r, nv, q, nq, tlp, blp = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(6))
    term = torch.rand(T, N, generator=g) < 0.2
    lam = torch.ones(T, N, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda lam: rtc.lambda_returns(
            r, None, term, next_values=nv, lmbda=lam, gamma=0.9, backend=backend
        ),
        (lam,),
    )
    lam0 = torch.zeros(T, N, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(
        lambda lam: rtc.retrace(
            r, q, nq, tlp, blp, term, lmbda=lam, trace="q_lambda", backend=backend
        ),
        (lam0,),
    )


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_nan_in_a_cut_coefficient_leaves_other_gradients_finite(backend):
    """lambda is NaN at a terminated step, where the trace is cut: the advantages and the
    gradient of gamma stay finite (the NaN factor is masked before the product)."""
    g = torch.Generator().manual_seed(6)
    T, N = 5, 2
    r, v = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    term = torch.zeros(T, N, dtype=torch.bool)
    term[2] = True
    lam = torch.full((T, N), 0.9)
    lam[2] = float("nan")
    gamma = torch.full((T, N), 0.99, requires_grad=True)
    adv, _ = rtc.gae(
        r, v, term, bootstrap_value=torch.zeros(N), gamma=gamma, lmbda=lam, backend=backend
    )
    adv.sum().backward()
    assert torch.isfinite(adv).all()
    assert torch.isfinite(gamma.grad).all(), gamma.grad


@pytest.mark.parametrize("fn", ["gae", "discounted_returns", "vtrace", "eligibility_traces"])
def test_long_horizon_float32_with_gradients(fn, backend, device):
    """The autograd path accumulates long-horizon float32 calls in float64 as the direct paths
    do (gamma = 0.9997, lambda = 1, 300 steps: ``_dispatch.accumulates_in_float64``): outputs
    within 1e-6 of float64 (float32 accumulation drifts past that here), float32 gradients."""
    T, N = (300, 2) if not interpreted(backend) else (140, 1)
    g = torch.Generator().manual_seed(11)
    x = (0.5 + 0.5 * torch.rand(T, N, generator=g, dtype=F64)).to(device)  # no cancellation
    v = torch.rand(T, N, generator=g, dtype=F64).to(device)
    term = torch.zeros(T, N, dtype=torch.bool, device=device)
    boot = torch.rand(N, generator=g, dtype=F64).to(device)
    inp = {
        "gae": dict(rewards=x, values=v, terminated=term, bootstrap_value=boot, lmbda=1.0),
        "discounted_returns": dict(rewards=x, terminated=term, bootstrap_value=boot),
        "vtrace": dict(rewards=x, values=v, target_log_probs=-x, behavior_log_probs=-x,
                       terminated=term, bootstrap_value=boot),
        "eligibility_traces": dict(x=x, done=term, lmbda=1.0),
    }[fn]  # fmt: skip
    want = as_tuple(call(fn, inp, gamma=0.9997, backend="reference"))
    f32 = {k: x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
           for k, x in inp.items()}  # fmt: skip
    leaf = next(iter(f32.values())).requires_grad_()
    got = as_tuple(call(fn, f32, gamma=0.9997, backend=backend))
    assert all(o.requires_grad and o.dtype == torch.float32 for o in got)
    for i, (o, w) in enumerate(zip(got, want, strict=True)):
        assert_close(o, w, torch.float32, rtol=1e-6, name=f"{fn} output {i} (autograd path)")
    (grad,) = torch.autograd.grad(sum(o.sum() for o in got), leaf)
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all()
