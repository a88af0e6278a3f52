"""DQN for discrete-action classic control (CartPole-v1 by default) on gymnasium 1.x vector envs.

Launch:
    python cleanrl/dqn.py                                    # CartPole-v1, 60k steps, logs in runs/
    python cleanrl/dqn.py --env-id Acrobot-v1 --total-timesteps 100000
    python cleanrl/dqn.py --checkpoint-buffer                 # checkpoints also hold the replay buffer
    python cleanrl/dqn.py --resume runs/<run-name>
    tensorboard --logdir runs

Departures from CleanRL, and why: Double DQN targets (``--no-double-q`` for CleanRL's) and the
Huber loss (``--no-huber-loss`` for CleanRL's squared error); a 256-256 Q-network, 8 gradient steps of
batch 128 every 16 env steps, lr 5e-4 annealed to 0 at the end of the run, a target copy every 500 env
steps, and epsilon to 0.01 over the first 10k steps whatever the budget (CleanRL: a share of it). With
them CartPole's Q-values stay near the bound 1 / (1 - gamma) at any budget instead of running away, but
late oscillation remains: 380.74 +- 89.26 at 500k steps against CleanRL's 488.69 +- 16.11. ``--target-network-frequency 128 --no-anneal-lr`` is the short-run set: 400 (last 20 episodes)
within 22-36k steps, but past about 100k steps its Q-values run away and the policy collapses, as
Stable-Baselines3's DQN does with the same settings (benchmark/dqn_divergence.sh). Figures:
docs/benchmarks.md (the classic suite).
``--cuda`` is off by default: this small MLP is faster on the CPU.

Replay (cleanrl_utils/buffers.py): each observation is stored once. Under next-step autoreset the
observation after a transition is always the next one stored, including at episode ends, where
it is the real final observation: terminations stop bootstrapping, truncations bootstrap from it.
The reset steps in between are stored but never sampled.

Resume: checkpoints hold the networks, optimizer, counters, RNG states and the exact env state;
with ``--checkpoint-buffer`` also the replay buffer, and then a resumed run continues exactly as
the uninterrupted one. Without it the buffer refills from empty (``learning_starts`` again).
Reference figures: benchmark/replay_memory.sh.
"""

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
from cleanrl_utils.run import RUN_ERRORS, Run, interval_crossed, report_and_exit, setup


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i is seeded with seed + i"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = False
    """if toggled, train on CUDA when available (a small MLP is faster on the CPU)"""
    threads: int = 1
    """torch intra-op threads of this process"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into runs/<run-name>/videos"""
    save_model: bool = False
    """at the end, save the model as runs/<run-name>/<exp-name>.cleanrl_model and evaluate it (10 episodes)"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<unix-time>"""
    checkpoint_interval: int = 25_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    checkpoint_buffer: bool = False
    """if toggled, checkpoints also hold the replay buffer (exact resume, larger files)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest); its settings are kept (see README)"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""
    compile: bool = False
    """if toggled, torch.compile the policy step and the TD loss (the first steps pay for compiling)"""
    cudagraphs: bool = False
    """if toggled (with --compile, on CUDA), replay the policy step as a CUDA graph (mode reduce-overhead)"""

    # Algorithm specific arguments
    env_id: str = "CartPole-v1"
    """the id of the gymnasium environment (discrete actions, vector observations)"""
    total_timesteps: int = 60_000
    """total env steps of the run, summed over envs"""
    num_envs: int = 1
    """the number of parallel environments"""
    learning_rate: float = 5e-4
    """the learning rate of the optimizer"""
    anneal_lr: bool = True
    """if toggled, the learning rate decays linearly to 0 at total_timesteps"""
    buffer_size: int = 100_000
    """replay capacity in transitions, summed over envs"""
    gamma: float = 0.99
    """the discount factor"""
    target_network_frequency: int = 500
    """env steps (summed over envs) between target updates, as in CleanRL"""
    tau: float = 1.0
    """the target update: target <- (1 - tau) * target + tau * online (1.0: a copy, as in CleanRL)"""
    batch_size: int = 128
    """transitions per gradient step"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the final epsilon for exploration"""
    exploration_steps: int = 10_000
    """env steps (summed over envs) over which epsilon decays from start_e to end_e, whatever the budget"""
    exploration_fraction: float | None = None
    """if set, epsilon decays over this fraction of total_timesteps instead (CleanRL's schedule)"""
    learning_starts: int = 1000
    """env steps (summed over envs) of pure exploration before learning starts"""
    train_frequency: int = 16
    """env steps (summed over envs) between training bursts"""
    gradient_steps: int = 8
    """gradient steps per training burst"""
    max_grad_norm: float = 10.0
    """the maximum norm of the gradient"""
    double_q: bool = True
    """if toggled, Double DQN: the online network picks the next action, the target network values it"""
    huber_loss: bool = True
    """if toggled, the Huber (smooth L1) TD loss; --no-huber-loss for CleanRL's squared error"""

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "gamma", "max_grad_norm")


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency")
    require_positive(args, "threads", "gradient_steps", "target_network_frequency", "learning_rate")
    require_positive(args, "max_grad_norm", "exploration_steps")
    if args.exploration_fraction is not None and not 0.0 < args.exploration_fraction <= 1.0:
        fail(f"--exploration-fraction {args.exploration_fraction}: must be in (0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau}: must be in (0, 1]")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if args.train_frequency % args.num_envs != 0:
        fail(f"--train-frequency {args.train_frequency}: must be a multiple of --num-envs {args.num_envs}")
    if args.buffer_size < args.num_envs * 4:
        fail(
            f"--buffer-size {args.buffer_size}: must hold at least 4 steps of every env ({args.num_envs * 4})"
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
    """A thunk making env ``idx``, wrapped in EnvSnapshot (its whole state goes into checkpoints)."""

    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir)
        else:
            env = gym.make(env_id)
        return EnvSnapshot(env)

    return thunk


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, n_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float())  # observations as the env makes them (float64 too)


