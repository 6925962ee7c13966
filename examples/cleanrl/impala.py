# IMPALA (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561) in CleanRL's single-file style, on
# gymnasium 1.4 vector envs, with V-trace targets from rl_triton_cleanrl.compute_vtrace.
#
# Actor threads step their own environments with their own copy of the policy and queue the
# rollouts; one learner takes a gradient step per rollout. The copy an actor acts with lags the
# learner by exactly `policy_lag` updates (rollout u is collected with the parameters of update
# u - policy_lag), so importance weights are not 1 and V-trace has something to correct, while a
# run stays reproducible: which parameters produced which rollout does not depend on thread timing.
# How to run it, and how it differs from the paper: docs/cleanrl.md.
import copy
import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter

import rl_triton_cleanrl


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the environment"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 1e-3
    """the learning rate of the optimizer"""
    num_actors: int = 2
    """the number of actor threads"""
    num_envs: int = 8
    """the number of parallel game environments of each actor"""
    num_steps: int = 32
    """the number of steps to run in each environment per rollout (the unroll length)"""
    policy_lag: int = 2
    """learner updates by which the actors' policy lags, >= 0 (>= num_actors lets all actors run at once)"""
    async_envs: bool = False
    """if toggled, each actor's environments run in subprocesses (`gym.vector.AsyncVectorEnv`)"""
    anneal_lr: bool = True
    """Toggle learning rate annealing"""
    gamma: float = 0.99
    """the discount factor gamma"""
    vtrace_lambda: float = 1.0
    """the lambda of V-trace's traces"""
    rho_bar: float = 1.0
    """the clipping threshold of the importance weights of the TD errors (and of the policy gradient)"""
    c_bar: float = 1.0
    """the clipping threshold of the importance weights of the traces"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""

    # Credit assignment (rl_triton)
    advantage_backend: Literal["auto", "triton", "torch", "reference"] = "auto"
    """V-trace backend: auto (Triton on CUDA, torch on CPU), triton, torch, or reference (float64 loop)"""
    advantage_device: str | None = None
    """where the credit assignment runs: the rollout's device (default), or e.g. `cuda` for Triton's kernels while the networks run on the CPU (`--no-cuda`); the rollout is copied there and the results back"""
    bootstrap_truncated: bool = True
    """bootstrap time-limit truncations from V(final observation); `--no-bootstrap-truncated` treats them as terminations"""
    shadow_check: bool = False
    """also compute the V-trace targets with the float64 reference every update and log the max relative difference"""

    # to be filled in runtime
    batch_size: int = 0
    """the batch size of one update: num_envs * num_steps (computed in runtime)"""
    num_iterations: int = 0
    """the number of learner updates (computed in runtime)"""


def make_env(env_id):
    def thunk():
        env = gym.make(env_id)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(np.array(envs.single_observation_space.shape).prod(), 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action(self, x, generator=None):
        """Samples with the actor thread's own random generator (reproducible across threads)."""
        probs = Categorical(logits=self.actor(x))
        action = torch.multinomial(probs.probs, 1, generator=generator).squeeze(-1)
        return action, probs.log_prob(action)


