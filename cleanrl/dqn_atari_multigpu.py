"""Data-parallel DQN for Atari with a sharded replay: N processes (GPUs, CPU groups, nodes) train one Q-network.

Launch:
    python cleanrl/dqn_atari_multigpu.py                                  # one process (= dqn_atari.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/dqn_atari_multigpu.py --num-envs 2 --batch-size 64
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=breakout cleanrl/dqn_atari_multigpu.py --num-envs 16 --batch-size 512
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 cleanrl/dqn_atari_multigpu.py --num-envs 2 --run-name r1
    tensorboard --logdir runs

Preprocessing (cleanrl_utils/atari_wrappers.py) is the standard one, as in ppo_atari.py: no-op
resets, 4-frame skip with max-pooling, 84x84 grayscale, episodic life, FIRE on reset, reward
clipping, a stack of 4 frames; ``charts/episodic_return`` is the raw game score.

Defaults are the Nature DQN / CleanRL settings (1M transitions of replay, 80k steps of pure
exploration, one gradient step of batch 32 every 4 env steps, a target copy every 1000 env steps,
epsilon 1 -> 0.01 over 10% of the run). Departures from CleanRL, and why: Double DQN targets
(``--no-double-q`` for CleanRL's) and the Huber loss (``--no-huber-loss`` for CleanRL's squared
error), which the Nature DQN uses too: they keep the Q-values from running away.

Replay memory (cleanrl_utils/buffers.py): only the newest 84x84 frame of each step is stored, so
1M transitions take 7.1 GB instead of the 56 GB of separate uint8 ``obs`` and ``next_obs`` stacks.
Stacks are rebuilt at sampling time and never reach across an episode start (a lost life starts
one). The arrays are reserved once at start (the run refuses to start if they do not fit in the
available memory) and the operating system commits their pages as they fill.

Data parallelism: each process (rank) steps its own share of the envs into its own shard of the
replay and samples its share of every minibatch from it; the ranks keep one Q-network by averaging
gradients with one all_reduce of a flat buffer per gradient step, and the target network, a copy of
that common Q-network, is identical on every rank too. With one rank per node every node added
divides the replay memory per node: sharding is what lets 1M Atari transitions spread over a cluster.

Sizes: ``--num-envs`` (or CleanRL-style ``--local-num-envs`` per rank), ``--buffer-size``,
``--batch-size``, ``--total-timesteps``, ``--learning-starts``, ``--train-frequency`` and
``--target-network-frequency`` are global (summed over ranks), so a run with N ranks is dqn_atari.py
with the same flags: the same replay capacity, batch and gradient steps per env step. Each rank's
envs fill its shard at the same rate, so an equal share from each shard samples the whole replay.

Faults and checkpoints are cleanrl_utils/distributed.py's, as in ppo_atari_multigpu.py: a non-finite
gradient norm (checked after the all_reduce, so every rank decides the same) stops every rank naming
the last good checkpoint; rank 0 writes one file holding the networks once and every rank's env
state, RNG state, parameter digests and, with ``--checkpoint-buffer``, replay shard (gathered, so no
shared filesystem is needed; it costs one copy of the shards in rank 0's memory while writing).
A restarted torchrun attempt resumes from the newest checkpoint; Ctrl-C on any rank checkpoints all.
Reference figures: benchmark/replay_memory.sh.
"""

import os
import random
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import ale_py
import gymnasium as gym
import numpy as np
import psutil
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_positive, warn_if_no_learning
from cleanrl_utils.atari_wrappers import wrap_atari
from cleanrl_utils.buffers import ReplayBuffer, to_device
from cleanrl_utils.checkpoint import load_optimizer, rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks, check_devices, log_rank_stats, parameters_digest
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

