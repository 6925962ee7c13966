"""Argument checking and canonicalisation shared by every public function and backend.

Everything here reads only shapes, dtypes and devices (never tensor data), so validation
never forces a host<->device synchronisation.

The canonical form handed to the backends puts time first: every per-step tensor is a view
``[T, *batch]`` of the caller's tensor (``expand`` + ``movedim``: no copy), flags and
coefficient tensors are broadcast views of the same shape, Python scalars stay Python floats,
and boundary tensors (``bootstrap_value``, ``initial``) are views of shape ``[*batch]``.
"""

from __future__ import annotations

import functools
import numbers
import sys
from collections.abc import Sequence

import torch
from torch import Tensor

Coefficient = float | Tensor
# The per-step values an estimator may go without (the others are required: None is refused):
# next_values, and lambda_returns' values (its next-state values can come from next_values)
_OPTIONAL_VALUES = ("next_values",)
_OPTIONAL_VALUES_OF = {"lambda_returns": ("values", "next_values")}
# The floating dtypes of values, coefficients and float flags (not float8: torch has too few
# ops for them, and Triton loads none)
_FLOATS = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))
_FLAGS = _FLOATS | {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                   torch.uint16, torch.uint32, torch.uint64}  # fmt: skip
_STRIDED = torch.strided


def _refuse_irregular(fn: str, name: str, x: Tensor) -> None:
    """A TypeError naming ``name`` for a nested tensor (it has no strides or single shape) or a
    sparse one (no strides)."""
    if x.is_nested:
        raise TypeError(f"{fn}: `{name}` is a nested tensor; pass a strided (regular) tensor")
    if x.layout is not _STRIDED:
        raise TypeError(f"{fn}: `{name}` has layout {x.layout}; pass a strided (dense) tensor")


def _refuse_non_float(fn: str, name: str, x: Tensor) -> None:
    """A TypeError naming ``name`` unless ``x`` is a regular (strided) float16, bfloat16,
    float32 or float64 tensor: values, coefficient tensors, bootstrap values."""
    _refuse_irregular(fn, name, x)
    if x.dtype not in _FLOATS:
        raise TypeError(
            f"{fn}: `{name}` must be a floating-point tensor (float16, bfloat16, float32 or "
            f"float64), got {x.dtype}"
        )


