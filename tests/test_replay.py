"""Replayed calls (rl_triton_core/_replay.py): a repeated Triton call skips validation and
launch planning and replays the recorded launches with its own tensors.

Each test makes a first call that records, then a second call with new data (and new tensors)
of the same metadata, checks that the second call was a replay (the launcher's planning
function did not run) and that its outputs, NaN-poisoned first when ``out=`` is given, equal
the float64 reference. Then the cases a replay must refuse: aliased arguments, a CPU scalar
read as a float, gradients, tensor subclasses.
"""

from __future__ import annotations

import collections
import inspect

import pytest
import torch
import triton.language as tl
from _support import (
    FLAG_ARGS,
    NOTIME_ARGS,
    PARAM_ARGS,
    POSITIONAL,
    STEP_ARGS,
    as_tuple,
    forget_launches,
)
from conftest import HAS_CUDA, TRITON_INTERPRET, assert_close

import rl_triton_core as rtc
from rl_triton_core import _replay

DEVICES = [
    pytest.param(
        "cpu", marks=pytest.mark.skipif(not TRITON_INTERPRET, reason="needs TRITON_INTERPRET=1")
    ),
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")],
    ),
]
FUNCTIONS = tuple(POSITIONAL)
# (per-step shape, time_dim): time-major, batch-major, TorchRL [B, T, 1]; T = 20 splits the
# time axis across programs under the interpreter (two launches per call).
LAYOUTS = {"time-major": ((7, 3), 0), "batch-major": ((3, 7), 1), "torchrl": ((2, 7, 1), -2)}


@pytest.fixture
def launcher_calls(monkeypatch):
    """Counts the Triton launcher's planning calls (a replay makes none)."""
    from rl_triton_core import triton_backend

    calls = []
    real = triton_backend._launch
    monkeypatch.setattr(
        triton_backend, "_launch", lambda *a, **k: (calls.append(1), real(*a, **k))[1]
    )
    return calls


def _inputs(fn, shape, time_dim, device, dtype, seed, *, truncation, tensor_gamma):
    g = torch.Generator().manual_seed(seed)

    def rand(*s):
        return torch.randn(s, generator=g, dtype=torch.float64).to(device, dtype)

    td = time_dim % len(shape)
    boundary = shape[:td] + shape[td + 1 :]
    d = {}
    for name in STEP_ARGS[fn]:
        if name == "next_values" and not truncation:
            continue
        d[name] = rand(*shape)
        if name.endswith("log_probs"):
            d[name] = -d[name].abs()
    for name in FLAG_ARGS[fn]:
        if name == "truncated" and not truncation:
            continue
        d[name] = (torch.rand(shape, generator=g) < 0.2).to(device)
    for name in NOTIME_ARGS[fn]:
        if not (name == "bootstrap_value" and truncation):
            d[name] = rand(*boundary)
    for name in PARAM_ARGS[fn]:
        d[name] = 0.9  # float32 cannot hold it: float64 calls pass a cached float64 scalar
        if tensor_gamma and name == "gamma":  # per step and sequence
            d[name] = (0.8 + 0.2 * torch.rand(shape, generator=g)).to(device, dtype)
    return d


def _call(fn, inputs, **kwargs):
    pos = [inputs.get(n) for n in POSITIONAL[fn]]
    rest = {k: v for k, v in inputs.items() if k not in POSITIONAL[fn]}
    return getattr(rtc, fn)(*pos, **rest, **kwargs)


