"""Plots of a harness results file (matplotlib, Agg backend; nothing is shown).

* ``<prefix>_gae_time.png``: GAE device time against shape, one line per method, one panel
  per shape family, time-major float32; the bandwidth floor dashed.
* ``<prefix>_pct_of_floor.png``: ours as % of the bandwidth floor per estimator, one bar per
  shape and layout that several estimators ran (float32), with the issue's 1.15x / 1.3x
  target levels.

    python benchmarks/plots.py benchmarks/results/cuda_results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FAMILIES = ("large", "parallel", "long", "cpu")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(meta: dict) -> str:
    where = meta.get("gpu") or meta.get("cpu") or meta.get("device")
    return f"{where}; torch {meta.get('torch')}, {meta.get('date', '')[:10]}"


def _ours(meta: dict) -> str:
    return "ours-triton" if str(meta.get("device", "")).startswith("cuda") else "ours-torch"


def gae_time(rows: list[dict], meta: dict, path: Path) -> Path | None:
    plt = _plt()
    ok = [
        r
        for r in rows
        if r["estimator"] == "gae"
        and r["status"] == "ok"
        and r["layout"] == "time-major"
        and r["dtype"] == "float32"
    ]
    families = [f for f in FAMILIES if any(r["family"] == f for r in ok)]
    if not families:
        return None
    fig, axes = plt.subplots(1, len(families), figsize=(5.5 * len(families), 4.5), squeeze=False)
    methods = sorted({r["method"] for r in ok}, key=lambda m: (not m.startswith("ours"), m))
    for ax, family in zip(axes[0], families, strict=True):
        fam = [r for r in ok if r["family"] == family]
        shapes = sorted({(r["T"], r["N"]) for r in fam}, key=lambda s: (s[0] * s[1], s[0]))
        x = {s: i for i, s in enumerate(shapes)}
        for m in methods:
            pts = sorted((x[(r["T"], r["N"])], r["device_us"]) for r in fam if r["method"] == m)
            if pts:
                style = "o-" if m.startswith("ours") else ".--"
                ax.plot(*zip(*pts, strict=True), style, label=m, lw=2 if m == _ours(meta) else 1)
        floor = {(r["T"], r["N"]): r["floor_us"] for r in fam}
        ax.plot([x[s] for s in shapes], [floor[s] for s in shapes], "k:", label="bandwidth floor")
        ax.set_xticks(
            range(len(shapes)), [f"[{t}, {n}]" for t, n in shapes], rotation=45, ha="right"
        )
        ax.set_yscale("log")
        ax.set_ylabel("device time (us), log")
        ax.set_title(f"GAE, {family} (time-major, fp32)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = {}, {}
    for ax in axes[0]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    labels = list(handles)
    fig.legend([handles[k] for k in labels], labels, loc="lower center", ncol=min(len(labels), 6))
    fig.suptitle(_title(meta), fontsize=9)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pct_of_floor(rows: list[dict], meta: dict, path: Path) -> Path | None:
    plt = _plt()
    ours = [
        r
        for r in rows
        if r["method"] == _ours(meta) and r["status"] == "ok" and r["dtype"] == "float32"
    ]
    if not ours:
        return None
    estimators = list(dict.fromkeys(r["estimator"] for r in ours))
    counts: dict[tuple, int] = {}
    for r in ours:
        key = (r["T"], r["N"], r["layout"])
        counts[key] = counts.get(key, 0) + 1
    shared = [g for g, n in counts.items() if n > 1] or list(counts)  # shapes most estimators ran
    groups = sorted(shared, key=lambda g: (-g[0] * g[1], g[0], g[2]))[:8]
    width = 0.8 / len(groups)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(estimators) + 3), 4.5))
    for j, (T, N, layout) in enumerate(groups):
        values = []
        for est in estimators:
            hit = [
                r["pct_of_floor"]
                for r in ours
                if (r["estimator"], r["T"], r["N"], r["layout"]) == (est, T, N, layout)
            ]
            values.append(hit[0] if hit else 0.0)
        xs = [i + (j - (len(groups) - 1) / 2) * width for i in range(len(estimators))]
        hatch = "//" if layout == "batch-major" else None
        ax.bar(xs, values, width, label=f"[{T}, {N}] {layout}", hatch=hatch)
    ax.axhline(100, color="k", lw=1)
    ax.axhline(100 / 1.15, color="g", ls="--", lw=1, label="1.15x floor target")
    ax.axhline(100 / 1.3, color="orange", ls="--", lw=1, label="1.3x (V-trace, Retrace)")
    ax.set_xticks(range(len(estimators)), estimators, rotation=20)
    ax.set_ylabel("% of bandwidth floor (floor / device time)")
    ax.set_title(f"{_ours(meta)}: % of the bandwidth floor (float32)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(_title(meta), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(rows: list[dict], meta: dict, out_dir: Path, prefix: str) -> list[Path]:
    paths = [
        gae_time(rows, meta, out_dir / f"{prefix}_gae_time.png"),
        pct_of_floor(rows, meta, out_dir / f"{prefix}_pct_of_floor.png"),
    ]
    return [p for p in paths if p is not None]


if __name__ == "__main__":
    src = Path(sys.argv[1])
    data = json.loads(src.read_text())
    prefix = src.name.removesuffix("_results.json")
    for p in plot_all(data["rows"], data["meta"], src.parent, prefix):
        print(f"wrote {p}")
