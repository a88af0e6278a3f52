"""Soft Actor-Critic for continuous control (HalfCheetah-v4 by default; any gymnasium env with Box actions).

Launch:
    python cleanrl/sac_continuous_action.py                          # HalfCheetah-v4, 1M steps
    python cleanrl/sac_continuous_action.py --env-id Hopper-v4
    python cleanrl/sac_continuous_action.py --env-id Pendulum-v1 --total-timesteps 15000 --learning-starts 1000
    python cleanrl/sac_continuous_action.py --checkpoint-buffer      # checkpoints also hold the replay buffer
    python cleanrl/sac_continuous_action.py --resume runs/<run-name>
    tensorboard --logdir runs

Algorithm (Haarnoja et al. 2018, with the CleanRL / TD3 conventions): a tanh-squashed Gaussian
actor, two Q-networks with Polyak-averaged targets, clipped double-Q soft targets, the entropy
temperature tuned towards -|A| unless ``--no-autotune``, and the actor (with the temperature)
updated ``policy_frequency`` times every ``policy_frequency`` steps. One critic update per
vector step; before ``learning_starts`` actions are uniform. The two Q-networks are one module
(``SoftQNetworks``: weights stacked, one batched matrix product per layer; the same maths as two
networks, tests/test_maths.py), so each update is a few large kernels instead of many small ones:
benchmark/offpolicy_throughput.sh and offpolicy_profile.py measure it against Stable-Baselines3.

Replay (cleanrl_utils/buffers.py): each observation is stored once. Under next-step autoreset the
observation after a transition is the next one stored, including at episode ends where it is the
real final observation: terminations stop bootstrapping, truncations (MuJoCo's 1000-step limit)
bootstrap from it. Reset steps are stored but never sampled.

Departures from CleanRL, and why: the temperature starts at ``--alpha`` (0.2) and is tuned with the
policy's learning rate; CleanRL starts it at 1.0 (log alpha = 0) whatever ``--alpha`` says and tunes
it with the Q-networks' learning rate (1e-3). Starting at the documented value and moving it at the
actor's pace avoids an early phase of near-random actions. Other defaults are CleanRL's.

Resume: checkpoints hold the networks, optimizers, temperature, counters, RNG states and the exact
env state (MuJoCo included); with ``--checkpoint-buffer`` also the replay, and then a resumed run
continues exactly as the uninterrupted one. Reference figures: benchmark/replay_memory.sh.
"""

import math
import os
import random
import time
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_positive, warn_if_no_learning
from cleanrl_utils.buffers import ReplayBuffer, to_device
from cleanrl_utils.checkpoint import load_optimizer, rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks
from cleanrl_utils.envs import (
    EnvSnapshot,
    check_env_id,
    finished_episodes,
    get_vector_state,
    set_vector_state,
)
from cleanrl_utils.monitor import DeviceClock
from cleanrl_utils.nan_guard import NaNGuard
from cleanrl_utils.run import RUN_ERRORS, Run, report_and_exit, setup


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i is seeded with seed + i"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, train on CUDA when available"""
    threads: int | None = None
    """torch intra-op threads of this process (None: torch's default)"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into runs/<run-name>/videos"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<unix-time>"""
    checkpoint_interval: int = 100_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    checkpoint_buffer: bool = False
    """if toggled, checkpoints also hold the replay buffer (exact resume, larger files)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest); its settings are kept (see README)"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""
    compile: bool = False
    """if toggled, torch.compile the policy step and the critic and actor losses (the first steps compile)"""
    cudagraphs: bool = False
    """if toggled (with --compile, on CUDA), replay the policy step as a CUDA graph (mode reduce-overhead)"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the gymnasium environment (Box actions and observations)"""
    total_timesteps: int = 1_000_000
    """total env steps of the run, summed over envs"""
    num_envs: int = 1
    """the number of parallel environments"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions, summed over envs"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging per update)"""
    batch_size: int = 256
    """transitions per gradient step"""
    learning_starts: int = 5_000
    """env steps (summed over envs) of uniform random actions before learning starts"""
    policy_lr: float = 3e-4
    """the learning rate of the actor and the temperature"""
    q_lr: float = 1e-3
    """the learning rate of the Q-networks"""
    policy_frequency: int = 2
    """critic updates between actor updates (the actor then takes this many steps: TD3's delay)"""
    target_network_frequency: int = 1
    """critic updates between Polyak updates of the target networks"""
    alpha: float = 0.2
    """entropy temperature (the initial one with --autotune; CleanRL starts that at 1.0)"""
    autotune: bool = True
    """if toggled, tune the temperature towards the target entropy -dim(A)"""

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("policy_lr", "q_lr", "gamma", "tau")


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    require_positive(args, "threads", "target_network_frequency", "policy_lr", "q_lr", "alpha")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau}: must be in (0, 1]")
    if args.buffer_size < args.num_envs * 3:
        fail(
            f"--buffer-size {args.buffer_size}: must hold at least 3 steps of every env ({args.num_envs * 3})"
        )
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts}: must be at least --batch-size {args.batch_size}")
    warn_if_no_learning(args)
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.cudagraphs and not (args.compile and args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs: needs --compile and CUDA (torch.compile replays the policy step as a CUDA graph)")
    check_env_id(args.env_id)


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str):
    """A thunk making env ``idx`` with flat observations, wrapped in EnvSnapshot."""

    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir)
        else:
            env = gym.make(env_id)
        return EnvSnapshot(gym.wrappers.FlattenObservation(env))

    return thunk


