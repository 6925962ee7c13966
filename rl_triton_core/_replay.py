"""Replayed calls: the host path of a repeated Triton call cut to a lookup, a check of its
tensors and the launch.

A training loop calls an estimator with the same shapes, strides, dtypes, devices and options
at every update. Validation and launch planning depend on exactly that metadata and never on
tensor data (see :mod:`._validate`), so their outcome can be remembered:

1. The first call with given metadata runs as usual (validation, views, the Triton launcher)
   while the launcher records the launches it makes (:func:`recording`).
2. The launch arguments are then mapped back onto the call: every tensor a kernel reads or
   writes is one of the caller's tensors (time-first views share their data pointer, and the
   kernel addresses them through the recorded strides) or a freshly allocated output. The
   mapping is compiled into a straight-line function of the call's tensors (:func:`_compile`).
3. A later call looks up the recordings under its key (grad mode, the first tensor's shape,
   the call's structure: :func:`_structure`), checks its tensors against each one's (class,
   shape, strides, dtype, device, ``requires_grad``, negative bit, inference:
   :func:`_metadata`, in C++ by
   :func:`_cpp_checks` where torch has them), and replays the first that matches with its own
   tensors: no validation, no views.

A call is only recorded when the mapping is exact: every launch argument that is a tensor is
found among the call's tensors or outputs (or is a cached constant of the launcher), every
tensor of the call is used, and no two of them share memory. Anything else (the torch and
reference backends, layouts the launcher copies, a CPU scalar read as a float, ``torch.compile``)
is remembered as "not replayable" and runs the ordinary path; calls with tensors that require
gradients are not recorded.

Only CUDA calls (and Triton-interpreter calls, so that CPU tests exercise the replay) look up
the table; on the CPU it costs one device check.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from ._dispatch import triton_interpreted
from ._validate import extent

ENABLED = os.environ.get("RL_TRITON_REPLAY", "1") != "0"  # RL_TRITON_REPLAY=0: never replay
_INTERPRETED = triton_interpreted()
_MAX_RECORDINGS = 4096  # recordings in all (many distinct calls): more start afresh
_state = threading.local()  # the recording of the call in progress, per thread (IMPALA actors)


def recording() -> list | None:
    """The list the Triton launcher appends ``(launch, args)`` to (``None`` for a launch it
    had to copy inputs for), or None when no call is being recorded."""
    return getattr(_state, "launches", None)


_SCALARS = (float, int, bool, str, type(None))  # compared by type and value in the key


def _structure(args: tuple, kwargs: dict, tensors: list[Tensor]) -> tuple:
    """The part of a call that validation and launch planning depend on, tensors aside: the
    number of positional arguments; Python scalars by type and value (a zero float with its
    sign, the value the kernel receives); where the tensors are, and ``out=`` sequences (any
    tuple or list) by length; the keywords' names. The tensors are collected into ``tensors``,
    in order (their metadata is checked separately). Raises TypeError for anything else (numpy
    scalars, other number types, nested tensors): such calls are never replayed."""
    key = [len(args)]
    for x in (*args, *kwargs.values()):
        cls = x.__class__
        if cls is Tensor:
            if x.is_nested:  # (the C++ checks would abort the process on its strides)
                raise TypeError
            tensors.append(x)
            key.append(Tensor)
        elif cls in _SCALARS:
            key.append((cls, x, math.copysign(1.0, x)) if cls is float and x == 0 else (cls, x))
        elif isinstance(x, (tuple, list)):
            key.append((list, len(x)))
            for o in x:
                if o.__class__ is not Tensor or o.is_nested:
                    raise TypeError
                tensors.append(o)
        else:
            raise TypeError
    key.extend(kwargs)
    return tuple(key)


def _metadata(tensors: list[Tensor]) -> list[tuple]:
    """What a replay depends on in each tensor, for the checks in Python: class (subclasses,
    whose dispatch differs), shape, strides, dtype, device, ``requires_grad``, and the dispatch
    bits the C++ checks compare too: the negative bit (a replay would read the memory as it
    is) and inference tensors (refused as ``out=`` outside ``inference_mode``)."""
    return [
        (
            t.__class__,
            t.shape,
            t.stride(),
            t.dtype,
            t.device,
            t.requires_grad,
            t.is_neg(),
            t.is_inference(),
        )
        for t in tensors
    ]


def _cpp_tensor_checks():
    """torch.compile's C++ tensor checks (about 0.2 us a tensor against 1.7 us in Python), if
    this torch has them and they refuse what they must (a private API: else None)."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        x = torch.zeros(2, 3)
        guards = TensorGuards(x, dynamic_dims_sizes=[[2, 3]], dynamic_dims_strides=[[3, 1]])
        others = (torch.zeros(2, 4), torch.zeros(2, 3, 1), torch.zeros(3, 2).t(), x.double(),
                  x.clone().requires_grad_(), torch.zeros(2, 3, device="meta"))  # fmt: skip
        if guards.check(torch.ones(2, 3)) and not any(guards.check(o) for o in others):
            return TensorGuards
    except Exception:  # (any failure: the Python checks)
        pass
    return None


