"""The benchmark's problems and its table of methods: ours and the baselines (issue 4).

A :class:`Problem` is one configuration's inputs in the contract's form (``[T, N]`` time-major
or ``[N, T]`` batch-major, ``time_dim`` 0 or 1, bool flags, about 5% episode ends, ``gamma``
and ``lmbda`` Python floats). Every method gets the same tensors; a baseline whose API wants
something else (next-state values, CleanRL's "episode start" flags, TorchRL's trailing feature
axis, an SB3 buffer) gets it built *outside* the timed region, which favours the baseline.

A :class:`Method` turns a problem into a callable that the harness checks against the float64
oracle and then times. The callables return the estimator's outputs in the contract's order
(``gae``: advantages, returns; ``vtrace``: vs, pg_advantages; otherwise one tensor), in the
problem's shape; their layout in memory may differ.

Baselines (float32 only; each applies to the estimators it implements):

* ``cleanrl-eager``: CleanRL's ``ppo.py`` GAE loop in eager PyTorch (one Python iteration per
  step, a handful of kernels each). Skipped for T > 4096: far too slow to time.
* ``sb3-numpy``: Stable-Baselines3's own ``RolloutBuffer.compute_returns_and_advantage`` (a
  reverse numpy loop), CPU only, time-major only.
* ``torchrl-loop`` / ``torchrl-vec``: TorchRL's functional estimators
  (``generalized_advantage_estimate``, ``td_lambda_return_estimate``,
  ``vtrace_advantage_estimate``; the vectorised ``vec_generalized_advantage_estimate`` and
  ``vec_td_lambda_return_estimate``) on ``[*B, T, 1]`` views, with ``done = terminated``.
  Loops skipped for T > 4096; the vectorised ones pad every trajectory to the longest one and
  are skipped where that padding would not fit in memory.
* ``doubling-compiled``: a ``torch.compile``d log-depth doubling scan (Hillis-Steele on the
  ``(a, b)`` pairs, ``ceil(log2 T)`` passes over the whole array), for GAE and ``linear_scan``.
* ``unrolled-compiled`` / ``unrolled-compiled+graph``: LeanRL's ``torch.compile``d GAE loop
  (unrolled by dynamo at trace time), without and with CUDA-graph capture; T <= 256.

Compiled baselines are compiled per configuration (the harness resets dynamo first), with
``fullgraph=True, dynamic=False``.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

import rl_triton_core as rtc

ESTIMATORS = (
    "gae",
    "lambda_returns",
    "discounted_returns",
    "vtrace",
    "retrace",
    "eligibility_traces",
    "episodic_cumsum",
    "linear_scan",
)
GAMMA, LMBDA = 0.99, 0.95
EPISODE_END_Z = 1.645  # flags = randn > z: about 5% episode ends
LOOP_MAX_T = 4096  # eager/TorchRL Python loops: skipped above this T (too slow to time)
UNROLL_MAX_T = 256  # LeanRL-style unrolled compile: only for short rollouts
COMPILE = {"backend": "inductor"}  # the harness may switch this (e.g. --compile-backend)

# Per estimator: the per-step inputs in call order (flags last), and the boundary kwarg.
INPUTS = {
    "gae": (("rewards", "values", "terminated"), "bootstrap_value"),
    "lambda_returns": (("rewards", "values", "terminated"), "bootstrap_value"),
    "discounted_returns": (("rewards", "terminated"), "bootstrap_value"),
    "vtrace": (
        ("rewards", "values", "target_log_probs", "behavior_log_probs", "terminated"),
        "bootstrap_value",
    ),
    "retrace": (
        (
            "rewards",
            "q_values",
            "next_expected_q",
            "target_log_probs",
            "behavior_log_probs",
            "terminated",
        ),
        None,
    ),
    "eligibility_traces": (("x", "done"), None),
    "episodic_cumsum": (("x", "done"), None),
    "linear_scan": (("a", "b"), None),
}
FLAGS = ("terminated", "done")
N_OUTPUTS = {"gae": 2, "vtrace": 2}  # every other estimator has one output


# -- problems -------------------------------------------------------------------------------------


@dataclass
class Problem:
    """One configuration's inputs, shared by every method (see the module docstring)."""

    estimator: str
    T: int
    N: int
    layout: str  # "time-major" ([T, N], time_dim=0) or "batch-major" ([N, T], time_dim=1)
    dtype: torch.dtype
    device: torch.device
    tensors: dict[str, Tensor]  # per-step tensors in the layout, plus the [N] boundary
    gamma: float = GAMMA
    lmbda: float = LMBDA
    cache: dict = field(default_factory=dict)  # inputs derived for baselines, compiled fns

    @property
    def time_dim(self) -> int:
        return 0 if self.layout == "time-major" else 1

    @property
    def fn(self) -> Callable:
        return getattr(rtc, self.estimator)

    def call_args(self) -> tuple[tuple, dict]:
        """Positional and keyword arguments of the public ``rl_triton_core`` function."""
        names, boundary = INPUTS[self.estimator]
        args = tuple(self.tensors[n] for n in names)
        kwargs: dict = {"time_dim": self.time_dim}
        if boundary is not None:
            kwargs[boundary] = self.tensors["bootstrap"]
        if self.estimator in ("gae", "lambda_returns", "discounted_returns", "vtrace", "retrace"):
            kwargs["gamma"] = self.gamma
        if self.estimator in ("gae", "lambda_returns", "eligibility_traces"):
            kwargs["lmbda"] = self.lmbda
        return args, kwargs

    def call(self, backend: str):
        args, kwargs = self.call_args()
        return self.fn(*args, backend=backend, **kwargs)

    def to(self, dtype: torch.dtype | None = None, device: torch.device | None = None):
        """The same data with every floating tensor cast to ``dtype`` (flags kept)."""
        dtype = dtype or self.dtype
        device = device or self.device
        tensors = {
            k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
            for k, v in self.tensors.items()
        }
        return Problem(self.estimator, self.T, self.N, self.layout, dtype, device, tensors)

    def tf(self, name: str) -> Tensor:
        """A per-step input as a time-first view ``[T, N]`` (no copy)."""
        return self.tensors[name].movedim(self.time_dim, 0)

    def bytes_moved(self) -> int:
        """Bytes the estimator must move: each input read once, each output written once.
        Flags count by their dtype (bool: 1 byte); Python-scalar coefficients cost nothing."""
        inputs = sum(x.numel() * x.element_size() for x in self.tensors.values())
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return inputs + N_OUTPUTS.get(self.estimator, 1) * self.T * self.N * itemsize

    # Derived inputs, built once (untimed) for the baselines that need them.
    def derived(self, key: str, build: Callable[[], object]):
        if key not in self.cache:
            self.cache[key] = build()
        return self.cache[key]

    def next_values(self) -> Tensor:
        """``values[t + 1]``, and the bootstrap value at the last step (in the layout)."""

        def build():
            v = self.tf("values")
            return torch.cat((v[1:], self.tensors["bootstrap"][None])).movedim(0, self.time_dim)

        return self.derived("next_values", build)

    def episode_starts(self) -> Tensor:
        """CleanRL's ``dones`` / SB3's ``episode_starts``: ``start[t] = terminated[t - 1]``."""

        def build():
            term = self.tf("terminated")
            start = torch.cat((torch.zeros_like(term[:1]), term[:-1]))
            return start.movedim(0, self.time_dim)

        return self.derived("episode_starts", build)