class SoftQNetworks(nn.Module):
    """The twin critics Q1 and Q2 as one network: their weights stacked, each layer one batched matrix
    product over both. ``forward`` gives a (2, batch) tensor: row i is critic i's Q(s, a)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: int = 256, critics: int = 2):
        super().__init__()
        sizes = [(obs_dim + action_dim, hidden), (hidden, hidden), (hidden, 1)]
        layers = [
            [nn.Linear(n_in, n_out) for n_in, n_out in sizes] for _ in range(critics)
        ]  # nn.Linear's init
        self.w1, self.w2 = (
            nn.Parameter(torch.stack([c[i].weight.detach().T for c in layers])) for i in (0, 1)
        )
        self.b1, self.b2 = (
            nn.Parameter(torch.stack([c[i].bias.detach()[None] for c in layers])) for i in (0, 1)
        )
        self.w3 = nn.Parameter(torch.stack([c[2].weight.detach() for c in layers]))  # (critics, 1, hidden)
        self.b3 = nn.Parameter(torch.stack([c[2].bias.detach() for c in layers]))  # (critics, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=1).expand(len(self.w1), -1, -1)  # every critic sees the same input
        x = torch.baddbmm(self.b1, x, self.w1).relu_()
        x = torch.baddbmm(self.b2, x, self.w2).relu_()
        return (x * self.w3).sum(2) + self.b3  # the 256 -> 1 layer as a dot product: a bmm of width 1 is slow


LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Actor(nn.Module):
    """A Gaussian policy squashed by tanh into the action box [low, high]."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        action_dim = len(action_low)
        self.trunk = nn.Sequential(
            nn.Linear(obs_dim, 256), nn.ReLU(inplace=True), nn.Linear(256, 256), nn.ReLU(inplace=True)
        )
        self.heads = nn.Linear(256, 2 * action_dim)  # the Gaussian's mean and (before its squash) log std
        low, high = (torch.as_tensor(bound, dtype=torch.float32) for bound in (action_low, action_high))
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)
        # the constant part of log pi(a|s): sum over the action of log(scale) + 2 log 2 + log(2 pi) / 2
        constant = torch.log(self.action_scale).sum() + action_dim * (
            2 * math.log(2.0) + 0.5 * math.log(2 * math.pi)
        )
        self.register_buffer("log_prob_constant", constant)

    def gaussian(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log standard deviation of the Gaussian before the squash."""
        mean, log_std = self.heads(self.trunk(obs)).chunk(2, dim=1)
        # a smooth squash of log_std into [LOG_STD_MIN, LOG_STD_MAX] keeps its gradient alive
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action and its log-probability (with the tanh correction)."""
        mean, log_std = self.gaussian(obs)
        noise = torch.randn_like(mean)
        u = mean + log_std.exp() * noise  # reparameterised sample
        # log N(u; mean, std) - log |da/du| for a = scale * tanh(u) + bias, with
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)) in a stable form
        log_prob = (2.0 * (u + F.softplus(-2.0 * u)) - 0.5 * noise.square() - log_std).sum(1)
        return torch.tanh(u) * self.action_scale + self.action_bias, log_prob - self.log_prob_constant

    def greedy(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic action: the squashed mean (for evaluation)."""
        return torch.tanh(self.gaussian(obs)[0]) * self.action_scale + self.action_bias


def soft_q_target(
    rewards: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_prob: torch.Tensor,
    terminations: torch.Tensor,
    alpha: float | torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """r + gamma * (min(Q1', Q2') - alpha * log pi(a'|s')), without bootstrap after a termination.

    The next-state quantities belong to the *real* next observation, which for a truncated
    transition is the final observation (so truncation keeps its bootstrap).
    """
    return rewards + gamma * (1.0 - terminations) * (torch.min(next_q1, next_q2) - alpha * next_log_prob)


def critic_loss(actor, qf, qf_target, data: dict[str, torch.Tensor], alpha, gamma: float):
    """Both critics' mean squared error to one clipped double-Q soft target on ``data``, summed; returns
    it and the critics' values (2, batch)."""
    with torch.no_grad():
        next_obs, rewards, terminations = data["next_obs"], data["rewards"], data["terminations"].float()
        next_actions, next_log_prob = actor(next_obs)
        next_q = qf_target(next_obs, next_actions)
        target = soft_q_target(rewards, next_q[0], next_q[1], next_log_prob, terminations, alpha, gamma)
    q_values = qf(data["obs"], data["actions"])
    return 2.0 * F.mse_loss(q_values, target.expand_as(q_values)), q_values  # = MSE(Q1) + MSE(Q2)


def policy_loss(actor, qf, obs: torch.Tensor, alpha, log_alpha, target_entropy: float, autotune: bool):
    """The actor's loss mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a)), a ~ pi(.|s), on ``obs``; with
    ``autotune`` plus the temperature's loss, which reaches ``log_alpha`` only (one backward for both).
    Returns (the sum, the actor's loss)."""
    pi, log_pi = actor(obs)
    actor_loss = (alpha * log_pi - qf(obs, pi).amin(0)).mean()
    if not autotune:
        return actor_loss, actor_loss
    return actor_loss - (log_alpha * (log_pi.detach() + target_entropy)).mean(), actor_loss


@torch.no_grad()
def polyak_update_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place, one fused op over all tensors."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def main() -> None:
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = ranks.device  # cuda:LOCAL_RANK (or --device-ids) with --cuda and a GPU, else the CPU

    # ENV SETUP
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, str(run_dir / "videos")) for i in range(args.num_envs)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the replay buffer relies on it
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a continuous (Box) action space, got {envs.single_action_space}")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    action_shape = envs.single_action_space.shape
    low, high = envs.single_action_space.low, envs.single_action_space.high
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a bounded action space, got {envs.single_action_space}")
    envs.single_action_space.seed(args.seed)

    actor = Actor(obs_dim, low, high).to(device)
    qf, qf_target = (SoftQNetworks(obs_dim, action_shape[0]).to(device) for _ in range(2))
    qf_target.requires_grad_(False)
    qf_target.load_state_dict(qf.state_dict())
    q_params = list(qf.parameters())
    q_optimizer = torch.optim.Adam(q_params, lr=args.q_lr, fused=True)
    target_entropy = -float(np.prod(action_shape))
    log_alpha = torch.tensor([math.log(args.alpha)], device=device, requires_grad=args.autotune)
    alpha = log_alpha.detach().exp()
    # the actor's and the temperature's gradients come from one backward: one optimizer steps both
    actor_params = [*actor.parameters(), log_alpha] if args.autotune else list(actor.parameters())
    actor_optimizer = torch.optim.Adam(actor_params, lr=args.policy_lr, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(actor, mode=mode) if args.compile else actor
    critic_loss_fn = torch.compile(critic_loss) if args.compile else critic_loss
    policy_loss_fn = torch.compile(policy_loss) if args.compile else policy_loss
    rb = ReplayBuffer(
        args.buffer_size, args.num_envs, (obs_dim,), action_shape, np.float32, np.float32, seed=args.seed
    )

    next_obs, _ = envs.reset(seed=[args.seed + i for i in range(args.num_envs)])
    next_done = np.zeros(args.num_envs, dtype=bool)  # did the previous step end an episode?
    global_step, updates = 0, 0
    if checkpoint is not None:
        actor.load_state_dict(checkpoint["actor"])
        qf.load_state_dict(checkpoint["qf"])
        qf_target.load_state_dict(checkpoint["qf_target"])
        load_optimizer(q_optimizer, checkpoint["q_optimizer"], args.q_lr)
        load_optimizer(actor_optimizer, checkpoint["actor_optimizer"], args.policy_lr)
        with torch.no_grad():
            log_alpha.copy_(checkpoint["log_alpha"])
        alpha = log_alpha.detach().exp()
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        envs.single_action_space.np_random.bit_generator.state = checkpoint["action_space_rng"]
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
        global_step, updates = checkpoint["global_step"], checkpoint["updates"]
        if "replay" in checkpoint:
            rb.load_state_dict(checkpoint["replay"])
    start_step = global_step
    # without a saved replay, a resumed run refills its buffer before learning again
    first_learning_step = args.learning_starts + (0 if "replay" in (checkpoint or {}) else start_step)

    # LOGGING SETUP: TensorBoard/W&B, Ctrl-C, progress, checkpoints; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    env_time = 0.0
    inference_clock, learn_clock = DeviceClock(device), DeviceClock(device)  # CUDA events on a GPU
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes
    qf_loss = actor_loss = torch.zeros((), device=device)  # of the latest update
    q_values = torch.zeros(2, 1, device=device)
    num_steps = (args.total_timesteps - global_step) // args.num_envs
    try:
        for step in range(1, num_steps + 1):
            global_step += args.num_envs

            # ACT: uniform actions until learning starts, then samples of the policy
            if global_step <= first_learning_step:
                actions = np.stack([envs.single_action_space.sample() for _ in range(args.num_envs)])
            else:
                with inference_clock, torch.inference_mode():
                    actions, _ = act(to_device(next_obs.astype(np.float32), device))  # pinned: no GPU wait
                actions = actions.cpu().numpy()
            t0 = time.perf_counter()
            obs = next_obs
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            env_time += time.perf_counter() - t0

            # REPLAY: the step after an episode end only resets that env; it is stored, never sampled.
            rb.add(obs, actions, rewards, terminations, ~next_done)
            next_done = np.logical_or(terminations, truncations)
            for episodic_return, length in finished_episodes(infos):
                run.log_episode(global_step, episodic_return, length)

            # UPDATE: one critic step per vector step; the actor (and alpha) every policy_frequency of them
            if global_step > first_learning_step:
                with learn_clock:
                    data = rb.sample_to(args.batch_size, device)
                    qf_loss, q_values = critic_loss_fn(actor, qf, qf_target, data, alpha, args.gamma)
                    q_optimizer.zero_grad(set_to_none=True)
                    qf_loss.backward()
                    norm = nn.utils.get_total_norm([p.grad for p in q_params])
                    nan_guard.step(q_optimizer, norm, global_step)  # skipped on the device if NaN/inf
                    updates += 1

                    if updates % args.policy_frequency == 0:
                        qf.requires_grad_(
                            False
                        )  # the actor's loss trains the actor only: no critic weight gradients
                        for _ in range(args.policy_frequency):
                            loss, actor_loss = policy_loss_fn(
                                actor, qf, data["obs"], alpha, log_alpha, target_entropy, args.autotune
                            )
                            actor_optimizer.zero_grad(set_to_none=True)
                            loss.backward()
                            norm = nn.utils.get_total_norm([p.grad for p in actor_params])
                            nan_guard.step(actor_optimizer, norm, global_step)
                            alpha = log_alpha.detach().exp()  # on the device: no host wait
                        qf.requires_grad_(True)

                    if updates % args.target_network_frequency == 0:
                        polyak_update_(qf_target, qf, args.tau)

            # LOGGING (and the NaN check: read here and right before each checkpoint, not per gradient step)
            due = run.checkpoint_due(global_step, args.num_envs, step == num_steps, run.stop.signum)
            if step % log_every == 0 or due:
                nan_guard.check(run.last_checkpoint)
            if step % log_every == 0:
                writer.add_scalar("perf/env_time", env_time, global_step)
                writer.add_scalar("perf/inference_time", inference_clock.read(), global_step)
                writer.add_scalar("perf/learn_time", learn_clock.read(), global_step)
                writer.add_scalar("perf/replay_bytes", rb.nbytes, global_step)
                if updates > 0:
                    writer.add_scalar("losses/qf1_values", q_values[0].mean().item(), global_step)
                    writer.add_scalar("losses/qf2_values", q_values[1].mean().item(), global_step)
                    writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                    writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                    writer.add_scalar("losses/alpha", float(alpha), global_step)
                run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line
                env_time = 0.0

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            if due:
                state = {  # everything an exact resume needs (and the replay, with --checkpoint-buffer)
                    "actor": actor.state_dict(),
                    "qf": qf.state_dict(),
                    "qf_target": qf_target.state_dict(),
                    "q_optimizer": q_optimizer.state_dict(),
                    "actor_optimizer": actor_optimizer.state_dict(),
                    "log_alpha": log_alpha.detach().cpu(),
                    "global_step": global_step,
                    "updates": updates,
                    "rng": rng_state(),
                    "action_space_rng": envs.single_action_space.np_random.bit_generator.state,
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                }
                if args.checkpoint_buffer:
                    state["replay"] = rb.state_dict()
                path = run.save(state, global_step)
                if run.stop.signum:
                    run.exit_on_signal(run.stop.signum, path, global_step)
    except RUN_ERRORS as e:  # a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
