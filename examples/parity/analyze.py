"""Learning-curve parity study, step 2: the verdict per pair from the logged runs (issue 8).

Reads ``{results}/index.json`` (written by ``run.py``) and every run's TensorBoard events, and
writes into ``--out`` (default ``docs/parity``): ``{pair}.png`` (episodic return vs environment
steps, mean and 95% bootstrap band across seeds, both sides overlaid), ``{pair}_first_updates.png``
(one seed, both runs over the first updates), ``parity.md`` (the table) and ``summary.json``.

    python examples/parity/analyze.py --results runs/parity --out docs/parity

Per pair, seeds pair up (same seed on both sides): ``d_i = B_i - A_i`` for the area under the
curve (mean return over the common step grid) and the final return (mean episodic return of
the episodes that end in the last 10% of the steps), the mean of ``d`` with a 95% bootstrap CI
over seeds; "match" when both CIs contain 0. The shadow check must stay below 1e-5.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

RETURN = "charts/episodic_return"
SHADOW = "charts/shadow_max_rel_diff"
CREDIT = "charts/credit_assignment_time"
SPS = "charts/SPS"
SHADOW_LIMIT = 1e-5
FIRST_UPDATES_TAGS = ("losses/value_loss", "losses/policy_loss", "losses/entropy", RETURN)


def load_scalars(logdir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Every scalar tag of a run: ``{tag: (steps, values)}`` (all events, no down-sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        out[tag] = (
            np.array([e.step for e in events], dtype=np.int64),
            np.array([e.value for e in events], dtype=np.float64),
        )
    return out


def curve_on_grid(steps: np.ndarray, values: np.ndarray, total: int, bins: int) -> np.ndarray:
    """Episodic returns on a common grid of ``bins`` equal step intervals over ``[0, total]``:
    the mean return of the episodes that end in each interval; empty intervals repeat the last
    value (before the first episode: the first episode's return)."""
    edges = np.linspace(0, total, bins + 1)
    which = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, bins - 1)
    sums = np.bincount(which, weights=values, minlength=bins)
    counts = np.bincount(which, minlength=bins)
    curve = np.full(bins, np.nan)
    curve[counts > 0] = sums[counts > 0] / counts[counts > 0]
    if not np.isfinite(curve).any():
        return curve
    last = curve[np.flatnonzero(np.isfinite(curve))[0]]
    for i in range(bins):
        if np.isfinite(curve[i]):
            last = curve[i]
        else:
            curve[i] = last
    return curve


def final_return(steps: np.ndarray, values: np.ndarray, total: int, tail: float = 0.1) -> float:
    """Mean return of the episodes that end in the last ``tail`` of the steps (else the last)."""
    late = steps >= (1 - tail) * total
    if late.any():
        return float(values[late].mean())
    return float(values[-1]) if len(values) else float("nan")


