"""Developer tool, no GPU needed: what one tile of ``scan_kernel`` costs in sm_90 instructions.

Runs the public estimator on CPU tensors with the Triton launcher's last step replaced by a
capture (the H200's 132 SMs assumed for the plan), so that the plan, the constexprs and the
arguments are exactly those of a CUDA call of that shape and layout; Triton's own binder then
specialises them (integers equal to 1 become constants, multiples of 16 and 16-byte aligned
pointers get divisibility hints) and the installed Triton compiles the kernel for an H100/H200
(``GPUTarget("cuda", 90, 32)``, its bundled ptxas and cuobjdump), once with the plan's
``UNROLL`` set to 1 and once to 2. The difference approximates one tile's body (code the
compiler schedules differently around the loop shows up as small negative counts). Prints
the plan, registers, stack and the body's SASS instructions per element a thread owns
(``block_t * block_n / (32 * warps)``); ``--mix`` adds the opcodes per element. A tile sweep
on the GPU (``sweep_tiles.py``) says what is fast; this says what the instructions are, offline.

    python benchmarks/sass_count.py [--mix] [--phase scan|totals] [--forward-scan]
        [--plan BT:BN:WARPS[:FIELD=VALUE ...]] [--dtype bfloat16] [--meta FULL=1]
        ESTIMATOR:T:N[:bm] ...

ESTIMATOR: gae, lambda_returns, discounted_returns, vtrace, retrace, eligibility_traces,
linear_scan; float32 values (or ``--dtype``), terminated flags as bool, a bootstrap value
where the estimator takes one (``sweep_tiles.estimator_calls``; ``linear_scan`` reverse
unless ``--forward-scan``); time-major ``[T, N]`` unless ``bm``. ``--phase`` picks the pass
of a split plan (an unsplit plan has only the scan; a resident plan is one launch without a
tile loop, compiled once and counted whole). ``--plan`` replaces the tile (unsplit; prefetch
off; other ``Plan`` fields by name, e.g. ``segs=2``); ``--meta`` (repeatable) overrides a
constexpr of the launch (an integer, e.g. ``FULL=1``: loads and stores without masks).
The local Triton may compile differently from the GPU machine's.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import torch
import triton
from sweep_tiles import estimator_calls
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

import rl_triton_core as rtc
from rl_triton_core import _dispatch, triton_backend
from rl_triton_core.triton_backend import kernels

TARGET = GPUTarget("cuda", 90, 32)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def captured_launch(
    name: str,
    T: int,
    N: int,
    batch_major: bool,
    plan: str | None,
    reverse_scan: bool = True,
    dtype: torch.dtype = torch.float32,
):
    """The (launch description, call arguments) the Triton launcher would start."""
    captured = []
    patches = dict(start=lambda launch, args: captured.append((launch, args)))
    patches["_sm_count"] = lambda index: 132
    if plan is not None:
        bt, bn, warps, *fields = plan.split(":")
        extra = {k: int(v) for k, v in (f.split("=") for f in fields)}
        patches["_plan"] = lambda kind, T_, N_, tm, device, **_: triton_backend.Plan(
            int(bt), int(bn), 1, triton.cdiv(T_, int(bt)) * int(bt), 1, int(warps)
        )._replace(**extra)  # (a whole number of tiles, as _plan's chunks: a partial last one
        # is masked)
    saved = {k: getattr(triton_backend, k) for k in patches}
    runs_on = _dispatch.triton_runs_on
    try:
        for k, f in patches.items():
            setattr(triton_backend, k, f)
        _dispatch.triton_runs_on = lambda device: True
        triton_backend._LAUNCHES.clear()
        shape = (N, T) if batch_major else (T, N)
        calls = estimator_calls(
            torch.randn(shape).to(dtype),
            torch.randn(shape).to(dtype),
            torch.rand(shape) < 0.05,
            torch.randn(N).to(dtype),
            int(batch_major),
            reverse_scan,
        )
        args, kwargs = calls[name]
        getattr(rtc, name)(*args, **kwargs, time_dim=int(batch_major), backend="triton")
    finally:
        for k, f in saved.items():
            setattr(triton_backend, k, f)
        _dispatch.triton_runs_on = runs_on
        triton_backend._LAUNCHES.clear()
    return captured[0]


def compile_sass(launch, args, phase: dict, unroll: int, overrides: dict | None = None):
    """(registers, stack bytes, SASS text) of the launch's kernel, specialised by Triton
    (``overrides``: constexprs replacing the launch's)."""
    backend = make_backend(TARGET)
    kernel = kernels.scan_kernel
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    totals = torch.empty(16) if launch.plan.n_chunks > 1 else None  # (only its alignment counts)
    meta = {**launch.meta, "UNROLL": unroll, **(overrides or {})}
    bound, specialization, options = binder(*args, totals, *launch.tail, **phase, **meta)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, options, bound, specialization, options
    )
    compiled = triton.compile(
        ASTSource(kernel, signature, constexprs, attrs), target=TARGET, options=options.__dict__
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        cuobjdump = os.path.join(_BIN, "cuobjdump")
        sass, usage = (
            subprocess.run([cuobjdump, flag, f.name], capture_output=True, text=True, check=True)
            for flag in ("-sass", "-res-usage")
        )
    sass, usage = sass.stdout, usage.stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return regs, stack, sass


def opcodes(sass: str) -> collections.Counter:
    """Instructions by opcode (predicates and modifiers dropped)."""
    ops = re.findall(r"/\*[0-9a-f]{4,5}\*/ +(?:@!?U?P\w+ +)?([A-Z][A-Z0-9]*)", sass)
    return collections.Counter(ops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="ESTIMATOR:T:N[:bm]")
    ap.add_argument("--mix", action="store_true", help="opcodes per element too")
    ap.add_argument("--phase", choices=("scan", "totals"), default="scan")
    ap.add_argument("--plan", help="BT:BN:WARPS[:FIELD=VALUE ...], an unsplit tile instead")
    ap.add_argument("--forward-scan", action="store_true", help="linear_scan forward, not reverse")
    ap.add_argument("--dtype", default="float32", help="of the value inputs, e.g. bfloat16")
    ap.add_argument("--meta", action="append", default=[], help="KEY=INT: a constexpr to override")
    args = ap.parse_args()
    overrides = {k: int(v) for k, v in (m.split("=") for m in args.meta)}
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # (the GPU machine's Triton fuses)
    for spec in args.specs:
        name, T, N, *layout = spec.split(":")
        launch, call_args = captured_launch(
            name, int(T), int(N), layout == ["bm"], args.plan, not args.forward_scan,
            getattr(torch, args.dtype),
        )  # fmt: skip
        p = launch.plan
        split = p.n_chunks > 1 and not p.resident  # (a resident plan: one launch, no phases)
        phase = triton_backend._Phase(WRITE_TOTALS=split and args.phase == "totals",
                                      READ_TOTALS=split and args.phase == "scan",
                                      RESIDENT=p.resident)._asdict()  # fmt: skip
        regs1, stack1, one = compile_sass(launch, call_args, phase, 1, overrides)
        if p.resident:  # (no tile loop, so UNROLL changes nothing: the whole kernel instead)
            regs2, stack2, body, what = regs1, stack1, opcodes(one), "the whole kernel"
        else:
            regs2, stack2, two = compile_sass(launch, call_args, phase, 2, overrides)
            body, what = opcodes(two), "a tile"
            body.subtract(opcodes(one))
        per = p.block_t * p.block_n / (32 * p.num_warps)
        pass_ = "one launch" if p.resident else f"{args.phase} pass"
        print(f"{spec} ({pass_} of {p}): registers {regs1} (unroll 2: {regs2}), "
              f"stack {stack1}/{stack2}, {body.total() / per:.1f} instructions an element, "
              f"{what}")  # fmt: skip
        if args.mix:
            mix = sorted(((n / per, op) for op, n in body.items() if n), reverse=True)
            print("   ", ", ".join(f"{op} {x:.1f}" for x, op in mix))


if __name__ == "__main__":
    main()
