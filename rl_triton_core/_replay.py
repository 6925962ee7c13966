"""Replayed calls: the host path of a repeated Triton call cut to one dictionary lookup.

A training loop calls an estimator with the same shapes, strides, dtypes, devices and options
at every update. Validation and launch planning depend on exactly that metadata and never on
tensor data (see :mod:`._validate`), so their outcome can be remembered:

1. The first call with a given metadata key runs as usual (validation, views, the Triton
   launcher) while the launcher records the launches it makes (:func:`recording`).
2. The launch arguments are then mapped back onto the call: every tensor a kernel reads or
   writes is one of the caller's tensors (time-first views share their data pointer, and the
   kernel addresses them through the recorded strides) or a freshly allocated output.
3. Later calls with the same key allocate the outputs with the recorded shapes and strides
   and replay the launches with their own tensors in those slots: no validation, no views.

A call is only recorded when the mapping is exact: every launch argument that is a tensor is
found among the call's tensors or outputs (or is a cached constant of the launcher), every
tensor of the call is used, and no two of them share memory. Anything else (the torch and
reference backends, layouts the launcher copies, a CPU scalar read as a float, gradients,
``torch.compile``) is remembered as "not replayable" and runs the ordinary path.

Only CUDA calls (and Triton-interpreter calls, so that CPU tests exercise the replay) look up
the table; on the CPU it costs one device check.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ._dispatch import triton_interpreted

ENABLED = os.environ.get("RL_TRITON_REPLAY", "1") != "0"  # RL_TRITON_REPLAY=0: never replay
_INTERPRETED = triton_interpreted()
_MAX_ENTRIES = 4096  # many distinct call signatures: start afresh
_state = threading.local()  # the recording of the call in progress, per thread (IMPALA actors)


def recording() -> list | None:
    """The list the Triton launcher appends ``(launch, args)`` to (``None`` for a launch it
    had to copy inputs for), or None when no call is being recorded."""
    return getattr(_state, "launches", None)


class _Plan(NamedTuple):
    """What a recorded call did, in terms of the call's tensors."""

    start: Callable  # triton_backend.start
    launches: tuple  # (launch, argument template, ((position, source), ...)) per launch
    new_outputs: tuple  # (shape, stride, dtype, device) per freshly allocated output
    returned: tuple  # source of each returned tensor
    single: bool  # the function returned one tensor, not a tuple


# A source is an index into the call's tensors (>= 0) or ~j for the j-th new output.


_SCALARS = (float, int, bool, str, type(None))  # compared by type and value in the key


def _metadata(args: tuple, kwargs: dict, tensors: list[Tensor]) -> tuple:
    """The part of a call that validation and launch planning depend on: the number of
    positional arguments; tensors by shape, strides, dtype and device (collected into
    ``tensors``, in order); Python scalars by type and value (a zero float with its sign, the
    value the kernel receives); ``out=`` sequences (any tuple or list) element by element; the
    keywords' names. Raises TypeError for anything else (tensor subclasses, numpy scalars,
    other number types): such calls are never replayed."""
    key = [len(args)]
    for x in (*args, *kwargs.values()):
        cls = x.__class__
        if cls is Tensor:
            tensors.append(x)
            key.append((x.shape, x.stride(), x.dtype, x.device))
        elif cls in _SCALARS:
            key.append((cls, x, math.copysign(1.0, x)) if cls is float and x == 0 else (cls, x))
        elif isinstance(x, (tuple, list)):
            key.append((list, len(x)))
            for o in x:
                if o.__class__ is not Tensor:
                    raise TypeError
                tensors.append(o)
                key.append((o.shape, o.stride(), o.dtype, o.device))
        else:
            raise TypeError
    key.extend(kwargs)
    return tuple(key)


