"""Data-parallel PPO for Atari: N processes (one per GPU, or per CPU group) train one model.

Each process (rank) steps its own share of the envs, and the ranks keep a single model by
averaging gradients with one all_reduce of a flat buffer per minibatch (NCCL on GPUs, gloo on CPUs).

Launch:
    python cleanrl/ppo_atari_multigpu.py                                  # one process (= ppo_atari.py)
    torchrun --standalone --nproc_per_node=2 cleanrl/ppo_atari_multigpu.py --num-envs 16
    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --rdzv-backend=c10d \
        --rdzv-endpoint=HOST:29400 --rdzv-id=breakout cleanrl/ppo_atari_multigpu.py --num-envs 128
    torchrun --standalone --nproc_per_node=2 --max-restarts=3 cleanrl/ppo_atari_multigpu.py --run-name r1

Preprocessing (cleanrl_utils/atari_wrappers.py): no-op starts, frame skip 4 with max-pooling, episodic
life (training episodes end on a lost life; the game resets only on game over), FIRE on reset, reward
clipping to the sign, 84x84 grayscale, 4-frame stack. ``charts/episodic_return`` is whole games' score.

Autoreset: next-step (gymnasium's default). The step that ends an episode returns its real final
observation; the next ``step`` only resets that env. Such reset steps stay in the rollout to keep
the time axis aligned but weigh 0 in the loss. Termination (including a lost
life) stops bootstrapping; truncation (the 108k-frame limit) bootstraps from the final observation.

Sizes: ``--num-envs`` and ``--total-timesteps`` are global (summed over ranks); each rank runs
num_envs / world_size envs. CleanRL's ``--local-num-envs`` (per rank, default 8) is accepted instead
of ``--num-envs``, so CleanRL's command lines keep their meaning. Tuning: 8-16 envs per GPU; keep the
global batch (num_envs x num_steps) at 2048 or more, and raise the learning rate with the batch
(``--scale-lr`` scales it linearly with the number of processes).

Communication: ``--grad-compression fp16|bf16`` sends the flat gradient buffer in half precision
(half the bytes) and applies the average in fp32; ``--sync-every K`` (local SGD) lets ranks step
on their own gradients and averages parameters every K optimizer steps and at the end of every
iteration, so every rollout uses one common policy.

Faults: a non-finite gradient norm (checked after the all_reduce, so every rank decides the same)
stops the run naming the last good checkpoint; a rank that stops answering is named after
``--dist-timeout``. Checkpoints, resume, torchrun restarts and Ctrl-C are cleanrl_utils/distributed.py's:
rank 0 alone reads and writes the file, which holds every rank's env and RNG state (an exact resume).

Defaults are CleanRL's Atari PPO settings (no departure). Speed: rollouts stay on the device (frames as the
uint8 sent for act()), so the host waits for the GPU once per env step, for the actions; minibatches
keep one size (reset steps weigh 0); the CNN runs channels-last. ``--compile`` compiles the policy
step and the loss, ``--cudagraphs`` replays the policy step as a CUDA graph, and
``--no-torch-deterministic`` lets cuDNN autotune and matmuls use TF32 (GPUs only; results then vary).
Reference figures: benchmark/ppo_throughput.sh, benchmark/ppo_multigpu_scaling.sh, benchmark/gpu_check.sh.
"""

