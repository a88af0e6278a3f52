"""PPO for Atari (Breakout-v5 by default) with EnvPool stepping the games in a C++ thread pool.

Launch:
    python cleanrl/ppo_atari_envpool.py                      # Breakout, 8 envs
    python cleanrl/ppo_atari_envpool.py --env-id Pong-v5 --num-envs 16
    python cleanrl/ppo_atari_envpool.py --resume runs/<run-name>
    tensorboard --logdir runs

EnvPool does the standard Atari preprocessing in C++ (no-op starts, frame skip 4 with max-pooling,
episodic life, FIRE on reset, reward clipping, 84x84 grayscale, 4-frame stack).

Autoreset (EnvPool is next-step, and says so in its metadata): after a game ends (game over or the
27k-step limit), the next ``step`` ignores the action, resets that env and returns reward 0. That
reset step is not a transition: it is kept in the rollout but dropped from the training batch.
A lost life only *terminates* the training episode (``terminated`` is set, the value is not
bootstrapped) and the game goes on with a real transition, so it is not followed by a reset step:
this is why validity follows ``info["terminated"]`` (game over) or truncation, not every
``terminated``. Episode statistics use ``info["reward"]`` (the unclipped score) summed over whole
games.

Resume: EnvPool exposes no environment state, so a resumed run restores the model, optimizer,
counters and RNGs exactly but starts new games (seeded from the seed and the iteration).
Reference figures: benchmark/ppo_throughput.sh.
"""

import os
import random
import time
from dataclasses import dataclass

import envpool
import numpy as np
import torch
import torch.nn as nn
from gymnasium.vector import AutoresetMode

from cleanrl_utils.buffers import to_device
from cleanrl_utils.checkpoint import rng_state, set_rng_state
from cleanrl_utils.envs import EnvPoolGames, EpisodeVideo, envpool_atari_task
from cleanrl_utils.run import RUN_ERRORS, Run, fail, report_and_exit, require_positive, start


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment; env i is seeded with seed + i"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
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

    # Algorithm specific arguments
    env_id: str = "Breakout-v5"
    """the EnvPool Atari task, e.g. Pong-v5 (or an ALE id of the same game: PongNoFrameskip-v4)"""
    env_threads: int = 0
    """EnvPool worker threads (0: one per env, capped by the cores)"""
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


def validate(args: Args) -> None:
    """Reject bad input with one line naming the value and the rule (exit code 2), before any work."""
    require_positive(args, "total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs", "threads")
    require_positive(args, "learning_rate", "clip_coef", "max_grad_norm")
    if args.env_threads < 0:
        fail(f"--env-threads {args.env_threads}: must be >= 0")
    if not 0.0 < args.gamma <= 1.0:
        fail(f"--gamma {args.gamma}: must be in (0, 1]")
    if not 0.0 <= args.gae_lambda <= 1.0:
        fail(f"--gae-lambda {args.gae_lambda}: must be in [0, 1]")
    if args.checkpoint_interval < 0:
        fail(f"--checkpoint-interval {args.checkpoint_interval}: must be >= 0")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches}: must divide the batch size num_envs * num_steps = {batch_size}"
        )
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps}: must be at least one iteration, "
            f"num_envs * num_steps = {batch_size}"
        )
    envpool_atari_task(args.env_id)  # an EnvPool Atari id, or an ALE id of the same game