class PolicyVersions:
    """The learner's parameters after each update, kept until no actor needs them any more."""

    def __init__(self):
        self.cond = threading.Condition()
        self.versions = {}
        self.closed = False

    def publish(self, version, agent, oldest_needed):
        params = {k: v.detach().clone() for k, v in agent.state_dict().items()}
        with self.cond:
            self.versions[version] = params
            for old in [v for v in self.versions if v < oldest_needed]:
                del self.versions[old]
            self.cond.notify_all()

    def get(self, version):
        """Waits for `version`; None once the learner has stopped."""
        with self.cond:
            self.cond.wait_for(lambda: version in self.versions or self.closed)
            return None if self.closed else self.versions[version]

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def actor(actor_id, args, envs, agent, policy_versions, rollouts, device):
    """Collects rollouts actor_id, actor_id + num_actors, ... into the queue `rollouts`; rollout u
    with the learner's parameters after update u - policy_lag."""
    try:
        generator = torch.Generator(device=device).manual_seed(args.seed + actor_id)
        obs_shape = envs.single_observation_space.shape
        next_obs, _ = envs.reset(seed=args.seed + actor_id * args.num_envs)
        next_obs = torch.Tensor(next_obs).to(device)
        next_done = torch.zeros(args.num_envs).to(device)
        for u in range(actor_id, args.num_iterations, args.num_actors):
            version = max(0, u - args.policy_lag)
            params = policy_versions.get(version)
            if params is None:
                return
            agent.load_state_dict(params)

            obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape)).to(device)
            actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long).to(device)
            logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
            rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
            dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
            # for --bootstrap-truncated: steps truncated (not terminated), and their final obs
            truncated = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool).to(device)
            final_obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape)).to(device)
            episodes = []  # (step, episodic return, episodic length)
            for step in range(args.num_steps):
                obs[step] = next_obs
                dones[step] = next_done
                with torch.no_grad():
                    action, logprob = agent.get_action(next_obs, generator)
                actions[step] = action
                logprobs[step] = logprob

                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                next_done = np.logical_or(terminations, truncations)
                rewards[step] = torch.tensor(reward).to(device).view(-1)
                if args.bootstrap_truncated:
                    # a step that is both terminated and truncated is terminal
                    only_truncated = truncations & ~terminations
                    truncated[step] = torch.as_tensor(only_truncated).to(device)
                    if only_truncated.any():
                        final = np.stack(infos["final_obs"][only_truncated])
                        final_obs[step, truncated[step]] = torch.Tensor(final).to(device)
                next_obs = torch.Tensor(next_obs).to(device)
                next_done = torch.Tensor(next_done).to(device)
                if "episode" in infos:  # the RecordEpisodeStatistics vector wrapper
                    for i in np.flatnonzero(infos["_episode"]):
                        episodes.append((step, infos["episode"]["r"][i], infos["episode"]["l"][i]))

            rollouts.put(
                dict(
                    obs=obs,
                    actions=actions,
                    behavior_logprobs=logprobs,
                    rewards=rewards,
                    dones=dones,
                    truncated=truncated,
                    final_obs=final_obs,
                    next_obs=next_obs,
                    next_done=next_done,
                    episodes=episodes,
                    version=version,
                )
            )
    except BaseException as error:  # hand it to the learner, which re-raises it
        rollouts.put(error)


