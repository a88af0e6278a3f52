"""Evaluate a trained policy: load any script's checkpoint into the script's own network and play.

    python -m cleanrl_utils.enjoy runs/<run-name>                      # its newest checkpoint, 10 episodes
    python -m cleanrl_utils.enjoy runs/<run-name>/checkpoints/ckpt_00100000.pt --episodes 30 --greedy
    python -m cleanrl_utils.enjoy runs/<run-name> --capture-video        # videos in runs/<run-name>/eval_videos

Only the weights are read (``weights_only=True``, digest checked); the network class and the env
factory come from the script that wrote the checkpoint (``cleanrl/<script>``), with the env id
and settings the run trained with, so what is evaluated is exactly what was trained. Episode
``i`` is reset with seed ``--seed + i``. The policy samples its actions as in training, or with
``--greedy`` takes the most likely action (the mean for continuous actions); DQN acts greedily,
with ``--epsilon`` random actions. Atari returns are the raw game scores over all lives. Prints
each episode's return and then the mean +- std.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import tyro

from cleanrl_utils.checkpoint import CheckpointError, load_checkpoint, resolve_resume
from cleanrl_utils.envs import register_env_family
from cleanrl_utils.launch import REPO, load_script

DISCRETE_PPO = {"ppo", "appo"}
ATARI_PPO = {"ppo_atari", "ppo_atari_multigpu", "appo_atari"}
DQN = {"dqn"}
ATARI_DQN = {"dqn_atari", "dqn_atari_multigpu"}
SAC = {"sac_continuous_action", "sac_continuous_action_multigpu"}
CONTINUOUS_PPO = {"ppo_continuous_action"}


def make_policy(name: str, module, checkpoint: dict, env: gym.Env, greedy: bool, epsilon: float, rng):
    """The script's network with the checkpoint's weights, as ``obs (numpy) -> action``."""
    obs_dim = int(np.prod(env.observation_space.shape))
    if name in DISCRETE_PPO | ATARI_PPO:
        n = int(env.action_space.n)
        net = module.Agent(obs_dim, n) if name in DISCRETE_PPO else module.Agent(n)
        net.load_state_dict(checkpoint["model"])

        def policy(x):
            if not greedy:
                return net.act(x)[0]
            hidden = x if name in DISCRETE_PPO else net.hidden(x)
            return net.actor(hidden).argmax(-1)

    elif name in DQN | ATARI_DQN:
        n = int(env.action_space.n)
        net = module.QNetwork(obs_dim, n) if name in DQN else module.QNetwork(n)
        net.load_state_dict(checkpoint["model"])

        def policy(x):
            if epsilon > 0 and rng.random() < epsilon:
                return torch.as_tensor([env.action_space.sample()])
            return net(x).argmax(-1)

    elif name in SAC:
        net = module.Actor(obs_dim, env.action_space.low, env.action_space.high)
        net.load_state_dict(checkpoint["actor"])

        def policy(x):
            return net.greedy(x) if greedy else net(x)[0]

    elif name in CONTINUOUS_PPO:
        net = module.Agent(obs_dim, int(np.prod(env.action_space.shape)))
        net.load_state_dict(checkpoint["model"])
        rms = checkpoint.get("obs_rms")
        clip = checkpoint["args"].get("clip_obs", 10.0)

        def policy(x):
            if rms is not None:  # the observation normalisation the policy was trained with, frozen
                x = ((x - rms["mean"].float()) / torch.sqrt(rms["var"].float() + 1e-8)).clamp(-clip, clip)
            return net.actor_mean(x) if greedy else net.act(x)[0]

    else:
        raise CheckpointError(
            f"checkpoint of {name}.py: enjoy.py evaluates the gymnasium scripts "
            f"({', '.join(sorted(DISCRETE_PPO | ATARI_PPO | DQN | ATARI_DQN | SAC | CONTINUOUS_PPO))})"
        )
    net.eval()

    @torch.inference_mode()
    def act(obs: np.ndarray):
        action = policy(torch.as_tensor(np.asarray(obs)[None]).float() if name not in ATARI_PPO | ATARI_DQN
                        else torch.as_tensor(np.asarray(obs)[None]))  # fmt: skip
        return action[0].numpy()

    return act


def has_episode_statistics(env: gym.Env) -> bool:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.RecordEpisodeStatistics):
            return True
        env = env.env
    return False


def evaluate(checkpoint_path: str | Path, episodes: int, seed: int, greedy: bool, epsilon: float = 0.0,
             capture_video: bool = False) -> list[float]:  # fmt: skip
    """Returns of ``episodes`` episodes of the checkpoint's policy on its env; episode i reset with seed + i."""
    path = resolve_resume(checkpoint_path)
    checkpoint = load_checkpoint(path)
    script = checkpoint.get("script")
    if not script or not (REPO / "cleanrl" / script).exists():
        raise CheckpointError(f"checkpoint {path}: written by {script!r}, not a script of cleanrl/")
    name = Path(script).stem
    module = load_script(REPO / "cleanrl" / script)
    args = checkpoint["args"]
    video_dir = str(path.parent.parent / "eval_videos")
    register_env_family(args["env_id"])  # (dm_control/* ids)
    env = module.make_env(args["env_id"], 0, capture_video, video_dir)()
    rng = np.random.default_rng(seed)
    act = make_policy(name, module, checkpoint, env, greedy, epsilon, rng)
    torch.manual_seed(seed)
    env.action_space.seed(seed)
    inner_stats = has_episode_statistics(env)  # Atari: the raw game score over all lives
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(act(obs))
            total += float(reward)
            if inner_stats:
                done = "episode" in info
                if done:
                    total = float(info["episode"]["r"])
                elif terminated or truncated:
                    obs, _ = env.reset()  # a lost life: the same game goes on
            else:
                done = terminated or truncated
        returns.append(total)
        print(f"episode {i}: return {total:.2f}", flush=True)
    env.close()
    return returns


@dataclass
class Args:
    checkpoint: tyro.conf.Positional[str]
    """a checkpoint file, or a run directory (its newest checkpoint)"""
    episodes: int = 10
    """evaluation episodes"""
    seed: int = 1
    """episode i is reset with seed + i"""
    greedy: bool = False
    """take the most likely action (the mean for continuous actions) instead of sampling"""
    epsilon: float = 0.0
    """DQN: probability of a random action"""
    capture_video: bool = False
    """record videos into runs/<run-name>/eval_videos"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)
    if args.episodes < 1:
        print(f"error: --episodes {args.episodes}: must be a positive integer", file=sys.stderr)
        return 2
    if not 0.0 <= args.epsilon <= 1.0:
        print(f"error: --epsilon {args.epsilon}: must be in [0, 1]", file=sys.stderr)
        return 2
    try:
        returns = evaluate(args.checkpoint, args.episodes, args.seed, args.greedy, args.epsilon, args.capture_video)
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} episodes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
