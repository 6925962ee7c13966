"""Reports of the benchmark harness: the issue's targets, the markdown tables, the files.

Everything here reads result rows (dicts, as written to ``<device>_results.json``) and never
runs a benchmark, so reports can be rebuilt from a results file:
``python benchmarks/harness.py --from-json benchmarks/results/cuda_results.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import baselines as bl

TM, BM = "time-major", "batch-major"
LARGE_ELEMENTS = 1 << 24  # "T*N >= 16M" in the issue's targets
SMALL_ELEMENTS = 128 * 4096  # "[128, 4096] and below": T*N <= this and T <= SMALL_MAX_T
SMALL_MAX_T = 256
LIMITS = {"vtrace": 1.3, "retrace": 1.3}  # device time / floor at large shapes; else 1.15


# -- targets --------------------------------------------------------------------------------------


def _ok(rows, **match):
    return [r for r in rows if r["status"] == "ok" and all(r[k] == v for k, v in match.items())]


def _where(r: dict) -> str:
    return f"{r['estimator']} {r['shape']} {r['layout']} {r['dtype']}"


def _worst(items, limit, key, better="low"):
    """(status, worst value, its row) of ``key(row)`` against ``limit``."""
    if not items:
        return "N/A", None, None
    pick = max if better == "low" else min
    worst = pick(items, key=key)
    value = key(worst)
    ok = value <= limit if better == "low" else value >= limit
    return ("PASS" if ok else "MISS"), value, worst


def is_small(r: dict) -> bool:
    """The issue's "small problems ([128, 4096] and below)": at most as many elements, and a
    rollout-length T (long-horizon shapes are judged by device time instead)."""
    return r["T"] * r["N"] <= SMALL_ELEMENTS and r["T"] <= SMALL_MAX_T


def _target(name: str, rows: list[dict], limit: float, key, better="low", unit="x") -> dict:
    """One target line: PASS when every row's ``key`` is within ``limit``; the worst row."""
    status, value, worst = _worst(rows, limit, key, better)
    return {
        "target": name,
        "status": status,
        "measured": "—" if value is None else f"{value:.2f}{unit}",
        "where": f"{_where(worst)} (worst of {len(rows)})" if worst else "—",
    }


def _floor_ratio(r: dict) -> float:
    return r["device_us"] / r["floor_us"]


def _paired(ours: list[dict], others: list[dict], **override) -> list[tuple[dict, dict]]:
    """(ours, other) rows of the same configuration (``override`` changes the lookup key)."""
    index = {(r["estimator"], r["T"], r["N"], r["layout"], r["dtype"]): r for r in ours}
    pairs = []
    for b in others:
        key = dict(b, **override)
        o = index.get((key["estimator"], key["T"], key["N"], key["layout"], key["dtype"]))
        if o is not None:
            pairs.append((o, b))
    return pairs


def gpu_targets(mine: list[dict], meta: dict) -> list[dict]:
    """Bandwidth-floor, small-problem and bf16 targets of ours (float32 unless stated)."""
    fp32 = [r for r in mine if r["dtype"] == "float32"]
    out = []
    for est in bl.ESTIMATORS:
        limit = LIMITS.get(est, 1.15)
        big = [r for r in fp32 if r["estimator"] == est and r["T"] * r["N"] >= LARGE_ELEMENTS]
        out.append(
            _target(f"{est}: device <= {limit}x floor at T*N >= 16M", big, limit, _floor_ratio)
        )
    for est in bl.ESTIMATORS:
        few = [r for r in fp32 if r["estimator"] == est and r["N"] <= 16 and r["T"] >= 131072]
        out.append(
            _target(f"{est}: device <= 2x floor at N <= 16, T >= 131072", few, 2.0, _floor_ratio)
        )
    empty = meta.get("empty_graph_us")
    for est in bl.ESTIMATORS:
        small = [r for r in fp32 if r["estimator"] == est and is_small(r)]
        name = f"{est}: full call <= 15 us at T*N <= 128*4096, T <= {SMALL_MAX_T}"
        out.append(_target(name, small, 15.0, lambda r: r["full_call_us"], unit=" us"))
        if empty:
            graphs = [r for r in small if r["graph_us"] is not None]
            name = f"{est}: graph replay <= 2x empty kernel ({empty:.1f} us) at the same"
            out.append(_target(name, graphs, 2.0, lambda r: r["graph_us"] / empty))
    for est in bl.ESTIMATORS:
        bf16 = [r for r in mine if r["estimator"] == est and r["dtype"] == "bfloat16"]
        pairs = [
            dict(b, _ratio=b["device_us"] / o["device_us"], _bytes=b["bytes"] / o["bytes"])
            for o, b in _paired(fp32, bf16, dtype="float32")
        ]
        name = f"{est}: bf16 device time < fp32"
        if pairs:
            name += f" (bytes ratio {pairs[0]['_bytes']:.2f})"
        out.append(_target(name, pairs, 0.9999, lambda r: r["_ratio"]))
    return out