def _reference(fn, inputs, time_dim):
    """The float64 results: the reference loop, or past 10^4 steps the float64 torch backend
    (as in test_gpu_triton's large shapes; the core tests check it against the loop), since the
    loop makes some 15 launches a step on a GPU: minutes at the GPU shapes of 131072 and 200003
    steps."""
    f64 = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
           for k, v in inputs.items()}  # fmt: skip
    steps = f64[POSITIONAL[fn][0]].shape[time_dim]
    backend = "torch" if steps > 10_000 else "reference"
    return as_tuple(_call(fn, f64, time_dim=time_dim, backend=backend))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_second_call_is_a_replay_with_the_new_data(fn, layout, device, launcher_calls):
    shape, time_dim = LAYOUTS[layout]
    # (float64 with a per-step gamma tensor: the other coefficients, 0.9, are float64 scalars
    # that the kernel reads as one value for every step, beside the per-step tensor, in place)
    for dtype, truncation, tensor_gamma, use_out in (
        (torch.float32, False, True, True),
        (torch.float64, True, False, False),
        (torch.float64, False, True, True),
    ):
        kw = dict(truncation=truncation, tensor_gamma=tensor_gamma)
        first = _inputs(fn, shape, time_dim, device, dtype, 1, **kw)
        second = _inputs(fn, shape, time_dim, device, dtype, 2, **kw)
        n_out = 2 if fn in ("gae", "vtrace") else 1

        def outs(dtype=dtype, n_out=n_out, use_out=use_out):
            o = tuple(torch.full(shape, float("nan"), dtype=dtype, device=device)
                      for _ in range(n_out))  # fmt: skip
            return dict(out=o if n_out > 1 else o[0]) if use_out else {}

        _call(fn, first, time_dim=time_dim, backend="triton", **outs())
        recorded = len(launcher_calls)
        assert recorded == 1, "the first call did not go through the launcher"
        got = as_tuple(_call(fn, second, time_dim=time_dim, backend="triton", **outs()))
        assert len(launcher_calls) == recorded, f"{fn} {layout} {dtype}: not replayed"
        for g, w in zip(got, _reference(fn, second, time_dim), strict=True):
            assert g.shape == w.shape and g.dtype == dtype
            assert_close(g, w, dtype, name=f"{fn} {layout} {dtype} replayed")
        launcher_calls.clear()


@pytest.mark.parametrize("device", DEVICES)
def test_split_time_axis_replay(device, launcher_calls):
    """Two launches per call (totals written, then folded in) on the interpreter's tiny tiles
    (on a GPU: 64 chunks of a long single sequence)."""
    T = 20 if device == "cpu" else 1 << 16
    for seed in (1, 2):
        d = _inputs("gae", (T, 1), 0, device, torch.float32, seed, truncation=True,
                    tensor_gamma=False)  # fmt: skip
        got = _call("gae", d, backend="triton")
    assert len(launcher_calls) == 1
    for g, w in zip(got, _reference("gae", d, 0), strict=True):
        assert_close(g, w, torch.float32, name="split replay")


@pytest.mark.skipif(not TRITON_INTERPRET, reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_launch_records_where_its_tensors_are(fn, monkeypatch):
    """A direct launch keys its compiled kernel on the 16-byte alignment of the pointers at
    ``launch.pointers`` alone (GPU only): those positions must be exactly where the launch's
    tensors are, for every estimator, split launches (chunk totals, group passes) and float64
    coefficient tensors included."""
    from rl_triton_core import triton_backend

    seen = []
    real = triton_backend._run

    def run(launch, args, *phase):
        seen.append(
            (launch.pointers, tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)))
        )
        return real(launch, args, *phase)

    monkeypatch.setattr(triton_backend, "_run", run)
    for shape, time_dim, dtype, truncation, tensor_gamma in (
        ((7, 3), 0, torch.float32, False, True),
        ((40, 2), 0, torch.float64, True, False),  # split in chunks; float64 coefficient tensors
        ((3, 40), 1, torch.float32, True, False),  # batch-major, split
    ):
        d = _inputs(fn, shape, time_dim, "cpu", dtype, 1, truncation=truncation,
                    tensor_gamma=tensor_gamma)  # fmt: skip
        _call(fn, d, time_dim=time_dim, backend="triton")
    # (15: the chunk totals' place, after 5 value inputs, 2 flags, 5 coefficients, boot, 2 outputs)
    assert any(15 in tensors for _, tensors in seen), "no split launch"
    for pointers, tensors in seen:
        assert pointers == tensors, f"{fn}: pointers {pointers}, tensors at {tensors}"


