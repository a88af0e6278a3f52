"""Data-parallel DQN for Atari with a sharded replay: N processes (one per GPU, or per CPU group) train one Q-network.

Each process (rank) steps its own share of the envs into its own shard of the replay
(buffer_size / world size transitions), samples its share of every minibatch from that shard, and
the ranks keep a single Q-network by averaging gradients with one all_reduce of a flat buffer per
gradient step. The target network is a copy of that common Q-network, so it is identical on every
rank too. Each rank holds buffer_size / world size transitions, so with one rank per node every
node added divides the replay memory per node: sharding is what lets a replay of 1M Atari
transitions (7.1 GB here) spread over a cluster.

Launch:
    python cleanrl/dqn_atari_multigpu.py                                  # one process (= dqn_atari.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/dqn_atari_multigpu.py --num-envs 2 --batch-size 64
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=breakout cleanrl/dqn_atari_multigpu.py --num-envs 16 --batch-size 512
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 cleanrl/dqn_atari_multigpu.py --num-envs 2 --run-name r1

Sizes: ``--num-envs``, ``--buffer-size``, ``--batch-size``, ``--total-timesteps``,
``--learning-starts`` and ``--train-frequency`` are global (summed over ranks), so a run with N
ranks is the same algorithm as dqn_atari.py with the same flags: the same replay capacity, batch
and gradient steps per env step, with the sampling split over the shards. Each rank's envs fill
its shard at the same rate, so sampling an equal share from each shard is uniform over the whole
replay.

Faults and checkpoints are handled as in ppo_atari_multigpu.py: a non-finite gradient norm (checked
after the all_reduce, so every rank decides the same) stops every rank naming the last good
checkpoint; rank 0 writes one file holding the model once and every rank's env state, RNG state,
parameter digest and, with ``--checkpoint-buffer``, replay shard (gathered over the process group, so
no shared filesystem is needed; it costs one copy of the shards in rank 0's memory while writing).
A restarted torchrun attempt resumes from the newest checkpoint; Ctrl-C on any rank checkpoints all.
Reference figures: benchmark/replay_memory.sh.
"""

import dataclasses
import datetime
import hashlib
import multiprocessing
import os
import random
import signal
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ale_py
import gymnasium as gym
import numpy as np
import psutil
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import tyro
from gymnasium.vector import AutoresetMode
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.atari_wrappers import wrap_atari
from cleanrl_utils.buffers import ReplayBuffer
from cleanrl_utils.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from cleanrl_utils.envs import EnvSnapshot, get_vector_state, set_vector_state
from cleanrl_utils.monitor import Progress, ResourceMonitor

gym.register_envs(ale_py)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i of rank r is seeded with seed + r * local_num_envs + i"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, train on CUDA when available"""
    threads: int | None = None
    """torch intra-op threads per process (None: torch's default; torchrun sets OMP_NUM_THREADS=1)"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanrl"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into runs/<run-name>/videos"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<torchrun run id or unix time>"""
    checkpoint_interval: int = 500_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    checkpoint_buffer: bool = False
    """if toggled, checkpoints also hold every rank's replay shard (exact resume, larger files)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest checkpoint); the saved Args are used"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (ALE), e.g. PongNoFrameskip-v4 or ALE/Pong-v5"""
    total_timesteps: int = 10_000_000
    """total env steps of the run, summed over all envs of all ranks (one step = 4 frames)"""
    num_envs: int = 1
    """the number of parallel environments, summed over all ranks (each rank runs num_envs / world size)"""
    learning_rate: float = 1e-4
    """the learning rate of the optimizer"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions, summed over all ranks (each rank holds a shard of buffer_size / world size)"""
    gamma: float = 0.99
    """the discount factor"""
    target_network_frequency: int = 250
    """gradient steps between copies of the Q-network into the target network"""
    batch_size: int = 32
    """transitions per gradient step, summed over all ranks (each rank samples batch_size / world size from its shard)"""
    start_e: float = 1.0
    """the starting epsilon for exploration"""
    end_e: float = 0.01
    """the final epsilon for exploration"""
    exploration_fraction: float = 0.10
    """the fraction of total_timesteps over which epsilon decays from start_e to end_e"""
    learning_starts: int = 80_000
    """env steps (summed over all ranks) of pure exploration before learning starts"""
    train_frequency: int = 4
    """env steps (summed over all ranks) between training bursts"""
    gradient_steps: int = 1
    """gradient steps per training burst"""
    max_grad_norm: float = 10.0
    """the maximum norm of the gradient"""
    double_q: bool = True
    """if toggled, Double DQN: the online network picks the next action, the target network values it"""

    # Distributed arguments
    backend: Literal["nccl", "gloo"] | None = None
    """torch.distributed backend; None: nccl when CUDA is used, else gloo"""
    device_ids: list[int] | None = None
    """GPU of each local rank (local rank i uses device_ids[i]); None: GPU i for local rank i"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails"""
    grad_compression: Literal["none", "fp16", "bf16"] = "none"
    """precision of the flat gradient buffer on the wire (averaged and applied in fp32)"""


