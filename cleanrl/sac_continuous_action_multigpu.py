"""Data-parallel SAC with a sharded replay: N processes (one per GPU, or per CPU group) train one agent.

Each process (rank) steps its own share of the envs into its own shard of the replay
(buffer_size / world size transitions) and samples its share of every minibatch from that shard.
The ranks keep one actor, one pair of critics and one temperature by averaging gradients: one
all_reduce of a flat buffer for the critics' step, one for the actor's and temperature's. The
target critics are Polyak averages of identical critics, so they stay identical on every rank.

Launch:
    python cleanrl/sac_continuous_action_multigpu.py                       # one process (= sac_continuous_action.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/sac_continuous_action_multigpu.py --num-envs 2 --batch-size 512
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=cheetah cleanrl/sac_continuous_action_multigpu.py --num-envs 16 --batch-size 4096

Sizes: ``--num-envs``, ``--buffer-size``, ``--batch-size``, ``--total-timesteps`` and
``--learning-starts`` are global (summed over ranks): N ranks run the same algorithm as
sac_continuous_action.py with the same flags (one update per vector step of all ranks' envs),
with sampling split over the shards. With more ranks, raise ``--num-envs`` and ``--batch-size``
together to keep the update-to-data ratio.

Faults and checkpoints as in dqn_atari_multigpu.py: a non-finite loss (all-reduced, so every rank
decides the same) stops every rank; rank 0 writes one file with the networks once and every rank's
env state, RNG states, parameter digests and, with ``--checkpoint-buffer``, replay shard.
Reference figures: benchmark/replay_memory.sh.
"""

import dataclasses
import datetime
import hashlib
import importlib
import math
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

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import tyro
from gymnasium.vector import AutoresetMode
from torch.utils.tensorboard import SummaryWriter

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
    checkpoint_interval: int = 100_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    checkpoint_buffer: bool = False
    """if toggled, checkpoints also hold every rank's replay shard (exact resume, larger files)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest checkpoint); the saved Args are used"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""

    # Algorithm specific arguments
    env_id: str = "HalfCheetah-v4"
    """the id of the gymnasium environment (Box actions and observations)"""
    total_timesteps: int = 1_000_000
    """total env steps of the run, summed over all envs of all ranks"""
    num_envs: int = 1
    """the number of parallel environments, summed over all ranks (each rank runs num_envs / world size)"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions, summed over all ranks (each rank holds a shard of buffer_size / world size)"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 0.005
    """target smoothing coefficient (Polyak averaging per update)"""
    batch_size: int = 256
    """transitions per gradient step, summed over all ranks (each rank samples batch_size / world size from its shard)"""
    learning_starts: int = 5_000
    """env steps (summed over all ranks) of uniform random actions before learning starts"""
    policy_lr: float = 3e-4
    """the learning rate of the actor and the temperature"""
    q_lr: float = 1e-3
    """the learning rate of the Q-networks"""
    policy_frequency: int = 2
    """critic updates between actor updates (the actor then takes this many steps: TD3's delay)"""
    target_network_frequency: int = 1
    """critic updates between Polyak updates of the target networks"""
    alpha: float = 0.2
    """entropy temperature (the initial one with --autotune)"""
    autotune: bool = True
    """if toggled, tune the temperature towards the target entropy -dim(A)"""

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
    positive = ("total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency", "threads")
    for name in positive + ("target_network_frequency",):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    for name in ("policy_lr", "q_lr", "alpha", "dist_timeout"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau}: must be in (0, 1]")
    for name in ("num_envs", "buffer_size", "batch_size"):
        if getattr(args, name) % world_size != 0:
            fail(
                f"--{name.replace('_', '-')} {getattr(args, name)}: must be a multiple of the number of processes "
                f"(WORLD_SIZE={world_size})"
            )
    cuda = args.cuda and torch.cuda.is_available()
    if args.backend == "nccl" and not cuda:
        fail("--backend nccl: needs CUDA (use gloo on CPUs)")
    if cuda and args.device_ids is not None and len(args.device_ids) < local_world_size:
        fail(f"--device-ids {args.device_ids}: needs one GPU per local process (LOCAL_WORLD_SIZE={local_world_size})")
    if cuda and args.device_ids is None and torch.cuda.device_count() < local_world_size:
        fail(
            f"{local_world_size} processes on this node but only {torch.cuda.device_count()} GPUs (use --device-ids or --no-cuda)"
        )
    if args.buffer_size < args.num_envs * 3:
        fail(f"--buffer-size {args.buffer_size}: must hold at least 3 steps of every env ({args.num_envs * 3})")
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts}: must be at least --batch-size {args.batch_size}")
    if args.total_timesteps <= args.learning_starts:
        fail(f"--total-timesteps {args.total_timesteps}: must exceed --learning-starts {args.learning_starts}")
    if args.checkpoint_interval < 0 or args.checkpoint_interval % args.num_envs != 0:
        fail(
            f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0 and a multiple of --num-envs {args.num_envs}"
        )
    module, _, env_name = args.env_id.rpartition(":")
    try:
        if module:  # "package.module:Env-v0" registers a custom env on import, as gym.make does
            importlib.import_module(module)
        gym.spec(env_name)
    except (ImportError, gym.error.Error) as e:
        fail(f"--env-id {args.env_id}: not a registered gymnasium environment ({e})")