@torch.no_grad()
def polyak_update_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place, one fused op over all tensors."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def td_target(
    rewards: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor | None,
    terminations: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """One-step target r + gamma * Q_target(s', a*), without bootstrap after a termination.

    a* = argmax_a Q_target(s', a), or argmax_a Q_online(s', a) when ``next_q_online`` is given
    (Double DQN: the max over one network's noisy estimates is biased upwards; picking with one and
    valuing with the other removes most of that bias). The next-state values are those of the
    *real* next observation, which for a truncated transition is the final observation (so
    truncation keeps its bootstrap).
    """
    best = (next_q_target if next_q_online is None else next_q_online).argmax(dim=1, keepdim=True)
    return rewards + gamma * next_q_target.gather(1, best).squeeze(1) * (1.0 - terminations)


def td_loss(q_network, data: dict, gamma: float, double_q: bool, huber: bool):
    """The TD loss of ``q_network`` on ``data`` (Huber with ``huber``, else squared error) against
    :func:`td_target` (Double DQN with ``double_q``), the target network's values of the next states given
    as ``data["next_q_target"]``; returns it and the Q-values of the taken actions."""
    with torch.no_grad():
        next_q_online = q_network(data["next_obs"]) if double_q else None
        rewards, terminations = data["rewards"], data["terminations"].float()
        target = td_target(rewards, data["next_q_target"], next_q_online, terminations, gamma)
    old_val = q_network(data["obs"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
    return F.smooth_l1_loss(old_val, target) if huber else F.mse_loss(old_val, target), old_val


def main() -> None:
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    exploration_steps = args.exploration_steps  # epsilon's decay, env steps
    if args.exploration_fraction is not None:  # CleanRL's: a share of the budget
        exploration_steps = int(args.exploration_fraction * args.total_timesteps)

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
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a discrete action space, got {envs.single_action_space}")
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(int(np.prod(obs_shape)), n_actions).to(device)
    target_network = QNetwork(int(np.prod(obs_shape)), n_actions).to(device).requires_grad_(False)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(q_network, mode=mode) if args.compile else q_network
    loss_fn = torch.compile(td_loss) if args.compile else td_loss
    rb = ReplayBuffer(args.buffer_size, args.num_envs, obs_shape, (), np.float32, np.int64, seed=args.seed)
    loss = old_val = torch.zeros((), device=device)  # of the latest gradient step

    next_obs, _ = envs.reset(seed=[args.seed + i for i in range(args.num_envs)])
    next_done = np.zeros(args.num_envs, dtype=bool)  # did the previous step end an episode?
    global_step = 0
    if checkpoint is not None:
        q_network.load_state_dict(checkpoint["model"])
        target_network.load_state_dict(checkpoint["target"])
        load_optimizer(optimizer, checkpoint["optimizer"], args.learning_rate)
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
        global_step = checkpoint["global_step"]
        if "replay" in checkpoint:
            rb.load_state_dict(checkpoint["replay"])
    # without a saved replay, a resumed run refills its buffer before learning again
    first_learning_step = args.learning_starts + (0 if "replay" in (checkpoint or {}) else global_step)

    # LOGGING SETUP: TensorBoard/W&B, Ctrl-C, progress, checkpoints; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    env_time = 0.0
    inference_clock, learn_clock = DeviceClock(device), DeviceClock(device)  # CUDA events on a GPU
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes
    num_steps = (args.total_timesteps - global_step) // args.num_envs
    try:
        for step in range(1, num_steps + 1):
            global_step += args.num_envs

            # ACT: epsilon-greedy; the network runs only when some env does not explore
            epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
            explore = np.random.random(args.num_envs) < epsilon
            actions = np.zeros(args.num_envs, dtype=np.int64)
            if not explore.all():
                with inference_clock, torch.inference_mode():
                    actions = act(to_device(next_obs, device)).argmax(dim=1).cpu().numpy()
            actions[explore] = np.random.randint(n_actions, size=int(explore.sum()))
            t0 = time.perf_counter()
            obs = next_obs
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            env_time += time.perf_counter() - t0

            # REPLAY: the step after an episode end only resets that env; it is stored, never sampled.
            rb.add(obs, actions, rewards, terminations, ~next_done)
            next_done = np.logical_or(terminations, truncations)
            for episodic_return, length in finished_episodes(infos):
                run.log_episode(global_step, episodic_return, length)

            # UPDATE: a burst of gradient steps every train_frequency env steps
            if global_step > first_learning_step and global_step % args.train_frequency == 0:
                frac = 1.0 - (global_step - args.num_envs) / args.total_timesteps if args.anneal_lr else 1.0
                # from args: a resume may change it
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
                with learn_clock:
                    # one draw for the whole burst; the target network, fixed within it, values it in one pass
                    burst = rb.sample_to(args.batch_size * args.gradient_steps, device)
                    with torch.no_grad():
                        burst["next_q_target"] = target_network(burst["next_obs"])
                    for i in range(args.gradient_steps):
                        batch = slice(i * args.batch_size, (i + 1) * args.batch_size)
                        data = {k: v[batch] for k, v in burst.items()}
                        loss, old_val = loss_fn(q_network, data, args.gamma, args.double_q, args.huber_loss)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        grad_norm = nn.utils.clip_grad_norm_(q_network.parameters(), args.max_grad_norm)
                        nan_guard.step(optimizer, grad_norm, global_step)  # skipped on the device if NaN/inf
            if global_step > first_learning_step and interval_crossed(
                global_step, args.num_envs, args.target_network_frequency
            ):
                polyak_update_(target_network, q_network, args.tau)

            # LOGGING (and the NaN check: read here and right before each checkpoint, not per gradient step)
            due = run.checkpoint_due(global_step, args.num_envs, step == num_steps, run.stop.signum)
            if step % log_every == 0 or due:
                nan_guard.check(run.last_checkpoint)
            if step % log_every == 0:
                if global_step > first_learning_step:
                    writer.add_scalar("losses/td_loss", loss.item(), global_step)
                    writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                writer.add_scalar("charts/epsilon", epsilon, global_step)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("perf/env_time", env_time, global_step)
                writer.add_scalar("perf/inference_time", inference_clock.read(), global_step)
                writer.add_scalar("perf/learn_time", learn_clock.read(), global_step)
                writer.add_scalar("perf/replay_bytes", rb.nbytes, global_step)
                run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line
                env_time = 0.0

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            if due:
                state = {  # everything an exact resume needs (and the replay, with --checkpoint-buffer)
                    "model": q_network.state_dict(),
                    "target": target_network.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "global_step": global_step,
                    "rng": rng_state(),
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                }
                if args.checkpoint_buffer:
                    state["replay"] = rb.state_dict()
                path = run.save(state, global_step)
                if run.stop.signum:
                    run.exit_on_signal(run.stop.signum, path, global_step)
        if args.save_model:  # the final checkpoint's weights, evaluated as CleanRL's scripts evaluate theirs
            from cleanrl_utils.enjoy import evaluate

            model_path = run.save_model(["model"])
            returns = evaluate(model_path, 10, args.seed, greedy=False, epsilon=args.end_e)
            for i, episodic_return in enumerate(returns):
                writer.add_scalar("eval/episodic_return", episodic_return, i)
    except RUN_ERRORS as e:  # a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