def baseline_targets(rows: list[dict], mine: list[dict]) -> list[dict]:
    """Ours against every baseline, device and full-call time; 10x the doubling scan."""
    out = []
    for base in bl.BASELINES:
        if not any(r["method"] == base for r in rows):
            continue  # not in this run's grid at all (e.g. compiled baselines on the CPU)
        theirs = _ok(rows, method=base)
        for col, label in (("device_us", "device"), ("full_call_us", "full call")):
            pairs = [dict(o, _ratio=o[col] / b[col]) for o, b in _paired(mine, theirs)]
            name = f"faster than {base} ({label}), ours/baseline < 1"
            out.append(_target(name, pairs, 0.9999, lambda r: r["_ratio"]))
    if not any(r["method"] == "doubling-compiled" for r in rows):
        return out
    doubling = _ok(rows, method="doubling-compiled", T=1024, N=65536, dtype="float32")
    pairs = [dict(o, _ratio=b["device_us"] / o["device_us"]) for o, b in _paired(mine, doubling)]
    name = ">= 10x the compiled doubling scan at [1024, 65536]"
    out.append(_target(name, pairs, 10.0, lambda r: r["_ratio"], better="high"))
    return out


def evaluate_targets(rows: list[dict], meta: dict) -> list[dict]:
    """The issue's targets: PASS / MISS / N/A with the measured worst ratio and where. A
    report, not an assertion. On the CPU only the comparisons with the baselines apply."""
    cuda = str(meta.get("device", "")).startswith("cuda")
    mine = _ok(rows, method="ours-triton" if cuda else "ours-torch")
    return (gpu_targets(mine, meta) if cuda else []) + baseline_targets(rows, mine)


def print_targets(targets: list[dict]) -> None:
    print("\nTargets (issue 4): a report, not an assertion")
    for t in targets:
        print(f"  {t['status']:<4}  {t['target']}: {t['measured']}  [{t['where']}]")
    counts = {s: sum(t["status"] == s for t in targets) for s in ("PASS", "MISS", "N/A")}
    print("  " + ", ".join(f"{v} {k}" for k, v in counts.items()))


# -- reports --------------------------------------------------------------------------------------


def _f(x, spec=".1f", suffix="") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def _revision(meta: dict) -> str:
    """Which files ran: the commit whose files they are (``git_tree_commit``, and the checkout's
    HEAD where that differs: a copy of a working tree with older git metadata), else the
    uncommitted tree and HEAD."""
    head = f"{str(meta.get('git_commit'))[:10]}{' (dirty)' if meta.get('git_dirty') else ''}"
    tree, commit = (meta.get("git_tree") or "")[:10], (meta.get("git_tree_commit") or "")[:10]
    if not tree:
        return f"commit {head}"
    if not commit:
        return f"uncommitted files (tree {tree}; HEAD {head})"
    return f"commit {commit} (tree {tree}{'' if head.startswith(commit) else '; HEAD ' + head})"


_FLUSHED = {
    "write": "writing",
    "read": "reading (a lower bound: docs/benchmarks.md, the L2 flush)",
}


