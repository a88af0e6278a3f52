"""Data-parallel SAC with a sharded replay: N processes (GPUs, CPU groups, nodes) train one agent.

Launch:
    python cleanrl/sac_continuous_action_multigpu.py                       # one process (= sac_continuous_action.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/sac_continuous_action_multigpu.py --num-envs 2 --batch-size 512
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=cheetah cleanrl/sac_continuous_action_multigpu.py --num-envs 16 --batch-size 4096
    tensorboard --logdir runs

Algorithm (Haarnoja et al. 2018, with the CleanRL / TD3 conventions): a tanh-squashed Gaussian
actor, two Q-networks with Polyak-averaged targets, clipped double-Q soft targets, the entropy
temperature tuned towards -|A| unless ``--no-autotune``, and the actor (with the temperature)
updated ``policy_frequency`` times every ``policy_frequency`` steps. One critic update per
vector step; before ``learning_starts`` actions are uniform. The two Q-networks are one module, as in
sac_continuous_action.py.

Replay (cleanrl_utils/buffers.py): each observation is stored once. Under next-step autoreset the
observation after a transition is the next one stored, including at episode ends where it is the
real final observation: terminations stop bootstrapping, truncations (MuJoCo's 1000-step limit)
bootstrap from it. Reset steps are stored but never sampled.

Departures from CleanRL, and why: the temperature starts at ``--alpha`` (0.2) and is tuned with the
policy's learning rate; CleanRL starts it at 1.0 (log alpha = 0) whatever ``--alpha`` says and tunes
it with the Q-networks' learning rate (1e-3). Starting at the documented value and moving it at the
actor's pace avoids an early phase of near-random actions. Other defaults are CleanRL's.

Data parallelism: each process (rank) steps its own share of the envs into its own shard of the
replay and samples its share of every minibatch from it. The ranks keep one actor, one pair of
critics and one temperature by averaging gradients: one all_reduce of a flat buffer for the critics'
step, one for the actor's and temperature's. The target critics are Polyak averages of identical
critics, so they stay identical on every rank.

Sizes: ``--num-envs`` (or ``--local-num-envs`` per rank), ``--buffer-size``, ``--batch-size``,
``--total-timesteps`` and ``--learning-starts`` are global (summed over ranks): N ranks run
sac_continuous_action.py with the same flags (one update per vector step of all ranks' envs), with
sampling split over the shards. With more ranks, raise ``--num-envs`` and ``--batch-size`` together
to keep the update-to-data ratio.

Faults and checkpoints as in dqn_atari_multigpu.py: a non-finite loss (all-reduced, so every rank
decides the same) stops every rank; rank 0 writes one file with the networks once and every rank's
env state, RNG states, parameter digests and, with ``--checkpoint-buffer``, replay shard.
Reference figures: benchmark/replay_memory.sh.
"""

import math
import os
import random
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_positive, warn_if_no_learning
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
from cleanrl_utils.run import RUN_ERRORS, Run, report_and_exit, setup


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
    num_envs: int | None = None
    """the number of parallel environments, summed over all ranks (default: local_num_envs x WORLD_SIZE)"""
    local_num_envs: int = 1
    """the number of parallel environments of each rank (give it or --num-envs)"""
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
    RESUMABLE: ClassVar[tuple[str, ...]] = ("policy_lr", "q_lr", "gamma", "tau")


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "buffer_size", "batch_size", "policy_frequency")
    require_positive(args, "threads", "target_network_frequency", "policy_lr", "q_lr", "alpha")
    require_positive(args, "dist_timeout")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau {args.tau}: must be in (0, 1]")
    for name in ("buffer_size", "batch_size"):
        if getattr(args, name) % ranks.world_size != 0:
            fail(
                f"--{name.replace('_', '-')} {getattr(args, name)}: must be a multiple of the processes "
                f"(WORLD_SIZE={ranks.world_size})"
            )
    if args.buffer_size < args.num_envs * 3:
        fail(
            f"--buffer-size {args.buffer_size}: must hold at least 3 steps of every env ({args.num_envs * 3})"
        )
    if args.learning_starts < args.batch_size:
        fail(f"--learning-starts {args.learning_starts}: must be at least --batch-size {args.batch_size}")
    warn_if_no_learning(args)
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    check_devices(args, ranks.local_world_size)
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