@pytest.mark.skipif(not TRITON_INTERPRET, reason="needs TRITON_INTERPRET=1")
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_replay_by_address_launches_what_start_would(fn, monkeypatch):
    """The replay's launches by address (GPU only; see ``_replay._compile``), run on the CPU
    through a stand-in for Triton's direct launcher that maps each address back to its tensor
    and runs the kernel under the interpreter: an unsplit call, split calls (totals and the
    carried scan; with a group pass) and a resident one. A replay launches every phase in
    order on chunk totals of its own, never through ``start``, and its outputs equal the
    float64 reference."""
    from rl_triton_core import triton_backend as tb
    from rl_triton_core.triton_backend import kernels

    params = inspect.signature(kernels.scan_kernel.fn).parameters.values()  # (interpreted)
    runtime = [p.name for p in params if p.annotation is not tl.constexpr]
    constexpr_names = [p.name for p in params if p.annotation is tl.constexpr]
    live = {}  # address -> tensor, for the stand-in launcher

    def keep(t):
        if isinstance(t, torch.Tensor):
            live[t.data_ptr()] = t
        return t

    launched = []

    def direct_run(gx, gy, gz, stream, function, *rest):
        assert gz == 1 and stream == 0 and function == "function"
        args, constexprs = rest[4 : 4 + len(runtime)], rest[4 + len(runtime) :]
        args = [live[a] if i < runtime.index("T") and type(a) is int else a
                for i, a in enumerate(args)]  # fmt: skip
        meta = dict(zip(constexpr_names, constexprs, strict=True))
        launched.append(tuple(meta[k] for k in tb._Phase._fields))
        kernels.scan_kernel[(gx, gy)](*args, **meta)

    real_run, real_totals, real_empty, real_start = tb._run, tb.new_totals, _replay.empty, tb.start
    started = []

    def run(launch, args, grid, phase):  # the recording call: as on a GPU, a direct launcher
        real_run(launch, args, grid, phase)  # for each phase with every pointer aligned
        constexprs = {**launch.meta, **phase._asdict()}
        launch.direct[(phase, *(True,) * len(launch.pointers))] = (
            direct_run,
            ("function", "packed", None, None, None),
            tuple(constexprs[k] for k in constexpr_names),
        )

    monkeypatch.setattr(tb, "_run", run)
    monkeypatch.setattr(tb, "new_totals", lambda launch: keep(real_totals(launch)))
    monkeypatch.setattr(_replay, "empty", lambda *a: keep(real_empty(*a)))
    monkeypatch.setattr(tb, "start", lambda *a: (started.append(1), real_start(*a))[1])
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: None, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 0, raising=False)
    monkeypatch.setattr(_replay, "_INTERPRETED", True)
    seen = set()
    # (interpreter plans: unsplit; split in two launches, batch-major; split with a group pass;
    # resident at N = 7)
    for shape, time_dim in (((7, 5), 0), ((3, 40), 1), ((150, 3), 0), ((20, 7), 0)):
        tb._LAUNCHES.clear()
        _replay._PLANS.clear()
        for seed in (1, 2):  # records, then replays
            d = _inputs(fn, shape, time_dim, "cpu", torch.float32, seed, truncation=True,
                        tensor_gamma=True)  # fmt: skip
            for t in d.values():
                keep(t)
            started.clear()
            launched.clear()
            got = as_tuple(_call(fn, d, time_dim=time_dim, backend="triton"))
            for g, w in zip(got, _reference(fn, d, time_dim), strict=True):
                assert_close(g, w, torch.float32, name=f"{fn} {shape} replayed by address")
        (launch,) = tb._LAUNCHES.values()
        phases = [tuple(phase) for phase, _ in launch.phases]
        assert not started and launched == phases, f"{fn} {shape}: {launched} for {phases}"
        seen.add(len(phases) if not launch.plan.resident else "resident")
    assert seen == {1, 2, 3, "resident"}, seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "fn,N,time_dim",
    [
        ("gae", 2, 0),  # time-major, two chunks side by side in a program (reverse scan)
        ("gae", 5, 0),  # time-major, one chunk a program (reverse scan)
        ("eligibility_traces", 5, 0),  # the same, forward
        ("lambda_returns", 4, 1),  # batch-major (CPU only: on a GPU no batch-major call groups)
        ("lambda_returns", 3, 1),  # the same, one-sequence tiles scanned by fours
    ],
)
def test_two_level_carry_in_repeated(device, fn, N, time_dim):
    """A call split in many chunks takes the two-level carry-in (GROUP > 1: a group pass between
    the totals and the scan launches): right on every one of repeated calls with new data."""
    from rl_triton_core import triton_backend

    if device == "cuda" and time_dim == 1:
        pytest.skip("batch-major calls fold their chunk totals in one step on a GPU (GROUP = 1)")
    T = 150 if device == "cpu" else 1 << 17  # interpreter: 5-8 chunks; GPU: thousands
    shape = (T, N) if time_dim == 0 else (N, T)
    triton_backend._LAUNCHES.clear()
    _replay._PLANS.clear()
    for seed in (3, 4, 5):
        d = _inputs(fn, shape, time_dim, device, torch.float32, seed, truncation=False,
                    tensor_gamma=False)  # fmt: skip
        got = as_tuple(_call(fn, d, time_dim=time_dim, backend="triton"))
        for g, w in zip(got, _reference(fn, d, time_dim), strict=True):
            assert_close(g, w, torch.float32, name=f"{fn} two-level carry-in")
        grouped = [
            x
            for x in triton_backend._LAUNCHES.values()
            if any(phase == triton_backend._GROUPS for phase, _ in x.phases)
        ]
        assert grouped, "the call did not take the two-level carry-in"