_TensorGuards = _cpp_tensor_checks()


def _cpp_checks(tensors: list[Tensor]):
    """The same checks as comparing :func:`_metadata` (dispatch keys for the class), in C++:
    ``check(*tensors) -> bool``; None where torch lacks them."""
    if _TensorGuards is None:
        return None
    return _TensorGuards(
        *tensors,
        dynamic_dims_sizes=[list(t.shape) for t in tensors],
        dynamic_dims_strides=[list(t.stride()) for t in tensors],
    )


def _plan(launches: list, tensors: list[Tensor], result) -> Callable | None:
    """Map a recorded call onto its tensors: a function of a later call's tensors that
    replays it (:func:`_compile`), or None when it cannot be replayed exactly. A source is an
    index into the call's tensors (>= 0) or ~j for the j-th new output."""
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
    # a caller's out= tensor against every other tensor of the call (each pair once): the
    # bytes each spans (recorded) must not intersect at a later call, else it takes the
    # ordinary path
    spans = [extent(t) for t in tensors]
    outs = [o for o in returned if o >= 0]
    apart = [
        (o, x, spans[o], spans[x])
        for o in outs
        for x in range(len(tensors))
        if x != o and not (x in outs and x < o)
    ]
    return _compile(plans, new_outputs, returned, isinstance(result, Tensor), apart)


def _compile(plans: list, new_outputs: list, returned: list, single: bool, apart: list) -> Callable:
    """The replay of a recorded call as straight-line Python (no loops over argument
    positions; about 1 us a call where a generic loop took 3.5): allocate the new outputs,
    start each launch with the call's tensors in their positions, return the outputs. E.g.

        def replay(t):
            n0 = empty(*o0)
            start(L0, (t[0], t[1], None, c0_3, ..., n0))
            return n0

    A CUDA launch whose phases were all launched directly (``direct_launches``: the unsplit
    kernel, or the totals, group and carried launches of a split one) skips ``start``: the
    replay passes the tensors' addresses to Triton's launcher itself, as integers (Triton
    then neither calls ``data_ptr`` nor asks the driver about each pointer), when every
    address is 16-byte aligned as recorded, no profiler hooks Triton's launches and the
    launch's device is the current one; otherwise it calls ``start``. A split launch's chunk
    totals are allocated by the replay (``new_totals``, aligned):

            p0_0 = t[0].data_ptr()
            ...
            if (p0_0 | ... | p0_9) & 15 or hooks() or device() != D0:
                start(L0, (t[0], ...))
            else:
                s0 = stream(D0)
                q0 = totals(L0)
                a0 = q0.data_ptr()
                R0_0(*G0_0, 1, s0, *H0_0, p0_0, ..., a0, *K0_0)
                R0_1(*G0_1, 1, s0, *H0_1, p0_0, ..., a0, *K0_1)

    A call given ``out=`` first compares the bytes its out= tensors span with every other
    tensor's (``apart``: the spans recorded): where they may overlap, the replay returns None
    and the call takes the ordinary path, whose validation refuses overlapping outputs (or
    runs interleaved ones, which it tells apart exactly).

    Whether a recording launches by address is decided when it is made: one whose call found
    no such direct launchers (a first call with misaligned tensors, a profiler's hooks,
    ``RL_TRITON_DIRECT_LAUNCH=0``) or holds a misaligned constant always calls ``start``.
    """
    from .triton_backend import _launch_hooks_set, direct_launches, new_totals, start

    names = {"empty": empty, "start": start}
    lines = ["def replay(t):"]
    if apart:  # ``apart``: (out=, other, their byte spans); None when they may overlap
        for i in sorted({i for o, x, _, _ in apart for i in (o, x)}):
            lines.append(f"    d{i} = t[{i}].data_ptr()")
        for o, x, (lo, ho), (lx, hx) in apart:  # (named, not literals: one code for all shapes)
            names.update({f"lo{o}": lo, f"hi{o}": ho, f"lo{x}": lx, f"hi{x}": hx})
        near = " or ".join(f"(d{o} + hi{o} > d{x} + lo{x} and d{x} + hi{x} > d{o} + lo{o})"
                           for o, x, _, _ in apart)  # fmt: skip
        lines += [f"    if {near}:", "        return None"]
    for j, o in enumerate(new_outputs):
        names[f"o{j}"] = o
        lines.append(f"    n{j} = empty(*o{j})")

    def source(s: int) -> str:
        return f"t[{s}]" if s >= 0 else f"n{~s}"

    for k, (launch, template, fills) in enumerate(plans):
        names[f"L{k}"] = launch
        filled = dict(fills)
        items = []
        for pos, a in enumerate(template):
            if pos in filled:
                items.append(source(filled[pos]))
            elif a is None:
                items.append("None")
            else:
                names[f"c{k}_{pos}"] = a
                items.append(f"c{k}_{pos}")
        call = f"start(L{k}, ({', '.join(items)},))"
        direct = direct_launches(launch)
        pointers = [pos for pos in launch.pointers if pos < len(template)]  # (not the totals)
        if direct is None or any(  # (the direct launchers of the all-aligned kernel)
            template[pos].data_ptr() & 15 for pos in pointers if pos not in filled
        ):
            lines.append(f"    {call}")
            continue
        addresses = list(items)  # the launch's tensors by address
        checked = []
        for pos in pointers:
            addresses[pos] = f"p{k}_{pos}"
            if pos in filled:
                lines.append(f"    p{k}_{pos} = {items[pos]}.data_ptr()")
                checked.append(f"p{k}_{pos}")
            else:  # a cached constant of the launcher (kept alive by c{k}_{pos})
                names[f"p{k}_{pos}"] = template[pos].data_ptr()
        names.update(hooks=_launch_hooks_set, device=torch._C._cuda_getDevice)
        names.update(stream=torch._C._cuda_getCurrentRawStream, totals=new_totals)
        names[f"D{k}"] = launch.device.index
        lines.append(f"    if ({' | '.join(checked)}) & 15 or hooks() or device() != D{k}:")
        lines.append(f"        {call}")
        lines.append("    else:")
        lines.append(f"        s{k} = stream(D{k})")
        totals = "None"
        if launch.plan.n_chunks > 1:  # (kept alive by q{k} until the launches are queued)
            lines.append(f"        q{k} = totals(L{k})")
            lines.append(f"        a{k} = q{k}.data_ptr()")
            totals = f"a{k}"
        fast = ", ".join(addresses)
        for j, (run, grid, head, tail) in enumerate(direct):
            names.update({f"R{k}_{j}": run, f"G{k}_{j}": grid, f"H{k}_{j}": head})
            names[f"K{k}_{j}"] = tail
            lines.append(
                f"        R{k}_{j}(*G{k}_{j}, 1, s{k}, *H{k}_{j}, {fast}, {totals}, *K{k}_{j})"
            )
    outs = [source(s) for s in returned]
    lines.append(f"    return {outs[0]}" if single else f"    return ({', '.join(outs)},)")
    exec(_code("\n".join(lines)), names)  # (generated from the recording: no user text)
    return names["replay"]


