"""Learning-curve parity study, step 1: run one pair, S seeds per side (issue 8, docs/parity.md).

Side A is the reference (CleanRL scripts with ``--advantage-backend reference``; SB3's own
``RolloutBuffer``), side B is ours (``--backend-b``, default ``triton`` with CUDA, else ``auto``;
SB3 with ``TritonRolloutBuffer``). Both sides use the same seeds, so runs pair up seed by seed.
Side B runs with the shadow check (every update also computes the targets with the reference
and logs ``charts/shadow_max_rel_diff``). Every run is a subprocess of its own, ``--workers`` at
a time, writing TensorBoard events under ``{results}/{pair}/{side}/seed{S}/runs/...``;
``{results}/index.json`` lists the runs (log dir, wall-clock) for ``analyze.py``.

    python examples/parity/run.py --pair ppo --seeds 10 --total-timesteps 500000 --workers 16
    python examples/parity/run.py --pair sb3 --seeds 10 --workers 16
    python examples/parity/analyze.py --results runs/parity --out docs/parity

Pairs: ``ppo`` (CleanRL PPO, CartPole-v1), ``ppo_continuous`` (CleanRL continuous PPO, its
default HalfCheetah-v5; ``--env-id Pendulum-v1`` without MuJoCo), ``impala`` (V-trace,
CartPole-v1), ``sb3`` (SB3 PPO, CartPole-v1), ``torchrl`` (examples/torchrl_ppo.py with
rl_triton_torchrl off vs on, CartPole-v1).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLEANRL = {
    "ppo": ROOT / "examples" / "cleanrl" / "ppo.py",
    "ppo_continuous": ROOT / "examples" / "cleanrl" / "ppo_continuous_action.py",
    "impala": ROOT / "examples" / "cleanrl" / "impala.py",
}
PAIRS = (*CLEANRL, "sb3", "torchrl")
DEFAULT_STEPS = {
    "ppo": 500_000,
    "ppo_continuous": 1_000_000,
    "impala": 500_000,
    "sb3": 500_000,
    "torchrl": 500_000,
}
SIDES = {"sb3": ("sb3", "rl_triton"), "torchrl": ("torchrl", "rl_triton")}


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"parity_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses with string annotations look it up
    spec.loader.exec_module(module)
    return module


def _value(text: str):
    """``--set`` values: JSON where it parses (numbers, true/false, null), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# ---------------------------------------------------------------------------------------------
# one run (inside its own subprocess)


def _run_cleanrl(job: dict) -> str:
    module = _load(CLEANRL[job["pair"]])
    kwargs = dict(
        seed=job["seed"],
        total_timesteps=job["total_timesteps"],
        advantage_backend=job["backend"],
        shadow_check=job["shadow_check"],
        cuda=job["cuda"],
        exp_name=f"{job['pair']}_{job['side']}",
    )
    if job.get("env_id"):
        kwargs["env_id"] = job["env_id"]
    if job.get("advantage_device"):
        kwargs["advantage_device"] = job["advantage_device"]
    kwargs.update(job.get("overrides", {}))
    return module.main(module.Args(**kwargs))


def _run_sb3(job: dict) -> str:
    """SB3 PPO on CartPole-v1, episodic returns per env step in TensorBoard (CleanRL's names)."""
    import copy

    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.buffers import RolloutBuffer
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from torch.utils.tensorboard import SummaryWriter

    from rl_triton_cleanrl import max_rel_diff
    from rl_triton_sb3 import TritonRolloutBuffer

    ours = job["side"] == "B"
    opts = dict(n_envs=8, n_steps=256, batch_size=256)
    opts.update(job.get("overrides", {}))
    env_id = job.get("env_id") or "CartPole-v1"
    device = "cuda" if job["cuda"] and torch.cuda.is_available() else "cpu"
    logdir = f"runs/{env_id}__sb3_{job['side']}__{job['seed']}__{int(time.time())}"
    writer = SummaryWriter(logdir)
    env = make_vec_env(env_id, n_envs=opts.pop("n_envs"), seed=job["seed"])
    buffer = dict(rollout_buffer_class=RolloutBuffer)
    if ours:
        buffer = dict(
            rollout_buffer_class=TritonRolloutBuffer,
            rollout_buffer_kwargs=dict(advantage_device="auto"),
        )
    model = PPO("MlpPolicy", env, seed=job["seed"], device=device, **opts, **buffer)
    rollout_buffer = model.rollout_buffer
    compute = rollout_buffer.compute_returns_and_advantage
    state = {"shadow_s": 0.0, "start": time.perf_counter()}

    def timed_compute(last_values, dones):
        start = time.perf_counter()
        compute(last_values, dones)
        seconds = time.perf_counter() - start
        step = model.num_timesteps
        writer.add_scalar("charts/credit_assignment_time", seconds, step)
        if ours and job["shadow_check"]:  # SB3's own loop on a copy of the buffer
            start = time.perf_counter()
            twin = copy.copy(rollout_buffer)
            twin.advantages = np.zeros_like(rollout_buffer.advantages)
            RolloutBuffer.compute_returns_and_advantage(twin, last_values, dones)
            outputs = lambda b: (torch.from_numpy(b.advantages), torch.from_numpy(b.returns))
            diff = max_rel_diff(outputs(rollout_buffer), outputs(twin))
            writer.add_scalar("charts/shadow_max_rel_diff", diff, step)
            state["shadow_s"] += time.perf_counter() - start
        elapsed = time.perf_counter() - state["start"] - state["shadow_s"]
        writer.add_scalar("charts/SPS", int(step / max(elapsed, 1e-9)), step)

    rollout_buffer.compute_returns_and_advantage = timed_compute

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    r, n = info["episode"]["r"], info["episode"]["l"]
                    writer.add_scalar("charts/episodic_return", r, self.num_timesteps)
                    writer.add_scalar("charts/episodic_length", n, self.num_timesteps)
            return True

    model.learn(total_timesteps=job["total_timesteps"], callback=Episodes())
    writer.close()
    return logdir