@pytest.mark.parametrize("device", DEVICES)
def test_refused_cooperative_launch_falls_back(device, monkeypatch):
    """A resident plan whose cooperative launch the GPU refuses (it runs fewer programs at once
    than its SM count promises) runs the split plans instead, on that device from then on;
    repeated calls replay those."""
    from rl_triton_core import triton_backend

    shape = (200_003, 2) if device == "cuda" else (40, 7)  # resident on the GPU / interpreter
    real_run, refused = triton_backend._run, []

    def run(launch, args, grid, phase):
        if phase.RESIDENT:
            refused.append(grid)
            raise RuntimeError("Triton Error [CUDA]: too many blocks in cooperative launch")
        return real_run(launch, args, grid, phase)

    monkeypatch.setattr(triton_backend, "_run", run)
    monkeypatch.setattr(triton_backend, "_NO_RESIDENT", set())
    triton_backend._LAUNCHES.clear()
    _replay._PLANS.clear()
    for seed in (3, 4, 5):
        d = _inputs("gae", shape, 0, device, torch.float32, seed, truncation=False,
                    tensor_gamma=False)  # fmt: skip
        got = as_tuple(_call("gae", d, time_dim=0, backend="triton"))
        for g, w in zip(got, _reference("gae", d, 0), strict=True):
            assert_close(g, w, torch.float32, name="gae after a refused cooperative launch")
    assert len(refused) == 1, "the refused plan was tried again"
    assert triton_backend._LAUNCHES
    assert not any(x.plan.resident for x in triton_backend._LAUNCHES.values())
    triton_backend._LAUNCHES.clear()
    _replay._PLANS.clear()