def validate(args: Args, world_size: int, local_world_size: int) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work.

    Every rank runs this on the same input, so every rank exits; only rank 0 prints.
    """
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "train_frequency", "gradient_steps")
    for name in positive + ("target_network_frequency", "threads"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    for name in ("learning_rate", "max_grad_norm", "exploration_fraction", "dist_timeout"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    for name in ("num_envs", "buffer_size", "batch_size"):
        if getattr(args, name) % world_size != 0:
            fail(
                f"--{name.replace('_', '-')} {getattr(args, name)}: must be a multiple of the number of processes "
                f"(WORLD_SIZE={world_size})"
            )
    if args.train_frequency % args.num_envs != 0:
        fail(f"--train-frequency {args.train_frequency}: must be a multiple of --num-envs {args.num_envs}")
    cuda = args.cuda and torch.cuda.is_available()
    if args.backend == "nccl" and not cuda:
        fail("--backend nccl: needs CUDA (use gloo on CPUs)")
    if cuda and args.device_ids is not None and len(args.device_ids) < local_world_size:
        fail(f"--device-ids {args.device_ids}: needs one GPU per local process (LOCAL_WORLD_SIZE={local_world_size})")
    if cuda and args.device_ids is None and torch.cuda.device_count() < local_world_size:
        fail(
            f"{local_world_size} processes on this node but only {torch.cuda.device_count()} GPUs (use --device-ids or --no-cuda)"
        )
    if args.buffer_size < args.num_envs * (FRAME_STACK + 2):
        fail(
            f"--buffer-size {args.buffer_size}: must hold at least {FRAME_STACK + 2} steps of every env "
            f"({args.num_envs * (FRAME_STACK + 2)})"
        )
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts}: must be at least --batch-size {args.batch_size}")
    if args.total_timesteps <= args.learning_starts:
        fail(f"--total-timesteps {args.total_timesteps}: must exceed --learning-starts {args.learning_starts}")
    if args.checkpoint_interval < 0 or args.checkpoint_interval % args.num_envs != 0:
        fail(
            f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0 and a multiple of --num-envs {args.num_envs}"
        )
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        fail(f"--env-id {args.env_id}: not a registered gymnasium environment ({e})")
    if not str(spec.entry_point).startswith("ale_py"):
        fail(f"--env-id {args.env_id}: not an Atari (ALE) environment")
    # The replay is reserved in full at start: refuse now rather than be killed for memory hours later.
    need = args.buffer_size // world_size * local_world_size * (84 * 84 + 16)  # the shards of this node
    available = psutil.virtual_memory().available
    if need > 0.9 * available:
        fail(
            f"--buffer-size {args.buffer_size}: this node's replay shards need {need / 1e9:.1f} GB, "
            f"this node has {available / 1e9:.1f} GB available"
        )


def fail(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # one line for the user, not one per rank
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


FRAME_STACK = 4


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str):
    def thunk():
        if multiprocessing.parent_process() is not None:
            # An async worker: Ctrl-C is for the main process, which checkpoints and stops us.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # frameskip=1: AtariPreprocessing skips frames (with max-pooling) and reads the screen from
        # the emulator itself, so the base env's own per-frame copy is kept small (grayscale).
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


class StopRequested:
    """Turns SIGINT/SIGTERM into a flag checked once per iteration, so the run can checkpoint and exit."""

    def __init__(self):
        self.signum: int | None = None
        self.first_at = 0.0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        # A second Ctrl-C stops at once. One within a second of the first is the same Ctrl-C arriving
        # twice: the terminal signals the whole process group, and torchrun forwards it as well.
        if self.signum is None:
            self.signum, self.first_at = signum, time.monotonic()
        elif time.monotonic() - self.first_at > 1.0:
            raise KeyboardInterrupt


def init_distributed(backend: str, timeout: datetime.timedelta, device: torch.device) -> None:
    """Join the process group that torchrun describes in RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    The store is built here instead of by ``init_method="env://"`` so that it can carry a prefix per
    attempt: after a failed worker, torchrun restarts every worker but keeps its store, and without
    the prefix the new ranks read the dead ranks' addresses and gloo's connectFullMesh is refused
    (pytorch/pytorch#135712).
    """
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts it
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,
        timeout=timeout,
        multi_tenant=not agent_store,
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"attempt{attempt}", store),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if backend == "nccl" else None,
    )


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


def parameters_digest(module: nn.Module) -> str:
    """SHA-256 of the parameters' bytes: equal on all ranks exactly when the models are identical."""
    digest = hashlib.sha256()
    for p in module.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = tyro.cli(Args)
    # torchrun sets these; a plain `python` launch is rank 0 of 1 and never starts a process group.
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    distributed = "RANK" in os.environ
    validate(args, world_size, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))

    is_main = rank == 0  # rank 0 alone logs, records video and reads/writes checkpoints
    cuda = args.cuda and torch.cuda.is_available()
    device = (
        torch.device("cuda", args.device_ids[local_rank] if args.device_ids else local_rank)
        if cuda
        else torch.device("cpu")
    )
    if cuda:
        torch.cuda.set_device(device)
    if distributed:
        init_distributed(
            args.backend or ("nccl" if cuda else "gloo"), datetime.timedelta(seconds=args.dist_timeout), device
        )

    # RESUME: rank 0 picks the run directory and the checkpoint and hands each rank its part.
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    plan: list = [None, None, False]  # error, run name, resuming?
    parts = None  # on rank 0 when resuming: what each rank restores
    if is_main:
        # The default name is stable across torchrun restarts (same run id), so restarts find the checkpoints.
        stamp = os.environ.get("TORCHELASTIC_RUN_ID", str(int(time.time())))
        plan[1] = args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp}"
        try:
            found = list_checkpoints(Path("runs") / plan[1] / "checkpoints")
            path = resolve_resume(args.resume) if args.resume else (found[-1] if found and restart > 0 else None)
            if path is None and found:
                raise CheckpointError(
                    f"runs/{plan[1]} holds checkpoints: pass --resume runs/{plan[1]} or another --run-name"
                )
            if path is not None:
                saved = load_checkpoint(path)
                if saved["world_size"] != world_size:
                    raise CheckpointError(
                        f"checkpoint {path} was written by {saved['world_size']} processes, this run has {world_size}"
                    )
                plan[1], plan[2] = saved["run_name"], True
                shared = {k: v for k, v in saved.items() if k != "ranks"}
                parts = [{**shared, **own} for own in saved["ranks"]]
                print(f"resuming from {path}", file=sys.stderr)
        except CheckpointError as e:
            plan[0] = str(e)
    if distributed:
        dist.broadcast_object_list(plan, src=0)
    error, run_name, resuming = plan
    if error is not None:
        fail(error)
    checkpoint = None
    if resuming and distributed:
        received = [None]
        dist.scatter_object_list(received, parts, src=0)
        checkpoint = received[0]
    elif resuming:
        checkpoint = parts[0]
    if checkpoint is not None:  # the saved algorithm settings win; the machine-related ones are this launch's
        machine = ("cuda", "threads", "backend", "device_ids", "dist_timeout", "progress", "resume")
        args = Args(**{**checkpoint["args"], **{k: getattr(args, k) for k in machine}})
    run_dir = Path("runs") / run_name

    local_num_envs = args.num_envs // world_size
    local_batch_size = args.batch_size // world_size

    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    # ENV SETUP: env i of rank r is seeded seed + r * local_num_envs + i, so no two envs share a seed.
    env_seeds = [args.seed + rank * local_num_envs + i for i in range(local_num_envs)]
    capture = args.capture_video and is_main
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, capture, str(run_dir / "videos")) for i in range(local_num_envs)],
        autoreset_mode=AutoresetMode.NEXT_STEP,
    )
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP, "the replay buffer assumes next-step autoreset"
    obs_shape = envs.single_observation_space.shape
    n_actions = int(envs.single_action_space.n)

    q_network = QNetwork(n_actions).to(device, memory_format=torch.channels_last)
    if distributed:  # one set of initial weights: rank 0's
        for param in q_network.parameters():
            dist.broadcast(param.data, src=0)
    target_network = QNetwork(n_actions).to(device, memory_format=torch.channels_last)
    target_network.load_state_dict(q_network.state_dict())
    params = list(q_network.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, fused=True)
    # This rank's shard: its own envs' transitions only, buffer_size / world_size of them.
    rb = ReplayBuffer(
        args.buffer_size // world_size,
        local_num_envs,
        obs_shape,
        (),
        np.uint8,
        np.int64,
        frame_stack=FRAME_STACK,
        seed=args.seed + rank,
    )

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
    global_step, gradient_steps, wandb_id = 0, 0, None
    if checkpoint is not None:
        q_network.load_state_dict(checkpoint["model"])
        target_network.load_state_dict(checkpoint["target"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
        global_step, gradient_steps = checkpoint["global_step"], checkpoint["gradient_steps"]
        wandb_id = checkpoint["wandb_id"]
        if "replay" in checkpoint:
            rb.load_state_dict(checkpoint["replay"])
    start_step = global_step
    # without a saved replay, a resumed run refills its shards before learning again
    first_learning_step = args.learning_starts if "replay" in (checkpoint or {}) else start_step + args.learning_starts

    # LOGGING SETUP (rank 0; the run directory exists only from here on)
    writer = None
    if is_main:
        if args.track:
            import wandb

            wandb_id = wandb_id or uuid.uuid4().hex[:12]  # kept in checkpoints so --resume continues the W&B run
            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config={**dataclasses.asdict(args), "world_size": world_size},
                name=run_name,
                id=wandb_id,
                resume="allow",
                dir=str(run_dir),
                save_code=True,
            )
        writer = SummaryWriter(str(run_dir), purge_step=global_step if checkpoint is not None else None)
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items()),
        )

    def gather_to_main(obj):
        """Every rank's ``obj``, as a list on rank 0 (None elsewhere)."""
        if not distributed:
            return [obj]
        out = [None] * world_size if is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def write_checkpoint() -> Path | None:
        """Collective: every rank hands rank 0 its env, RNG and replay state; rank 0 writes one file."""
        own = {
            "rng": rng_state(),
            "envs": get_vector_state(envs),
            "next_obs": torch.from_numpy(np.array(next_obs)),
            "next_done": torch.from_numpy(next_done.copy()),
            "env_seeds": env_seeds,
            "parameters_sha256": parameters_digest(q_network),
            "target_sha256": parameters_digest(target_network),
        }
        if args.checkpoint_buffer:
            own["replay"] = rb.state_dict()
        ranks = gather_to_main(own)
        if not is_main:
            return None
        if len({(r["parameters_sha256"], r["target_sha256"]) for r in ranks}) != 1:
            raise RuntimeError(f"ranks hold different networks at step {global_step}; not checkpointing")
        state = {
            "model": q_network.state_dict(),
            "target": target_network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "args": dataclasses.asdict(args),
            "run_name": run_name,
            "world_size": world_size,
            "global_step": global_step,
            "gradient_steps": gradient_steps,
            "wandb_id": wandb_id,
            "ranks": ranks,
        }
        return save_checkpoint(state, run_dir / "checkpoints", global_step)

    stop = StopRequested()
    progress = Progress(args.total_timesteps, global_step, description=run_name, enabled=args.progress and is_main)
    monitor = ResourceMonitor(device)
    recent_returns: deque[float] = deque(maxlen=20)
    start_time = time.perf_counter()
    env_time = inference_time = learn_time = comm_time = 0.0
    episodes = []
    loss = old_val = None  # of the latest gradient step
    last_checkpoint: Path | None = None
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes (and stop-signal checks)
    try:
        for step in range(1, (args.total_timesteps - global_step) // args.num_envs + 1):
            global_step += args.num_envs

            # ACT: epsilon-greedy (each rank draws its own exploration)
            t0 = time.perf_counter()
            epsilon = linear_schedule(
                args.start_e, args.end_e, int(args.exploration_fraction * args.total_timesteps), global_step
            )
            with torch.inference_mode():
                q_values = q_network(torch.as_tensor(next_obs, device=device))
            actions = q_values.argmax(dim=1).cpu().numpy()
            explore = np.random.random(local_num_envs) < epsilon
            actions[explore] = np.random.randint(n_actions, size=int(explore.sum()))
            t1 = time.perf_counter()
            obs = next_obs
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            t2 = time.perf_counter()
            inference_time, env_time = inference_time + t1 - t0, env_time + t2 - t1

            # REPLAY: into this rank's shard; the step after an episode end only resets that env.
            rb.add(obs, actions, rewards, terminations, ~next_done)
            next_done = np.logical_or(terminations, truncations)
            if "_episode" in infos:
                for i in np.flatnonzero(infos["_episode"]):
                    episodes.append((global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))

            # UPDATE: each rank samples its share of the minibatch from its own shard; gradients are averaged.
            if global_step > first_learning_step and global_step % args.train_frequency == 0:
                t0 = time.perf_counter()
                for _ in range(args.gradient_steps):
                    data = {k: torch.as_tensor(v, device=device) for k, v in rb.sample(local_batch_size).items()}
                    with torch.no_grad():
                        next_q_online = q_network(data["next_obs"]) if args.double_q else None
                        target = td_target(
                            data["rewards"],
                            target_network(data["next_obs"]),
                            next_q_online,
                            data["terminations"].float(),
                            args.gamma,
                        )
                    old_val = q_network(data["obs"]).gather(1, data["actions"].unsqueeze(1)).squeeze(1)
                    loss = F.smooth_l1_loss(old_val, target)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if distributed:
                        t1 = time.perf_counter()
                        all_reduce_mean_([p.grad for p in params], world_size, args.grad_compression)
                        comm_time += time.perf_counter() - t1
                    grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                    if not torch.isfinite(grad_norm):  # after the all_reduce: every rank decides the same
                        raise FloatingPointError(
                            f"non-finite gradient norm at step {global_step}; "
                            f"last good checkpoint: {last_checkpoint or 'none'}"
                        )
                    optimizer.step()
                    gradient_steps += 1
                    if gradient_steps % args.target_network_frequency == 0:
                        target_network.load_state_dict(q_network.state_dict())  # identical on every rank
                learn_time += time.perf_counter() - t0

            # LOGGING: rank 0 logs the episodes and timings of every rank.
            if step % log_every == 0:
                local_sps = local_num_envs * step / (time.perf_counter() - start_time)
                gathered = gather_to_main((episodes, local_sps, env_time, inference_time, learn_time, comm_time))
                if is_main:
                    for r, (rank_episodes, rank_sps, *_times) in enumerate(gathered):
                        writer.add_scalar(f"perf/SPS_rank{r}", rank_sps, global_step)
                        for step_at, episodic_return, episodic_length in rank_episodes:
                            recent_returns.append(episodic_return)
                            writer.add_scalar("charts/episodic_return", episodic_return, step_at)
                            writer.add_scalar("charts/episodic_length", episodic_length, step_at)
                    sps = (global_step - start_step) / (time.perf_counter() - start_time)
                    writer.add_scalar("charts/SPS", sps, global_step)
                    writer.add_scalar("charts/epsilon", epsilon, global_step)
                    writer.add_scalar("charts/learning_rate", args.learning_rate, global_step)
                    writer.add_scalar("perf/env_time", max(g[2] for g in gathered), global_step)
                    writer.add_scalar("perf/inference_time", max(g[3] for g in gathered), global_step)
                    writer.add_scalar("perf/learn_time", max(g[4] for g in gathered), global_step)
                    writer.add_scalar("perf/comm_time", max(g[5] for g in gathered), global_step)
                    writer.add_scalar("perf/replay_bytes_per_rank", rb.nbytes, global_step)
                    if loss is not None:
                        writer.add_scalar("losses/td_loss", loss.item(), global_step)
                        writer.add_scalar("losses/q_values", old_val.mean().item(), global_step)
                    for name, value in monitor.sample().items():
                        writer.add_scalar(f"perf/{name}", value, global_step)
                    progress.update(global_step, sps, np.mean(recent_returns) if recent_returns else None)
                episodes = []
                env_time = inference_time = learn_time = comm_time = 0.0

                # A signal on any rank stops every rank at this same step.
                signum = torch.tensor([stop.signum or 0], device=device)
                if distributed:
                    dist.all_reduce(signum, op=dist.ReduceOp.MAX)
                if signum.item():
                    path = write_checkpoint()
                    if is_main:
                        print(
                            f"stopped by signal {signum.item()} at step {global_step}; checkpoint {path}",
                            file=sys.stderr,
                        )
                    raise SystemExit(128 + int(signum.item()))

            # CHECKPOINT
            if (
                args.checkpoint_interval
                and global_step % args.checkpoint_interval == 0
                and global_step < args.total_timesteps
            ):
                last_checkpoint = write_checkpoint()
        write_checkpoint()
        if distributed:
            dist.destroy_process_group()
    except FloatingPointError as e:
        if is_main:  # raised on every rank alike
            print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        progress.close()
        envs.close()
        if writer is not None:
            writer.close()
        if is_main and args.track:
            wandb.finish()


if __name__ == "__main__":
    main()