def extent(x: Tensor) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` around ``x.data_ptr()`` that ``x``'s elements span (relative)."""
    size = x.element_size()
    if x.is_contiguous():
        return 0, max(x.numel(), 1) * size
    lo = sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(x.shape, x.stride(), strict=True) if s > 0)
    return lo * size, (hi + 1) * size


def _offset_reachable(d: int, dims: list[tuple[int, int]], budget: list[int]) -> bool:
    """Whether ``d = sum j_i s_i`` with ``|j_i| < n_i`` for ``dims`` ``(s_i, n_i)`` (strides
    descending, positive): whether two tensors of these strides ``d`` elements apart share an
    element. True once the search has tried ``budget[0]`` branches (then assume overlap)."""
    if not dims:
        return d == 0
    (s, n), rest = dims[0], dims[1:]
    reach = sum((m - 1) * t for t, m in rest)
    lo, hi = max(-(n - 1), -((reach - d) // s)), min(n - 1, (d + reach) // s)
    budget[0] -= max(0, hi - lo + 1)
    if budget[0] < 0:
        return True
    return any(_offset_reachable(d - j * s, rest, budget) for j in range(lo, hi + 1))


def _span(x: Tensor) -> tuple[int, int]:
    """The absolute bytes ``[lo, hi)`` ``x`` spans (empty for no elements)."""
    if not x.numel():
        return 0, 0
    lo, hi = extent(x)
    p = x.data_ptr()
    return p + lo, p + hi


def overlap(a: Tensor, b: Tensor, span_a: tuple[int, int], span_b: tuple[int, int]) -> bool:
    """Whether two tensors may share memory: exact for tensors of one layout (e.g. interleaved
    views of one buffer), else whether the bytes they span intersect (addresses, not storage
    objects: two ``torch.from_numpy`` views of one numpy buffer have storages of their own).
    Metadata only; ``span_a``, ``span_b``: their :func:`_span`."""
    (lo_a, hi_a), (lo_b, hi_b) = span_a, span_b
    if hi_a <= lo_b or hi_b <= lo_a or a.device != b.device or a.device.type == "meta":
        return False
    size = a.element_size()
    if a.shape != b.shape or a.stride() != b.stride() or size != b.element_size():
        return True
    d = a.data_ptr() - b.data_ptr()
    if d % size:
        return True  # (elements straddle each other)
    dims = sorted(((abs(s), n) for n, s in zip(a.shape, a.stride(), strict=True) if s and n > 1),
                  reverse=True)  # fmt: skip
    return _offset_reachable(abs(d) // size, dims, [4096])


def _refuse_overlap(fn: str, outs: Sequence[Tensor], names: Sequence[str], inputs) -> None:
    """A ValueError naming ``out`` where an output may share memory with another output or an
    input (``(name, tensor)`` pairs): a scan would read what it has overwritten."""
    tensors = [*outs, *(x for _, x in inputs)]
    spans = [_span(x) for x in tensors]
    for k, o in enumerate(outs):
        for j in range(k + 1, len(tensors)):  # (the outputs before k: checked against k)
            if overlap(o, tensors[j], spans[k], spans[j]):
                other = (
                    f"`out` for `{names[j]}`" if j < len(outs) else f"`{inputs[j - len(outs)][0]}`"
                )
                raise ValueError(
                    f"{fn}: `out` tensor for `{names[k]}` shares memory with {other}; pass "
                    "outputs that share no memory with the inputs or with each other"
                )


def not_a_coefficient(fn: str, name: str, x) -> TypeError:
    """The error for a coefficient that is neither a number (a bool is not) nor a tensor."""
    return TypeError(f"{fn}: `{name}` must be a float or a tensor, got {type(x)}")


_FLOAT_MAX = int(sys.float_info.max)


def real_to_float(fn: str, name: str, x) -> float:
    """``float(x)`` for a real-number coefficient, eager or compiled; an int past float64's
    range is a ValueError naming it (tested, not caught: Dynamo cannot catch the
    OverflowError of ``float()``)."""
    if isinstance(x, int) and not -_FLOAT_MAX <= x <= _FLOAT_MAX:
        raise ValueError(f"{fn}: `{name}` is too large for a float")
    return float(x)


def _name_list(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


class Steps:
    """The per-step shape of one call and the helpers that map arguments onto it.

    Built from the call's value tensors (rewards, values, ...): they fix the step shape (their
    broadcast, same rank required), the device, the time axis and the output dtype.
    """

    __slots__ = (
        "_device_of",
        "batch_shape",
        "device",
        "dtype",
        "fn",
        "layout_like",
        "seen",
        "shape",
        "time_dim",
    )

    def __init__(self, fn: str, time_dim: int, values: dict[str, Tensor | None]) -> None:
        # This runs on every call: one pass over the tensors, and the common case (equal
        # shapes and dtypes) needs neither torch.broadcast_shapes nor type promotion.
        self.fn = fn
        optional = _OPTIONAL_VALUES_OF.get(fn, _OPTIONAL_VALUES)
        self.seen = given = [
            (name, x) for name, x in values.items() if x is not None or name not in optional
        ]
        for name, x in given:
            if not isinstance(x, Tensor):
                raise TypeError(f"{fn}: `{name}` must be a torch.Tensor, got {type(x).__name__}")
            _refuse_non_float(fn, name, x)
        first_name, first = given[0]
        ndim = first.dim()
        if ndim == 0:
            raise ValueError(f"{fn}: `{first_name}` must have a time axis, got a 0-dim tensor")
        if time_dim.__class__ is not int:
            if isinstance(time_dim, bool) or not isinstance(time_dim, int):
                raise TypeError(f"{fn}: `time_dim` must be an int, got {type(time_dim).__name__}")
        if not -ndim <= time_dim < ndim:
            raise ValueError(
                f"{fn}: `time_dim`={time_dim} is out of range for `{first_name}` with "
                f"{ndim} dims (expected {-ndim} <= time_dim < {ndim})"
            )
        self.time_dim = td = time_dim % ndim
        self.device = device = first.device
        self._device_of = first_name
        shape, dtype = first.shape, first.dtype
        same_shape = same_dtype = True
        for name, x in given[1:]:
            if x.dim() != ndim or x.device != device:
                self._check_rank_device(name, x, ndim)
            same_shape = same_shape and x.shape == shape
            same_dtype = same_dtype and x.dtype == dtype
        if not same_shape:
            try:
                shape = torch.broadcast_shapes(*(x.shape for _, x in given))
            except RuntimeError:
                shapes = ", ".join(f"`{k}` {tuple(v.shape)}" for k, v in given)
                raise ValueError(
                    f"{fn}: per-step tensors have mismatched shapes: {shapes}"
                ) from None
        if not same_dtype:
            dtype = functools.reduce(torch.promote_types, (x.dtype for _, x in given))
        self.shape, self.dtype = shape, dtype
        self.batch_shape = shape[:td] + shape[td + 1 :]
        self.layout_like = (
            first if same_shape else next((x for _, x in given if x.shape == shape), first)
        )

    @property
    def T(self) -> int:  # the paper's name
        return self.shape[self.time_dim]

    # -- argument kinds ------------------------------------------------------------------------

    def _check_rank_device(self, name: str, x: Tensor, ndim: int) -> None:
        if x.dim() != ndim:
            raise ValueError(
                f"{self.fn}: `{name}` must have {ndim} dims like the other per-step tensors "
                f"(size-1 dims broadcast), got shape {tuple(x.shape)}"
            )
        if x.device != self.device:
            raise ValueError(
                f"{self.fn}: `{name}` is on {x.device} but `{self._device_of}` "
                f"(and the inputs checked against it) is on {self.device}"
            )

    def _broadcast(self, name: str, x: Tensor, shape: torch.Size) -> Tensor:
        if x.shape == shape:
            return x
        try:
            return x.expand(shape)
        except RuntimeError:
            raise ValueError(
                f"{self.fn}: `{name}` has shape {tuple(x.shape)}, which does not broadcast to "
                f"the per-step shape {tuple(shape)} (each dim must match or be 1)"
            ) from None

    def _time_first(self, x: Tensor) -> Tensor:
        return x.movedim(self.time_dim, 0) if self.time_dim else x

    def step(self, name: str, x: Tensor | None) -> Tensor | None:
        """A per-step value tensor (already checked in ``__init__``), time first."""
        if x is None:
            return None
        return self._time_first(x if x.shape == self.shape else x.expand(self.shape))

    def flag(self, name: str, x: Tensor | None) -> Tensor | None:
        """A per-step flag: bool, integer or float 0/1 (non-zero is true), time first."""
        if x is None:
            return None
        if not isinstance(x, Tensor):
            raise TypeError(f"{self.fn}: `{name}` must be a torch.Tensor or None")
        _refuse_irregular(self.fn, name, x)
        if x.dtype not in _FLAGS:  # (not complex, quantized nor float8)
            raise TypeError(
                f"{self.fn}: `{name}` must be bool, integer or float (float16, bfloat16, float32 "
                f"or float64), got {x.dtype}"
            )
        self.seen.append((name, x))
        self._check_rank_device(name, x, len(self.shape))
        return self._time_first(self._broadcast(name, x, self.shape))

    def coefficient(self, name: str, x: Coefficient) -> Coefficient:
        """gamma, lmbda or a clipping threshold: a Python number, or a tensor broadcast per step."""
        if x.__class__ is float:  # the common case, before the slower ABC check
            return x
        if isinstance(x, numbers.Real) and not isinstance(x, (Tensor, bool)):
            # (a bool is refused below, as numpy's is: gamma=True is a slip)
            return real_to_float(self.fn, name, x)
        if not isinstance(x, Tensor):
            raise not_a_coefficient(self.fn, name, x)
        _refuse_non_float(self.fn, name, x)
        self.seen.append((name, x))
        if x.dim() == 0:
            if x.device != self.device and x.device.type == "cpu" and not x.requires_grad:
                return float(x)  # a CPU scalar: reading it does not touch the accelerator
            x = x.reshape((1,) * len(self.shape))
        self._check_rank_device(name, x, len(self.shape))
        return self._time_first(self._broadcast(name, x, self.shape))

    def boundary(self, name: str, x: Tensor | None) -> Tensor | None:
        """bootstrap_value / initial: the step shape without time (or with a size-1 time axis)."""
        if x is None:
            return None
        if not isinstance(x, Tensor):
            raise TypeError(f"{self.fn}: `{name}` must be a torch.Tensor or None")
        _refuse_non_float(self.fn, name, x)
        self.seen.append((name, x))
        if x.device != self.device:
            raise ValueError(
                f"{self.fn}: `{name}` is on {x.device} but `{self._device_of}` "
                f"(and the inputs checked against it) is on {self.device}"
            )
        ndim = len(self.shape)
        if x.dim() == ndim and x.shape[self.time_dim] == 1:
            x = x.squeeze(self.time_dim)
        if x.dim() != ndim - 1:
            raise ValueError(
                f"{self.fn}: `{name}` must have the per-step shape without the time axis, "
                f"{tuple(self.batch_shape)}, got {tuple(x.shape)}"
            )
        return self._broadcast(name, x, self.batch_shape)

    def outputs(self, out: Tensor | Sequence[Tensor] | None, names: Sequence[str]):
        """Output tensors in the caller's layout, and their time-first views for the backend."""
        if out is None:
            like = self.layout_like
            if like.shape != self.shape:
                outs = tuple(
                    torch.empty(self.shape, dtype=self.dtype, device=self.device) for _ in names
                )
            elif like.dtype == self.dtype:  # (passing dtype= costs a little even when equal)
                outs = tuple(torch.empty_like(like) for _ in names)
            else:
                outs = tuple(torch.empty_like(like, dtype=self.dtype) for _ in names)
        else:
            outs = check_out(self.fn, out, names, self.shape, self.dtype, self.device, self.seen)
        if not self.time_dim:
            return outs, outs
        return outs, tuple(o.movedim(self.time_dim, 0) for o in outs)


def check_out(
    fn: str, out, names: Sequence[str], shape, dtype, device, inputs=()
) -> tuple[Tensor, ...]:
    """``out=`` as a tuple, one tensor per output name, each of the outputs' shape, dtype and
    device, sharing no memory with each other nor with ``inputs`` (``(name, tensor)`` pairs);
    otherwise a TypeError / ValueError naming ``out``."""

    def wanted() -> str:
        return f"{fn}: `out` must be {len(names)} tensor(s) ({_name_list(names)})"

    try:
        outs = (out,) if isinstance(out, Tensor) else tuple(out)
    except TypeError:
        raise TypeError(f"{wanted()}, got {type(out).__name__}") from None
    if len(outs) != len(names) or not all(isinstance(o, Tensor) for o in outs):
        raise TypeError(wanted())
    for o, n in zip(outs, names, strict=True):
        _refuse_irregular(fn, "out", o)
        if o.shape != shape or o.dtype != dtype or o.device != device:
            raise ValueError(
                f"{fn}: `out` tensor for `{n}` must have shape {tuple(shape)}, dtype {dtype} "
                f"and device {device}; got {tuple(o.shape)}, {o.dtype}, {o.device}"
            )
        if o.requires_grad and o.is_leaf and torch.is_grad_enabled():
            raise ValueError(f"{fn}: `out` tensor for `{n}` is a leaf that requires grad")
        if (
            0 in (strides := o.stride())
            and o.numel()
            and any(s == 0 and k > 1 for k, s in zip(o.shape, strides, strict=True))
        ):
            raise ValueError(f"{fn}: `out` tensor for `{n}` is a broadcast view (a stride of 0)")
    if torch.compiler.is_compiling():  # (memory and inference mode: not traceable; the
        return outs  # compiled op computes before it copies into out=)
    for o, n in zip(outs, names, strict=True):
        if o.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError(
                f"{fn}: `out` tensor for `{n}` is an inference tensor, written outside "
                "torch.inference_mode()"
            )
    _refuse_overlap(fn, outs, names, inputs)
    return outs


def require_next_state(
    fn: str, next_values: Tensor | None, bootstrap_value: Tensor | None, truncated, needed=True
) -> None:
    """The contract's rules for where the next-state value nv_t comes from."""
    if truncated is not None and next_values is None:
        raise ValueError(
            f"{fn}: `truncated` needs `next_values` (at a truncated step values[t+1] belongs to "
            "the next episode, so the value of the final observation must be passed explicitly)"
        )
    if needed and next_values is None and bootstrap_value is None:
        raise ValueError(
            f"{fn}: pass `next_values` (the value of every next state) or `bootstrap_value` "
            "(the value of the state after the last step)"
        )
