"""SB3's ``compute_returns_and_advantage`` as one call of ``rl_triton_core.gae``.

SB3's loop (``RolloutBuffer.compute_returns_and_advantage(last_values, dones)``), with
``nnt`` its ``next_non_terminal``::

    nnt_t = 1 - episode_starts[t+1]  (t < T-1)        nnt_{T-1} = 1 - dones
    nv_t  = values[t+1]              (t < T-1)        nv_{T-1}  = last_values
    δ_t = r_t + γ nnt_t nv_t - v_t      A_t = δ_t + γ λ nnt_t A_{t+1}      returns = A + v

is the contract's ``gae`` (docs/semantics.md) with

* ``terminated[t] = episode_starts[t+1]`` for ``t < T-1`` and ``terminated[T-1] = dones``,
* ``bootstrap_value = last_values`` (so ``nv_t = values[t+1]``, then ``last_values``),
* ``truncated = None``: SB3 folds a time-limit truncation into the reward
  (``r_t += γ V(final_obs)``) and flags the next observation as an episode start, so for the
  buffer a truncation is a termination with that reward,

and the same ``γ`` (``gamma``) and ``λ`` (``gae_lambda``). At ``t = T-1`` the contract's window
edge ``c_{T-1} = 0`` matches SB3's ``last_gae_lam = 0``.

No copies: the buffer's five ``[n_steps, n_envs]`` float32 arrays are laid out (at every
``reset``) as views of two blocks, ``[rewards | values | episode_starts | one spare row]`` and
``[advantages | returns]``. Writing ``dones`` into the spare row makes ``episode_starts``
shifted by one step, i.e. ``terminated``, a view too; ``gae`` reads the inputs in place and
writes the outputs straight into the arrays SB3's training loop reads (``out=``). On CUDA the
same blocks make one host-to-device and one device-to-host copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

try:
    from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"rl_triton_sb3 needs stable-baselines3 ({e}); install it with pip install 'rl-triton[sb3]'"
    ) from e

import rl_triton_core as rtc

#: ``advantage_device="auto"`` computes on the GPU only when the model is on CUDA and the
#: buffer holds at least this many steps (``n_steps * n_envs``); below it the CPU torch path
#: is as fast as one host-to-device plus one device-to-host copy of the buffer. Measured
#: (``benchmarks/sb3_buffer.py``, docs/sb3.md): on an H200 the CUDA path took 0.27 ms at
#: 2048 x 1 and 0.46 ms at 2048 x 16, the CPU path 0.3-1.1 ms and 1.4 ms on a 2-core CPU.
CUDA_MIN_ELEMENTS = 1 << 12

DEVICES = ("auto", "cpu", "cuda")
_FN = "compute_returns_and_advantage"


# -- options -----------------------------------------------------------------------------------


def check_options(advantage_device: Any, advantage_backend: Any) -> tuple[str, str]:
    """Validate ``advantage_device`` / ``advantage_backend``; returns them as strings."""
    if isinstance(advantage_device, torch.device):
        advantage_device = str(advantage_device)
    if not isinstance(advantage_device, str):
        raise TypeError(
            f"`advantage_device` must be one of {DEVICES} (or 'cuda:N'), "
            f"got {type(advantage_device).__name__}"
        )
    kind = advantage_device.split(":", 1)[0]
    if kind not in DEVICES or (kind != "cuda" and advantage_device != kind):
        raise ValueError(
            f"`advantage_device` must be one of {DEVICES} (or 'cuda:N'), got {advantage_device!r}"
        )
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"`advantage_device`={advantage_device!r} but CUDA is not available "
            "(use 'auto' or 'cpu')"
        )
    if advantage_backend not in rtc.BACKENDS:
        raise ValueError(
            f"`advantage_backend` must be one of {rtc.BACKENDS}, got {advantage_backend!r}"
        )
    return advantage_device, advantage_backend


def resolve_device(advantage_device: str, buffer: RolloutBuffer) -> torch.device:
    """Where the buffer's advantages are computed (see :data:`CUDA_MIN_ELEMENTS`)."""
    if advantage_device == "auto":
        big = buffer.buffer_size * buffer.n_envs >= CUDA_MIN_ELEMENTS
        return buffer.device if buffer.device.type == "cuda" and big else torch.device("cpu")
    if advantage_device == "cuda" and buffer.device.type == "cuda":
        return buffer.device  # the model's GPU
    return torch.device(advantage_device)


class Plan:
    """Device and backend of one buffer's computation, fixed when the buffer is built."""

    __slots__ = ("backend", "device")

    def __init__(self, buffer: RolloutBuffer, advantage_device: Any, advantage_backend: Any):
        advantage_device, self.backend = check_options(advantage_device, advantage_backend)
        self.device = resolve_device(advantage_device, buffer)
        if self.backend != "auto" and self.backend not in rtc.available_backends(self.device):
            raise ValueError(
                f"`advantage_backend`={self.backend!r} cannot run on {self.device} "
                f"(available there: {rtc.available_backends(self.device)})"
            )