def make_problem(
    estimator: str,
    T: int,
    N: int,
    layout: str,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> Problem:
    """Random inputs for one configuration: standard-normal rewards/values, log-probs <= 0,
    ``a`` uniform in [0, 1), bool flags with about 5% episode ends, a random bootstrap."""
    if layout not in ("time-major", "batch-major"):
        raise ValueError(f"unknown layout {layout!r}")
    shape = (T, N) if layout == "time-major" else (N, T)
    g = torch.Generator(device=device).manual_seed(seed + 7919 * T + N)

    def randn() -> Tensor:
        return torch.randn(shape, generator=g, device=device)

    def step(x: Tensor | None = None) -> Tensor:
        return (randn() if x is None else x).to(dtype)

    names, boundary = INPUTS[estimator]
    tensors: dict[str, Tensor] = {}
    for name in names:
        if name in FLAGS:
            tensors[name] = randn() > EPISODE_END_Z
        elif name.endswith("log_probs"):
            tensors[name] = step(-0.5 * randn().abs())
        elif name == "a":
            tensors[name] = step(torch.rand(shape, generator=g, device=device))
        else:
            tensors[name] = step()
    if boundary is not None:
        tensors["bootstrap"] = torch.randn(N, generator=g, device=device).to(dtype)
    return Problem(estimator, T, N, layout, dtype, device, tensors)


# -- the method table -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """A way to compute some estimators. ``build(problem)`` does all untimed preparation
    (compiling included) and returns the callable that is timed."""

    name: str
    kind: str  # "ours" or "baseline"
    estimators: tuple[str, ...]
    build: Callable[[Problem], Callable[[], object]]
    skip: Callable[[Problem], str | None] = lambda p: None
    devices: tuple[str, ...] = ("cuda", "cpu")
    compiled: bool = False
    graph: bool = False  # the harness captures the callable in a CUDA graph and times replays
    doc: str = ""


def skip_reason(method: Method, p: Problem) -> str | None:
    """Why ``method`` does not run on ``p`` (None: it runs)."""
    if p.estimator not in method.estimators:
        return f"{method.name} does not implement {p.estimator}"
    if p.device.type not in method.devices:
        return f"{method.name} runs on {'/'.join(method.devices)} only"
    if method.kind == "baseline" and p.dtype != torch.float32:
        return "baselines are timed in float32 only"
    return method.skip(p)


def _missing(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return f"{module} is not installed"
    return None


def _loop_limit(p: Problem) -> str | None:
    if p.T > LOOP_MAX_T:
        return f"Python loop over T = {p.T} steps: too slow to time (limit T <= {LOOP_MAX_T})"
    return None


# ours ---------------------------------------------------------------------------------------


def _ours(backend: str):
    def build(p: Problem):
        args, kwargs = p.call_args()
        return functools.partial(p.fn, *args, backend=backend, **kwargs)

    return build


def _ours_sb3_dropin(p: Problem):
    """What a drop-in SB3 buffer pays on the CPU (the SB3 drop-in "full call"): wrap
    the buffer's numpy arrays (no copy), shift ``episode_starts`` into ``terminated`` (one
    flag copy) and write advantages and returns straight into the buffer."""
    buf, last_values, dones = _sb3_buffer(p, key="sb3_dropin")
    rewards = torch.from_numpy(buf.rewards)
    values = torch.from_numpy(buf.values)
    starts = torch.from_numpy(buf.episode_starts)
    adv, ret = torch.from_numpy(buf.advantages), torch.from_numpy(buf.returns)
    boot = last_values.view(-1)
    dones_t = torch.from_numpy(dones)

    def call():
        terminated = torch.empty_like(starts)
        terminated[:-1] = starts[1:]
        terminated[-1] = dones_t
        return rtc.gae(
            rewards,
            values,
            terminated,
            bootstrap_value=boot,
            gamma=p.gamma,
            lmbda=p.lmbda,
            backend="torch",
            out=(adv, ret),
        )

    return call


# CleanRL ------------------------------------------------------------------------------------


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, lmbda):
    """CleanRL ``ppo.py``'s GAE loop (time-first tensors; float ``dones`` = episode starts)."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * lmbda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