def _plan(launches: list, tensors: list[Tensor], result) -> _Plan | None:
    """Map a recorded call onto its tensors, or None when it cannot be replayed exactly."""
    if not launches or None in launches:
        return None
    returned_tensors = (result,) if isinstance(result, Tensor) else tuple(result)
    sources = {}
    for i, t in enumerate(tensors):
        if t.data_ptr() in sources:
            return None  # two arguments share memory: a replay could not tell them apart
        sources[t.data_ptr()] = i
    new_outputs, returned = [], []
    for t in returned_tensors:
        i = next((i for i, x in enumerate(tensors) if x is t), None)
        if i is None:  # allocated by the call
            i = ~len(new_outputs)
            new_outputs.append((tuple(t.shape), t.stride(), t.dtype, t.device))
            sources[t.data_ptr()] = i
        returned.append(i)
    used, plans = set(), []
    for launch, args in launches:
        fills = []
        for pos, a in enumerate(args):
            if isinstance(a, Tensor):
                src = sources.get(a.data_ptr())
                if src is not None:
                    fills.append((pos, src))
                    used.add(src)
                elif any(a.stride()):  # the launcher's only own tensors: cached float64 scalars
                    return None
        filled = {pos for pos, _ in fills}
        template = tuple(None if pos in filled else a for pos, a in enumerate(args))
        plans.append((launch, template, tuple(fills)))
    if not used.issuperset(range(len(tensors))):
        return None  # a tensor the kernels do not read (e.g. a CPU scalar read as a float)
    from .triton_backend import start

    single = isinstance(result, Tensor)
    return _Plan(start, tuple(plans), tuple(new_outputs), tuple(returned), single)


# The allocation entry points of torch.compile's generated code (CUDA: on the current device):
# they skip torch.empty_strided's argument parsing (on the CPU 1.5 against 3.2 us a call). They
# take plain tuples, not torch.Size.
_empty_strided_cpu = getattr(torch._C._dynamo.guards, "_empty_strided_cpu", None)
_empty_strided_cuda = getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)


def empty(shape: tuple, stride: tuple, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised tensor (the replayed outputs, the launcher's chunk totals)."""
    if device.type == "cuda":
        if _empty_strided_cuda is not None and device.index == torch._C._cuda_getDevice():
            return _empty_strided_cuda(shape, stride, dtype)
    elif device.type == "cpu" and _empty_strided_cpu is not None:  # (interpreter replays)
        return _empty_strided_cpu(shape, stride, dtype)
    return torch.empty_strided(shape, stride, dtype=dtype, device=device)


def _replay(plan: _Plan, tensors: list[Tensor]):
    new = [empty(*o) for o in plan.new_outputs]
    for launch, template, fills in plan.launches:
        args = list(template)
        for pos, src in fills:
            args[pos] = tensors[src] if src >= 0 else new[~src]
        plan.start(launch, tuple(args))
    outs = tuple(tensors[s] if s >= 0 else new[~s] for s in plan.returned)
    return outs[0] if plan.single else outs


_MISSING = object()
_PLANS: dict[tuple, _Plan | None] = {}


def replayable(fn: Callable) -> Callable:
    """Wrap a public estimator so that repeated CUDA calls replay their recorded launches."""
    name = fn.__name__

    @functools.wraps(fn)
    def call(*args, **kwargs):
        first = args[0] if args else None
        if (
            not ENABLED
            or first.__class__ is not Tensor
            or not (first.is_cuda or _INTERPRETED)
            or torch.compiler.is_compiling()
        ):
            return fn(*args, **kwargs)
        tensors: list[Tensor] = []
        try:
            key = (name, *_metadata(args, kwargs, tensors))
            plan = _PLANS.get(key, _MISSING)
        except TypeError:  # a tensor subclass, or an unhashable argument
            return fn(*args, **kwargs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return fn(*args, **kwargs)  # the differentiable path (see estimators._graph_path)
        outer = recording()
        if outer is not None:  # called inside another call's recording (a user callback)
            outer.append(None)  # the outer call's launches would involve this one's
            return fn(*args, **kwargs)
        if plan.__class__ is _Plan:
            return _replay(plan, tensors)
        if plan is None:  # recorded as not replayable
            return fn(*args, **kwargs)
        _state.launches = launches = []
        try:
            result = fn(*args, **kwargs)
        finally:
            _state.launches = None
        if len(_PLANS) >= _MAX_ENTRIES:
            _PLANS.clear()
        _PLANS[key] = _plan(launches, tensors, result)
        return result

    return call
