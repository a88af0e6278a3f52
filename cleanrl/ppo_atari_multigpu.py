"""Data-parallel PPO for Atari: N processes (one per GPU, or per CPU group) train one model.

Each process (rank) steps its own share of the envs, and the ranks keep a single model by
averaging gradients with one all_reduce of a flat buffer per minibatch (NCCL on GPUs, gloo on CPUs).

Launch:
    python cleanrl/ppo_atari_multigpu.py                                  # one process (= ppo_atari.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/ppo_atari_multigpu.py --num-envs 16
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=breakout cleanrl/ppo_atari_multigpu.py --num-envs 128
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 cleanrl/ppo_atari_multigpu.py --run-name r1

Sizes: ``--num-envs`` and ``--total-timesteps`` are global (summed over ranks); each rank runs
num_envs / world_size envs. Tuning: 8-16 envs per GPU; keep the global batch (num_envs x num_steps)
at 2048 or more; with more ranks the batch grows, so raise the learning rate (``--scale-lr`` scales
it linearly with the number of processes).

Communication: ``--grad-compression fp16|bf16`` sends the flat gradient buffer in half precision
(half the bytes) and applies the average in fp32; ``--sync-every K`` (local SGD) lets ranks step
on their own gradients and averages parameters every K optimizer steps and at the end of every
iteration, so every rollout uses one common policy.

Faults: a non-finite gradient norm (checked after the all_reduce, so every rank decides the same)
stops the run naming the iteration and the last good checkpoint. Only rank 0 reads and writes
checkpoints (each holds every rank's env and RNG state, so a resume is exact); the run directory
does not change across torchrun restarts, and a restarted run resumes from its newest checkpoint.
Ctrl-C/SIGTERM on any rank makes all ranks checkpoint at the same iteration and exit.

Everything else (preprocessing, autoreset handling, metrics) is as in ppo_atari.py.
Reference figures: benchmark/ppo_multigpu_scaling.sh.
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
import torch
import torch.distributed as dist
import torch.nn as nn
import tyro
from gymnasium.vector import AutoresetMode
from torch.utils.tensorboard import SummaryWriter

from cleanrl_utils.atari_wrappers import wrap_atari
from cleanrl_utils.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from cleanrl_utils.envs import EnvSnapshot, EnvWorkerError, WorkerGuard, get_vector_state, set_vector_state
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
    checkpoint_interval: int = 50
    """write a checkpoint every this many iterations (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest checkpoint); the saved Args are used"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the Atari environment (ALE), e.g. PongNoFrameskip-v4 or ALE/Pong-v5"""
    vector_mode: Literal["sync", "async"] = "sync"
    """sync: envs step in this process; async: one worker process per env"""
    env_timeout: float = 60.0
    """seconds an async env worker may take for one reset or step before the run stops"""
    total_timesteps: int = 10_000_000
    """total env steps of the run, summed over all envs of all ranks (one step = 4 frames)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments, summed over all ranks (each rank runs num_envs / world size)"""
    num_steps: int = 128
    """the number of steps per env per rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches per epoch (each rank splits its own share of the batch this many times)"""
    update_epochs: int = 4
    """the number of epochs over each rollout"""
    norm_adv: bool = True
    """if toggled, normalise advantages within each minibatch"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's implementation"""
    ent_coef: float = 0.01
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm of the gradient"""
    target_kl: float | None = None
    """stop the epochs of an update early once the approximate KL (averaged over ranks) exceeds this"""

    # Distributed arguments
    backend: Literal["nccl", "gloo"] | None = None
    """torch.distributed backend; None: nccl when CUDA is used, else gloo"""
    device_ids: list[int] | None = None
    """GPU of each local rank (local rank i uses device_ids[i]); None: GPU i for local rank i"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails"""
    grad_compression: Literal["none", "fp16", "bf16"] = "none"
    """precision of the flat gradient buffer on the wire (averaged and applied in fp32)"""
    sync_every: int = 1
    """1: average gradients every step; K > 1: local SGD, average parameters every K optimizer steps"""
    scale_lr: bool = False
    """if toggled, multiply the learning rate by the number of processes"""