# The options of buffers that SB3 builds itself (rl_triton_sb3.enable() sets them).
global_options: dict[str, str] = {"advantage_device": "auto", "advantage_backend": "auto"}


def plan_of(buffer: RolloutBuffer) -> Plan:
    """The buffer's own plan (our classes), else one from the global options (enable())."""
    return buffer.__dict__.get("_rl_triton_plan") or Plan(buffer, **global_options)


# -- the layout --------------------------------------------------------------------------------


def contract_steps(inputs: torch.Tensor, T: int) -> tuple[torch.Tensor, ...]:
    """``rewards``, ``values``, ``terminated``: views of an input block (see :class:`Layout`)."""
    return inputs[:T], inputs[T : 2 * T], inputs[2 * T + 1 :]


class Layout:
    """The buffer's five ``[T, N]`` float32 arrays as views of two blocks.

    ``inputs`` ``[3T + 1, N]``: rows ``[0, T)`` rewards, ``[T, 2T)`` values, ``[2T, 3T)``
    episode_starts and row ``3T`` ``dones``, so rows ``[2T + 1, 3T + 1)`` are ``terminated``.
    ``outputs`` ``[2, T, N]``: advantages, returns. Both are also kept as torch tensors sharing
    the numpy memory, with the views ``gae`` takes (built once: a view costs µs per call).
    """

    __slots__ = ("arrays", "dones", "inputs", "out", "outputs", "steps")
    NAMES = ("rewards", "values", "episode_starts", "advantages", "returns")

    def __init__(self, T: int, N: int) -> None:
        inputs = np.zeros((3 * T + 1, N), dtype=np.float32)
        outputs = np.zeros((2, T, N), dtype=np.float32)
        self.arrays = (inputs[:T], inputs[T : 2 * T], inputs[2 * T : 3 * T], *outputs)
        self.dones = inputs[3 * T]  # the spare row
        self.inputs, self.outputs = torch.from_numpy(inputs), torch.from_numpy(outputs)
        self.steps, self.out = contract_steps(self.inputs, T), self.outputs.unbind(0)

    def __reduce__(self):
        # A copy (copy.deepcopy, pickle) would not share memory between the numpy arrays and
        # the torch tensors: copy a fresh layout instead, which is not installed, so the
        # copied buffer's data is adopted into a new layout at its next computation.
        return Layout, (len(self.out[0]), self.dones.shape[0])

    def install(self, buffer: RolloutBuffer) -> None:
        for name, array in zip(self.NAMES, self.arrays):
            setattr(buffer, name, array)
        buffer._rl_triton_layout = self

    def installed_in(self, buffer: RolloutBuffer) -> bool:
        """Whether the buffer's arrays are still ours (SB3's reset() and get() rebind them)."""
        d, (rewards, values, starts, advantages, returns) = buffer.__dict__, self.arrays
        return (
            d.get("rewards") is rewards
            and d.get("values") is values
            and d.get("episode_starts") is starts
            and d.get("advantages") is advantages
            and d.get("returns") is returns
        )


def install_layout(buffer: RolloutBuffer) -> None:
    """Give a freshly reset buffer (zeroed arrays) the no-copy layout."""
    layout = buffer.__dict__.get("_rl_triton_layout")
    if layout is None or not layout.installed_in(buffer):
        Layout(buffer.buffer_size, buffer.n_envs).install(buffer)


def layout_of(buffer: RolloutBuffer) -> Layout:
    """The buffer's layout; a buffer filled without one (e.g. built before enable()) is copied
    into a new one once."""
    layout = buffer.__dict__.get("_rl_triton_layout")
    if layout is not None and layout.installed_in(buffer):
        return layout
    T, N = buffer.buffer_size, buffer.n_envs
    for name in Layout.NAMES[:3]:
        shape = np.shape(getattr(buffer, name))
        if shape != (T, N):
            raise ValueError(
                f"{_FN}: `{name}` of the buffer has shape {shape}, expected (n_steps, n_envs) "
                f"= ({T}, {N}) (call it after filling the buffer and before get())"
            )
    layout = Layout(T, N)
    for name, array in zip(Layout.NAMES[:3], layout.arrays):
        array[...] = getattr(buffer, name)
    layout.install(buffer)
    return layout


# -- the computation ---------------------------------------------------------------------------