def main(args: Args) -> str:
    """Trains, logs to TensorBoard and returns the run's log directory (runs/{run_name})."""
    if args.num_actors < 1 or args.policy_lag < 0:  # (a negative lag would deadlock: rollout u
        # would wait for an update that needs rollout u)
        raise ValueError(
            f"--num-actors must be >= 1 and --policy-lag >= 0, got {args.num_actors} and "
            f"{args.policy_lag}"
        )
    args.batch_size = int(args.num_envs * args.num_steps)
    args.num_iterations = args.total_timesteps // args.batch_size
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.track:
        import wandb

        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            monitor_gym=True,
            save_code=True,
        )
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n"
        + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    # TRY NOT TO MODIFY: seeding
    random.seed(args.seed)
    np.random.seed(args.seed)  # noqa: NPY002 (for libraries that use numpy's global RNG)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup: one vector env per actor; SAME_STEP autoreset keeps CleanRL's rollout layout and
    # hands the final observation over in infos["final_obs"]
    vector_env = gym.vector.AsyncVectorEnv if args.async_envs else gym.vector.SyncVectorEnv
    actor_envs = []
    for _ in range(args.num_actors):
        envs = vector_env(
            [make_env(args.env_id) for _ in range(args.num_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        actor_envs.append(gym.wrappers.vector.RecordEpisodeStatistics(envs))
    envs = actor_envs[0]
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), (
        "only discrete action space is supported"
    )

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # actors: each with its environments, its policy copy and its queue of rollouts
    policy_versions = PolicyVersions()
    policy_versions.publish(0, agent, oldest_needed=0)
    queues = [queue.Queue() for _ in range(args.num_actors)]
    threads = [
        threading.Thread(
            target=actor,
            args=(a, args, actor_envs[a], copy.deepcopy(agent), policy_versions, queues[a], device),
            daemon=True,
        )
        for a in range(args.num_actors)
    ]
    for thread in threads:
        thread.start()

    global_step = 0
    start_time = time.time()
    shadow_seconds = 0.0  # time spent in --shadow-check, left out of SPS
    try:
        for iteration in range(1, args.num_iterations + 1):
            # Annealing the rate if instructed to do so.
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                lrnow = frac * args.learning_rate
                optimizer.param_groups[0]["lr"] = lrnow

            # rollouts in a fixed order: update u learns from rollout u
            rollout = queues[(iteration - 1) % args.num_actors].get()
            if isinstance(rollout, BaseException):
                raise rollout
            for step, episodic_return, episodic_length in rollout["episodes"]:
                episode_step = global_step + (step + 1) * args.num_envs
                print(f"global_step={episode_step}, episodic_return={episodic_return}")
                writer.add_scalar("charts/episodic_return", episodic_return, episode_step)
                writer.add_scalar("charts/episodic_length", episodic_length, episode_step)
            global_step += args.batch_size

            # the learner's (target) policy and values on the rollout
            obs, actions = rollout["obs"], rollout["actions"]
            logits = agent.actor(obs)
            probs = Categorical(logits=logits)
            target_logprobs = probs.log_prob(actions)
            entropy = probs.entropy()
            values = agent.get_value(obs).squeeze(-1)

            with torch.no_grad():
                next_value = agent.get_value(rollout["next_obs"]).reshape(1, -1)
                truncated = rollout["truncated"] if args.bootstrap_truncated else None
                final_values = torch.zeros_like(values)
                if args.bootstrap_truncated:
                    final_values[truncated] = agent.get_value(
                        rollout["final_obs"][truncated]
                    ).flatten()
                # V-trace value targets vs and policy-gradient advantages, in one call
                with rl_triton_cleanrl.Stopwatch(device) as credit_assignment:
                    vs, pg_advantages = rl_triton_cleanrl.compute_vtrace(
                        rollout["rewards"],
                        values.detach(),
                        target_logprobs.detach(),
                        rollout["behavior_logprobs"],
                        rollout["dones"],
                        next_value,
                        rollout["next_done"],
                        args.gamma,
                        truncated=truncated,
                        final_values=final_values,
                        lmbda=args.vtrace_lambda,
                        rho_bar=args.rho_bar,
                        c_bar=args.c_bar,
                        backend=args.advantage_backend,
                        device=args.advantage_device,
                    )
                if args.shadow_check:  # the same call with the float64 reference loop
                    with rl_triton_cleanrl.Stopwatch(device) as shadow:
                        shadow_max_rel_diff = rl_triton_cleanrl.shadow_check(
                            (vs, pg_advantages),
                            rl_triton_cleanrl.compute_vtrace,
                            rollout["rewards"],
                            values.detach(),
                            target_logprobs.detach(),
                            rollout["behavior_logprobs"],
                            rollout["dones"],
                            next_value,
                            rollout["next_done"],
                            args.gamma,
                            truncated=truncated,
                            final_values=final_values,
                            lmbda=args.vtrace_lambda,
                            rho_bar=args.rho_bar,
                            c_bar=args.c_bar,
                        )
                    shadow_seconds += shadow.seconds

            pg_loss = -(pg_advantages * target_logprobs).mean()
            v_loss = 0.5 * ((vs - values) ** 2).mean()
            entropy_loss = entropy.mean()
            loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
            optimizer.step()
            # the next rollout, `iteration`, needs the parameters of update iteration - policy_lag
            policy_versions.publish(iteration, agent, oldest_needed=iteration - args.policy_lag)

            with torch.no_grad():
                # how far the behaviour policy is from the learner's: importance weights
                logratio = target_logprobs - rollout["behavior_logprobs"]
                ratio = logratio.exp()
                approx_kl = ((ratio - 1) - logratio).mean()

            # TRY NOT TO MODIFY: record rewards for plotting purposes
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("charts/policy_lag", iteration - 1 - rollout["version"], global_step)
            writer.add_scalar("charts/importance_weight_mean", ratio.mean().item(), global_step)
            writer.add_scalar(
                "charts/importance_weight_clipfrac",
                (ratio > args.rho_bar).float().mean().item(),
                global_step,
            )
            writer.add_scalar(
                "charts/credit_assignment_time", credit_assignment.seconds, global_step
            )
            if args.shadow_check:
                writer.add_scalar("charts/shadow_max_rel_diff", shadow_max_rel_diff, global_step)
            sps = int(global_step / (time.time() - start_time - shadow_seconds))
            if iteration % 10 == 0 or iteration == args.num_iterations:
                print("SPS:", sps)
            writer.add_scalar("charts/SPS", sps, global_step)
    finally:
        policy_versions.close()
        for thread in threads:
            thread.join()
        for envs in actor_envs:
            envs.close()
        writer.close()
    return f"runs/{run_name}"


if __name__ == "__main__":
    main(tyro.cli(Args))