def _run_torchrl(job: dict) -> str:
    """examples/torchrl_ppo.py with rl_triton_torchrl off (A) or on (B). Its ``GAE`` class is
    replaced by a subclass that logs what the script does not: each finished episode's return at
    its environment step, the time of the call and (B) the shadow check against TorchRL's own
    GAE on a copy of the batch."""
    import torch
    from torch.utils.tensorboard import SummaryWriter

    import rl_triton_torchrl
    from rl_triton_cleanrl import max_rel_diff

    module = _load(ROOT / "examples" / "torchrl_ppo.py")
    ours = job["side"] == "B"
    fields = dict(seed=job["seed"], rl_triton=ours, threads=job.get("threads", 1))
    if job["cuda"] and torch.cuda.is_available():
        fields["device"] = "cuda"
    if job.get("env_id"):
        fields["env_id"] = job["env_id"]
    fields.update(job.get("overrides", {}))
    args = module.Args(**fields)
    frames = args.num_envs * args.steps_per_env
    args.iterations = max(1, job["total_timesteps"] // frames)
    logdir = f"runs/{args.env_id}__torchrl_{job['side']}__{job['seed']}__{int(time.time())}"
    writer = SummaryWriter(logdir)
    state = {"calls": 0, "shadow_s": 0.0, "start": time.perf_counter()}

    class LoggedGAE(module.GAE):
        def forward(self, tensordict, *a, **kw):
            before = state["calls"] * frames
            state["calls"] += 1
            step = before + frames
            done = tensordict["next", "done"].reshape(args.num_envs, -1)
            reward = tensordict["next", "episode_reward"].reshape(args.num_envs, -1)
            for i, t in done.nonzero().tolist():
                writer.add_scalar(
                    "charts/episodic_return", reward[i, t].item(), before + (t + 1) * args.num_envs
                )
            twin = tensordict.clone() if ours and job["shadow_check"] else None
            start = time.perf_counter()
            out = super().forward(tensordict, *a, **kw)
            if tensordict.device is not None and tensordict.device.type == "cuda":
                torch.cuda.synchronize()
            writer.add_scalar("charts/credit_assignment_time", time.perf_counter() - start, step)
            if twin is not None:
                start = time.perf_counter()
                with torch.no_grad():
                    rl_triton_torchrl.disable()
                    try:
                        super().forward(twin, *a, **kw)
                    finally:
                        rl_triton_torchrl.enable()
                keys = ("advantage", "value_target")
                diff = max_rel_diff([tensordict[k] for k in keys], [twin[k] for k in keys])
                writer.add_scalar("charts/shadow_max_rel_diff", diff, step)
                state["shadow_s"] += time.perf_counter() - start
            elapsed = time.perf_counter() - state["start"] - state["shadow_s"]
            writer.add_scalar("charts/SPS", int(step / max(elapsed, 1e-9)), step)
            return out

    module.GAE = LoggedGAE
    module.main(args)
    writer.close()
    return logdir


def run_job(job: dict) -> dict:
    """Runs one job in this process (cwd: its own folder); returns its record for the index."""
    import torch

    torch.set_num_threads(job.get("threads", 1))
    start = time.perf_counter()
    runner = {"sb3": _run_sb3, "torchrl": _run_torchrl}.get(job["pair"], _run_cleanrl)
    logdir = runner(job)
    return {**job, "logdir": str(Path(logdir).resolve()), "wall_s": time.perf_counter() - start}


# ---------------------------------------------------------------------------------------------
# the study (parent process)


def jobs_for(args: argparse.Namespace) -> list[dict]:
    results = Path(args.results).resolve()
    overrides = dict(kv.split("=", 1) for kv in args.set)
    overrides = {k.replace("-", "_"): _value(v) for k, v in overrides.items()}
    a, b = SIDES.get(args.pair, ("reference", args.backend_b))
    sides = {side: backend for side, backend in (("A", a), ("B", b)) if side in args.sides}
    jobs = []
    for i in range(args.seeds):
        for side, backend in sides.items():
            seed = args.first_seed + i
            jobs.append(
                dict(
                    pair=args.pair,
                    side=side,
                    backend=backend,
                    seed=seed,
                    total_timesteps=args.total_timesteps or DEFAULT_STEPS[args.pair],
                    shadow_check=side == "B" or args.shadow_both,
                    cuda=args.cuda,
                    advantage_device=args.advantage_device if side == "B" else None,
                    env_id=args.env_id,
                    overrides=overrides,
                    threads=args.threads,
                    dir=str(results / args.pair / side / f"seed{seed}"),
                )
            )
    return jobs


def _spawn(job: dict) -> dict:
    os.makedirs(job["dir"], exist_ok=True)
    log = Path(job["dir"]) / "stdout.txt"
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(job)],
            cwd=job["dir"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            },
        )
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"run {job['pair']}/{job['side']}/seed{job['seed']} failed:\n{tail}")
    return json.loads((Path(job["dir"]) / "record.json").read_text())