import os
import random
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_positive
from cleanrl_utils.atari_wrappers import wrap_atari
from cleanrl_utils.buffers import to_device
from cleanrl_utils.checkpoint import rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks, check_devices, log_rank_stats, parameters_digest, to_cpu
from cleanrl_utils.envs import (
    EnvSnapshot,
    async_vector_env,
    check_env_id,
    finished_episodes,
    get_vector_state,
    set_vector_state,
)
from cleanrl_utils.monitor import DeviceClock
from cleanrl_utils.nan_guard import NaNGuard
from cleanrl_utils.run import RUN_ERRORS, Run, report_and_exit, setup

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
    """torch intra-op threads of each process (None: torch's default; torchrun sets OMP_NUM_THREADS=1)"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of env 0 into runs/<run-name>/videos"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<torchrun run id or time>"""
    checkpoint_interval: int = 500_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest); its settings are kept (see README)"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""
    compile: bool = False
    """if toggled, torch.compile the policy step and the minibatch loss (the first iterations compile)"""
    cudagraphs: bool = False
    """if toggled (with --compile, on CUDA), replay the policy step as a CUDA graph (mode reduce-overhead)"""

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
    num_envs: int | None = None
    """the number of parallel environments, summed over all ranks (default: local_num_envs x WORLD_SIZE)"""
    local_num_envs: int = 8
    """the number of parallel environments of each rank (CleanRL's flag; give it or --num-envs)"""
    num_steps: int = 128
    """the number of steps per env per rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches per epoch"""
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
    """stop the epochs of an update early once the approximate KL exceeds this"""

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

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "vf_coef", "clip_coef",
                                            "max_grad_norm", "gamma", "gae_lambda",
                                            "update_epochs", "target_kl")  # fmt: skip


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_positive(args, "threads", "learning_rate", "clip_coef", "env_timeout", "max_grad_norm")
    require_positive(args, "dist_timeout", "sync_every")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.cudagraphs and not (args.compile and args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs: needs --compile and CUDA (torch.compile replays the policy step as a CUDA graph)")
    local_batch_size = args.num_envs // ranks.world_size * args.num_steps
    if local_batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches}: must divide each rank's batch "
            f"num_envs / WORLD_SIZE * num_steps = {local_batch_size}"
        )
    check_devices(args, ranks.local_world_size)
    batch_size = args.num_envs * args.num_steps
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps}: must be at least one iteration, "
            f"num_envs * num_steps = {batch_size}"
        )
    check_env_id(args.env_id, atari=True)


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

    def evaluate(self, x: torch.Tensor, action: torch.Tensor):
        """Log-probabilities of ``action``, policy entropy and state values."""
        hidden = self.hidden(x)
        log_probs = self.actor(hidden).log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        newlogprob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        return newlogprob, entropy, self.critic(hidden).squeeze(-1)


