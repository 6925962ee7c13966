"""Developer tool, no GPU needed: what one tile of ``scan_kernel`` costs in sm_90 instructions.

Compiles the kernel for an H100/H200 (``GPUTarget("cuda", 90, 32)``) with the installed Triton
(its bundled ptxas and cuobjdump), once with ``UNROLL=1`` and once with ``UNROLL=2``: the
difference is one tile's body. Prints registers, stack, the body's SASS instructions per
element a thread owns (``block_t * block_n / (32 * warps)`` elements) and, with ``--mix``, the
opcodes per element. A tile sweep on the GPU says what is fast; this says why, offline
(e.g. that Triton's layout already keeps a 1-warp ``[4, 32]`` tile's rows in each thread's
registers: no shuffles in its scan, 52 instructions an element for GAE).

    python benchmarks/sass_count.py [--mix] KIND:BT:BN:WARPS[:SEGS] ...

KIND is an estimator (gae, lambda, discounted, vtrace, retrace, traces, scan); every spec is a
reverse, unsplit, float32, time-major scan pass with terminated flags and a bootstrap value
(GAE reads next values from ``values``) and strides specialised like the launcher's.
The local Triton may differ from the GPU machine's.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rl_triton_core.triton_backend import kernels

KINDS = dict(scan=0, gae=1, lambda_=2, discounted=3, vtrace=4, retrace=5, traces=6)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_POINTERS = dict(term="*i1", trunc="*i1", gamma="fp32", lmbda="fp32", k0="fp32", k1="fp32",
                 k2="fp32")  # fmt: skip


def compile_sass(kind: int, bt: int, bn: int, warps: int, segs: int, unroll: int):
    """(registers, stack bytes, SASS text) of one specialisation."""
    reverse = kind not in (kernels.TRACES.value, kernels.SCAN.value)
    meta = dict(KIND=kind, TRACE=0, REVERSE=reverse, FLIP=reverse and bt > 1, ACC=tl.float32,
                HAS_TERM=True, HAS_TRUNC=False, HAS_NEXT=False, HAS_VALUES=True, HAS_BOOT=True,
                G_T=False, L_T=False, K0_T=False, K1_T=False, K2_T=False, WRITE_TOTALS=False,
                READ_TOTALS=False, GROUP_PASS=False, IDX64=False, BLOCK_T=bt, BLOCK_N=bn,
                SEGS=segs, UNROLL=unroll, FOLD=8, GROUP=1, PREFETCH=False)  # fmt: skip
    absent = {"trunc", "totals"}
    signature, constants = {}, {}
    for i, p in enumerate(kernels.scan_kernel.params):
        if p.name in meta or p.name in absent:
            signature[p.name] = "constexpr"
            constants[(i,)] = meta.get(p.name)
        else:
            signature[p.name] = _POINTERS.get(p.name, "*fp32" if i < 16 else "i32")
    aligned = [i for i, t in enumerate(signature.values()) if t.startswith("*") or t == "i32"]
    src = ASTSource(fn=kernels.scan_kernel, signature=signature, constexprs=constants,
                    attrs={(i,): [["tt.divisibility", 16]] for i in aligned})  # fmt: skip
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        usage = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-res-usage", f.name],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = int(re.search(r"STACK:(\d+)", usage).group(1))
    return regs, stack, sass


def opcodes(sass: str) -> collections.Counter:
    """Instructions by opcode (predicates and modifiers dropped)."""
    ops = re.findall(r"/\*[0-9a-f]{4,5}\*/ +(?:@!?U?P\w+ +)?([A-Z][A-Z0-9]*)", sass)
    return collections.Counter(ops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("specs", nargs="+", help="KIND:BT:BN:WARPS[:SEGS]")
    ap.add_argument("--mix", action="store_true", help="opcodes per element too")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # (as on the GPU's Triton)
    for spec in args.specs:
        name, *sizes = spec.split(":")
        bt, bn, warps, segs = (*map(int, sizes), 1)[:4]
        kind = KINDS["lambda_" if name == "lambda" else name]
        regs1, stack1, one = compile_sass(kind, bt, bn, warps, segs, 1)
        regs2, stack2, two = compile_sass(kind, bt, bn, warps, segs, 2)
        body = opcodes(two)
        body.subtract(opcodes(one))
        per = bt * bn / (32 * warps)
        print(f"{spec}: registers {regs1} (unroll 2: {regs2}), stack {stack1}/{stack2}, "
              f"{body.total() / per:.1f} instructions an element a tile")  # fmt: skip
        if args.mix:
            mix = sorted(((n / per, op) for op, n in body.items() if n), reverse=True)
            print("   ", ", ".join(f"{op} {x:.1f}" for x, op in mix))


if __name__ == "__main__":
    main()
