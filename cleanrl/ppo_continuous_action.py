"""PPO for continuous control (HalfCheetah-v4 by default; any gymnasium env with Box actions).

Launch:
    python cleanrl/ppo_continuous_action.py                          # HalfCheetah-v4, 1M steps
    python cleanrl/ppo_continuous_action.py --env-id Hopper-v4 --num-envs 4 --vector-mode async
    python cleanrl/ppo_continuous_action.py --env-id Pendulum-v1     # no MuJoCo needed
    python cleanrl/ppo_continuous_action.py --resume runs/<run-name>
    tensorboard --logdir runs

Normalisation: observations and rewards are normalised by gymnasium's *vector* wrappers, so all
envs share one set of running statistics (kept in this process even with async envs). Both are
saved in every checkpoint (under ``normalization`` and inside the env state), so a resumed run
and an evaluation see the same scaling. ``charts/episodic_return`` is the raw, unnormalised return.

Autoreset: next-step (gymnasium's default). The step that ends an episode returns its real final
observation (normalised like any other); the next ``step`` only resets that env. Such reset steps
stay in the rollout but weigh 0 in the loss. Termination stops bootstrapping;
truncation (the time limit, 1000 steps in MuJoCo) bootstraps from the final observation's value.

Defaults are CleanRL's MuJoCo PPO settings (no departure). Speed, as in ppo_atari.py: the rollout stays on
the device, so the host waits for a GPU once per env step, for the actions; minibatches keep one size
(reset steps weigh 0). ``--compile`` compiles the policy step and the loss; ``--cudagraphs`` replays the
policy step as a CUDA graph. Reference figures: benchmark/ppo_throughput.sh.
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
import torch.nn as nn
from gymnasium.vector import AutoresetMode

from cleanrl_utils.arguments import fail, require_batch, require_positive
from cleanrl_utils.buffers import to_device
from cleanrl_utils.checkpoint import rng_state, set_rng_state
from cleanrl_utils.distributed import Ranks
from cleanrl_utils.envs import (
    EnvSnapshot,
    async_vector_env,
    check_env_id,
    finished_episodes,
    get_vector_state,
    set_vector_state,
)
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
    cuda: bool = False
    """if toggled, train on CUDA when available (a small MLP is faster on the CPU)"""
    threads: int = 1
    """torch intra-op threads of this process (1 is fastest for a small MLP)"""
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
    checkpoint_interval: int = 100_000
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
    env_id: str = "HalfCheetah-v4"
    """the id of the gymnasium environment (Box actions and observations)"""
    vector_mode: Literal["sync", "async"] = "sync"
    """sync: envs step in this process; async: one worker process per env"""
    env_timeout: float = 60.0
    """seconds an async env worker may take for one reset or step before the run stops"""
    total_timesteps: int = 1_000_000
    """total env steps of the run, summed over envs"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    num_steps: int = 2048
    """the number of steps per env per rollout"""
    anneal_lr: bool = True
    """if toggled, anneal the learning rate linearly to 0 over the run"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches per epoch"""
    update_epochs: int = 10
    """the number of epochs over each rollout"""
    norm_adv: bool = True
    """if toggled, normalise advantages within each minibatch"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's implementation"""
    ent_coef: float = 0.0
    """coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm of the gradient"""
    target_kl: float | None = None
    """stop the epochs of an update early once the approximate KL exceeds this"""
    clip_obs: float = 10.0
    """normalised observations are clipped to [-clip_obs, clip_obs]"""
    clip_reward: float = 10.0
    """normalised rewards are clipped to [-clip_reward, clip_reward]"""

    # what --resume may change (population-based training mutates these); any other change is refused
    RESUMABLE: ClassVar[tuple[str, ...]] = ("learning_rate", "ent_coef", "vf_coef", "clip_coef",
                                            "max_grad_norm", "gamma", "gae_lambda",
                                            "update_epochs", "target_kl")  # fmt: skip


def validate(args: Args, ranks: Ranks) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs")
    require_positive(args, "threads", "learning_rate", "clip_coef", "env_timeout", "max_grad_norm")
    require_positive(args, "clip_obs", "clip_reward")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    if args.cudagraphs and not (args.compile and args.cuda and torch.cuda.is_available()):
        fail("--cudagraphs: needs --compile and CUDA (torch.compile replays the policy step as a CUDA graph)")
    require_batch(args)
    check_env_id(args.env_id)


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str):
    """A thunk making env ``idx`` (flat observations, actions clipped to the box), wrapped in EnvSnapshot."""

    def thunk():
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir)
        else:
            env = gym.make(env_id)
        env = gym.wrappers.FlattenObservation(env)
        if isinstance(env.action_space, gym.spaces.Box):  # (other spaces are refused in main)
            env = gym.wrappers.ClipAction(env)  # the policy's Gaussian samples are unbounded
        return EnvSnapshot(env)

    return thunk


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate value and mean networks; a state-independent log standard deviation."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, action_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; return them with their log-probabilities and the state values."""
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        action = mean + logstd.exp() * torch.randn_like(mean)
        return action, gaussian_log_prob(action, mean, logstd), self.get_value(x)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor):
        """Log-probabilities of ``action``, policy entropy and state values."""
        mean = self.actor_mean(x)
        logstd = self.actor_logstd.expand_as(mean)
        entropy = (0.5 + 0.5 * math.log(2 * math.pi) + logstd).sum(-1)
        return gaussian_log_prob(action, mean, logstd), entropy, self.get_value(x)