gym.register_envs(ale_py)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i of rank r is seeded with seed + r * local_num_envs + i"""
    torch_deterministic: bool = True
    """if toggled, deterministic cuDNN and full fp32 matmuls; off: cuDNN autotuning and TF32 (GPUs)"""
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
    checkpoint_interval: int = 500_000
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
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (ALE), e.g. PongNoFrameskip-v4 or ALE/Pong-v5"""
    total_timesteps: int = 10_000_000
    """total env steps of the run, summed over envs (one step = 4 frames)"""
    num_envs: int | None = None
    """the number of parallel environments, summed over all ranks (default: local_num_envs x WORLD_SIZE)"""
    local_num_envs: int = 1
    """the number of parallel environments of each rank (give it or --num-envs)"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    anneal_lr: bool = False
    """if toggled, the learning rate decays linearly to 0 at total_timesteps"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions, summed over envs"""
    gamma: float = 0.99
    """the discount factor"""
    target_network_frequency: int = 1000
    """env steps (summed over envs) between target updates, as in CleanRL"""
    tau: float = 1.0
    """the target update: target <- (1 - tau) * target + tau * online (1.0: a copy, as in CleanRL)"""
    batch_size: int = 32
    """transitions per gradient step"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the final epsilon for exploration"""
    exploration_steps: int = 1_000_000
    """env steps (summed over envs) over which epsilon decays from start_e to end_e, whatever the budget"""
    exploration_fraction: float | None = None
    """if set, epsilon decays over this fraction of total_timesteps instead (CleanRL's schedule)"""
    learning_starts: int = 80_000
    """env steps (summed over envs) of pure exploration before learning starts"""
    train_frequency: int = 4
    """env steps (summed over envs) between training bursts"""
    gradient_steps: int = 1
    """gradient steps per training burst"""
    max_grad_norm: float = 10.0
    """the maximum norm of the gradient"""
    double_q: bool = True
    """if toggled, Double DQN: the online network picks the next action, the target network values it"""
    huber_loss: bool = True
    """if toggled, the Huber (smooth L1) TD loss; --no-huber-loss for CleanRL's squared error"""

    # Distributed arguments
    backend: Literal["nccl", "gloo"] | None = None
    """torch.distributed backend; None: nccl when CUDA is used, else gloo"""
    device_ids: list[int] | None = None
    """GPU of each local rank (local rank i uses device_ids[i]); None: GPU i for local rank i"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails"""
    grad_compression: Literal["none", "fp16", "bf16"] = "none"
    """precision of the flat gradient buffer on the wire (averaged and applied in fp32)"""

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "gamma", "max_grad_norm")


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency")
    require_positive(args, "threads", "gradient_steps", "target_network_frequency", "learning_rate")
    require_positive(args, "max_grad_norm", "exploration_steps", "dist_timeout")
    if args.exploration_fraction is not None and not 0.0 < args.exploration_fraction <= 1.0:
        fail(f"--exploration-fraction {args.exploration_fraction}: must be in (0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau}: must be in (0, 1]")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    for name in ("buffer_size", "batch_size"):
        if getattr(args, name) % ranks.world_size != 0:
            fail(
                f"--{name.replace('_', '-')} {getattr(args, name)}: must be a multiple of the processes "
                f"(WORLD_SIZE={ranks.world_size})"
            )
    if args.train_frequency % args.num_envs != 0:
        fail(f"--train-frequency {args.train_frequency}: must be a multiple of --num-envs {args.num_envs}")
    if args.buffer_size < args.num_envs * (FRAME_STACK + 2):
        fail(
            f"--buffer-size {args.buffer_size}: must hold at least {FRAME_STACK + 2} steps of every env "
            f"({args.num_envs * (FRAME_STACK + 2)})"
        )
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts}: must be at least --batch-size {args.batch_size}")
    warn_if_no_learning(args)
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    check_devices(args, ranks.local_world_size)
    if args.cudagraphs and not (args.compile and args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs: needs --compile and CUDA (torch.compile replays the policy step as a CUDA graph)")
    check_env_id(args.env_id, atari=True)
    # The replay is reserved in full at start: refuse now rather than be killed for memory hours later.
    need = (
        args.buffer_size // ranks.world_size * ranks.local_world_size * (84 * 84 + 16)
    )  # this node's shards
    available = psutil.virtual_memory().available
    if need > 0.9 * available:
        fail(
            f"--buffer-size {args.buffer_size}: this node's replay shards need {need / 1e9:.1f} GB, "
            f"this node has {available / 1e9:.1f} GB available"
        )


FRAME_STACK = 4


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str):
    """A thunk making Atari env ``idx`` with the standard preprocessing, wrapped in EnvSnapshot."""

    def thunk():
        # frameskip=1: AtariPreprocessing skips (max-pooled) frames and reads the grayscale screen itself
        if capture_video and idx == 0:
            env = gym.make(env_id, frameskip=1, obs_type="grayscale", render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir)
        else:
            env = gym.make(env_id, frameskip=1, obs_type="grayscale")
        return EnvSnapshot(wrap_atari(env))

    return thunk


