"""What the L2 flush charges to the timed call: device times under the harness's two flushes.

    python benchmarks/flush_effect.py [--shapes 256x65536 1024x65536] [--out F.json]

The harness evicts the L2 before each timed repetition. Zeroing a 256 MB buffer (``write``,
the default, as ``triton.testing.do_bench`` does) leaves the L2 full of that buffer's dirty
lines: the timed call writes them back as its own data evicts them, and leaves its own last
dirty lines for later. Reading the buffer instead (``read``) leaves clean lines: the call pays
for none but its own, and still leaves its last outputs unwritten, so it is timed for fewer
bytes than it moves. This script times, side by side in one process, plain copies of several
sizes and every estimator of ours (Triton backend, float32, both layouts) under both flushes.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baselines as bl
import harness as h


def device_us(clock: h.Clock, fn, reps: int = 60) -> float:
    """Median device time of ``fn`` in us (the harness's repetition: flush, sleep, events)."""
    fn()
    return statistics.median(clock.device_times(fn, reps, lead_us=60.0)) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["256x65536", "1024x65536"], help="TxN")
    ap.add_argument("--copies-mib", nargs="*", type=int, default=[1024, 144, 64])
    ap.add_argument("--out", type=Path, help="JSON of every row")
    args = ap.parse_args(argv)
    device = torch.device("cuda", torch.cuda.current_device())
    clocks = {mode: h.Clock(device, mode) for mode in h.FLUSHES}
    rows = []
    print(torch.cuda.get_device_name(device), f"torch {torch.__version__}")

    def row(what: str, nbytes: int, fn) -> None:
        times = {mode: device_us(clock, fn) for mode, clock in clocks.items()}
        rows.append(dict(what=what, bytes=nbytes, **{f"{m}_us": t for m, t in times.items()}))
        gbps = " | ".join(f"{m} {t:7.1f} us {nbytes / t / 1e3:5.0f} GB/s" for m, t in times.items())
        print(
            f"{what:44s} {gbps} | write - read {times['write'] - times['read']:5.1f} us", flush=True
        )

    for mib in args.copies_mib:
        src = torch.randn((mib << 20) // 4, device=device)
        row(f"copy {mib} MiB", 2 * (mib << 20), functools.partial(torch.empty_like(src).copy_, src))
        del src
    for shape in args.shapes:
        T, N = map(int, shape.split("x"))
        for est in bl.ESTIMATORS:
            for layout in (h.TM, h.BM):
                p = bl.make_problem(est, T, N, layout, torch.float32, device, seed=0)
                row(f"{est} [{T}, {N}] {layout}", p.bytes_moved(), bl._ours("triton")(p))
                del p
                torch.cuda.empty_cache()
    if args.out:
        meta = dict(gpu=torch.cuda.get_device_name(device), torch=torch.__version__)
        args.out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