def validate(args: Args, world_size: int, local_world_size: int) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work.

    Every rank runs this on the same input, so every rank exits; only rank 0 prints.
    """
    positive = ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "threads", "sync_every")
    for name in positive:
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    for name in ("learning_rate", "clip_coef", "env_timeout", "max_grad_norm", "dist_timeout"):
        if not getattr(args, name) > 0:
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: must be > 0")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.num_envs % world_size != 0:
        fail(f"--num-envs {args.num_envs}: must be a multiple of the number of processes (WORLD_SIZE={world_size})")
    local_batch_size = args.num_envs // world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches}: must divide each rank's batch "
            f"num_envs / WORLD_SIZE * num_steps = {local_batch_size}"
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
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps}: must be at least one iteration, "
            f"num_envs * num_steps = {batch_size}"
        )
    try:
        spec = gym.spec(args.env_id)
    except gym.error.Error as e:
        fail(f"--env-id {args.env_id}: not a registered gymnasium environment ({e})")
    if not str(spec.entry_point).startswith("ale_py"):
        fail(f"--env-id {args.env_id}: not an Atari (ALE) environment")


def fail(message: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:  # one line for the user, not one per rank
        print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


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


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Nature-CNN trunk shared by the policy and value heads."""

    def __init__(self, n_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        # uint8 frames travel and are stored as bytes; scaling happens here, on the device.
        # Change the layout while the frames are still bytes (4x less memory traffic), then scale.
        return self.network(x.contiguous(memory_format=torch.channels_last).float().div_(255.0))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.hidden(x)).squeeze(-1)

    def act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; return them with their log-probabilities and the state values."""
        hidden = self.hidden(x)
        log_probs = self.actor(hidden).log_softmax(-1)
        # Gumbel-max: argmax(log p + Gumbel noise) is a sample of p.
        action = (log_probs - torch.empty_like(log_probs).exponential_().log()).argmax(-1)
        return action, log_probs.gather(-1, action.unsqueeze(-1)).squeeze(-1), self.critic(hidden).squeeze(-1)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``action``, policy entropy and state values."""
        hidden = self.hidden(x)
        log_probs = self.actor(hidden).log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy, self.critic(hidden).squeeze(-1)


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_value: np.ndarray,
    terminations: np.ndarray,
    dones: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation over a (num_steps, num_envs) rollout.

    ``values[t + 1]`` (``next_value`` after the last step) is the value of the observation that
    step t returned: under next-step autoreset that is the real final observation when step t
    ended an episode. ``terminations[t]`` stops bootstrapping from it; ``dones[t]`` (terminated or
    truncated) stops the advantage recursion, so a truncated step keeps its bootstrap value.
    Returns (advantages, returns).
    """
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    lastgaelam = np.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * (1.0 - terminations[t]) - values[t]
        lastgaelam = delta + gamma * gae_lambda * (1.0 - dones[t]) * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def ppo_loss(
    newlogprob: torch.Tensor,
    oldlogprob: torch.Tensor,
    advantages: torch.Tensor,
    newvalue: torch.Tensor,
    oldvalue: torch.Tensor,
    returns: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate policy loss and (optionally clipped) value loss, both to be minimised."""
    ratio = (newlogprob - oldlogprob).exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    return pg_loss, v_loss


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
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    learning_rate = args.learning_rate * (world_size if args.scale_lr else 1)

    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    # ENV SETUP: env i of rank r is seeded seed + r * local_num_envs + i, so no two envs share a seed.
    env_seeds = [args.seed + rank * local_num_envs + i for i in range(local_num_envs)]
    capture = args.capture_video and is_main
    env_fns = [make_env(args.env_id, i, capture, str(run_dir / "videos")) for i in range(local_num_envs)]
    if args.vector_mode == "sync":
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    else:
        envs = WorkerGuard(
            gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP), args.env_id, args.env_timeout
        )
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP, "the rollout below assumes next-step autoreset"
    obs_shape = envs.single_observation_space.shape

    agent = Agent(int(envs.single_action_space.n)).to(device, memory_format=torch.channels_last)
    if distributed:  # one set of initial weights: rank 0's
        for param in agent.parameters():
            dist.broadcast(param.data, src=0)
    params = list(agent.parameters())
    # fused Adam: one kernel for all parameters instead of ~10 small ops per tensor.
    optimizer = torch.optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True)

    # ROLLOUT STORAGE in host memory, for this rank's envs.
    obs = np.zeros((args.num_steps, local_num_envs, *obs_shape), dtype=np.uint8)
    actions = np.zeros((args.num_steps, local_num_envs), dtype=np.int64)
    logprobs = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    rewards = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    terminations = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    dones = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)
    valid = np.zeros((args.num_steps, local_num_envs), dtype=bool)
    values = np.zeros((args.num_steps, local_num_envs), dtype=np.float32)

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
    start_iteration, global_step, wandb_id = 1, 0, None
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint.get("local_optimizer", checkpoint["optimizer"]))
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        next_obs = checkpoint["next_obs"].numpy()
        next_done = checkpoint["next_done"].numpy()
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]
        wandb_id = checkpoint["wandb_id"]

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

    def write_checkpoint(iteration: int) -> Path | None:
        """Collective: every rank hands rank 0 its env and RNG state; rank 0 writes one file."""
        own = {
            "rng": rng_state(),
            "envs": get_vector_state(envs),
            "next_obs": torch.from_numpy(np.array(next_obs)),
            "next_done": torch.from_numpy(next_done.copy()),
            "env_seeds": env_seeds,
            "parameters_sha256": parameters_digest(agent),
        }
        if args.sync_every > 1:  # local SGD: each rank's Adam moments are its own
            own["local_optimizer"] = optimizer.state_dict()
        ranks = gather_to_main(own)
        if not is_main:
            return None
        digests = {r["parameters_sha256"] for r in ranks}
        if len(digests) != 1:
            raise RuntimeError(f"ranks hold different parameters at iteration {iteration}; not checkpointing")
        state = {
            "model": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "args": dataclasses.asdict(args),
            "run_name": run_name,
            "world_size": world_size,
            "iteration": iteration,
            "global_step": global_step,
            "wandb_id": wandb_id,
            "ranks": ranks,
        }
        return save_checkpoint(state, run_dir / "checkpoints", iteration)

    def sync_parameters(nonfinite_steps: int) -> float:
        """Local SGD: average parameters over ranks; the non-finite-gradient count rides along."""
        t0 = time.perf_counter()
        flags = torch.tensor([float(nonfinite_steps)], device=device)
        all_reduce_mean_([p.data for p in params] + [flags], world_size)
        if flags.item() > 0:
            raise FloatingPointError(
                f"non-finite gradient norm at iteration {iteration}; last good checkpoint: {last_checkpoint or 'none'}"
            )
        return time.perf_counter() - t0

    stop = StopRequested()
    progress = Progress(args.total_timesteps, global_step, description=run_name, enabled=args.progress and is_main)
    monitor = ResourceMonitor(device)
    recent_returns: deque[float] = deque(maxlen=20)
    start_step, start_time = global_step, time.perf_counter()
    iteration = start_iteration - 1
    last_checkpoint: Path | None = None
    local_steps = 0  # optimizer steps since the last parameter average (local SGD)
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * learning_rate
            env_time = inference_time = comm_time = 0.0
            episodes = []

            # ROLLOUT
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                valid[step] = ~next_done  # a step right after an episode end only resets that env

                t0 = time.perf_counter()
                with torch.inference_mode():
                    action, logprob, value = agent.act(torch.as_tensor(obs[step], device=device))
                actions[step], logprobs[step], values[step] = (
                    action.cpu().numpy(),
                    logprob.cpu().numpy(),
                    value.cpu().numpy(),
                )
                t1 = time.perf_counter()
                next_obs, reward, terminated, truncated, infos = envs.step(actions[step])
                t2 = time.perf_counter()
                env_time += t2 - t1
                inference_time += t1 - t0

                next_done = np.logical_or(terminated, truncated)
                rewards[step], terminations[step], dones[step] = reward, terminated, next_done
                if "_episode" in infos:
                    for i in np.flatnonzero(infos["_episode"]):
                        episodes.append((global_step, float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])))

            # Ranks finish their rollouts at different times (games differ in speed); wait here, once,
            # so that perf/comm_time below measures the collectives and not this imbalance.
            wait_time = 0.0
            if distributed:
                t0 = time.perf_counter()
                dist.barrier()
                wait_time = time.perf_counter() - t0

            # ADVANTAGES
            learn_start = time.perf_counter()
            with torch.inference_mode():
                next_value = agent.get_value(torch.as_tensor(next_obs, device=device)).cpu().numpy()
            advantages, returns = compute_gae(
                rewards, values, next_value, terminations, dones, args.gamma, args.gae_lambda
            )

            # UPDATE: only real transitions enter the batch (reset steps are left out).
            b_valid = valid.reshape(-1)
            b_obs = torch.as_tensor(obs.reshape((-1, *obs_shape))[b_valid], device=device)
            b_logprobs = torch.as_tensor(logprobs.reshape(-1)[b_valid], device=device)
            b_actions = torch.as_tensor(actions.reshape(-1)[b_valid], device=device)
            b_advantages = torch.as_tensor(advantages.reshape(-1)[b_valid], device=device)
            b_returns = torch.as_tensor(returns.reshape(-1)[b_valid], device=device)
            b_values = torch.as_tensor(values.reshape(-1)[b_valid], device=device)
            clipfracs = []
            nonfinite_steps = 0
            for _epoch in range(args.update_epochs):
                b_inds = torch.randperm(b_obs.shape[0], device=device)
                for mb_inds in torch.tensor_split(b_inds, args.num_minibatches):
                    newlogprob, entropy, newvalue = agent.evaluate(b_obs[mb_inds], b_actions[mb_inds])
                    logratio = newlogprob - b_logprobs[mb_inds]
                    with torch.no_grad():
                        ratio = logratio.exp()
                        old_approx_kl = (-logratio).mean()
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean())

                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv and mb_advantages.numel() > 1:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss, v_loss = ppo_loss(
                        newlogprob,
                        b_logprobs[mb_inds],
                        mb_advantages,
                        newvalue,
                        b_values[mb_inds],
                        b_returns[mb_inds],
                        args.clip_coef,
                        args.clip_vloss,
                    )
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if distributed and args.sync_every == 1:
                        t0 = time.perf_counter()
                        all_reduce_mean_([p.grad for p in params], world_size, args.grad_compression)
                        comm_time += time.perf_counter() - t0
                    grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                    if not torch.isfinite(grad_norm):  # after the all_reduce: every rank decides the same
                        if args.sync_every == 1:
                            last = last_checkpoint or "none"
                            raise FloatingPointError(
                                f"non-finite gradient norm at iteration {iteration}; last good checkpoint: {last}"
                            )
                        nonfinite_steps += 1  # local SGD: reported at the next parameter average
                        continue
                    optimizer.step()
                    local_steps += 1
                    if distributed and args.sync_every > 1 and local_steps % args.sync_every == 0:
                        comm_time += sync_parameters(nonfinite_steps)
                        nonfinite_steps = local_steps = 0

                if args.target_kl is not None:
                    kl = approx_kl.detach().reshape(1)
                    if distributed:  # one decision for all ranks
                        all_reduce_mean_([kl], world_size)
                    if kl.item() > args.target_kl:
                        break
            if distributed and args.sync_every > 1 and (local_steps or nonfinite_steps):
                comm_time += sync_parameters(nonfinite_steps)  # every rollout starts from one common policy
                local_steps = 0
            learn_time = time.perf_counter() - learn_start

            # LOGGING: rank 0 logs the episodes and timings of every rank.
            local_sps = (
                args.num_steps * local_num_envs * (iteration - start_iteration + 1) / (time.perf_counter() - start_time)
            )
            gathered = gather_to_main((episodes, local_sps, env_time, inference_time, learn_time, comm_time, wait_time))
            if is_main:
                for r, (rank_episodes, rank_sps, *_times) in enumerate(gathered):
                    writer.add_scalar(f"perf/SPS_rank{r}", rank_sps, global_step)
                    for step_at, episodic_return, episodic_length in rank_episodes:
                        recent_returns.append(episodic_return)
                        writer.add_scalar("charts/episodic_return", episodic_return, step_at)
                        writer.add_scalar("charts/episodic_length", episodic_length, step_at)
                y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                sps = (global_step - start_step) / (time.perf_counter() - start_time)
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                writer.add_scalar("charts/SPS", sps, global_step)
                writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
                writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
                writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
                writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
                writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
                writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
                writer.add_scalar("losses/explained_variance", explained_var, global_step)
                writer.add_scalar("perf/env_time", max(g[2] for g in gathered), global_step)
                writer.add_scalar("perf/inference_time", max(g[3] for g in gathered), global_step)
                writer.add_scalar("perf/learn_time", max(g[4] for g in gathered), global_step)
                writer.add_scalar("perf/comm_time", max(g[5] for g in gathered), global_step)
                writer.add_scalar("perf/rollout_wait_time", max(g[6] for g in gathered), global_step)
                for name, value in monitor.sample().items():
                    writer.add_scalar(f"perf/{name}", value, global_step)
                progress.update(global_step, sps, np.mean(recent_returns) if recent_returns else None)

            # CHECKPOINT: a signal on any rank stops every rank after this same iteration.
            signum = torch.tensor([stop.signum or 0], device=device)
            if distributed:
                dist.all_reduce(signum, op=dist.ReduceOp.MAX)
            if signum.item():
                path = write_checkpoint(iteration)
                if is_main:
                    print(
                        f"stopped by signal {signum.item()} at iteration {iteration}; checkpoint {path}",
                        file=sys.stderr,
                    )
                raise SystemExit(128 + int(signum.item()))
            if args.checkpoint_interval and iteration % args.checkpoint_interval == 0 and iteration < num_iterations:
                last_checkpoint = write_checkpoint(iteration)
        write_checkpoint(iteration)
        if distributed:
            dist.destroy_process_group()
    except (EnvWorkerError, FloatingPointError) as e:
        if is_main or isinstance(e, EnvWorkerError):  # a FloatingPointError is raised on every rank alike
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