@functools.lru_cache(maxsize=1024)
def _code(source: str):
    """Compiled replay source: one compile (~0.4 ms) per distinct layout of a recording; the
    recordings of other shapes of the same call share it."""
    return compile(source, "<rl_triton_core replay>", "exec")


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


# (function, grad mode, first tensor's shape, call structure) -> the recordings under that key:
# ((C++ tensor checks or None, tensor metadata, replay or None), ...)
_PLANS: dict[tuple, tuple] = {}
_MAX_PLANS = 8  # recordings kept per key (other dtypes, strides ...): the oldest goes first
_recordings = 0  # made since _PLANS was last cleared
_grad_enabled = torch.is_grad_enabled


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
            # (grad mode: a recording made under no_grad must not serve a call that records
            # gradients; the first tensor's shape: one short list of recordings a shape)
            key = (name, _grad_enabled(), first.shape, *_structure(args, kwargs, tensors))
            recorded = _PLANS.get(key, ())
        except (TypeError, RuntimeError):  # an argument of another type, an unhashable one, a
            return fn(*args, **kwargs)  # nested tensor first (no shape): the ordinary path
        outer = recording()
        if outer is not None:  # called inside another call's recording (a user callback)
            outer.append(None)  # the outer call's launches would involve this one's
            return fn(*args, **kwargs)
        for checks, _, replay in recorded:
            if checks is not None and checks.check(*tensors):
                result = None if replay is None else replay(tensors)  # (None: out= overlaps)
                return fn(*args, **kwargs) if result is None else result
        metadata = None
        if _TensorGuards is None or len(set(map(id, tensors))) < len(tensors):  # the checks
            # in Python: torch lacks the C++ ones, or one tensor is in two places (they refuse)
            try:
                metadata = _metadata(tensors)
            except RuntimeError:  # (a tensor without strides: the ordinary path refuses it)
                return fn(*args, **kwargs)
            for _, recorded_metadata, replay in recorded:
                if recorded_metadata == metadata:
                    result = None if replay is None else replay(tensors)
                    return fn(*args, **kwargs) if result is None else result
        if key[1] and any(t.requires_grad for t in tensors):
            return fn(*args, **kwargs)  # the differentiable path (see estimators._graph_path)
        _state.launches = launches = []
        try:
            result = fn(*args, **kwargs)
        finally:
            _state.launches = None
        global _recordings
        if _recordings >= _MAX_RECORDINGS:
            _PLANS.clear()
            _recordings = 0
        _recordings += 1
        entry = (
            _cpp_checks(tensors),
            metadata or _metadata(tensors),
            _plan(launches, tensors, result),
        )
        _PLANS[key] = (*recorded[max(0, len(recorded) + 1 - _MAX_PLANS) :], entry)
        return result

    return call
