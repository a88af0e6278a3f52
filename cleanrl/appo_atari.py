"""Asynchronous PPO (APPO) for Atari: actor processes play while the learner learns.

Launch:
    python cleanrl/appo_atari.py                                  # Breakout, 2 actors x 4 envs
    python cleanrl/appo_atari.py --env-backend envpool --env-id Breakout-v5   # or --env-backend ale
    torchrun --standalone --nproc_per_node=2 cleanrl/appo_atari.py --num-envs 16
    python cleanrl/appo_atari.py --resume runs/<run-name>

The architecture, the off-policy correction (V-trace targets, PPO clipping against the behaviour
policy) and the lifecycle are appo.py's; read that file's docstring first. What differs is Atari:
the standard preprocessing and Nature CNN of ppo_atari.py, uint8 frames in the shared-memory
slots (a slot of 4 envs x 129 frames is 14.6 MB), and a choice of env backend inside each actor:
gymnasium's vector env with cleanrl_utils/atari_wrappers.py, EnvPool, or ALE's own vector env (one
C++ thread per actor: the actors are the parallelism). With the C++ envs a lost life terminates the
training episode without a reset step, so a step that only resets an env follows a game over or a
truncation, as in ppo_atari_envpool.py.

Reference figures: benchmark/appo_throughput.sh.
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

from cleanrl_utils.actors import ActorChannel, ActorPool
from cleanrl_utils.arguments import fail, require_positive
from cleanrl_utils.atari_wrappers import wrap_atari
from cleanrl_utils.buffers import to_device
from cleanrl_utils.checkpoint import rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks, check_devices, log_rank_stats, parameters_digest
from cleanrl_utils.envs import (
    ALEVectorEnv,
    EnvPoolGames,
    EnvSnapshot,
    atari_actions,
    check_env_id,
    envpool_atari_task,
    finished_episodes,
)
from cleanrl_utils.monitor import DeviceClock
from cleanrl_utils.nan_guard import NaNGuard
from cleanrl_utils.param_server import ParameterServer
from cleanrl_utils.run import RUN_ERRORS, Run, report_and_exit, setup

gym.register_envs(ale_py)


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i of actor a on rank r: seed + (r * num_actors + a) * envs_per_actor + i"""
    torch_deterministic: bool = True
    """if toggled, deterministic cuDNN and full fp32 matmuls; off: cuDNN autotuning and TF32 (GPUs)"""
    cuda: bool = True
    """if toggled, the learner trains on CUDA when available"""
    threads: int | None = None
    """torch intra-op threads of the learner process (None: torch's default; actors use one each)"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of actor 0's env 0 into runs/<run-name>/videos"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<unix-time>"""
    checkpoint_interval: int = 500_000
    """write a checkpoint every this many env steps (0: only at the end and on Ctrl-C)"""
    resume: str | None = None
    """continue from a checkpoint file or a run directory (its newest); its settings are kept (see README)"""
    progress: bool = True
    """show live progress on the console (plain periodic lines when it is not a terminal)"""
    compile: bool = False
    """if toggled, torch.compile the learner's minibatch loss (the first updates compile)"""
    actor_timeout: float = 60.0
    """seconds the learner waits for any rollout before declaring the actors stuck"""

    # Algorithm specific arguments
    env_id: str = "BreakoutNoFrameskip-v4"
    """the Atari game: an ALE id for the gymnasium backend, an EnvPool task (Breakout-v5) for envpool and ale"""
    env_backend: Literal["gymnasium", "envpool", "ale"] = "gymnasium"
    """what steps the envs inside each actor: gymnasium, EnvPool or ale-py's AtariVectorEnv"""
    total_timesteps: int = 10_000_000
    """env steps the learners train on, summed over all envs of all ranks (dropped rollouts not counted)"""
    num_actors: int = 2
    """actor processes of each learner (rank)"""
    num_envs: int = 8
    """parallel environments, summed over all ranks; each learner's share is split over its actors"""
    num_steps: int = 128
    """the number of steps per env per rollout"""
    max_policy_lag: int = 4
    """rollouts sampled with weights more than this many updates old are dropped"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of the V-trace traces (equal to GAE's lambda on-policy)"""
    vtrace_rho_bar: float = 1.0
    """truncation of the importance weights in the V-trace temporal differences"""
    vtrace_c_bar: float = 1.0
    """truncation of the importance weights in the V-trace traces"""
    num_minibatches: int = 4
    """the number of minibatches per epoch"""
    update_epochs: int = 4
    """the number of epochs over each batch"""
    norm_adv: bool = True
    """if toggled, normalise advantages within each minibatch"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient (the ratio is taken against the behaviour policy)"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's implementation"""
    ent_coef: float = 0.01
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm of the gradient"""

    # Distributed arguments
    backend: Literal["nccl", "gloo"] | None = None
    """torch.distributed backend; None: nccl when CUDA is used, else gloo"""
    device_ids: list[int] | None = None
    """GPU of each local rank (local rank i uses device_ids[i]); None: GPU i for local rank i"""
    dist_timeout: float = 600.0
    """seconds a collective may wait for the other ranks before the run fails"""

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "vf_coef", "clip_coef",
                                            "max_grad_norm", "gamma", "gae_lambda",
                                            "update_epochs")  # fmt: skip


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_positive(args, "threads", "num_actors", "learning_rate", "clip_coef", "actor_timeout")
    require_positive(args, "max_grad_norm", "vtrace_rho_bar", "vtrace_c_bar", "dist_timeout")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.max_policy_lag < 0:
        fail(f"--max-policy-lag {args.max_policy_lag}: must be >= 0")
    n, per_update = ranks.world_size * args.num_actors, args.num_envs * args.num_steps
    learner_batch = per_update // ranks.world_size
    if args.num_envs % n != 0:
        fail(f"--num-envs {args.num_envs}: must be a multiple of WORLD_SIZE x --num-actors = {n}")
    if learner_batch % args.num_minibatches != 0:
        fail(f"--num-minibatches {args.num_minibatches}: must divide a learner's batch, {learner_batch}")
    if args.total_timesteps < per_update:
        fail(f"--total-timesteps {args.total_timesteps}: must be at least one update, {per_update} steps")
    check_devices(args, ranks.local_world_size)
    if args.env_backend == "envpool":
        envpool_atari_task(args.env_id)  # an EnvPool Atari id, or an ALE id of the same game
    elif args.env_backend == "ale":
        ALEVectorEnv.check(args.env_id)  # a game ale-py ships, named as EnvPool or gymnasium names it
    else:
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


def vtrace(behaviour_logprobs, target_logprobs, rewards, values, next_value, terminations, dones, gamma, lam,
           rho_bar, c_bar):  # fmt: skip
    """V-trace targets over (num_steps, num_envs) arrays; returns (advantages v_s - V(x_s), targets v_s).

    ``values[t + 1]`` (``next_value`` after the last step) is the value of the observation step t
    returned (the real final observation when step t ended an episode, under next-step
    autoreset); ``terminations[t]`` stops bootstrapping from it and ``dones[t]`` cuts the traces,
    exactly as in ppo.py's compute_gae. With target == behaviour log-probabilities, rho = 1 and
    c = lam, and the result is GAE(lam).
    """
    ratio = np.exp(target_logprobs - behaviour_logprobs)
    rhos = np.minimum(rho_bar, ratio)
    cs = lam * np.minimum(c_bar, ratio)
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    acc = np.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        nextvalues = next_value if t == num_steps - 1 else values[t + 1]
        delta = rhos[t] * (rewards[t] + gamma * nextvalues * (1.0 - terminations[t]) - values[t])
        acc = delta + gamma * cs[t] * (1.0 - dones[t]) * acc
        advantages[t] = acc
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


def actor_loop(actor_id: int, channel: ActorChannel, args: Args, seeds: list, slots: dict, params, video_dir):
    """One actor process: step its envs (gymnasium, EnvPool or ALE) with the newest policy, fill rollouts."""
    with channel.running(actor_id):  # Ctrl-C is the learner's; an exception reaches it as one error
        torch.set_num_threads(1)
        if args.env_backend == "ale":  # env i is seeded seeds[0] + i, like the gymnasium backend's
            envs = ALEVectorEnv(args.env_id, len(seeds), seeds[0], num_threads=1)  # one C++ thread per actor
        elif args.env_backend == "envpool":
            import envpool

            envs = envpool.make(
                envpool_atari_task(args.env_id), env_type="gymnasium", num_envs=len(seeds), num_threads=1,
                seed=seeds[0], episodic_life=True, reward_clip=True, noop_max=30,
            )  # fmt: skip
        if args.env_backend != "gymnasium":
            next_obs, _ = envs.reset()
            games = EnvPoolGames(len(seeds))  # whole-game scores, and which env's next step only resets it
        else:
            capture = bool(video_dir) and args.capture_video and actor_id == 0
            fns = [make_env(args.env_id, i, capture, video_dir) for i in range(len(seeds))]
            envs = gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
            next_obs, _ = envs.reset(seed=seeds)
        assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the rollout relies on it
        policy = Agent(int(envs.single_action_space.n)).to(memory_format=torch.channels_last)
        torch.manual_seed(seeds[0])
        version = -1
        next_reset = np.zeros(len(seeds), dtype=bool)  # the next step of this env only resets it
        while (slot := channel.take_slot()) is not None:  # None: the learner stops the actors
            version = params.pull(policy, version)
            episodes = []
            for step in range(args.num_steps):
                slots["obs"][slot, step] = torch.from_numpy(next_obs)
                slots["valid"][slot, step] = torch.from_numpy(~next_reset)
                with torch.inference_mode():
                    action, logprob, _ = policy.act(torch.from_numpy(next_obs))
                next_obs, reward, terminated, truncated, infos = envs.step(action.numpy().astype(np.int32))
                done = np.logical_or(terminated, truncated)
                slots["actions"][slot, step] = action
                slots["logprobs"][slot, step] = logprob
                slots["rewards"][slot, step] = torch.from_numpy(reward)
                slots["terminations"][slot, step] = torch.from_numpy(terminated)
                slots["dones"][slot, step] = torch.from_numpy(done)
                if args.env_backend != "gymnasium":  # whole games, unclipped; reset steps count for nothing
                    episodes += [(score, length) for _, score, length in games.update(infos, truncated)]
                    next_reset = games.reset_next
                else:
                    next_reset = done
                    episodes += finished_episodes(infos)
            slots["obs"][slot, args.num_steps] = torch.from_numpy(next_obs)  # the bootstrap observation
            channel.deliver(actor_id, slot, version, episodes)


def main() -> None:
    # RANK, LOCAL_RANK, WORLD_SIZE from torchrun (`python`: rank 0 of 1); rank 0 reads the checkpoint
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    device = ranks.device  # cuda:LOCAL_RANK (or --device-ids) with --cuda and a GPU, else the CPU
    rank, world_size, distributed = ranks.rank, ranks.world_size, ranks.distributed

    local_num_envs = args.num_envs // world_size
    envs_per_actor = local_num_envs // args.num_actors
    batch_size = args.num_envs * args.num_steps  # of all learners: one rollout of every env
    num_updates = args.total_timesteps // batch_size
    num_slots = 2 * args.num_actors  # the learner holds one batch while the actors fill the rest

    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic  # autotuned kernels per (fixed) shape
    torch.set_float32_matmul_precision("highest" if args.torch_deterministic else "high")  # TF32 on GPUs
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    obs_shape = (4, 84, 84)  # every backend: 4 stacked 84x84 grayscale frames
    n_actions = atari_actions(args.env_id)  # the game's minimal action set, as every backend uses it

    agent = Agent(n_actions).to(device, memory_format=torch.channels_last)
    if distributed:  # one set of initial weights: rank 0's
        for param in agent.parameters():
            dist.broadcast(param.data, src=0)
    params = list(agent.parameters())
    optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    loss_coefs = {k: getattr(args, k) for k in ("clip_coef", "clip_vloss", "ent_coef", "vf_coef")}
    start_update, global_step, version = 1, 0, 0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_state(checkpoint["rng"])  # this rank's own
        start_update, global_step = checkpoint["update"] + 1, checkpoint["global_step"]
        version = checkpoint["version"]

    # SHARED MEMORY (frames as uint8): rollout slots and the parameter server, made before the actors start
    shape = (num_slots, args.num_steps, envs_per_actor)
    slots = {
        "obs": torch.zeros((num_slots, args.num_steps + 1, envs_per_actor, *obs_shape), dtype=torch.uint8)
    }
    slots |= {"actions": torch.zeros(shape, dtype=torch.long), "valid": torch.zeros(shape, dtype=torch.bool)}
    slots |= {k: torch.zeros(shape) for k in ("logprobs", "rewards", "terminations", "dones")}
    for tensor in slots.values():
        tensor.share_memory_()
    param_server = ParameterServer(agent)
    param_server.publish(agent, version)

    # ACTORS (cleanrl_utils/actors.py starts, supervises and stops the processes). Seeds never collide
    # across actors, ranks or resumes (a resumed run starts new episodes).
    seed_base = args.seed + 10_000_019 * (start_update - 1) + rank * args.num_actors * envs_per_actor
    seeds = [
        [seed_base + a * envs_per_actor + i for i in range(envs_per_actor)] for a in range(args.num_actors)
    ]
    video_dir = str(run_dir / "videos") if ranks.is_main else None  # rank 0's actor 0 records
    actor_args = [(args, seeds[a], slots, param_server, video_dir) for a in range(args.num_actors)]
    actors = ActorPool(actor_loop, actor_args, num_slots, args.env_id, args.actor_timeout)

    # LOGGING SETUP: TensorBoard/W&B (rank 0), Ctrl-C, progress; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    comm_clock = DeviceClock(device)  # CUDA events: an NCCL call returns before its work is done
    dropped = 0
    try:
        for update in range(start_update, num_updates + 1):
            frac = 1.0 - (update - 1.0) / num_updates if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate  # from args: a resume may change it

            # COLLECT: the next num_actors rollouts that are recent enough.
            wait_start = time.perf_counter()
            batch, lags, episodes, actor_wait, actor_busy = [], [], [], 0.0, 0.0
            while len(batch) < args.num_actors:
                rollout = actors.next_rollout()  # an actor that raised, died or hangs: ActorError
                actor_wait, actor_busy = actor_wait + rollout.wait, actor_busy + rollout.busy
                episodes += [(global_step, *episode) for episode in rollout.episodes]
                lag = version - rollout.version
                if lag > args.max_policy_lag:
                    dropped += 1
                    actors.release(rollout.slot)
                    continue
                lags.append(lag)
                batch.append(rollout.slot)
            learner_wait = time.perf_counter() - wait_start
            queue_depth = actors.queue_depth()
            global_step += batch_size
            # once, on the gloo side group: a learner that is gone is named here, in one line, before NCCL waits
            wait_time = ranks.wait_for_all()

            # ADVANTAGES: V-trace under the learner's current weights. Slots are (steps, envs); the
            # batch puts the rollouts side by side as (steps, num_actors * envs_per_actor).
            learn_start = time.perf_counter()
            b = {k: torch.cat([v[slot] for slot in batch], dim=1) for k, v in slots.items()}
            # uploads through pinned memory (no GPU wait); obs_all: (num_steps + 1, num_envs, *obs_shape)
            obs_all, actions = to_device(b["obs"], device), to_device(b["actions"], device)
            with torch.inference_mode():
                target_logprobs, _, values = agent.evaluate(obs_all[:-1].flatten(0, 1), actions.reshape(-1))
                # one read of all three: the learner's one wait for the GPU before V-trace
                read = torch.cat([target_logprobs, values, agent.get_value(obs_all[-1])]).cpu().numpy()
            target_logprobs, values, next_value = np.split(read, [len(values), 2 * len(values)])
            target_logprobs, values = (
                x.reshape(args.num_steps, local_num_envs) for x in (target_logprobs, values)
            )
            rewards, terminations, dones = (b[k].numpy() for k in ("rewards", "terminations", "dones"))
            behaviour, hyper = (
                b["logprobs"].numpy(),
                (args.gamma, args.gae_lambda, args.vtrace_rho_bar, args.vtrace_c_bar),
            )
            advantages, returns = vtrace(
                behaviour, target_logprobs, rewards, values, next_value, terminations, dones, *hyper
            )

            # UPDATE: PPO epochs on fixed-size minibatches (reset steps weigh 0), the ratio taken against
            # the behaviour policy, as in ppo_atari.py. The batch is copied out: the actors may refill the slots.
            host = {
                "advantages": advantages,
                "returns": returns,
                "values": values,
                "weights": b["valid"].float().numpy(),
            }
            host["logprobs"] = b["logprobs"]
            data = {
                "obs": obs_all[:-1],
                "actions": actions,
                **{k: to_device(v, device) for k, v in host.items()},
            }
            data = {k: v.flatten(0, 1) for k, v in data.items()}  # (steps, envs, ...) -> (steps*envs, ...)
            for slot in batch:
                actors.release(slot)
            minibatch_stats = []
            for _epoch in range(args.update_epochs):
                for mb in minibatches(data, args.num_minibatches, args.norm_adv):
                    loss, mb_stats = loss_fn(agent, mb, **loss_coefs)
                    minibatch_stats.append(mb_stats)

                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if distributed:
                        with comm_clock:
                            all_reduce_mean_([p.grad for p in params], world_size)
                    grad_norm = nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                    nan_guard.step(optimizer, grad_norm, global_step)  # all-reduced: every rank skips alike

            # PUBLISH the new weights for the actors.
            version += 1
            param_server.publish(agent, version)
            nan_guard.check(run.last_checkpoint, ranks.max)  # one read per update; no NaN reached the weights
            learn_time = time.perf_counter() - learn_start

            # LOGGING: rank 0 logs the episodes of every rank and the slowest rank's figures.
            local_sps = run.sps(global_step) / world_size
            timings = {"learn_time": learn_time, "comm_time": comm_clock.read(), "queue_depth": queue_depth}
            timings["rollout_wait_time"] = wait_time
            timings["learner_idle_fraction"] = learner_wait / (learner_wait + learn_time)
            timings["actor_idle_fraction"] = actor_wait / max(actor_wait + actor_busy, 1e-9)
            timings |= {"dropped_rollouts": dropped, "policy_lag": np.mean(lags)}
            gathered = ranks.gather({"episodes": episodes, "sps": local_sps, **timings})
            if ranks.is_main:
                log_rank_stats(
                    run, gathered, global_step
                )  # episodes, perf/SPS_rank<r>, perf/<stat> of the slowest rank
                # the last minibatch's losses and KL, the clip fraction of all minibatches
                stats = {**mb_stats, "clipfrac": torch.stack([s["clipfrac"] for s in minibatch_stats]).mean()}
                stats = dict(zip(stats, torch.stack(list(stats.values())).tolist()))  # one read of the device
                valid = b["valid"].numpy()
                y_pred, y_true = values[valid], returns[valid]
                var_y = np.var(y_true)
                explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
                writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
                for name, value in stats.items():
                    writer.add_scalar(f"losses/{name}", value, global_step)
                writer.add_scalar("losses/explained_variance", explained_var, global_step)
                writer.add_histogram("perf/policy_lag_hist", np.array(lags), global_step)
                run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            signum = ranks.agree_on_signal(run.stop.signum)  # every rank stops after this same update
            if run.checkpoint_due(global_step, batch_size, update == num_updates, signum):
                state = {  # shared by the learners
                    "model": agent.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "update": update,
                    "version": version,
                    "global_step": global_step,
                }
                own = {
                    "rng": rng_state(),
                    "parameters_sha256": parameters_digest(agent),
                }  # this learner's part
                path = run.save(state, global_step, own=own)  # rank 0 writes; all wait for it
                if signum:
                    run.exit_on_signal(signum, path, global_step)
    except RUN_ERRORS as e:  # a dead actor, a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    except RuntimeError as e:  # a collective that failed: name the rank that stopped answering
        ranks.exit_on_lost_rank(e, global_step, run.last_checkpoint)
    finally:
        actors.close()
        run.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
