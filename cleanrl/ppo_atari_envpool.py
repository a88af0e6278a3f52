"""PPO for Atari (Breakout-v5 by default) with EnvPool (or ALE's own vector env) stepping the games in C++ threads.

Launch:
    python cleanrl/ppo_atari_envpool.py                      # Breakout, 8 envs
    python cleanrl/ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16
    python cleanrl/ppo_atari_envpool.py --vector-mode ale     # ale-py's AtariVectorEnv instead of EnvPool
    python cleanrl/ppo_atari_envpool.py --resume runs/<run-name>
    tensorboard --logdir runs

EnvPool does the standard Atari preprocessing in C++ (no-op starts, frame skip 4 with max-pooling,
episodic life, FIRE on reset, reward clipping, 84x84 grayscale, 4-frame stack); ``--vector-mode ale``: ale-py's
``AtariVectorEnv`` does, behind EnvPool's interface (``cleanrl_utils.envs.ALEVectorEnv``; no EnvPool needed).

Autoreset (EnvPool is next-step, and says so in its metadata): after a game ends (game over or the
27k-step limit), the next ``step`` ignores the action, resets that env and returns reward 0. That
reset step is not a transition: it is kept in the rollout but dropped from the training batch.
A lost life only *terminates* the training episode (``terminated`` is set, the value is not
bootstrapped) and the game goes on with a real transition, so it is not followed by a reset step:
this is why validity follows ``info["terminated"]`` (game over) or truncation, not every
``terminated``. Episode statistics use ``info["reward"]`` (the unclipped score) summed over whole
games.

Resume: EnvPool and ALE's vector env expose no environment state, so a resumed run restores the model, optimizer,
counters and RNGs exactly but starts new games (seeded from the seed and the iteration).

Speed: rollouts stay on the device (frames as the
uint8 sent for act()), so the host waits for the GPU once per env step, for the actions; minibatches
keep one size (reset steps weigh 0); the CNN runs channels-last. ``--compile`` compiles the policy
step and the loss, ``--cudagraphs`` replays the policy step as a CUDA graph, and
``--no-torch-deterministic`` lets cuDNN autotune and matmuls use TF32 (GPUs only; results then vary).
Reference figures: benchmark/ppo_throughput.sh, benchmark/gpu_check.sh.
"""