def markdown(rows: list[dict], meta: dict, targets: list[dict]) -> str:
    cuda = meta.get("device", "").startswith("cuda")
    ours = "ours-triton" if cuda else "ours-torch"
    flush = meta.get("flush", "write" if cuda else None)  # (runs before the option: write)
    lines = [f"# rl-triton benchmark: {meta.get('gpu') or meta.get('cpu')}", ""]
    lines.append(
        f"{meta.get('date')}, {_revision(meta)}; torch "
        f"{meta.get('torch')}, triton "
        f"{meta.get('triton')}"
        f"{' (ptxas ' + meta['triton_ptxas_release'] + ')' if meta.get('triton_ptxas_release') else ''}"
        f", torchrl {meta.get('torchrl')}, SB3 {meta.get('stable_baselines3')}, "
        f"Python {meta.get('python')}; grid `{meta.get('grid')}`, {meta.get('wall_s', 0):.0f} s."
    )
    lines.append(
        f"Copy bandwidth {meta['bandwidth_GBps']:.0f} GB/s (read + write). "
        + (
            f"L2 flushed by {_FLUSHED[flush]} a {meta.get('flush_bytes', 0) >> 20} MiB buffer "
            "before each timed repetition. "
            if flush
            else ""
        )
        + (
            f"Empty Triton kernel: launch {_f(meta.get('empty_launch_us'))} us, graph replay "
            f"{_f(meta.get('empty_graph_us'))} us (device), "
            f"{_f(meta.get('empty_graph_full_call_us'))} us (full call). "
            if "empty_graph_us" in meta
            else ""
        )
        + "Times in microseconds; % of floor = floor / device time. Methodology: docs/benchmarks.md."
    )
    if meta.get("interrupted") or meta.get("skipped_for_budget"):
        lines.append(
            f"\n**Incomplete run**: {meta.get('interrupted') or ''} "
            f"{meta.get('skipped_for_budget', 0)} configurations not started (time budget)."
        )
    lines += [
        "",
        "## Targets",
        "",
        "| status | target | measured | worst at |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {t['status']} | {t['target']} | {t['measured']} | {t['where']} |" for t in targets
    ]
    lines += ["", *headline(rows, ours), "", *speed_table(rows, ours), "", *full_table(rows)]
    lines += ["", *not_timed(rows)]
    return "\n".join(lines) + "\n"


def _speedups(rows: list[dict], r: dict, methods: list[str], col: str) -> list[str]:
    """Cells "baseline time / ours" for each of ``methods`` at ``r``'s configuration."""
    cells = []
    for m in methods:
        match = dict(estimator=r["estimator"], T=r["T"], N=r["N"], layout=r["layout"])
        hit = _ok(rows, method=m, dtype=r["dtype"], **match)
        cells.append(f"{hit[0][col] / r[col]:.1f}x" if hit else "—")
    return cells


def _others(rows: list[dict], ours: str) -> list[str]:
    names = (*bl.BASELINES, "ours-torch")
    return [b for b in names if b != ours and any(r["method"] == b for r in rows)]


def headline(rows: list[dict], ours: str) -> list[str]:
    """Per estimator at the large shapes (the "large" family, else the largest T*N): % of
    floor and device-time speedup over every baseline."""
    large = [r for r in rows if r["family"] == "large"]
    biggest = max((r["T"] * r["N"] for r in rows), default=0)
    shapes = {(r["T"], r["N"]) for r in large} or {
        (r["T"], r["N"]) for r in rows if r["T"] * r["N"] == biggest
    }
    others = _others(rows, ours)
    out = [
        f"## Headline: large shapes ({', '.join(f'[{t}, {n}]' for t, n in sorted(shapes))})",
        "",
        "Speedup = baseline device time / ours (— : the baseline does not apply, was skipped"
        " or failed; see below).",
        "",
        "| estimator | [T, N] | layout | dtype | ours device | floor | % of floor | ours full call"
        " | " + " | ".join(f"vs {b}" for b in others) + " |",
        "|---|---|---|---|---:|---:|---:|---:|" + "---:|" * len(others),
    ]
    for r in _ok(rows, method=ours):
        if (r["T"], r["N"]) in shapes:
            out.append(
                f"| {r['estimator']} | {r['shape']} | {r['layout']} | {r['dtype']} | "
                f"{r['device_us']:.1f} | {r['floor_us']:.1f} | {r['pct_of_floor']:.0f}% | "
                f"{r['full_call_us']:.1f} | "
                + " | ".join(_speedups(rows, r, others, "device_us"))
                + " |"
            )
    return out


def speed_table(rows: list[dict], ours: str) -> list[str]:
    """Every configuration of ours: what a training loop pays per call (full call), the host
    and graph times, and the full-call speedup over every baseline."""
    mine = _ok(rows, method=ours)
    if not mine:
        return []
    others = _others(rows, ours)
    out = [
        "## Every configuration: full-call time and speedups",
        "",
        "Speedup = baseline full-call time / ours. Small problems (T*N <= 128*4096, "
        f"T <= {SMALL_MAX_T}) are marked *.",
        "",
        "| estimator | [T, N] | layout | dtype | ours host | ours full call | ours graph | "
        "ours device | " + " | ".join(f"vs {b}" for b in others) + " |",
        "|---|---|---|---|---:|---:|---:|---:|" + "---:|" * len(others),
    ]
    for r in mine:
        out.append(
            f"| {r['estimator']} | {r['shape']}{' *' if is_small(r) else ''} | {r['layout']} | "
            f"{r['dtype']} | {_f(r.get('host_us'))} | {r['full_call_us']:.1f} | "
            f"{_f(r['graph_us'])} | {r['device_us']:.1f} | "
            + " | ".join(_speedups(rows, r, others, "full_call_us"))
            + " |"
        )
    return out