def _cleanrl(p: Problem):
    td = p.time_dim
    r, v = p.tf("rewards"), p.tf("values")
    dones = p.episode_starts().movedim(td, 0).to(r.dtype)  # CleanRL stores dones as floats
    next_done = p.tf("terminated")[-1].to(r.dtype)
    boot = p.tensors["bootstrap"]

    def call():
        adv, ret = cleanrl_gae(r, v, dones, boot, next_done, p.gamma, p.lmbda)
        return adv.movedim(0, td), ret.movedim(0, td)

    return call


# Stable-Baselines3 --------------------------------------------------------------------------


def _sb3_buffer(p: Problem, key: str = "sb3"):
    """A real SB3 ``RolloutBuffer`` [T, N] holding the problem's data (built once)."""

    def build():
        import numpy as np
        from gymnasium import spaces
        from stable_baselines3.common.buffers import RolloutBuffer

        box = spaces.Box(low=-1.0, high=1.0, shape=(1,), dtype=np.float32)
        buf = RolloutBuffer(
            p.T, box, box, device="cpu", gae_lambda=p.lmbda, gamma=p.gamma, n_envs=p.N
        )
        buf.rewards[:] = p.tensors["rewards"].numpy()
        buf.values[:] = p.tensors["values"].numpy()
        buf.episode_starts[:] = p.episode_starts().numpy()
        last_values = p.tensors["bootstrap"].view(p.N, 1).clone()
        dones = p.tensors["terminated"][-1].numpy().copy()
        return buf, last_values, dones

    return p.derived(key, build)