@pytest.mark.parametrize("device", DEVICES)
def test_long_horizon_beside_a_tensor_coefficient_is_replayed(device, launcher_calls):
    """A float32 call with a long-horizon Python-float gamma (float64 accumulation alone) and a
    tensor clipping threshold accumulates in float32 (a tensor coefficient is the documented way
    to keep float32: ``_dispatch.accumulates_in_float64``), and its repeated call is a replay."""
    from rl_triton_core import triton_backend

    d = _inputs("vtrace", (200, 3), 0, device, torch.float32, 3, truncation=False,
                tensor_gamma=False)  # fmt: skip
    d.update(gamma=0.9995, lmbda=1.0, c_bar=torch.full((200, 3), 0.9, device=device))
    forget_launches()  # (the launches of earlier tests: only this call's are checked)
    for _ in range(2):
        got = _call("vtrace", d, backend="triton")
    assert len(launcher_calls) == 1, "the repeated call was not a replay"
    assert all(
        x.meta["ACC"] == triton_backend.tl.float32 for x in triton_backend._LAUNCHES.values()
    )
    for g, w in zip(got, _reference("vtrace", d, 0), strict=True):
        assert_close(g, w, torch.float32, name="long-horizon V-trace with a tensor c_bar")


@pytest.mark.parametrize("device", DEVICES)
def test_one_value_coefficient_beside_a_per_step_one_is_replayed(device, launcher_calls):
    """A coefficient tensor of one value for every step (a [1, 1] gamma, broadcast: stride 0)
    beside a per-step tensor threshold: the kernel reads its one value (kernels.COEF_ONE), so
    no copies, and the repeated call with new data is a replay."""
    kw = dict(truncation=False, tensor_gamma=False)
    for seed in (1, 2):
        d = _inputs("vtrace", (9, 3), 0, device, torch.float32, seed, **kw)
        d.update(gamma=torch.full((1, 1), 0.97, device=device),
                 c_bar=torch.rand((9, 3), device=device) + 0.5)  # fmt: skip
        got = _call("vtrace", d, backend="triton")
    assert len(launcher_calls) == 1, "the repeated call was not a replay"
    for g, w in zip(got, _reference("vtrace", d, 0), strict=True):
        assert_close(g, w, torch.float32, name="V-trace with a [1, 1] gamma and a tensor c_bar")


@pytest.mark.parametrize("device", DEVICES)
def test_aliased_arguments(device, launcher_calls):
    """A recording made with two distinct flag tensors replays correctly when one tensor is
    passed for both; a first call with one tensor passed twice is not replayable (its
    recording could not tell the two slots apart)."""
    kw = dict(truncation=True, tensor_gamma=False)
    _call("gae", _inputs("gae", (7, 3), 0, device, torch.float32, 3, **kw), backend="triton")
    d = _inputs("gae", (7, 3), 0, device, torch.float32, 4, **kw)
    d["truncated"] = d["terminated"]
    got = _call("gae", d, backend="triton")
    assert len(launcher_calls) == 1, "not replayed"
    for g, w in zip(got, _reference("gae", d, 0), strict=True):
        assert_close(g, w, torch.float32, name="aliased flags replayed")
    for seed in (5, 6):
        d = _inputs("gae", (6, 3), 0, device, torch.float32, seed, **kw)
        d["truncated"] = d["terminated"]
        _call("gae", d, backend="triton")
    assert len(launcher_calls) == 3, "a recording with aliased arguments was replayed"