def fail(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # one line for the user, not one per rank
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str):
    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir)
        else:
            env = gym.make(env_id)
        return EnvSnapshot(gym.wrappers.FlattenObservation(env))

    return thunk


class SoftQNetwork(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim + action_dim, 256),
            nn.ReLU(),
            nn.Linear(256, 256),
            nn.ReLU(),
            nn.Linear(256, 1),
        )

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.network(torch.cat([obs, action], dim=1)).squeeze(1)


LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Actor(nn.Module):
    """A Gaussian policy squashed by tanh into the action box [low, high]."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        action_dim = len(action_low)
        self.trunk = nn.Sequential(nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.mean = nn.Linear(256, action_dim)
        self.log_std = nn.Linear(256, action_dim)
        low, high = torch.as_tensor(action_low, dtype=torch.float32), torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability (with the tanh correction) and the deterministic action."""
        hidden = self.trunk(obs)
        mean = self.mean(hidden)
        # a smooth squash of log_std into [LOG_STD_MIN, LOG_STD_MAX] keeps its gradient alive
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(self.log_std(hidden)) + 1)
        std = log_std.exp()
        u = mean + std * torch.randn_like(mean)  # reparameterised sample
        y = torch.tanh(u)
        gaussian_log_prob = (-0.5 * ((u - mean) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(1)
        # change of variables a = scale * tanh(u) + bias; log(1 - tanh(u)^2) in a stable form
        log_det = (torch.log(self.action_scale) + 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(1)
        action = y * self.action_scale + self.action_bias
        return action, gaussian_log_prob - log_det, torch.tanh(mean) * self.action_scale + self.action_bias


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


@torch.no_grad()
def polyak_update_(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place, one fused op over all tensors."""
    torch._foreach_lerp_(list(target.parameters()), list(source.parameters()), tau)


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
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP, "the replay buffer assumes next-step autoreset"
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a continuous (Box) action space, got {envs.single_action_space}")
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    action_shape = envs.single_action_space.shape
    low, high = envs.single_action_space.low, envs.single_action_space.high
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a bounded action space, got {envs.single_action_space}")
    envs.single_action_space.seed(args.seed + rank)

    actor = Actor(obs_dim, low, high).to(device)
    qf1, qf2 = SoftQNetwork(obs_dim, action_shape[0]).to(device), SoftQNetwork(obs_dim, action_shape[0]).to(device)
    target_entropy = -float(np.prod(action_shape))
    log_alpha = torch.tensor([math.log(args.alpha)], device=device, requires_grad=True)
    if distributed:  # one set of initial weights: rank 0's
        for param in [*actor.parameters(), *qf1.parameters(), *qf2.parameters()]:
            dist.broadcast(param.data, src=0)
    qf1_target = SoftQNetwork(obs_dim, action_shape[0]).to(device).requires_grad_(False)
    qf2_target = SoftQNetwork(obs_dim, action_shape[0]).to(device).requires_grad_(False)
    qf1_target.load_state_dict(qf1.state_dict())
    qf2_target.load_state_dict(qf2.state_dict())
    q_params = [*qf1.parameters(), *qf2.parameters()]
    # the actor's and the temperature's gradients travel in one buffer
    actor_params = [*actor.parameters(), log_alpha] if args.autotune else list(actor.parameters())
    q_optimizer = torch.optim.Adam(q_params, lr=args.q_lr, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True)
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.policy_lr)
    alpha = args.alpha
    # This rank's shard: its own envs' transitions only, buffer_size / world_size of them.
    rb = ReplayBuffer(
        args.buffer_size // world_size,
        local_num_envs,
        (obs_dim,),
        action_shape,
        np.float32,
        np.float32,
        seed=args.seed + rank,
    )

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
    global_step, updates, wandb_id = 0, 0, None
    if checkpoint is not None:
        actor.load_state_dict(checkpoint["actor"])
        for net, key in ((qf1, "qf1"), (qf2, "qf2"), (qf1_target, "qf1_target"), (qf2_target, "qf2_target")):
            net.load_state_dict(checkpoint[key])
        q_optimizer.load_state_dict(checkpoint["q_optimizer"])
        actor_optimizer.load_state_dict(checkpoint["actor_optimizer"])
        a_optimizer.load_state_dict(checkpoint["a_optimizer"])
        with torch.no_grad():
            log_alpha.copy_(checkpoint["log_alpha"])
        alpha = log_alpha.exp().item() if args.autotune else args.alpha
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        envs.single_action_space.np_random.bit_generator.state = checkpoint["action_space_rng"]
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
        global_step, updates, wandb_id = checkpoint["global_step"], checkpoint["updates"], checkpoint["wandb_id"]
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
            "action_space_rng": envs.single_action_space.np_random.bit_generator.state,
            "envs": get_vector_state(envs),
            "next_obs": torch.from_numpy(np.array(next_obs)),
            "next_done": torch.from_numpy(next_done.copy()),
            "env_seeds": env_seeds,
            "parameters_sha256": [parameters_digest(net) for net in (actor, qf1, qf2, qf1_target, qf2_target)],
        }
        if args.checkpoint_buffer:
            own["replay"] = rb.state_dict()
        ranks = gather_to_main(own)
        if not is_main:
            return None
        if len({tuple(r["parameters_sha256"]) for r in ranks}) != 1:
            raise RuntimeError(f"ranks hold different networks at step {global_step}; not checkpointing")
        state = {
            "actor": actor.state_dict(),
            "qf1": qf1.state_dict(),
            "qf2": qf2.state_dict(),
            "qf1_target": qf1_target.state_dict(),
            "qf2_target": qf2_target.state_dict(),
            "q_optimizer": q_optimizer.state_dict(),
            "actor_optimizer": actor_optimizer.state_dict(),
            "a_optimizer": a_optimizer.state_dict(),
            "log_alpha": log_alpha.detach().cpu(),
            "args": dataclasses.asdict(args),
            "run_name": run_name,
            "world_size": world_size,
            "global_step": global_step,
            "updates": updates,
            "wandb_id": wandb_id,
            "ranks": ranks,
        }
        return save_checkpoint(state, run_dir / "checkpoints", global_step)

    def synced_step(loss: torch.Tensor, params: list[torch.Tensor], optimizers: list[torch.optim.Optimizer]) -> float:
        """Backward, average the gradients over ranks (one flat buffer), then step; returns seconds spent communicating."""
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t0 = time.perf_counter()
        if distributed:
            all_reduce_mean_([p.grad for p in params], world_size, args.grad_compression)
        spent = time.perf_counter() - t0
        for optimizer in optimizers:
            optimizer.step()
        return spent

    stop = StopRequested()
    progress = Progress(args.total_timesteps, global_step, description=run_name, enabled=args.progress and is_main)
    monitor = ResourceMonitor(device)
    recent_returns: deque[float] = deque(maxlen=20)
    start_time = time.perf_counter()
    env_time = inference_time = learn_time = comm_time = 0.0
    episodes = []
    last_checkpoint: Path | None = None
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes (and stop-signal checks)
    qf_loss = actor_loss = qf1_values = qf2_values = torch.zeros((), device=device)  # of the latest update

    def check_finite() -> None:
        """At logging and checkpoint time; the losses are all-reduced so every rank decides the same."""
        losses = torch.stack([qf_loss.detach(), actor_loss.detach()]).reshape(2)
        if distributed:
            all_reduce_mean_([losses], world_size)
        if not torch.isfinite(losses).all():
            raise FloatingPointError(
                f"non-finite loss at step {global_step}; last good checkpoint: {last_checkpoint or 'none'}"
            )

    try:
        for step in range(1, (args.total_timesteps - global_step) // args.num_envs + 1):
            global_step += args.num_envs

            # ACT: uniform actions until learning starts, then samples of the policy
            t0 = time.perf_counter()
            if global_step <= first_learning_step:
                actions = np.stack([envs.single_action_space.sample() for _ in range(local_num_envs)])
            else:
                with torch.inference_mode():
                    actions, _, _ = actor(torch.as_tensor(next_obs, dtype=torch.float32, device=device))
                actions = actions.cpu().numpy()
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
            if global_step > first_learning_step:
                t0 = time.perf_counter()
                data = {k: torch.as_tensor(v, device=device) for k, v in rb.sample(local_batch_size).items()}
                with torch.no_grad():
                    next_actions, next_log_prob, _ = actor(data["next_obs"])
                    target = soft_q_target(
                        data["rewards"],
                        qf1_target(data["next_obs"], next_actions),
                        qf2_target(data["next_obs"], next_actions),
                        next_log_prob,
                        data["terminations"].float(),
                        alpha,
                        args.gamma,
                    )
                qf1_values, qf2_values = qf1(data["obs"], data["actions"]), qf2(data["obs"], data["actions"])
                qf_loss = F.mse_loss(qf1_values, target) + F.mse_loss(qf2_values, target)
                comm_time += synced_step(qf_loss, q_params, [q_optimizer])
                updates += 1

                if updates % args.policy_frequency == 0:
                    for _ in range(args.policy_frequency):
                        pi, log_pi, _ = actor(data["obs"])
                        min_q_pi = torch.min(qf1(data["obs"], pi), qf2(data["obs"], pi))
                        actor_loss = (alpha * log_pi - min_q_pi).mean()
                        if args.autotune:  # the temperature's loss only reaches log_alpha
                            alpha_loss = -(log_alpha * (log_pi.detach() + target_entropy)).mean()
                            comm_time += synced_step(
                                actor_loss + alpha_loss, actor_params, [actor_optimizer, a_optimizer]
                            )
                            alpha = log_alpha.exp().item()
                        else:
                            comm_time += synced_step(actor_loss, actor_params, [actor_optimizer])

                if updates % args.target_network_frequency == 0:
                    polyak_update_(qf1_target, qf1, args.tau)
                    polyak_update_(qf2_target, qf2, args.tau)
                learn_time += time.perf_counter() - t0

            # LOGGING: rank 0 logs the episodes and timings of every rank.
            if step % log_every == 0:
                check_finite()
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
                    writer.add_scalar("perf/env_time", max(g[2] for g in gathered), global_step)
                    writer.add_scalar("perf/inference_time", max(g[3] for g in gathered), global_step)
                    writer.add_scalar("perf/learn_time", max(g[4] for g in gathered), global_step)
                    writer.add_scalar("perf/comm_time", max(g[5] for g in gathered), global_step)
                    writer.add_scalar("perf/replay_bytes_per_rank", rb.nbytes, global_step)
                    if updates > 0:
                        writer.add_scalar("losses/qf1_values", qf1_values.mean().item(), global_step)
                        writer.add_scalar("losses/qf2_values", qf2_values.mean().item(), global_step)
                        writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                        writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                        writer.add_scalar("losses/alpha", alpha, global_step)
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
                check_finite()
                last_checkpoint = write_checkpoint()
        check_finite()
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
