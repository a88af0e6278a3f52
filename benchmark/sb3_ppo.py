"""Stable-Baselines3's PPO with ppo_continuous_action.py's settings: the peer row of docs/benchmarks.md.

    python benchmark/learning.py peer        # 3 seeds of this beside 3 of ours, one of each at a time
    python benchmark/sb3_ppo.py --env-id HalfCheetah-v4 --seed 1 --total-timesteps 1000000 --run-name sb3

The settings are read from ``cleanrl/ppo_continuous_action.py``'s ``Args`` (a flag of that script given
here overrides one), so the two rows differ in their code, not in their numbers: rollouts of
``num_steps`` per env, ``num_minibatches`` minibatches, ``update_epochs`` epochs, the learning rate
annealed linearly to 0, GAE, the clip range, advantages normalised per minibatch, the value clipped
around its old prediction, gradients clipped, Adam with eps 1e-5; separate 64-64 tanh networks with
orthogonal initialisation and a state-independent log std starting at 0; observations and rewards
normalised (running statistics, clipped at ``clip_obs`` and ``clip_reward``: SB3's VecNormalize in place
of gymnasium's wrappers); actions clipped to the box; the budget rounded down to whole rollouts, as ours
is. One departure is SB3's own and kept: its value loss is the squared error of the clipped prediction
alone (no gradient once the prediction leaves the clip range), not halved; ours is CleanRL's, half the
larger of the clipped and unclipped errors. At the same ``vf_coef`` SB3's value step is twice ours.

Logs what our scripts log, where our tools read it: every training episode's undiscounted return
(``charts/episodic_return``, from SB3's Monitor, before any normalisation) and ``charts/SPS`` into
``runs/<run-name>``, with the ``hyperparameters`` and ``hardware`` tables, so ``cleanrl_utils.plot`` and
``benchmark/learning.py`` read it as one more run. SB3 has no exact resume: a run started again over an
unfinished one starts from scratch (its old event files are removed, and it says so). One torch thread.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cleanrl.ppo_continuous_action import Args  # noqa: E402

# ppo_continuous_action.py's flags that say what SB3's PPO trains with (the rest is about our runs)
SETTINGS = ["env_id", "total_timesteps", "learning_rate", "num_envs", "num_steps", "anneal_lr", "gamma", "gae_lambda",
            "num_minibatches", "update_epochs", "norm_adv", "clip_coef", "clip_vloss", "ent_coef", "vf_coef",
            "max_grad_norm", "target_kl", "clip_obs", "clip_reward"]  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--exp-name", default="sb3_ppo")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-name", default=None, help="the run directory under runs/ (default <env>__<exp>__<seed>)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    defaults = {f.name: f.default for f in fields(Args)}
    for name in SETTINGS:
        value, flag = defaults[name], "--" + name.replace("_", "-")
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            p.add_argument(flag, type=float if name == "target_kl" else type(value), default=value)
    args = p.parse_args(argv)
    for name in ("total_timesteps", "num_envs", "num_steps", "num_minibatches", "update_epochs"):
        if getattr(args, name) < 1:
            p.exit(2, f"error: --{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer\n")
    if args.seed < 0:
        p.exit(2, f"error: --seed {args.seed}: must be >= 0\n")
    if (args.num_envs * args.num_steps) % args.num_minibatches:
        p.exit(2, f"error: --num-minibatches {args.num_minibatches}: must divide num_envs * num_steps "
                  f"({args.num_envs * args.num_steps})\n")  # fmt: skip
    if args.total_timesteps < args.num_envs * args.num_steps:
        p.exit(2, f"error: --total-timesteps {args.total_timesteps}: must be at least one rollout, num_envs * num_steps "
                  f"({args.num_envs * args.num_steps})\n")  # fmt: skip
    name = args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}"
    if Path(name).is_absolute() or ".." in Path(name).parts:
        p.exit(2, f"error: --run-name {name}: must be a relative name inside runs/\n")
    args.run_dir = Path("runs") / name
    return args


def sb3_settings(args: argparse.Namespace) -> dict:
    """The keyword arguments of SB3's PPO that carry ``args``."""
    import torch

    lr = args.learning_rate
    return dict(
        n_steps=args.num_steps,
        batch_size=args.num_envs * args.num_steps // args.num_minibatches,
        n_epochs=args.update_epochs,
        learning_rate=(lambda remaining: remaining * lr) if args.anneal_lr else lr,  # SB3: 1 -> 0 over the run
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        clip_range=args.clip_coef,
        clip_range_vf=args.clip_coef if args.clip_vloss else None,
        normalize_advantage=args.norm_adv,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        target_kl=args.target_kl,
        policy_kwargs=dict(
            net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn=torch.nn.Tanh, ortho_init=True, log_std_init=0.0
        ),  # fmt: skip
    )


def make_model(args: argparse.Namespace):
    """SB3's PPO on ``args.num_envs`` copies of the env (each in SB3's Monitor, so the returns logged are the
    env's own, before VecNormalize), seeded seed + i as ours are."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = make_vec_env(
        lambda: gym.wrappers.FlattenObservation(gym.make(args.env_id)), n_envs=args.num_envs, seed=args.seed
    )
    venv = VecNormalize(venv, norm_obs=True, norm_reward=True, clip_obs=args.clip_obs, clip_reward=args.clip_reward,
                        gamma=args.gamma)  # fmt: skip
    return PPO("MlpPolicy", venv, seed=args.seed, device="cpu", verbose=0, **sb3_settings(args))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from torch.utils.tensorboard import SummaryWriter

    from cleanrl_utils.run import hardware
    from cleanrl_utils.tb import format_table

    torch.set_num_threads(1)
    events = sorted(args.run_dir.glob("events.out.tfevents.*"))
    if events:  # an interrupted attempt: SB3 cannot continue it exactly, so this one starts over
        print(f"{args.run_dir}: starting over (SB3 has no exact resume); removing {len(events)} event file(s)")
        for path in events:
            path.unlink()
    model = make_model(args)
    writer = SummaryWriter(str(args.run_dir))
    table = {"exp_name": args.exp_name, "seed": args.seed, **{k: getattr(args, k) for k in SETTINGS}}
    writer.add_text("hyperparameters", format_table(table))
    writer.add_text("hardware", format_table(hardware()))

    class Log(BaseCallback):
        """Every finished episode's return and length; SPS after each rollout."""

        def __init__(self):
            super().__init__()
            self.start, self.last_line = time.perf_counter(), 0.0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    writer.add_scalar("charts/episodic_return", info["episode"]["r"], self.num_timesteps)
                    writer.add_scalar("charts/episodic_length", info["episode"]["l"], self.num_timesteps)
            return True

        def _on_rollout_end(self) -> None:
            sps = self.num_timesteps / (time.perf_counter() - self.start)
            writer.add_scalar("charts/SPS", sps, self.num_timesteps)
            if args.progress and time.perf_counter() - self.last_line > 30:
                self.last_line = time.perf_counter()
                print(f"{args.run_dir.name}: step {self.num_timesteps:,}, {sps:,.0f} SPS", flush=True)

    batch = args.num_envs * args.num_steps
    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps // batch * batch, callback=Log())
    writer.add_scalar("charts/SPS", model.num_timesteps / (time.perf_counter() - start), model.num_timesteps)
    writer.close()
    print(f"{args.run_dir}: {model.num_timesteps:,} steps in {time.perf_counter() - start:,.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