def bootstrap_ci(x: np.ndarray, n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``x`` and the 95% percentile-bootstrap CI of the mean (resampling entries)."""
    x = np.asarray(x, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), (n, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(x.mean()), float(lo), float(hi)


def bootstrap_band(curves: np.ndarray, n: int = 2_000, seed: int = 0):
    """Mean curve over seeds (rows) and its 95% bootstrap band, point by point."""
    rng = np.random.default_rng(seed)
    mean = curves.mean(axis=0)
    if len(curves) < 2:
        return mean, mean, mean
    means = curves[rng.integers(0, len(curves), (n, len(curves)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5], axis=0)
    return mean, lo, hi


def _paired(a: dict[int, float], b: dict[int, float]) -> dict:
    seeds = sorted(set(a) & set(b))
    d = np.array([b[s] - a[s] for s in seeds])
    ref = np.array([a[s] for s in seeds])
    ours = np.array([b[s] for s in seeds])
    mean, lo, hi = bootstrap_ci(d)
    ref_mean = float(ref.mean()) if len(ref) else float("nan")
    scale = abs(ref_mean) if ref_mean else float("nan")
    return {
        "seeds": seeds,
        "diffs": d.tolist(),
        "mean_diff": mean,
        "ci": [lo, hi],
        "contains_0": bool(lo <= 0 <= hi) if np.isfinite(lo) else None,
        "half_width_pct": 100 * (hi - lo) / 2 / scale,
        "ref_mean": ref_mean,
        "ours_mean": float(ours.mean()) if len(ours) else float("nan"),
        "ref_spread_pct": 100 * float(ref.std(ddof=1)) / scale if len(ref) > 1 else float("nan"),
        "ours_spread_pct": 100 * float(ours.std(ddof=1)) / scale if len(ours) > 1 else float("nan"),
    }


def analyze_pair(entry: dict, out: Path, bins: int = 100, first_updates: int = 20) -> dict:
    """The verdict of one pair (an ``index.json`` entry); writes its two PNGs into ``out``."""
    total = int(entry["total_timesteps"])
    runs = {"A": {}, "B": {}}
    for record in entry["runs"]:
        runs[record["side"]][record["seed"]] = (record, load_scalars(record["logdir"]))
    result = {"pair": entry["pair"], "sides": entry["sides"], "total_timesteps": total}
    auc, final, curves = {"A": {}, "B": {}}, {"A": {}, "B": {}}, {"A": [], "B": []}
    shadow, timing = {"A": [], "B": []}, {}
    for side, by_seed in runs.items():
        walls, trains, credits = [], [], []
        for seed, (record, scalars) in sorted(by_seed.items()):
            steps, values = scalars.get(RETURN, (np.zeros(0, np.int64), np.zeros(0)))
            curve = curve_on_grid(steps, values, total, bins)
            curves[side].append(curve)
            auc[side][seed] = float(np.nanmean(curve)) if np.isfinite(curve).any() else np.nan
            final[side][seed] = final_return(steps, values, total)
            if SHADOW in scalars:
                shadow[side].append(float(np.max(scalars[SHADOW][1])))
            walls.append(record["wall_s"])
            if SPS in scalars and scalars[SPS][1][-1] > 0:  # training time without the shadow
                trains.append(scalars[SPS][0][-1] / scalars[SPS][1][-1])
            else:
                trains.append(record["wall_s"])
            credits.append(float(scalars[CREDIT][1].sum()) if CREDIT in scalars else np.nan)
        trains, credits = np.array(trains), np.array(credits)
        timing[side] = {
            "wall_s": float(np.mean(walls)),
            "train_s": float(trains.mean()),
            "credit_s": float(np.mean(credits)),
            "credit_share_pct": float(100 * np.mean(credits / trains)),
        }
    result["auc"] = _paired(auc["A"], auc["B"])
    result["final"] = _paired(final["A"], final["B"])
    shadows = shadow["B"] + shadow["A"]
    result["shadow_max"] = max(shadows) if shadows else None
    result["shadow_ok"] = None if not shadows else bool(result["shadow_max"] < SHADOW_LIMIT)
    result["timing"] = timing
    verdicts = (result["auc"]["contains_0"], result["final"]["contains_0"])
    if None in verdicts:
        result["verdict"] = "too few seeds"
    else:
        result["verdict"] = "match" if all(verdicts) else "differ"
    if result["shadow_ok"] is False:
        result["verdict"] += ", shadow check FAILED"
    grid = np.linspace(0, total, bins + 1)[1:]
    _plot_curves(entry, grid, curves, out / f"{entry['pair']}.png")
    seeds = sorted(set(runs["A"]) & set(runs["B"]))
    if seeds:
        s = seeds[0]
        _plot_first_updates(
            entry, s, runs["A"][s][1], runs["B"][s][1], first_updates,
            out / f"{entry['pair']}_first_updates.png",
        )  # fmt: skip
        result["first_updates_seed"] = s
        result["first_divergence_step"] = first_divergence(runs["A"][s][1], runs["B"][s][1])
        result["value_loss_logged"] = "losses/value_loss" in runs["A"][s][1]
    return result


def first_divergence(a: dict, b: dict, tag: str = "losses/value_loss", rtol: float = 1e-6):
    """The first logged step where the two runs' ``tag`` differ by more than ``rtol`` (relative),
    or None where they agree at every common step (or the tag is missing)."""
    if tag not in a or tag not in b:
        return None
    n = min(len(a[tag][0]), len(b[tag][0]))
    va, vb = a[tag][1][:n], b[tag][1][:n]
    off = np.abs(va - vb) > rtol * np.maximum(np.abs(va), 1e-12)
    return int(a[tag][0][np.argmax(off)]) if off.any() else None


def _label(entry: dict, side: str) -> str:
    return f"{side}: {entry['sides'][side]}"


def _plot_curves(entry: dict, grid: np.ndarray, curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for side, color in (("A", "tab:blue"), ("B", "tab:orange")):
        if not curves[side]:
            continue
        mean, lo, hi = bootstrap_band(np.array(curves[side]))
        n = len(curves[side])
        ax.plot(grid, mean, color=color, label=f"{_label(entry, side)} ({n} seeds)")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.25, linewidth=0)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episodic return")
    ax.set_title(f"{entry['pair']}: mean and 95% bootstrap band across seeds")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_first_updates(entry, seed, a: dict, b: dict, updates: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tags = [t for t in FIRST_UPDATES_TAGS if t in a and t in b]
    if not tags:
        return
    width = max(3.6 * len(tags), 6.0)
    fig, axes = plt.subplots(1, len(tags), figsize=(width, 3.4), squeeze=False)
    # the first `updates` updates: every pair logs the credit-assignment time once per update
    ref_steps = a.get(CREDIT, a.get("losses/value_loss", a[tags[0]]))[0]
    limit = ref_steps[min(updates, len(ref_steps)) - 1] if len(ref_steps) else 0
    for ax, tag in zip(axes[0], tags, strict=False):
        for side, run, style in (("A", a, "-o"), ("B", b, "--x")):
            steps, values = run[tag]
            order = np.argsort(steps, kind="stable")  # episodes of several envs: by step
            steps, values = steps[order], values[order]
            keep = steps <= limit
            ax.plot(steps[keep], values[keep], style, ms=3, label=_label(entry, side))
        ax.set_title(tag, fontsize=9)
        ax.set_xlabel("environment steps", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{entry['pair']}, seed {seed}: both runs over the first {updates} updates")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def markdown(results: list[dict]) -> str:
    lines = [
        "| pair | A vs B | seeds | final return A / B | Δ final [95% CI] | Δ AUC [95% CI] "
        "| CI half-width (final, AUC) % of A | across-seed spread A / B % | max shadow diff "
        "| train s A / B | credit share A / B | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        f, a, t = r["final"], r["auc"], r["timing"]
        shadow = "-" if r["shadow_max"] is None else f"{r['shadow_max']:.1e}"
        lines.append(
            f"| {r['pair']} | {r['sides']['A']} vs {r['sides']['B']} | {len(f['seeds'])} "
            f"| {_fmt(f['ref_mean'])} / {_fmt(f['ours_mean'])} "
            f"| {_fmt(f['mean_diff'])} [{_fmt(f['ci'][0])}, {_fmt(f['ci'][1])}] "
            f"| {_fmt(a['mean_diff'])} [{_fmt(a['ci'][0])}, {_fmt(a['ci'][1])}] "
            f"| {_fmt(f['half_width_pct'])}, {_fmt(a['half_width_pct'])} "
            f"| {_fmt(f['ref_spread_pct'])} / {_fmt(f['ours_spread_pct'])} | {shadow} "
            f"| {_fmt(t['A']['train_s'], 0)} / {_fmt(t['B']['train_s'], 0)} "
            f"| {_fmt(t['A']['credit_share_pct'], 2)}% / {_fmt(t['B']['credit_share_pct'], 2)}% "
            f"| {r['verdict']} |"
        )
    lines += [
        "",
        "Δ = B - A per seed (same seed on both sides), mean over seeds with its 95% bootstrap "
        "CI; final return: episodes ending in the last 10% of the steps; AUC: mean return over "
        'the step grid. "match" when both CIs contain 0. Shadow diff: max over every update '
        f"of every run of max|ours - reference| / max|reference| (must be < {SHADOW_LIMIT:g}). "
        "train s: mean seconds per run without the shadow check; credit share: time in the "
        "credit-assignment call / train s.",
    ]
    for r in results:
        if r.get("value_loss_logged"):
            step = r.get("first_divergence_step")
            where = "at no logged update" if step is None else f"first at step {step}"
            lines.append(
                f"\n{r['pair']}, seed {r['first_updates_seed']}: the value losses of A and B differ "
                f"(relative > 1e-6) {where}."
            )
    for r in results:
        lines += ["", f"![{r['pair']}]({r['pair']}.png)"]
        if "first_updates_seed" in r:
            lines.append(f"![{r['pair']}: first updates]({r['pair']}_first_updates.png)")
    return "\n".join(lines) + "\n"


def analyze(results: str | Path, out: str | Path, pairs=None, bins: int = 100) -> list[dict]:
    index = json.loads((Path(results) / "index.json").read_text())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = [analyze_pair(index[p], out, bins) for p in index if not pairs or p in pairs]
    (out / "parity.md").write_text(markdown(summary))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="runs/parity")
    parser.add_argument("--out", default="docs/parity")
    parser.add_argument("--pairs", nargs="*", help="only these pairs (default: all in the index)")
    parser.add_argument("--bins", type=int, default=100, help="points of the common step grid")
    args = parser.parse_args(argv)
    summary = analyze(args.results, args.out, args.pairs, args.bins)
    print(markdown(summary))


if __name__ == "__main__":
    main()