def backward_averaged(
    loss: torch.Tensor, params: list, world_size: int, compression: str, comm_clock: DeviceClock
) -> torch.Tensor:
    """``loss.backward()`` into fresh gradients of ``params``, averaged over ranks (one flat buffer, timed by
    ``comm_clock``); returns their norm, equal on every rank, so every rank skips a non-finite step alike."""
    for p in params:
        p.grad = None
    loss.backward()
    if world_size > 1:
        with comm_clock:
            all_reduce_mean_([p.grad for p in params], world_size, compression)
    return nn.utils.get_total_norm([p.grad for p in params])


def main() -> None:
    # RANK, LOCAL_RANK, WORLD_SIZE from torchrun (`python`: rank 0 of 1); rank 0 reads the checkpoint
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    device = ranks.device  # cuda:LOCAL_RANK (or --device-ids) with --cuda and a GPU, else the CPU
    world_size, distributed = ranks.world_size, ranks.distributed
    local_num_envs, local_batch_size = args.local_num_envs, args.batch_size // world_size

    random.seed(args.seed + ranks.rank)
    np.random.seed(args.seed + ranks.rank)
    torch.manual_seed(args.seed + ranks.rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    # ENV SETUP: this rank's envs
    env_seeds = [args.seed + ranks.rank * local_num_envs + i for i in range(local_num_envs)]
    capture = args.capture_video and ranks.is_main
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, capture, str(run_dir / "videos")) for i in range(local_num_envs)],
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
    envs.single_action_space.seed(args.seed + ranks.rank)

    actor = Actor(obs_dim, low, high).to(device)
    qf, qf_target = (SoftQNetworks(obs_dim, action_shape[0]).to(device) for _ in range(2))
    if distributed:  # one set of initial weights: rank 0's
        for param in [*actor.parameters(), *qf.parameters()]:
            dist.broadcast(param.data, src=0)
    qf_target.requires_grad_(False)
    qf_target.load_state_dict(qf.state_dict())
    q_params = list(qf.parameters())
    q_optimizer = torch.optim.Adam(q_params, lr=args.q_lr, fused=True)
    target_entropy = -float(np.prod(action_shape))
    log_alpha = torch.tensor([math.log(args.alpha)], device=device, requires_grad=args.autotune)
    alpha = log_alpha.detach().exp()
    # the actor's and the temperature's gradients travel in one buffer: one optimizer steps both
    actor_params = [*actor.parameters(), log_alpha] if args.autotune else list(actor.parameters())
    actor_optimizer = torch.optim.Adam(actor_params, lr=args.policy_lr, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(actor, mode=mode) if args.compile else actor
    critic_loss_fn = torch.compile(critic_loss) if args.compile else critic_loss
    policy_loss_fn = torch.compile(policy_loss) if args.compile else policy_loss
    # This rank's shard: its own envs' transitions only, buffer_size / world_size of them.
    rb = ReplayBuffer(
        args.buffer_size // world_size,
        local_num_envs,
        (obs_dim,),
        action_shape,
        np.float32,
        np.float32,
        seed=args.seed + ranks.rank,
    )

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
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

    # LOGGING SETUP: TensorBoard/W&B (rank 0), Ctrl-C, progress; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    env_time = 0.0
    inference_clock, learn_clock, comm_clock = (DeviceClock(device) for _ in range(3))  # CUDA events on a GPU
    episodes = []
    log_every = max(1000 // args.num_envs, 1)  # vector steps between scalar writes (and stop-signal checks)
    qf_loss = actor_loss = torch.zeros((), device=device)  # of the latest update
    q_values = torch.zeros(2, 1, device=device)
    num_steps = (args.total_timesteps - global_step) // args.num_envs
    try:
        for step in range(1, num_steps + 1):
            global_step += args.num_envs

            # ACT: uniform actions until learning starts (each rank its own), then samples of the policy
            if global_step <= first_learning_step:
                actions = np.stack([envs.single_action_space.sample() for _ in range(local_num_envs)])
            else:
                with inference_clock, torch.inference_mode():
                    actions, _ = act(to_device(next_obs.astype(np.float32), device))  # pinned: no GPU wait
                actions = actions.cpu().numpy()
            t0 = time.perf_counter()
            obs = next_obs
            next_obs, rewards, terminations, truncations, infos = envs.step(actions)
            env_time += time.perf_counter() - t0

            # REPLAY: into this rank's shard; the step after an episode end only resets that env.
            rb.add(obs, actions, rewards, terminations, ~next_done)
            next_done = np.logical_or(terminations, truncations)
            episodes += [(global_step, *episode) for episode in finished_episodes(infos)]

            # UPDATE: each rank samples its share of the minibatch from its own shard; gradients are averaged.
            if global_step > first_learning_step:
                with learn_clock:
                    data = rb.sample_to(local_batch_size, device)
                    qf_loss, q_values = critic_loss_fn(actor, qf, qf_target, data, alpha, args.gamma)
                    norm = backward_averaged(qf_loss, q_params, world_size, args.grad_compression, comm_clock)
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
                            norm = backward_averaged(
                                loss, actor_params, world_size, args.grad_compression, comm_clock
                            )
                            nan_guard.step(actor_optimizer, norm, global_step)
                            alpha = log_alpha.detach().exp()  # on the device: no host wait
                        qf.requires_grad_(True)

                    if updates % args.target_network_frequency == 0:
                        polyak_update_(qf_target, qf, args.tau)

            # LOGGING (and the NaN check: read here and right before each checkpoint, not per gradient step)
            signum = ranks.agree_on_signal(run.stop.signum) if step % log_every == 0 else 0  # all ranks alike
            due = run.checkpoint_due(global_step, args.num_envs, step == num_steps, signum)
            if step % log_every == 0 or due:
                nan_guard.check(run.last_checkpoint, ranks.max)
            if step % log_every == 0:
                local_sps = run.sps(global_step) / world_size
                timings = {"inference_time": inference_clock.read(), "learn_time": learn_clock.read()}
                timings |= {"env_time": env_time, "comm_time": comm_clock.read()}
                gathered = ranks.gather({"episodes": episodes, "sps": local_sps, **timings})
                if ranks.is_main:
                    log_rank_stats(
                        run, gathered, global_step
                    )  # episodes, perf/SPS_rank<r>, the slowest timings
                    writer.add_scalar("perf/replay_bytes_per_rank", rb.nbytes, global_step)
                    if updates > 0:
                        writer.add_scalar("losses/qf1_values", q_values[0].mean().item(), global_step)
                        writer.add_scalar("losses/qf2_values", q_values[1].mean().item(), global_step)
                        writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)
                        writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                        writer.add_scalar("losses/alpha", float(alpha), global_step)
                    run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line
                episodes, env_time = [], 0.0

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            if due:
                state = {  # shared by the ranks
                    "actor": actor.state_dict(),
                    "qf": qf.state_dict(),
                    "qf_target": qf_target.state_dict(),
                    "q_optimizer": q_optimizer.state_dict(),
                    "actor_optimizer": actor_optimizer.state_dict(),
                    "log_alpha": log_alpha.detach().cpu(),
                    "global_step": global_step,
                    "updates": updates,
                }
                own = {  # this rank's part: everything else an exact resume needs (and its replay shard)
                    "rng": rng_state(),
                    "action_space_rng": envs.single_action_space.np_random.bit_generator.state,
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                    "env_seeds": env_seeds,
                    "parameters_sha256": [parameters_digest(n) for n in (actor, qf, qf_target)],
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