import os
import random
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import torch
import torch.nn as nn
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_batch, require_positive
from cleanrl_utils.buffers import to_device
from cleanrl_utils.checkpoint import rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks
from cleanrl_utils.envs import ALEVectorEnv, EnvPoolGames, EpisodeVideo, envpool_atari_task
from cleanrl_utils.nan_guard import NaNGuard
from cleanrl_utils.run import RUN_ERRORS, Run, report_and_exit, setup


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i is seeded with seed + i"""
    torch_deterministic: bool = True
    """if toggled, deterministic cuDNN and full fp32 matmuls; off: cuDNN autotuning and TF32 (GPUs)"""
    cuda: bool = True
    """if toggled, train on CUDA when available"""
    threads: int | None = None
    """torch intra-op threads of this process (None: torch's default, one per core)"""
    track: bool = False
    """if toggled, also log to Weights & Biases (the API key is read from WANDB_API_KEY only)"""
    wandb_project_name: str = "cleanRL"
    """the W&B project"""
    wandb_entity: str | None = None
    """the W&B entity (team); None for the key's default"""
    capture_video: bool = False
    """if toggled, record videos of env 0's games into runs/<run-name>/videos"""
    run_name: str | None = None
    """name of the run directory under runs/; default <env-id>__<exp-name>__<seed>__<unix-time>"""
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
    env_id: str = "Breakout-v5"
    """the EnvPool Atari task, e.g. Pong-v5 (or an ALE id of the same game: PongNoFrameskip-v4)"""
    vector_mode: Literal["envpool", "ale"] = "envpool"
    """what steps the games: EnvPool, or ale-py's AtariVectorEnv (same preprocessing; no --capture-video)"""
    env_threads: int = 0
    """worker threads of the vector env (0: one per env, capped by the cores this process may use less one for
    the main thread, which runs the policy and the update; on 2 cores, both)"""
    total_timesteps: int = 10_000_000
    """total env steps of the run, summed over envs (one step = 4 frames)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel environments"""
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

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "vf_coef", "clip_coef",
                                            "max_grad_norm", "gamma", "gae_lambda",
                                            "update_epochs", "target_kl")  # fmt: skip


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_positive(args, "threads", "learning_rate", "clip_coef", "max_grad_norm")
    if args.env_threads < 0:
        fail(f"--env-threads {args.env_threads}: must be >= 0")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.cudagraphs and not (args.compile and args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs: needs --compile and CUDA (torch.compile replays the policy step as a CUDA graph)")
    require_batch(args)
    if args.vector_mode == "ale":
        ALEVectorEnv.check(args.env_id)  # a game ale-py ships, named as EnvPool or gymnasium names it
        if args.capture_video:
            fail("--capture-video: not with --vector-mode ale (ALE's vector env renders no frames)")
    else:
        envpool_atari_task(args.env_id)  # an EnvPool Atari id, or an ALE id of the same game


def make_envs(env_id: str, num_envs: int, seed: int, num_threads: int, capture_video: bool, vector_mode: str):
    """Env i runs with seed ``seed + i``."""
    if vector_mode == "ale":
        return ALEVectorEnv(env_id, num_envs, seed, num_threads)
    import envpool

    return envpool.make(
        envpool_atari_task(env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        num_threads=num_threads,
        seed=seed,
        episodic_life=True,
        reward_clip=True,
        noop_max=30,
        render_mode="rgb_array" if capture_video else None,
    )


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


def main() -> None:
    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    torch.backends.cudnn.benchmark = not args.torch_deterministic  # autotuned kernels per (fixed) shape
    torch.set_float32_matmul_precision("highest" if args.torch_deterministic else "high")  # TF32 on GPUs
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = ranks.device  # cuda:LOCAL_RANK (or --device-ids) with --cuda and a GPU, else the CPU

    # ENV SETUP
    env_seed = args.seed
    if checkpoint is not None:  # new games after a resume, not a replay of the first ones
        env_seed = int(np.random.SeedSequence([args.seed, checkpoint["iteration"]]).generate_state(1)[0] >> 2)
    # the env threads leave the main thread (policy, update, GPU launches) a core of its own, from 3 cores on
    cores = len(os.sched_getaffinity(0))
    env_threads = args.env_threads or min(args.num_envs, cores - 1 if cores > 2 else cores)
    envs = make_envs(args.env_id, args.num_envs, env_seed, env_threads, args.capture_video, args.vector_mode)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the rollout below relies on it
    obs_shape = envs.single_observation_space.shape

    agent = Agent(int(envs.single_action_space.n)).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(agent.act, mode=mode) if args.compile else agent.act
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    loss_coefs = {k: getattr(args, k) for k in ("clip_coef", "clip_vloss", "ent_coef", "vf_coef")}

    # ROLLOUT STORAGE, step t: obs_t, its action, what stepping returned; the policy's on the device
    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros((*shape, *obs_shape), dtype=torch.uint8, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    logprobs, values = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    rewards, terminations, dones, valid = (np.zeros(shape, np.float32) for _ in range(4))  # valid: 1 or 0

    next_obs, _ = envs.reset()
    games = EnvPoolGames(args.num_envs)  # whole-game scores, and which env's next step only resets it
    video = EpisodeVideo(str(run_dir / "videos")) if args.capture_video else None
    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_state(checkpoint["rng"])
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]

    # LOGGING SETUP: TensorBoard/W&B, Ctrl-C, progress, checkpoints; the run directory exists from here on
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)
    writer = run.writer
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations if args.anneal_lr else 1.0
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate  # from args: a resume may change it
            env_time = inference_time = 0.0

            # ROLLOUT
            for step in range(args.num_steps):
                global_step += args.num_envs
                valid[step] = ~games.reset_next  # a step right after a game ends only resets that env

                t0 = time.perf_counter()
                obs[step] = to_device(next_obs, device)
                with torch.inference_mode():
                    actions[step], logprobs[step], values[step] = act(obs[step])
                action = actions[step].cpu().numpy()  # the one wait for the device per step: the envs need it
                t1 = time.perf_counter()
                next_obs, reward, terminated, truncated, infos = envs.step(action.astype(np.int32))
                env_time, inference_time = env_time + time.perf_counter() - t1, inference_time + t1 - t0

                rewards[step], terminations[step] = reward, terminated
                dones[step] = np.logical_or(terminated, truncated)
                for _, score, length in games.update(infos, truncated):  # whole games, unclipped scores
                    run.log_episode(global_step, score, length)
                if video is not None:
                    video.record(envs, episode_over=games.reset_next[0])

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
                    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    nan_guard.step(optimizer, grad_norm, global_step)  # skipped on the device if NaN/inf

                if args.target_kl is not None and mb_stats["approx_kl"] > args.target_kl:
                    break
            nan_guard.check(run.last_checkpoint)  # one host read per iteration; no NaN reached the weights
            learn_time = time.perf_counter() - learn_start  # after that read, so the device's work is counted

            # LOGGING
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
            writer.add_scalar("perf/env_time", env_time, global_step)
            writer.add_scalar("perf/inference_time", inference_time, global_step)
            writer.add_scalar("perf/learn_time", learn_time, global_step)
            run.log_progress(global_step)  # charts/SPS, CPU/GPU figures, the console line

            # CHECKPOINT every checkpoint_interval env steps, at the end, and when a signal asks for one
            if run.checkpoint_due(global_step, batch_size, iteration == num_iterations, run.stop.signum):
                state = {  # everything an exact resume needs
                    "model": agent.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iteration": iteration,
                    "global_step": global_step,
                    "rng": rng_state(),
                }
                path = run.save(state, global_step)
                if run.stop.signum:
                    run.exit_on_signal(run.stop.signum, path, global_step)
    except RUN_ERRORS as e:  # a dead env worker, a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