@pytest.mark.parametrize("checks", ["c++", "python"])
@pytest.mark.parametrize("device", DEVICES)
def test_each_recording_replays_only_its_own_tensors(device, checks, launcher_calls, monkeypatch):
    """Calls of one structure (the same arguments, scalars and keywords) with tensors of
    another shape, dtype or strides record once each; alternating between them then replays
    the recording whose tensors match, never another one (with torch's C++ tensor checks, and
    with the Python ones used where torch lacks them)."""
    monkeypatch.setattr(_replay, "_PLANS", {})
    if checks == "python":
        monkeypatch.setattr(_replay, "_TensorGuards", None)
    kw = dict(truncation=False, tensor_gamma=False)

    def variants(seed):
        yield _inputs("gae", (7, 3), 0, device, torch.float32, seed, **kw)
        yield _inputs("gae", (6, 3), 0, device, torch.float32, seed, **kw)
        yield _inputs("gae", (7, 3), 0, device, torch.float64, seed, **kw)
        # shape (7, 3), strides (1, 7)
        transposed = _inputs("gae", (3, 7), 1, device, torch.float32, seed, **kw)
        yield {k: v.t() if getattr(v, "ndim", 0) == 2 else v for k, v in transposed.items()}

    for seed in (1, 2, 3):
        for i, d in enumerate(variants(seed)):
            dtype = d["rewards"].dtype
            for g, w in zip(
                _call("gae", d, backend="triton"), _reference("gae", d, 0), strict=True
            ):
                assert_close(g, w, dtype, name=f"variant {i}, seed {seed}")
    assert len(launcher_calls) == 4, "each variant records once, then replays"
    for seed in (4, 5):  # one tensor in two places (matched in Python): the same recordings
        for i, d in enumerate(variants(seed)):
            d["values"] = d["rewards"]
            dtype = d["rewards"].dtype
            for g, w in zip(
                _call("gae", d, backend="triton"), _reference("gae", d, 0), strict=True
            ):
                assert_close(g, w, dtype, name=f"aliased variant {i}, seed {seed}")
    assert len(launcher_calls) == 4, "aliased calls replay the matching recording"
    for T in range(2, 14):  # more recordings of one structure than are kept
        _call("gae", _inputs("gae", (T, 3), 0, device, torch.float32, T, **kw), backend="triton")
    assert max(map(len, _replay._PLANS.values())) <= _replay._MAX_PLANS


@pytest.mark.parametrize("checks", ["c++", "python"])
@pytest.mark.parametrize("device", DEVICES)
def test_negative_bit_and_inference_tensors_are_not_replayed_as_others(device, checks, monkeypatch):
    """A tensor with the negative bit (``z.conj().imag``: the same strides as ``z.imag``) or an
    inference tensor as ``out=`` matches no recording of plain tensors: the Python checks (used
    where torch lacks the C++ ones, and for one tensor passed twice) compared neither, so a
    replay read the negated tensor's memory as it is (results of the wrong sign) and took an
    inference ``out=`` outside ``inference_mode``."""
    monkeypatch.setattr(_replay, "_PLANS", {})
    if checks == "python":
        monkeypatch.setattr(_replay, "_TensorGuards", None)
    g = torch.Generator().manual_seed(3)
    z1, z2 = (torch.randn(6, 3, dtype=torch.complex64, generator=g).to(device) for _ in "12")
    # a recording, a replay, then the negated tensors (of the same strides); one tensor twice
    # (the Python checks either way)
    y = z1.conj().imag
    for x, nv in ((z1.imag, z2.imag), (z2.imag, z1.imag), (y, z2.conj().imag), (y, y)):
        got = rtc.discounted_returns(x, None, next_values=nv, backend="triton")
        want = rtc.discounted_returns(x.resolve_neg().double().cpu(), None,
                                      next_values=nv.resolve_neg().double().cpu(),
                                      backend="reference")  # fmt: skip
        assert_close(got, want, torch.float32, name=f"neg {x.is_neg()}, twice {x is nv}")
    r = torch.randn(6, 3, generator=g).to(device)
    boot = torch.zeros(3, device=device)
    rtc.discounted_returns(r, None, bootstrap_value=boot, backend="triton", out=torch.empty_like(r))
    with torch.inference_mode():
        frozen = torch.empty_like(r)
    with pytest.raises(ValueError, match="inference"):
        rtc.discounted_returns(r, None, bootstrap_value=boot, backend="triton", out=frozen)


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_take_the_differentiable_path(device, launcher_calls):
    """Inputs that require grad: under no_grad a call records and replays; with grad mode on
    it never replays that recording (nor records one): its outputs carry the graph."""
    d = _inputs("gae", (7, 3), 0, device, torch.float32, 6, truncation=False, tensor_gamma=False)
    d["values"] = d["values"].detach().requires_grad_()
    for _ in range(2):
        with torch.no_grad():
            adv, _ = _call("gae", d, backend="triton")
        assert adv.grad_fn is None
    assert len(launcher_calls) == 1, "the no_grad call was not replayed"
    for _ in range(2):
        d["values"] = d["values"].detach().requires_grad_()
        adv, _ = _call("gae", d, backend="triton")
        assert adv.grad_fn is not None
        adv.sum().backward()
        assert d["values"].grad is not None