def _sb3(p: Problem):
    buf, last_values, dones = _sb3_buffer(p)

    def call():
        buf.compute_returns_and_advantage(last_values=last_values, dones=dones)
        return torch.from_numpy(buf.advantages), torch.from_numpy(buf.returns)

    return call


def _sb3_skip(p: Problem) -> str | None:
    if _missing("stable_baselines3"):
        return _missing("stable_baselines3")
    if p.dtype != torch.float32:
        return "SB3 buffers are float32"
    if p.layout != "time-major":
        return "SB3 buffers are time-major [n_steps, n_envs] only"
    return None


# TorchRL ------------------------------------------------------------------------------------


def _torchrl_views(p: Problem, *names: str):
    """TorchRL's ``[*B, T, 1]`` views of the inputs and the ``time_dim`` to pass with them."""
    views = [p.tensors[n].unsqueeze(-1) for n in names]
    return views, (0 if p.layout == "time-major" else -2)


def _torchrl(name: str):
    def build(p: Problem):
        from torchrl.objectives.value import functional as F

        nv = p.next_values().unsqueeze(-1)
        loop = name == "loop"
        if p.estimator == "vtrace":
            (r, v, tlp, blp, term), td = _torchrl_views(
                p, "rewards", "values", "target_log_probs", "behavior_log_probs", "terminated"
            )

            def call():
                adv, vs = F.vtrace_advantage_estimate(
                    p.gamma, tlp, blp, v, nv, r, term, term, 1.0, 1.0, time_dim=td
                )
                return vs.squeeze(-1), adv.squeeze(-1)

            return call
        (r, v, term), td = _torchrl_views(p, "rewards", "values", "terminated")
        if p.estimator == "gae":
            fn = F.generalized_advantage_estimate if loop else F.vec_generalized_advantage_estimate

            def call():
                adv, ret = fn(p.gamma, p.lmbda, v, nv, r, term, term, time_dim=td)
                return adv.squeeze(-1), ret.squeeze(-1)

            return call
        fn = F.td_lambda_return_estimate if loop else F.vec_td_lambda_return_estimate

        def call():
            return fn(p.gamma, p.lmbda, nv, r, term, term, time_dim=td).squeeze(-1)

        return call

    return build


def padded_elements(p: Problem) -> int:
    """Elements of TorchRL's padded ``[trajectories, longest]`` tensor for these flags."""

    def build():
        term = p.tf("terminated")
        T = term.shape[0]
        t = torch.arange(T, device=term.device).view(T, *([1] * (term.dim() - 1)))
        start = torch.cat((torch.ones_like(term[:1]), term[:-1]))  # a trajectory starts here
        first = torch.where(start, t, torch.zeros_like(t)).cummax(0).values
        longest = int((t - first + 1).max())
        return int(start.sum()) * longest

    return p.derived("padded", build)


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30


CPU_PADDED_MAX = 1 << 25  # on the CPU, a longer padded conv takes seconds per call


def _torchrl_loop_skip(p: Problem) -> str | None:
    return _missing("torchrl") or _loop_limit(p)


