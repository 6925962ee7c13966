"""The learning-curve parity tooling (examples/parity/, docs/parity.md): the analysis on
synthetic TensorBoard logs, and a tiny end-to-end run of run.py + analyze.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("matplotlib")

PARITY = Path(__file__).resolve().parents[1] / "examples" / "parity"


def _load(name: str):
    if str(PARITY) not in sys.path:
        sys.path.insert(0, str(PARITY))
    spec = importlib.util.spec_from_file_location(f"parity_{name}", PARITY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


analyze = _load("analyze")

TOTAL = 10_000


def _write_run(logdir: Path, seed: int, shift: float, shadow: float | None) -> None:
    """A fake run: returns rising from 20 to 200 with seed noise (+ ``shift``), per-update
    losses, credit-assignment time and SPS, and optionally the shadow check."""
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(seed)
    writer = SummaryWriter(str(logdir))
    for step in range(50, TOTAL + 1, 50):
        ret = 20 + 180 * step / TOTAL + rng.normal(0, 10) + shift
        writer.add_scalar("charts/episodic_return", ret, step)
    for update, step in enumerate(range(500, TOTAL + 1, 500)):
        writer.add_scalar("losses/value_loss", 10.0 / (update + 1), step)
        writer.add_scalar("charts/credit_assignment_time", 0.01, step)
        writer.add_scalar("charts/SPS", 1000, step)
        if shadow is not None:
            writer.add_scalar("charts/shadow_max_rel_diff", shadow, step)
    writer.close()


def _synthetic(tmp_path: Path, shift_b, shadow_b: float = 3e-7, seeds: int = 6) -> Path:
    results = tmp_path / "results"
    runs = []
    for side in "AB":
        for seed in range(1, seeds + 1):
            logdir = results / "ppo" / side / f"seed{seed}" / "runs" / "x"
            shift = 0.0 if side == "A" else shift_b(seed)
            _write_run(logdir, seed, shift, shadow_b if side == "B" else None)
            runs.append(dict(side=side, seed=seed, logdir=str(logdir), wall_s=12.0))
    index = {
        "ppo": dict(
            pair="ppo", total_timesteps=TOTAL, sides={"A": "reference", "B": "triton"}, runs=runs
        )
    }
    (results / "index.json").write_text(json.dumps(index))
    return results


def test_helpers():
    steps = np.array([10, 20, 350, 990])
    values = np.array([1.0, 3.0, 5.0, 7.0])
    curve = analyze.curve_on_grid(steps, values, 1000, 10)
    np.testing.assert_allclose(curve, [2, 2, 2, 5, 5, 5, 5, 5, 5, 7])
    assert analyze.final_return(steps, values, 1000) == 7.0
    assert analyze.final_return(steps, values, 10_000) == 7.0  # none in the tail: the last
    mean, lo, hi = analyze.bootstrap_ci(np.array([1.0, 2.0, 3.0, 4.0]))
    assert mean == 2.5 and 1.0 <= lo < 2.5 < hi <= 4.0
    assert np.isnan(analyze.bootstrap_ci(np.array([1.0]))[1])


def test_match_on_synthetic_runs(tmp_path):
    # B = A + small seed-dependent noise of both signs: the CIs must contain 0
    results = _synthetic(tmp_path, lambda seed: (-1) ** seed * 0.5)
    out = tmp_path / "out"
    (r,) = analyze.analyze(results, out)
    assert r["verdict"] == "match"
    assert r["auc"]["contains_0"] and r["final"]["contains_0"]
    assert r["final"]["seeds"] == [1, 2, 3, 4, 5, 6]
    assert r["final"]["ref_mean"] > 150 and r["final"]["half_width_pct"] < 10
    assert r["shadow_max"] == pytest.approx(3e-7) and r["shadow_ok"]
    assert r["timing"]["A"]["train_s"] == pytest.approx(10.0)  # last step / last SPS
    assert r["timing"]["A"]["credit_share_pct"] == pytest.approx(100 * 0.2 / 10.0)
    assert r["first_divergence_step"] is None
    for name in ("ppo.png", "ppo_first_updates.png", "parity.md", "summary.json"):
        assert (out / name).stat().st_size > 0
    table = (out / "parity.md").read_text()
    assert "| ppo | reference vs triton | 6 |" in table and "match" in table


def test_difference_and_shadow_failure_are_caught(tmp_path):
    # B consistently 30 higher: the CIs must exclude 0; a shadow diff of 1e-4 fails the check
    results = _synthetic(tmp_path, lambda seed: 30.0 + seed % 2, shadow_b=1e-4)
    (r,) = analyze.analyze(results, tmp_path / "out")
    assert not r["final"]["contains_0"] and not r["auc"]["contains_0"]
    lo, hi = r["final"]["ci"]
    assert 25 < lo <= hi < 35
    assert r["auc"]["mean_diff"] == pytest.approx(30.5, abs=1)
    assert r["shadow_ok"] is False
    assert r["verdict"] == "differ, shadow check FAILED"


def test_one_seed_is_too_few(tmp_path):
    results = _synthetic(tmp_path, lambda seed: 0.0, seeds=1)
    (r,) = analyze.analyze(results, tmp_path / "out")
    assert r["verdict"] == "too few seeds"


def test_end_to_end_tiny_ppo(tmp_path):
    """run.py: 1 seed per side, 2 PPO updates; analyze.py on its output."""
    run = _load("run")
    results = tmp_path / "results"
    run.main(
        [
            "--pair", "ppo", "--seeds", "1", "--total-timesteps", "256", "--workers", "2",
            "--results", str(results), "--set", "num_steps=32", "--no-cuda",
            "--backend-b", "torch",
        ]
    )  # fmt: skip
    index = json.loads((results / "index.json").read_text())
    runs = index["ppo"]["runs"]
    assert [(r["side"], r["backend"], r["shadow_check"]) for r in runs] == [
        ("A", "reference", False),
        ("B", "torch", True),
    ]
    for r in runs:
        assert Path(r["logdir"]).is_dir() and r["wall_s"] > 0
    out = tmp_path / "out"
    (r,) = analyze.analyze(results, out)
    assert r["shadow_max"] < analyze.SHADOW_LIMIT
    assert r["final"]["mean_diff"] == 0.0  # same seed, CPU: identical to rounding
    assert r["first_divergence_step"] is None  # both updates agree
    assert (out / "ppo.png").exists() and (out / "parity.md").exists()

    # a second study adds seed 2 on side B only, with the credit assignment on another device:
    # the index keeps the first study's runs and labels side B by where it ran
    run.main(
        [
            "--pair", "ppo", "--seeds", "1", "--first-seed", "2", "--sides", "B",
            "--total-timesteps", "256", "--workers", "1", "--results", str(results),
            "--set", "num_steps=32", "--no-cuda", "--backend-b", "torch",
            "--advantage-device", "cpu",
        ]
    )  # fmt: skip
    entry = json.loads((results / "index.json").read_text())["ppo"]
    assert [(r["side"], r["seed"]) for r in entry["runs"]] == [("A", 1), ("B", 1), ("B", 2)]
    assert entry["sides"] == {"A": "reference", "B": "torch on cpu"}
    assert entry["runs"][2]["advantage_device"] == "cpu"


def test_end_to_end_tiny_sb3(tmp_path):
    """The SB3 pair: its own RolloutBuffer vs TritonRolloutBuffer, 2 rollouts, shadow check."""
    run = _load("run")
    results = tmp_path / "results"
    run.main(
        [
            "--pair", "sb3", "--seeds", "1", "--total-timesteps", "512", "--workers", "2",
            "--results", str(results), "--set", "n_steps=32", "--no-cuda",
        ]
    )  # fmt: skip
    (r,) = analyze.analyze(results, tmp_path / "out")
    assert r["sides"] == {"A": "sb3", "B": "rl_triton"}
    assert r["shadow_max"] < analyze.SHADOW_LIMIT
    assert r["timing"]["B"]["credit_s"] > 0


def test_shadow_metric_conditioning():
    """On converged CartPole-like rollouts every float32 GAE, CleanRL's own loop included,
    is off by ~1e-2 of the advantages' own scale (per output) but well under the shadow
    check's 1e-5 normwise: the reason the check scales by the largest output."""
    conditioning = _load("shadow_conditioning")
    worst = conditioning.errors(1e-3, ["torch"], rollouts=4)
    for name in ("CleanRL loop", "torch"):
        assert worst[("per output", name)] > 1e-3
        assert worst[("normwise", name)] < 1e-6
    assert worst[("per output", "torch")] == pytest.approx(
        worst[("per output", "CleanRL loop")], rel=0.5
    )