@pytest.mark.parametrize("device", DEVICES)
def test_out_sharing_memory_is_refused_not_replayed(device):
    """A recording made with separate out= tensors, then the same metadata with an out=
    tensor that is an input, or that overlaps the other one: the ordinary path refuses it
    (a replay would scan over what it has overwritten). Interleaved outs still run."""
    g = torch.Generator().manual_seed(3)
    r, v = (torch.randn(7, 4, generator=g).to(device) for _ in range(2))
    boot = torch.randn(4, generator=g).to(device)
    want = rtc.gae(r, v, None, bootstrap_value=boot, backend="reference")
    buffer = torch.empty(7, 8 + 1, device=device)[:, :8]  # (room for a shifted view)
    for _ in range(3):  # recorded, then replayed
        buffer.fill_(float("nan"))
        outs = (buffer[:, 0::2], buffer[:, 1::2])
        got = rtc.gae(r, v, None, bootstrap_value=boot, out=outs, backend="triton")
        for x, w in zip(got, want, strict=True):
            assert_close(x, w, torch.float32)
    with pytest.raises(ValueError, match="`out` tensor for `returns` shares memory with `values`"):
        rtc.gae(r, v, None, bootstrap_value=boot, out=(buffer[:, 0::2], v), backend="triton")
    shifted = (buffer[:, 0::2], torch.as_strided(buffer, (7, 4), (9, 2), 2))
    with pytest.raises(ValueError, match="`advantages` shares memory with `out` for `returns`"):
        rtc.gae(r, v, None, bootstrap_value=boot, out=shifted, backend="triton")
    for _ in range(2):  # contiguous outs recorded, then an input of the same layout as one
        rtc.gae(r, v, None, bootstrap_value=boot, out=(torch.empty_like(r), torch.empty_like(r)),
                backend="triton")  # fmt: skip
    with pytest.raises(ValueError, match="`out` tensor for `advantages` shares memory with `r"):
        rtc.gae(r, v, None, bootstrap_value=boot, out=(r, torch.empty_like(r)), backend="triton")


@pytest.mark.parametrize("device", DEVICES)
def test_nested_tensors_are_refused_not_replayed(device):
    """A nested tensor where a recording has a strided one: an ordinary error (torch's C++
    tensor checks would abort the process on its strides)."""
    d = _inputs("gae", (7, 3), 0, device, torch.float32, 7, truncation=False, tensor_gamma=False)
    for _ in range(2):
        _call("gae", d, backend="triton")
    d["values"] = torch.nested.nested_tensor([torch.randn(7, 3), torch.randn(5, 3)]).to(device)
    with pytest.raises(TypeError, match="`values` is a nested tensor"):
        _call("gae", d, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_subclasses_are_not_replayed(device, launcher_calls):
    d = _inputs("gae", (7, 3), 0, device, torch.float32, 7, truncation=False, tensor_gamma=False)
    d["values"] = torch.nn.Parameter(d["values"], requires_grad=False)
    for _ in range(2):
        _call("gae", d, backend="triton")
    assert len(launcher_calls) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="CUDA is not available")