def _torchrl_vec_skip(p: Problem) -> str | None:
    if _missing("torchrl"):
        return _missing("torchrl")
    if p.device.type == "cpu" and padded_elements(p) > CPU_PADDED_MAX:
        return (
            f"vectorised TorchRL pads to {padded_elements(p):.3g} elements: seconds per call "
            f"on the CPU (limit {CPU_PADDED_MAX:.3g})"
        )
    need = 32 * padded_elements(p)  # padded inputs, mask, padded conv input and output, x2
    have = available_memory(p.device)
    if need > have // 2:
        return (
            f"vectorised TorchRL pads to {padded_elements(p):.3g} elements "
            f"(~{need / 2**30:.0f} GiB), over half the free memory ({have / 2**30:.0f} GiB)"
        )
    return None


# compiled baselines -------------------------------------------------------------------------


def doubling_scan(a: Tensor, b: Tensor, reverse: bool) -> Tensor:
    """Hillis-Steele doubling on the pairs (a, b) of ``x_t = a_t x_{t-/+1} + b_t``, time at
    dim 0: after the pass with offset k, (a_t, b_t) maps the state 2k steps away onto x_t.
    ceil(log2 T) passes, each reading and writing the whole array."""
    T, k = a.shape[0], 1
    while k < T:
        if reverse:  # x_t = a_t x_{t+1} + b_t: combine with the pair k steps later
            b = torch.cat((torch.addcmul(b[:-k], a[:-k], b[k:]), b[-k:]))
            a = torch.cat((a[:-k] * a[k:], a[-k:]))
        else:  # x_t = a_t x_{t-1} + b_t: combine with the pair k steps earlier
            b = torch.cat((b[:k], torch.addcmul(b[k:], a[k:], b[:-k])))
            a = torch.cat((a[:k], a[k:] * a[:-k]))
        k *= 2
    return b


def doubling_gae(rewards, values, terminated, bootstrap, gamma: float, lmbda: float):
    """GAE as a doubling scan (time-first tensors, bool ``terminated``)."""
    nt = (~terminated).to(rewards.dtype)
    next_values = torch.cat((values[1:], bootstrap[None]))
    delta = rewards + gamma * nt * next_values - values
    cont = torch.cat((nt[:-1], torch.zeros_like(nt[-1:])))  # c_{T-1} = 0: the window edge
    adv = doubling_scan(gamma * lmbda * cont, delta, reverse=True)
    return adv, adv + values


def doubling_linear_scan(a, b):
    return (doubling_scan(a, b, reverse=False),)


def leanrl_gae(rewards, values, dones, next_value, next_done, gamma: float, lmbda: float):
    """LeanRL's compiled GAE (``ppo_*_torchcompile.py``): a Python loop over ``unbind``
    rows, unrolled by dynamo; ``dones`` are bool episode starts (time-first)."""
    nextnonterminals = (~dones).float().unbind(0)
    vals_unbind = values.unbind(0)
    rewards_unbind = rewards.unbind(0)
    advantages = []
    lastgaelam = 0
    nextnonterminal = (~next_done).float()
    nextvalues = next_value
    for t in range(rewards.shape[0] - 1, -1, -1):
        cur_val = vals_unbind[t]
        delta = rewards_unbind[t] + gamma * nextvalues * nextnonterminal - cur_val
        advantages.append(delta + gamma * lmbda * nextnonterminal * lastgaelam)
        lastgaelam = advantages[-1]
        nextnonterminal = nextnonterminals[t]
        nextvalues = cur_val
    advantages = torch.stack(list(reversed(advantages)))
    return advantages, advantages + values


def compile_fn(fn: Callable) -> Callable:
    return torch.compile(fn, fullgraph=True, dynamic=False, **COMPILE)


def _doubling(p: Problem):
    td = p.time_dim
    if p.estimator == "linear_scan":
        a, b = p.tf("a"), p.tf("b")
        fn = compile_fn(doubling_linear_scan)
        return lambda: tuple(x.movedim(0, td) for x in fn(a, b))
    r, v, term = p.tf("rewards"), p.tf("values"), p.tf("terminated")
    boot = p.tensors["bootstrap"]
    fn = compile_fn(doubling_gae)
    return lambda: tuple(x.movedim(0, td) for x in fn(r, v, term, boot, p.gamma, p.lmbda))