def make_envs(env_id: str, num_envs: int, seed: int, num_threads: int, capture_video: bool):
    """EnvPool runs env i with seed ``seed + i``."""
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

    def evaluate(self, x: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probabilities of ``action``, policy entropy and state values."""
        hidden = self.hidden(x)
        log_probs = self.actor(hidden).log_softmax(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1), entropy, self.critic(hidden).squeeze(-1)


def compute_gae(rewards, values, next_value, terminations, dones, gamma: float, gae_lambda: float):
    """Generalized advantage estimation over a rollout of (num_steps, num_envs) arrays; returns (advantages, returns).

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


def ppo_loss(newlogprob, oldlogprob, advantages, newvalue, oldvalue, returns, clip_coef: float, clip_vloss: bool):
    """Clipped surrogate policy loss and (optionally clipped) value loss of a minibatch, both to be minimised."""
    ratio = (newlogprob - oldlogprob).exp()
    pg_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if clip_vloss:
        v_clipped = oldvalue + (newvalue - oldvalue).clamp(-clip_coef, clip_coef)
        v_loss = 0.5 * torch.max((newvalue - returns) ** 2, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    return pg_loss, v_loss


def main() -> None:
    args, run_dir, checkpoint = start(Args, validate, __file__)  # exit 2 on bad input, before any work
    batch_size = args.num_envs * args.num_steps
    num_iterations = args.total_timesteps // batch_size

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # ENV SETUP
    env_seed = args.seed
    if checkpoint is not None:  # new games after a resume, not a replay of the first ones
        env_seed = int(np.random.SeedSequence([args.seed, checkpoint["iteration"]]).generate_state(1)[0] >> 2)
    envs = make_envs(args.env_id, args.num_envs, env_seed, args.env_threads, args.capture_video)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP, "the rollout below assumes next-step autoreset"
    obs_shape = envs.single_observation_space.shape

    agent = Agent(int(envs.single_action_space.n)).to(device, memory_format=torch.channels_last)
    # fused Adam: one kernel for all parameters instead of ~10 small ops per tensor.
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # ROLLOUT STORAGE in host memory, frames as bytes: a numpy write costs ~1us where a tensor copy costs ~5us.
    # Step t holds obs_t, the action taken in it and what stepping returned.
    shape = (args.num_steps, args.num_envs)
    obs = np.zeros((*shape, *obs_shape), dtype=np.uint8)
    actions, valid = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=bool)
    logprobs, rewards, values = np.zeros(shape, np.float32), np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    terminations, dones = np.zeros(shape, np.float32), np.zeros(shape, np.float32)

    next_obs, _ = envs.reset()
    games = EnvPoolGames(args.num_envs)  # whole-game scores, and which env's next step only resets it
    video = EpisodeVideo(str(run_dir / "videos")) if args.capture_video else None
    start_iteration, global_step = 1, 0
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        set_rng_state(checkpoint["rng"])
        start_iteration, global_step = checkpoint["iteration"] + 1, checkpoint["global_step"]

    # LOGGING SETUP (the run directory exists only from here on): TensorBoard/W&B, Ctrl-C, progress, checkpoints
    run = Run(args, run_dir, __file__, checkpoint, global_step, device)
    writer = run.writer
    try:
        for iteration in range(start_iteration, num_iterations + 1):
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate
            env_time = inference_time = 0.0

            # ROLLOUT
            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                valid[step] = ~games.reset_next  # a step right after a game ends only resets that env

                t0 = time.perf_counter()
                with torch.inference_mode():
                    action, logprob, value = agent.act(to_device(obs[step], device))
                actions[step], logprobs[step], values[step] = (t.cpu().numpy() for t in (action, logprob, value))
                t1 = time.perf_counter()
                next_obs, reward, terminated, truncated, infos = envs.step(actions[step].astype(np.int32))
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
            advantages, returns = compute_gae(
                rewards, values, next_value, terminations, dones, args.gamma, args.gae_lambda
            )

            # UPDATE: only real transitions enter the batch (reset steps are left out); to a GPU without a host wait.
            b_valid = valid.reshape(-1)
            b_obs = to_device(obs.reshape((-1, *obs_shape))[b_valid], device)
            b_logprobs = to_device(logprobs.reshape(-1)[b_valid], device)
            b_actions = to_device(actions.reshape((-1, *actions.shape[2:]))[b_valid], device)
            b_advantages = to_device(advantages.reshape(-1)[b_valid], device)
            b_returns = to_device(returns.reshape(-1)[b_valid], device)
            b_values = to_device(values.reshape(-1)[b_valid], device)
            clipfracs = []
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
                    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    run.step(optimizer, grad_norm, global_step)  # skipped on the device if NaN/inf: no host wait

                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            run.raise_if_nonfinite("gradient norm")  # one host read per iteration; no NaN step reached the weights
            learn_time = time.perf_counter() - learn_start  # after that read, so the device's work is counted

            # LOGGING
            y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
            var_y = np.var(y_true)
            explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
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