def _bootstrap_value(last_values: Any, N: int) -> torch.Tensor:
    if not isinstance(last_values, torch.Tensor):
        raise TypeError(
            f"{_FN}: `last_values` must be a torch.Tensor of n_envs={N} values "
            f"(the value of the state after the last step), got {type(last_values).__name__}"
        )
    if not last_values.is_floating_point():
        raise TypeError(f"{_FN}: `last_values` must be floating point, got {last_values.dtype}")
    if last_values.numel() != N:
        raise ValueError(
            f"{_FN}: `last_values` must hold n_envs={N} values ([n_envs] or [n_envs, 1]), "
            f"got shape {tuple(last_values.shape)}"
        )
    if last_values.requires_grad:
        last_values = last_values.detach()
    return last_values.reshape(N)  # a view for SB3's [n_envs, 1]


def _dones(dones: Any, N: int) -> np.ndarray:
    array = np.asarray(dones)
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{_FN}: `dones` must be bool, integer or float, got dtype {array.dtype}")
    if array.size != N:
        raise ValueError(
            f"{_FN}: `dones` must hold n_envs={N} flags, got shape {tuple(array.shape)}"
        )
    return array.reshape(N)


def compute_returns_and_advantage(buffer: RolloutBuffer, last_values: Any, dones: Any) -> None:
    """SB3's ``compute_returns_and_advantage``, computed by ``rl_triton_core.gae``.

    Same arguments and results as SB3 (to float32 rounding): fills ``buffer.advantages`` and
    ``buffer.returns`` in place. See the module docstring for the mapping.
    """
    T, N = buffer.buffer_size, buffer.n_envs
    bootstrap = _bootstrap_value(last_values, N)
    done_row = _dones(dones, N)
    layout = layout_of(buffer)
    plan = plan_of(buffer)
    layout.dones[...] = done_row  # so that inputs[2T + 1:] is terminated
    on_cpu = plan.device.type == "cpu"
    if on_cpu:
        steps, out = layout.steps, layout.out
    else:  # one copy each way
        inputs = layout.inputs.to(plan.device)
        outputs = torch.empty(layout.outputs.shape, dtype=torch.float32, device=plan.device)
        steps, out = contract_steps(inputs, T), outputs.unbind(0)
    rtc.gae(
        *steps,
        bootstrap_value=bootstrap.to(plan.device, torch.float32),
        gamma=buffer.gamma,
        lmbda=buffer.gae_lambda,
        backend=plan.backend,
        out=out,
    )
    if not on_cpu:
        layout.outputs.copy_(outputs)


# -- the buffer classes ------------------------------------------------------------------------


class TritonBufferMixin:
    """Makes an SB3 rollout buffer compute its advantages with ``rl_triton_core.gae``.

    Put it first among the bases: ``class B(TritonBufferMixin, SomeRolloutBuffer)``. It takes
    two keyword arguments on top of the buffer's own (pass them through
    ``rollout_buffer_kwargs``):

    * ``advantage_device``: ``"auto"`` (default: the CPU, or the model's GPU when the model is
      on CUDA and the buffer holds at least :data:`CUDA_MIN_ELEMENTS` steps), ``"cpu"``,
      ``"cuda"`` or ``"cuda:N"``. The buffer itself stays in numpy, as SB3 needs it; on CUDA
      the inputs go over in one copy and the results come back in one copy.
    * ``advantage_backend``: ``rl_triton_core``'s ``backend=`` (default ``"auto"``: the torch
      path on the CPU, Triton on CUDA).
    """

    def __init__(
        self, *args: Any, advantage_device: Any = "auto", advantage_backend: Any = "auto", **kw
    ) -> None:
        super().__init__(*args, **kw)
        self._rl_triton_plan = Plan(self, advantage_device, advantage_backend)

    def reset(self) -> None:
        super().reset()
        install_layout(self)

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """GAE advantages and returns of the rollout, written into ``self.advantages`` and
        ``self.returns`` (SB3's results, to float32 rounding; one ``rl_triton_core.gae`` call).

        :param last_values: ``V(s_T)``, the value of the state after the last step, one per env
            (a tensor ``[n_envs, 1]`` or ``[n_envs]``, on any device).
        :param dones: whether the last step ended each env's episode (``[n_envs]`` flags).
        """
        compute_returns_and_advantage(self, last_values, dones)


class TritonRolloutBuffer(TritonBufferMixin, RolloutBuffer):
    """SB3's ``RolloutBuffer`` with advantages from ``rl_triton_core.gae`` (PPO, A2C).

    ``PPO("MlpPolicy", env, rollout_buffer_class=TritonRolloutBuffer)``; options through
    ``rollout_buffer_kwargs={"advantage_device": "cpu"}`` (see :class:`TritonBufferMixin`).
    """


class TritonDictRolloutBuffer(TritonBufferMixin, DictRolloutBuffer):
    """SB3's ``DictRolloutBuffer`` (dict observations) with advantages from
    ``rl_triton_core.gae``; see :class:`TritonRolloutBuffer`."""