def _side_label(job: dict) -> str:
    where = job.get("advantage_device")
    return f"{job['backend']} on {where}" if where else job["backend"]


def run_pair(args: argparse.Namespace) -> dict:
    """Runs every job of the pair (``--workers`` at a time), updates ``{results}/index.json``."""
    jobs = jobs_for(args)
    start = time.perf_counter()
    records = []
    with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
        futures = {pool.submit(_spawn, job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            records.append(record)
            print(
                f"[{time.perf_counter() - start:7.1f} s] {record['pair']} side {record['side']} "
                f"({record['backend']}) seed {record['seed']}: {record['wall_s']:.1f} s",
                flush=True,
            )
    records.sort(key=lambda r: (r["side"], r["seed"]))
    index_path = Path(args.results) / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    entry = {
        "pair": args.pair,
        "total_timesteps": jobs[0]["total_timesteps"],
        "sides": {job["side"]: _side_label(job) for job in jobs},
        "study_wall_s": time.perf_counter() - start,
        "runs": records,
    }
    before = index.get(args.pair)
    if before and before["total_timesteps"] == entry["total_timesteps"]:  # add / redo runs
        runs = {(r["side"], r["seed"]): r for r in before["runs"] + records}
        entry["runs"] = [runs[key] for key in sorted(runs)]
        entry["sides"] = before["sides"] | entry["sides"]
        entry["study_wall_s"] += before["study_wall_s"]
    index[args.pair] = entry
    index_path.write_text(json.dumps(index, indent=1))
    return index[args.pair]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    import torch

    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=PAIRS, default="ppo")
    parser.add_argument("--seeds", type=int, default=10, help="seeds per side")
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument(
        "--sides", choices=("AB", "A", "B"), default="AB",
        help="run both sides or one; the index keeps earlier runs of the pair (same steps) and "
        "replaces those run again, so seeds can be added or a side re-run",
    )  # fmt: skip
    parser.add_argument("--total-timesteps", type=int, default=0, help="0: the pair's default")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--results", default="runs/parity", help="results folder")
    parser.add_argument("--backend-b", default="triton" if cuda else "auto")
    parser.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=cuda)
    parser.add_argument(
        "--advantage-device", default=None,
        help="CleanRL pairs, side B: where the credit assignment runs (e.g. cuda with --no-cuda: "
        "Triton on the GPU, networks on the CPU); default: the networks' device",
    )  # fmt: skip
    parser.add_argument("--env-id", default=None, help="override the pair's task")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--shadow-both", action="store_true", help="shadow check on side A too")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="extra script option for both sides, e.g. --set num_steps=32 (repeatable)",
    )  # fmt: skip
    parser.add_argument("--job", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.advantage_device and args.pair not in CLEANRL:
        raise SystemExit(f"--advantage-device applies to the CleanRL pairs, not {args.pair!r}")
    if args.job:  # one run, inside its subprocess
        job = json.loads(args.job)
        record = run_job(job)
        (Path(job["dir"]) / "record.json").write_text(json.dumps(record, indent=1))
        return
    entry = run_pair(args)
    print(f"{args.pair}: {len(entry['runs'])} runs in {entry['study_wall_s']:.0f} s")


if __name__ == "__main__":
    main()