def compute_gae(rewards, values, next_value, terminations, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation over (num_steps, num_envs) arrays; returns (advantages, returns).

    ``values[t + 1]`` (``next_value`` after the last step) is the value of the observation that
    step t returned: under next-step autoreset that is the real final observation when step t
    ended an episode. ``terminations[t]`` stops bootstrapping from it; ``dones[t]`` (terminated or
    truncated) stops the advantage recursion, so a truncated step keeps its bootstrap value.
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


def minibatches(batch: dict[str, torch.Tensor], num_minibatches: int, norm_adv: bool) -> list[dict]:
    """One epoch over ``batch`` (rows weigh ``batch["weights"]``: 1 for a transition, 0 for a step that only
    reset its env) in a random order, as ``num_minibatches`` minibatches of one size.

    Each minibatch's weights are scaled to sum to 1 over its transitions, so ``x.dot(weights)`` is the
    mean of ``x`` over them (one kernel); with ``norm_adv`` its advantages are normalised over them
    (Tensor.std's unbiased estimate, once there are two). Done for all minibatches of the epoch at once:
    one gather per tensor instead of one per minibatch, and the minibatches are views.
    """
    perm = torch.randperm(len(batch["weights"]), device=batch["weights"].device)
    epoch = {k: v.index_select(0, perm).unflatten(0, (num_minibatches, -1)) for k, v in batch.items()}
    n = epoch["weights"].sum(1, keepdim=True)
    epoch["weights"] = w = epoch["weights"] / n.clamp(min=1.0)
    if norm_adv:
        centred = epoch["advantages"] - (epoch["advantages"] * w).sum(1, keepdim=True)
        std = ((centred.square() * w).sum(1, keepdim=True) * n / (n - 1).clamp(min=1.0)).sqrt()
        epoch["advantages"] = torch.where(n > 1, centred / (std + 1e-8), epoch["advantages"])
    return [{k: v[i] for k, v in epoch.items()} for i in range(num_minibatches)]


def minibatch_loss(agent: Agent, mb: dict[str, torch.Tensor], *, clip_coef: float, clip_vloss: bool,
                   ent_coef: float, vf_coef: float) -> tuple[torch.Tensor, dict]:  # fmt: skip
    """PPO's loss on a minibatch of :func:`minibatches` (clipped surrogate, optionally clipped value
    loss, entropy bonus): every mean is over its transitions, so the loss and its gradients are those of
    the transitions alone, while the minibatch keeps one size every iteration (no data-dependent shapes:
    torch.compile compiles it once, cuDNN plans once). Returns the loss and its statistics by name (0-d
    tensors, detached), named as they are logged under ``losses/``.
    """
    w, adv, old_value, ret = mb["weights"], mb["advantages"], mb["values"], mb["returns"]
    newlogprob, entropy, newvalue = agent.evaluate(mb["obs"], mb["actions"])
    logratio = newlogprob - mb["logprobs"]
    ratio = logratio.exp()
    pg_loss = -torch.min(adv * ratio, adv * ratio.clamp(1 - clip_coef, 1 + clip_coef)).dot(w)
    v_loss = (newvalue - ret).square()
    if clip_vloss:
        v_clipped = old_value + (newvalue - old_value).clamp(-clip_coef, clip_coef)
        v_loss = torch.max(v_loss, (v_clipped - ret).square())
    v_loss = 0.5 * v_loss.dot(w)
    entropy_loss = entropy.dot(w)
    with torch.no_grad():
        stats = dict(policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), entropy=entropy_loss.detach())
        stats["old_approx_kl"] = (-logratio).dot(w)
        stats["approx_kl"] = ((ratio - 1) - logratio).dot(w)
        stats["clipfrac"] = ((ratio - 1.0).abs() > clip_coef).float().dot(w)
    return pg_loss - ent_coef * entropy_loss + v_loss * vf_coef, stats


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
    local_num_envs = args.local_num_envs  # num_envs / world_size
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size
    learning_rate = args.learning_rate * (world_size if args.scale_lr else 1)

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
    env_fns = [make_env(args.env_id, i, capture, str(run_dir / "videos")) for i in range(local_num_envs)]
    if args.vector_mode == "sync":
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    else:  # one worker process per env; one that raises, dies or hangs stops the run with one line
        envs = async_vector_env(env_fns, args.env_id, args.env_timeout)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the rollout below relies on it
    obs_shape = envs.single_observation_space.shape

    agent = Agent(int(envs.single_action_space.n)).to(device, memory_format=torch.channels_last)
    if distributed:  # one set of initial weights: rank 0's
        for param in agent.parameters():
            dist.broadcast(param.data, src=0)
    params = list(agent.parameters())
    # fused Adam: one kernel for all parameters instead of ~10 small ops per tensor.
    optimizer = torch.optim.Adam(params, lr=learning_rate, eps=1e-5, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(agent.act, mode=mode) if args.compile else agent.act
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    loss_coefs = {k: getattr(args, k) for k in ("clip_coef", "clip_vloss", "ent_coef", "vf_coef")}

    # ROLLOUT STORAGE, step t: obs_t, its action, what stepping returned; the policy's on the device
    shape = (args.num_steps, local_num_envs)
    obs = torch.zeros((*shape, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    logprobs, values = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    rewards, terminations, dones, valid = (np.zeros(shape, np.float32) for _ in range(4))  # valid: 1 or 0

    next_obs, _ = envs.reset(seed=env_seeds)
    next_done = np.zeros(local_num_envs, dtype=bool)  # did the previous step end an episode?
    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint.get("local_optimizer", checkpoint["optimizer"]))
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]

    # LOGGING SETUP: TensorBoard/W&B (rank 0), Ctrl-C, progress; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    comm_clock = DeviceClock(device)  # CUDA events: an NCCL call returns before its work is done
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = frac * learning_rate  # from args: a resume may change it
            env_time = inference_time = 0.0
            episodes, local_steps = [], 0  # local_steps: optimizer steps since the last parameter average

            # ROLLOUT of this rank's envs; their episodes go to rank 0 with the logs
            for step in range(args.num_steps):
                global_step += args.num_envs
                valid[step] = ~next_done  # a step right after an episode end only resets that env

                t0 = time.perf_counter()
                obs[step] = to_device(next_obs, device)
                with torch.inference_mode():
                    actions[step], logprobs[step], values[step] = act(obs[step])
                action = actions[step].cpu().numpy()  # the one wait for the device per step: the envs need it
                t1 = time.perf_counter()
                next_obs, reward, terminated, truncated, infos = envs.step(action)
                env_time, inference_time = env_time + time.perf_counter() - t1, inference_time + t1 - t0

                next_done = np.logical_or(terminated, truncated)
                rewards[step], terminations[step], dones[step] = reward, terminated, next_done
                episodes += [(global_step, *episode) for episode in finished_episodes(infos)]

            wait_time = ranks.wait_for_all()  # once: comm_time measures collectives, not unequal rollouts

            # ADVANTAGES
            learn_start = time.perf_counter()
            with torch.inference_mode():
                next_value = agent.get_value(to_device(next_obs, device)).cpu().numpy()
            values_np = values.cpu().numpy()  # one copy per iteration
            advantages, returns = compute_gae(
                rewards, values_np, next_value, terminations, dones, args.gamma, args.gae_lambda
            )

            # UPDATE on fixed-size minibatches of the whole rollout; steps that only reset their env weigh 0.
            host = {"advantages": advantages, "returns": returns, "weights": valid}
            batch = {"obs": obs, "actions": actions, "logprobs": logprobs, "values": values}
            batch |= {k: to_device(v, device) for k, v in host.items()}
            batch = {k: v.flatten(0, 1) for k, v in batch.items()}  # (steps, envs, ...) -> (steps*envs, ...)
            minibatch_stats = []
            for _epoch in range(args.update_epochs):
                for mb in minibatches(batch, args.num_minibatches, args.norm_adv):
                    loss, mb_stats = loss_fn(agent, mb, **loss_coefs)
                    minibatch_stats.append(mb_stats)

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if distributed and args.sync_every == 1:
                        with comm_clock:
                            all_reduce_mean_([p.grad for p in params], world_size, args.grad_compression)
                    grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                    nan_guard.step(optimizer, grad_norm, global_step)  # skipped on the device if NaN/inf
                    local_steps += 1
                    if distributed and args.sync_every > 1 and local_steps % args.sync_every == 0:
                        with comm_clock:
                            all_reduce_mean_(
                                [p.data for p in params], world_size
                            )  # local SGD: average parameters

                if args.target_kl is not None:
                    kl = mb_stats["approx_kl"].clone()  # the last minibatch's approx KL
                    if distributed:  # one decision for all ranks
                        all_reduce_mean_([kl], world_size)
                    if kl.item() > args.target_kl:
                        break
            if (
                distributed and args.sync_every > 1 and local_steps % args.sync_every
            ):  # one policy per rollout
                with comm_clock:
                    all_reduce_mean_([p.data for p in params], world_size)
            nan_guard.check(run.last_checkpoint, ranks.max)  # one read per iteration, the same on every rank
            learn_time = time.perf_counter() - learn_start  # after that read, so the device's work is counted

            # LOGGING: rank 0 logs the episodes and timings of every rank.
            local_sps = run.sps(global_step) / world_size
            timings = {"env_time": env_time, "inference_time": inference_time, "learn_time": learn_time}
            timings |= {"comm_time": comm_clock.read(), "rollout_wait_time": wait_time}
            gathered = ranks.gather({"episodes": episodes, "sps": local_sps, **timings})
            if ranks.is_main:
                log_rank_stats(run, gathered, global_step)  # episodes, perf/SPS_rank<r>, the slowest timings
                # the last minibatch\'s losses and KL, the clip fraction of all minibatches
                stats = {**mb_stats, "clipfrac": torch.stack([s["clipfrac"] for s in minibatch_stats]).mean()}
                stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))  # one read of the device
                y_pred, y_true = values_np[valid > 0], returns[valid > 0]
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                for name, value in stats.items():
                    writer.add_scalar(f"losses/{name}", value, global_step)
                writer.add_scalar("losses/explained_variance", explained_var, global_step)
                run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            signum = ranks.agree_on_signal(run.stop.signum)  # every rank stops after this same iteration
            if run.checkpoint_due(global_step, batch_size, iteration == num_iterations, signum):
                state = {  # shared by the ranks
                    "model": agent.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iteration": iteration,
                    "global_step": global_step,
                }
                own = {  # this rank's part: everything else an exact resume needs
                    "rng": rng_state(),
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                    "env_seeds": env_seeds,
                    "parameters_sha256": parameters_digest(agent),
                }
                if (
                    args.sync_every > 1
                ):  # local SGD: each rank's Adam moments are its own (sent as CPU tensors)
                    own["local_optimizer"] = to_cpu(optimizer.state_dict())
                path = run.save(state, global_step, own=own)  # rank 0 writes; all wait for it
                if signum:
                    run.exit_on_signal(signum, path, global_step)
    except RUN_ERRORS as e:  # a dead env worker, a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    except RuntimeError as e:  # a collective that failed: name the rank that stopped answering
        ranks.exit_on_lost_rank(e, global_step, run.last_checkpoint)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