def _unrolled(p: Problem):
    """The compiled LeanRL loop; shared by the with- and without-graph methods."""

    def build():
        td = p.time_dim
        r, v = p.tf("rewards"), p.tf("values")
        starts = p.episode_starts().movedim(td, 0)
        next_done = p.tf("terminated")[-1]
        boot = p.tensors["bootstrap"]
        fn = compile_fn(leanrl_gae)
        return lambda: tuple(
            x.movedim(0, td) for x in fn(r, v, starts, boot, next_done, p.gamma, p.lmbda)
        )

    return p.derived("unrolled", build)


def _unroll_limit(p: Problem) -> str | None:
    if p.T > UNROLL_MAX_T:
        return f"unrolled compile only for T <= {UNROLL_MAX_T} (got T = {p.T})"
    return None


# the table ----------------------------------------------------------------------------------

METHODS: tuple[Method, ...] = (
    Method(
        "ours-triton",
        "ours",
        ESTIMATORS,
        _ours("triton"),
        devices=("cuda",),
        doc="rl_triton_core, backend='triton' (fused Triton kernels)",
    ),
    Method(
        "ours-torch",
        "ours",
        ESTIMATORS,
        _ours("torch"),
        doc="rl_triton_core, backend='torch' (vectorised PyTorch)",
    ),
    Method(
        "ours-torch-sb3-dropin",
        "ours",
        ("gae",),
        _ours_sb3_dropin,
        skip=_sb3_skip,
        devices=("cpu",),
        doc="backend='torch' on an SB3 buffer's arrays, results written into the buffer",
    ),
    Method(
        "cleanrl-eager",
        "baseline",
        ("gae",),
        _cleanrl,
        skip=_loop_limit,
        doc="CleanRL ppo.py GAE loop, eager PyTorch",
    ),
    Method(
        "sb3-numpy",
        "baseline",
        ("gae",),
        _sb3,
        skip=_sb3_skip,
        devices=("cpu",),
        doc="SB3 RolloutBuffer.compute_returns_and_advantage (numpy loop)",
    ),
    Method(
        "torchrl-loop",
        "baseline",
        ("gae", "lambda_returns", "vtrace"),
        _torchrl("loop"),
        skip=_torchrl_loop_skip,
        doc="TorchRL generalized_advantage_estimate / td_lambda_return_estimate / "
        "vtrace_advantage_estimate",
    ),
    Method(
        "torchrl-vec",
        "baseline",
        ("gae", "lambda_returns"),
        _torchrl("vec"),
        skip=_torchrl_vec_skip,
        doc="TorchRL vec_generalized_advantage_estimate / vec_td_lambda_return_estimate",
    ),
    Method(
        "doubling-compiled",
        "baseline",
        ("gae", "linear_scan"),
        _doubling,
        compiled=True,
        doc="torch.compile'd log-depth doubling (Hillis-Steele) scan",
    ),
    Method(
        "unrolled-compiled",
        "baseline",
        ("gae",),
        _unrolled,
        skip=_unroll_limit,
        compiled=True,
        doc="torch.compile'd unrolled GAE loop (LeanRL)",
    ),
    Method(
        "unrolled-compiled+graph",
        "baseline",
        ("gae",),
        _unrolled,
        skip=_unroll_limit,
        devices=("cuda",),
        compiled=True,
        graph=True,
        doc="the same, captured in a CUDA graph (LeanRL's CudaGraphModule)",
    ),
)
BY_NAME = {m.name: m for m in METHODS}
BASELINES = tuple(m.name for m in METHODS if m.kind == "baseline")


def as_tuple(out) -> tuple[Tensor, ...]:
    """A method's or estimator's result as a tuple of tensors."""
    return (out,) if isinstance(out, Tensor) else tuple(out)


def max_rel_err(got, want) -> float:
    """max |got - want| / max(1, max |want|) in float64 over every output (inf on a shape
    mismatch)."""
    errs = []
    for g, w in zip(as_tuple(got), as_tuple(want), strict=True):
        if tuple(g.shape) != tuple(w.shape):
            return math.inf
        w = w.double()
        scale = w.abs().max().clamp_min(1.0)
        errs.append(((g.to(w.device, torch.float64) - w).abs().max() / scale).item())
    return max(errs)