def gaussian_log_prob(action: torch.Tensor, mean: torch.Tensor, logstd: torch.Tensor) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over action dimensions."""
    return (-0.5 * ((action - mean) / logstd.exp()) ** 2 - logstd - 0.5 * math.log(2 * math.pi)).sum(-1)


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
    video_dir = str(run_dir / "videos")
    env_fns = [make_env(args.env_id, i, args.capture_video, video_dir) for i in range(args.num_envs)]
    if args.vector_mode == "sync":
        envs = gym.vector.SyncVectorEnv(env_fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    else:  # one worker process per env; one that raises, dies or hangs stops the run with one line
        envs = async_vector_env(env_fns, args.env_id, args.env_timeout)
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        envs.close()
        fail(f"--env-id {args.env_id}: needs a continuous (Box) action space, got {envs.single_action_space}")
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # inside the normalisation: raw returns
    envs = obs_norm = gym.wrappers.vector.NormalizeObservation(envs)
    envs = gym.wrappers.vector.TransformObservation(  # float32 always: gymnasium 1.1 normalises to float64
        envs, lambda o: np.clip(o, -args.clip_obs, args.clip_obs).astype(np.float32)
    )
    envs = reward_norm = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
    envs = gym.wrappers.vector.ClipReward(envs, -args.clip_reward, args.clip_reward)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP  # the rollout below relies on it
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape

    agent = Agent(int(np.prod(obs_shape)), int(np.prod(action_shape))).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    nan_guard = NaNGuard(device)  # optimizer steps that a NaN/inf never reaches (no host wait)
    mode = "reduce-overhead" if args.cudagraphs else None  # reduce-overhead: replayed as a CUDA graph
    act = torch.compile(agent.act, mode=mode) if args.compile else agent.act
    loss_fn = torch.compile(minibatch_loss) if args.compile else minibatch_loss
    loss_coefs = {k: getattr(args, k) for k in ("clip_coef", "clip_vloss", "ent_coef", "vf_coef")}

    # ROLLOUT STORAGE, step t: obs_t, its action (a vector), what stepping returned; the policy's on device
    shape = (args.num_steps, args.num_envs)
    obs = torch.zeros((*shape, *obs_shape), device=device)
    actions = torch.zeros((*shape, *action_shape), device=device)
    logprobs, values = torch.zeros(shape, device=device), torch.zeros(shape, device=device)
    rewards, terminations, dones, valid = (np.zeros(shape, np.float32) for _ in range(4))  # valid: 1 or 0

    next_obs, _ = envs.reset(seed=[args.seed + i for i in range(args.num_envs)])
    next_done = np.zeros(args.num_envs, dtype=bool)  # did the previous step end an episode?
    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_vector_state(envs, checkpoint["envs"])
        set_rng_state(checkpoint["rng"])
        next_obs, next_done = checkpoint["next_obs"].numpy(), checkpoint["next_done"].numpy()
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
                for episodic_return, length in finished_episodes(infos):
                    run.log_episode(global_step, episodic_return, length)

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
                    "envs": get_vector_state(envs),
                    "next_obs": torch.from_numpy(np.array(next_obs)),
                    "next_done": torch.from_numpy(next_done.copy()),
                    # the normalisation statistics (also inside "envs"), for an evaluation without these envs
                    "obs_rms": {k: torch.as_tensor(np.asarray(v)) for k, v in vars(obs_norm.obs_rms).items()},
                    "return_var": float(reward_norm.return_rms.var),
                }
                path = run.save(state, global_step)
                if run.stop.signum:
                    run.exit_on_signal(run.stop.signum, path, global_step)
        if args.save_model:  # the final checkpoint's weights, evaluated as CleanRL's scripts evaluate theirs
            from cleanrl_utils.enjoy import evaluate

            model_path = run.save_model(["model", "obs_rms"])
            for i, episodic_return in enumerate(evaluate(model_path, 10, args.seed, greedy=False)):
                writer.add_scalar("eval/episodic_return", episodic_return, i)
    except RUN_ERRORS as e:  # a dead env worker, a NaN, a failed checkpoint write: one line, exit 1
        report_and_exit(e)
    finally:
        run.close()
        envs.close()
    run.summary(global_step)


if __name__ == "__main__":
    main()