def test_cpu_scalar_gamma_is_read_every_call():
    """A 0-dim CPU gamma for CUDA inputs is read as a float: such a call is not replayable,
    so a new value in the same tensor is honoured."""
    d = _inputs("gae", (7, 3), 0, "cuda", torch.float32, 8, truncation=False, tensor_gamma=False)
    gamma = torch.tensor(0.9)
    first = _call("gae", {**d, "gamma": gamma}, backend="triton")[0].clone()
    gamma.fill_(0.5)
    second = _call("gae", {**d, "gamma": gamma}, backend="triton")[0]
    want = _reference("gae", {**d, "gamma": 0.5}, 0)[0]
    assert not torch.equal(first, second)
    assert_close(second, want, torch.float32, name="gamma changed between calls")


def test_cpu_calls_without_the_interpreter_never_record(monkeypatch):
    """On the CPU (torch backend) the wrapper costs one device check and records nothing."""
    if TRITON_INTERPRET:
        pytest.skip("under the interpreter CPU calls may record")
    before = dict(_replay._PLANS)
    rtc.gae(torch.randn(5, 2), torch.randn(5, 2), None, bootstrap_value=torch.zeros(2))
    assert _replay._PLANS == before


@pytest.mark.parametrize("device", DEVICES)
def test_out_as_a_namedtuple_is_written_every_call(device, launcher_calls):
    """A reused ``out=`` buffer that is a tuple subclass: every call writes into it."""
    Out = collections.namedtuple("Out", "advantages returns")
    buf = Out(*(torch.empty(7, 3, device=device) for _ in range(2)))
    for seed in (10, 11, 12):
        d = _inputs("gae", (7, 3), 0, device, torch.float32, seed, truncation=False,
                    tensor_gamma=False)  # fmt: skip
        buf.advantages.fill_(float("nan"))
        got = _call("gae", d, backend="triton", out=buf)
        assert got[0] is buf.advantages and got[1] is buf.returns
        for g, w in zip(buf, _reference("gae", d, 0), strict=True):
            assert_close(g, w, torch.float32, name=f"namedtuple out, seed {seed}")
    assert len(launcher_calls) == 1, "not replayed"


@pytest.mark.parametrize("device", DEVICES)
def test_arguments_the_ordinary_path_rejects_are_never_replayed(device):
    """Keys compare scalars by type and value and count positional arguments, so a call that
    equals a recorded one only under ``==`` (True for 1, a complex gamma, an extra positional
    argument) still raises."""
    x = torch.randn(5, 3, device=device)
    done = torch.zeros(5, 3, dtype=torch.bool, device=device)
    for _ in range(2):
        rtc.episodic_cumsum(x, done, time_dim=1, backend="triton")
        rtc.discounted_returns(x, done, bootstrap_value=x[0], gamma=0.5, backend="triton")
    with pytest.raises(TypeError, match="time_dim"):
        rtc.episodic_cumsum(x, done, time_dim=True, backend="triton")
    with pytest.raises(TypeError, match="gamma"):
        rtc.discounted_returns(x, done, bootstrap_value=x[0], gamma=0.5 + 0j, backend="triton")
    with pytest.raises(TypeError):
        rtc.episodic_cumsum(x, done, 1, time_dim=1, backend="triton")


@pytest.mark.parametrize("device", DEVICES)
def test_negative_zero_coefficient_is_its_own_key(device, monkeypatch):
    """-0.0 and 0.0 are equal as numbers but reach the kernel with different sign bits: a
    call with -0.0 after recordings with 0.0 gives what the ordinary path gives."""
    r = torch.full((3, 1), -0.0, device=device)
    boot = torch.ones(1, device=device)

    def call(gamma):
        return rtc.discounted_returns(r, None, bootstrap_value=boot, gamma=gamma, backend="triton")

    got = [call(g) for g in (0.0, 0.0, -0.0)][-1]
    monkeypatch.setattr(_replay, "ENABLED", False)
    want = call(-0.0)
    assert torch.equal(got.signbit(), want.signbit())