class QNetwork(nn.Module):
    """The Nature-DQN CNN: 4 stacked 84x84 frames in, one value per action out."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(FRAME_STACK, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 512),
            nn.ReLU(),
            nn.Linear(512, n_actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # uint8 frames are stored and travel as bytes; change the layout while they are still
        # bytes (4x less memory traffic), then scale on the device.
        return self.network(x.contiguous(memory_format=torch.channels_last).float().div_(255.0))


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


def all_reduce_mean_(tensors: list[torch.Tensor], world_size: int, compression: str = "none") -> None:
    """Average ``tensors`` over all ranks, in place, with ONE all_reduce of a flat buffer.

    One collective instead of one per tensor: for the small tensors of an RL network the latency
    of each call, not the bytes, dominates. With compression the buffer travels as fp16 or bf16
    (half the bytes); it is divided by world_size *before* the sum, so fp16 cannot overflow, and
    the result is copied back into the fp32 tensors.
    """
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if compression == "none":
        dist.all_reduce(flat)
        flat /= world_size
    else:
        wire = flat.div_(world_size).to(torch.float16 if compression == "fp16" else torch.bfloat16)
        dist.all_reduce(wire)
        flat = wire.float()
    for t, chunk in zip(tensors, flat.split([t.numel() for t in tensors])):
        t.copy_(chunk.view_as(t))


def main() -> None:
    # RANK, LOCAL_RANK, WORLD_SIZE from torchrun (`python`: rank 0 of 1); rank 0 reads the checkpoint
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    device = ranks.device  # cuda:LOCAL_RANK (or --device-ids) with --cuda and a GPU, else the CPU
    world_size, distributed = ranks.world_size, ranks.distributed
    local_num_envs, local_batch_size = args.local_num_envs, args.batch_size // world_size
    exploration_steps = args.exploration_steps  # epsilon's decay, env steps
    if args.exploration_fraction is not None:  # CleanRL's: a share of the budget
        exploration_steps = int(args.exploration_fraction * args.total_timesteps)

    random.seed(args.seed + ranks.rank)
    np.random.seed(args.seed + ranks.rank)
    torch.manual_seed(args.seed + ranks.rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic  # autotuned kernels per (fixed) shape
    torch.set_float32_matmul_precision("highest" if args.torch_deterministic else "high")  # TF32 on GPUs
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    # ENV SETUP: this rank's envs
    env_seeds = [args.seed + ranks.rank * local_num_envs + i for i in range(local_num_envs)]
    capture = args.capture_video and ranks.is_main
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, capture, str(run_dir / "videos")) for i in range(local_num_envs)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the replay buffer relies on it
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(n_actions).to(device, memory_format=torch.channels_last)
    target_network = QNetwork(n_actions).to(device, memory_format=torch.channels_last).requires_grad_(False)
    if distributed:  # one set of initial weights: rank 0's
        for param in q_network.parameters():
            dist.broadcast(param.data, src=0)
    target_network.load_state_dict(q_network.state_dict())
    params = list(q_network.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(q_network, mode=mode) if args.compile else q_network
    loss_fn = torch.compile(td_loss) if args.compile else td_loss
    # This rank's shard: its own envs' transitions only, buffer_size / world_size of them.
    rb = ReplayBuffer(
        args.buffer_size // world_size,
        local_num_envs,
        obs_shape,
        (),
        np.uint8,
        np.int64,
        frame_stack=FRAME_STACK,
        seed=args.seed + ranks.rank,
    )

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
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

    # LOGGING SETUP: TensorBoard/W&B (rank 0), Ctrl-C, progress; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    env_time = 0.0
    inference_clock, learn_clock, comm_clock = (DeviceClock(device) for _ in range(3))  # CUDA events on a GPU
    episodes, loss, old_val = [], None, None  # loss, old_val: of the latest gradient step
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes (and stop-signal checks)
    num_steps = (args.total_timesteps - global_step) // args.num_envs
    try:
        for step in range(1, num_steps + 1):
            global_step += args.num_envs

            # ACT: epsilon-greedy, each rank its own draws; the network runs only where an env does not explore
            epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
            explore = np.random.random(local_num_envs) < epsilon
            actions = np.zeros(local_num_envs, dtype=np.int64)
            if not explore.all():
                with inference_clock, torch.inference_mode():
                    actions = act(to_device(next_obs, device)).argmax(dim=1).cpu().numpy()
            actions[explore] = np.random.randint(n_actions, size=int(explore.sum()))
            t0 = time.perf_counter()
            obs = next_obs
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            env_time += time.perf_counter() - t0

            # REPLAY: into this rank's shard; the step after an episode end only resets that env.
            rb.add(obs, actions, rewards, terminations, ~next_done)
            next_done = np.logical_or(terminations, truncations)
            episodes += [(global_step, *episode) for episode in finished_episodes(infos)]

            # UPDATE: each rank samples its share of the minibatch from its own shard; gradients are averaged.
            if global_step > first_learning_step and global_step % args.train_frequency == 0:
                frac = 1.0 - (global_step - args.num_envs) / args.total_timesteps if args.anneal_lr else 1.0
                # from args: a resume may change it
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
                with learn_clock:
                    # one draw for the whole burst; the target network, fixed within it, values it in one pass
                    burst = rb.sample_to(local_batch_size * args.gradient_steps, device)
                    with torch.no_grad():
                        burst["next_q_target"] = target_network(burst["next_obs"])
                    for i in range(args.gradient_steps):
                        batch = slice(i * local_batch_size, (i + 1) * local_batch_size)
                        data = {k: v[batch] for k, v in burst.items()}
                        loss, old_val = loss_fn(q_network, data, args.gamma, args.double_q, args.huber_loss)
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()
                        if distributed:
                            with comm_clock:
                                all_reduce_mean_([p.grad for p in params], world_size, args.grad_compression)
                        grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                        nan_guard.step(
                            optimizer, grad_norm, global_step
                        )  # all-reduced: every rank skips alike
            if global_step > first_learning_step and interval_crossed(
                global_step, args.num_envs, args.target_network_frequency
            ):
                polyak_update_(target_network, q_network, args.tau)  # identical on every rank

            # LOGGING: rank 0 logs the episodes and timings of every rank (and the NaN check: read here and
            # right before each checkpoint, not per gradient step).
            signum = ranks.agree_on_signal(run.stop.signum) if step % log_every == 0 else 0  # all ranks alike
            due = run.checkpoint_due(global_step, args.num_envs, step == num_steps, signum)
            if step % log_every == 0 or due:
                nan_guard.check(run.last_checkpoint, ranks.max)
            if step % log_every == 0:
                local_sps = run.sps(global_step) / world_size
                timings = {
                    "env_time": env_time,
                    "inference_time": inference_clock.read(),
                    "learn_time": learn_clock.read(),
                }
                gathered = ranks.gather(
                    {"episodes": episodes, "sps": local_sps, "comm_time": comm_clock.read(), **timings}
                )
                if ranks.is_main:
                    log_rank_stats(
                        run, gathered, global_step
                    )  # episodes, perf/SPS_rank<r>, the slowest timings
                    writer.add_scalar("charts/epsilon", epsilon, global_step)
                    writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                    writer.add_scalar("perf/replay_bytes_per_rank", rb.nbytes, global_step)
                    if loss is not None:
                        writer.add_scalar("losses/td_loss", loss.item(), global_step)
                        writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line
                episodes, env_time = [], 0.0

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            if due:
                state = {  # shared by the ranks
                    "model": q_network.state_dict(),
                    "target": target_network.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "global_step": global_step,
                }
                own = {  # this rank's part: everything else an exact resume needs (and its replay shard)
                    "rng": rng_state(),
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                    "env_seeds": env_seeds,
                    "parameters_sha256": [parameters_digest(q_network), parameters_digest(target_network)],
                }
                if args.checkpoint_buffer:
                    own["replay"] = rb.state_dict()
                path = run.save(state, global_step, own=own)  # rank 0 writes; all wait for it
                if signum:
                    run.exit_on_signal(signum, path, global_step)
    except RUN_ERRORS as e:  # a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    except RuntimeError as e:  # a collective that failed: name the rank that stopped answering
        ranks.exit_on_lost_rank(e, global_step, run.last_checkpoint)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