def full_table(rows: list[dict]) -> list[str]:
    out = [
        "## All timed rows",
        "",
        "Times in us. host: Python-side time of one call; prepare: building, compiling and the"
        " first call.",
        "",
        "| estimator | method | [T, N] | layout | dtype | device | full call | host | graph | floor"
        " | % of floor | max err | prepare s |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] == "ok":
            out.append(
                f"| {r['estimator']} | {r['method']} | {r['shape']} | {r['layout']} | {r['dtype']} | "
                f"{r['device_us']:.1f} | {r['full_call_us']:.1f} | {_f(r.get('host_us'))} | "
                f"{_f(r['graph_us'])} | {r['floor_us']:.1f} | "
                f"{r['pct_of_floor']:.0f}% | {r['max_err']:.1e} | {_f(r['prepare_s'], '.2f')} |"
            )
    return out


def not_timed(rows: list[dict]) -> list[str]:
    out = ["## Failed and skipped", ""]
    failed = [r for r in rows if r["status"] == "failed"]
    graph_issues = [r for r in rows if r["graph_status"] not in (None, "ok")]
    for r in failed:
        out.append(f"* FAILED {r['method']} {_where(r)}: {r['reason']}")
    for r in graph_issues:
        out.append(f"* graph of {r['method']} {_where(r)}: {r['graph_status']}")
    reasons: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["status"] == "skipped":
            key = (
                r["method"],
                r["reason"].split(" (")[0] if "budget" in r["reason"] else r["reason"],
            )
            reasons[key] = reasons.get(key, 0) + 1
    for (method, reason), n in sorted(reasons.items()):
        out.append(f"* skipped {method} in {n} configuration(s): {reason}")
    if len(out) == 2:
        out.append("None.")
    return out


def write_json(path: Path, meta: dict, rows: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)


def write_reports(out_dir: Path, prefix: str, meta: dict, rows: list[dict]) -> None:
    """JSON (with the targets), markdown, plots; a failing part is reported, never fatal."""
    json_path, md_path = out_dir / f"{prefix}_results.json", out_dir / f"{prefix}_results.md"
    targets: list[dict] = []
    for part in ("targets", "json", "markdown", "plots"):
        try:
            if part == "targets":
                targets = meta["targets"] = evaluate_targets(rows, meta)
            elif part == "json":
                write_json(json_path, meta, rows)
                print(f"wrote {json_path}")
            elif part == "markdown":
                md_path.write_text(markdown(rows, meta, targets))
                print(f"wrote {md_path}")
            else:
                import plots

                for path in plots.plot_all(rows, meta, out_dir, prefix):
                    print(f"wrote {path}")
        except Exception as e:
            print(f"{part} not written: {type(e).__name__}: {e}")
    print_targets(targets)


def synthetic_rows() -> list[dict]:
    """Rows with known outcomes for the self-check of the target evaluation and reports."""

    def row(est, method, T, N, layout, dtype, dev, full=20.0, graph=None, floor=100.0, nbytes=17):
        return {
            "estimator": est, "method": method, "kind": "ours" if method.startswith("ours") else "baseline",
            "T": T, "N": N, "shape": f"[{T}, {N}]", "layout": layout, "dtype": dtype, "family": "large",
            "status": "ok", "reason": None, "max_err": 1e-7, "tol": 1e-4, "device_us": dev,
            "full_call_us": full, "graph_us": graph, "graph_status": "ok" if graph else None,
            "bytes": nbytes, "floor_us": floor, "ratio_to_floor": dev / floor, "pct_of_floor": 100 * floor / dev,
            "reps": 5, "prepare_s": 0.1,
        }  # fmt: skip

    return [
        row("gae", "ours-triton", 1024, 65536, TM, "float32", 110.0),
        row("gae", "ours-triton", 1024, 65536, TM, "bfloat16", 60.0, nbytes=9),
        row("gae", "doubling-compiled", 1024, 65536, TM, "float32", 800.0),
        row("vtrace", "ours-triton", 1024, 65536, TM, "float32", 140.0),
        row("gae", "ours-triton", 128, 4096, TM, "float32", 5.0, full=12.0, graph=6.0, floor=2.0),
        row("gae", "cleanrl-eager", 128, 4096, TM, "float32", 900.0, full=1500.0),
        {
            **row("gae", "torchrl-loop", 128, 4096, BM, "float32", 1.0),
            "status": "skipped",
            "reason": "why",
        },
    ]
