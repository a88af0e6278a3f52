"""Is the divergence of dqn.py's defaults on CartPole-v1 past their 60k budget the settings or our code?
Stable-Baselines3's DQN trained with the same settings, its Q-values beside the ones our run logged.

    python benchmark/dqn_divergence.py --ours runs/bench/classic/CartPole-v1__dqn__1
    python benchmark/dqn_divergence.py --gradient-steps 2 \\
        --ours runs/bench/dqn-ablation/CartPole-v1__dqn_gradient_steps2__1

With gamma 0.99 and a reward of 1 per step, no CartPole state is worth more than 1 / (1 - 0.99) = 100:
a mean Q(s, a) above that is divergence, not learning. SB3's DQN gets dqn.py's defaults (read from
``cleanrl/dqn.py``'s ``Args``; a flag here overrides one): a 256-256 network, Adam, the Huber loss,
gradients clipped at norm 10, epsilon decaying over ``exploration_steps`` (``--exploration-steps``; SB3's
fraction of ``--total-timesteps``, the budget of the run it is compared with, which SB3 is stopped short of
at ``--steps``). It is not
Double DQN (SB3 has none); ``--ours`` should then be a run with dqn.py's Double DQN, as the default runs
are, or with ``--no-double-q``. Every ``--every`` steps it prints the mean Q(s, a) of 1,024 transitions
sampled from its replay and the mean return of its last 100 episodes, beside the ``losses/q_values``
(the mean Q(s, a) of a training batch) and the last-100 return that the ``--ours`` run logged at the
nearest step. One torch thread.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cleanrl.dqn import Args  # noqa: E402
from cleanrl_utils.tb import ScalarReader  # noqa: E402

OVERRIDABLE = [
    "learning_rate",
    "gradient_steps",
    "target_network_frequency",
    "buffer_size",
    "train_frequency",
    "exploration_steps",
]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=30_000, help="SB3's env steps (default 30,000)")
    p.add_argument("--total-timesteps", type=int, default=500_000, help="the compared run's budget (its schedule)")
    p.add_argument("--every", type=int, default=5_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ours", type=Path, help="a dqn.py run directory (its TensorBoard events) to set beside")
    defaults = Args()
    for name in OVERRIDABLE:
        value = getattr(defaults, name)
        p.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = p.parse_args()
    for name in ("steps", "total_timesteps", "every"):
        if getattr(args, name) < 1:
            p.exit(2, f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive number of steps\n")
    if args.ours is not None and not list(args.ours.glob("events.out.tfevents.*")):
        p.exit(2, f"--ours {args.ours}: no TensorBoard event file there\n")
    return args


def sb3_q_values(args: argparse.Namespace) -> tuple[dict, list[tuple[int, float, float]]]:
    """The settings SB3's DQN holds, and (step, mean Q(s, a) of 1,024 replay samples, mean return of the
    last 100 episodes) every ``--every`` steps."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    d = Args()
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=args.learning_rate, buffer_size=args.buffer_size,
                learning_starts=d.learning_starts, batch_size=d.batch_size, gamma=d.gamma, train_freq=args.train_frequency,
                gradient_steps=args.gradient_steps, target_update_interval=args.target_network_frequency,
                exploration_initial_eps=d.start_e, exploration_final_eps=d.end_e, max_grad_norm=d.max_grad_norm,
                exploration_fraction=args.exploration_steps / args.total_timesteps, policy_kwargs={"net_arch": [256, 256]}, seed=args.seed,
                device="cpu")  # fmt: skip
    held = {"learning_rate": model.learning_rate, "gradient_steps": model.gradient_steps,
            "target_network_frequency": model.target_update_interval, "buffer_size": model.buffer_size,
            "train_frequency": model.train_freq.frequency}  # fmt: skip
    points = []

    class Probe(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % args.every == 0:
                data = self.model.replay_buffer.sample(1024)
                with torch.no_grad():
                    q = self.model.q_net(data.observations).gather(1, data.actions.long()).mean().item()
                returns = [e["r"] for e in self.model.ep_info_buffer]
                points.append((self.num_timesteps, q, float(np.mean(returns)) if returns else float("nan")))
            return self.num_timesteps < args.steps

    # learn() over the compared run's budget, so that epsilon follows the same schedule; stopped at --steps
    model.learn(args.total_timesteps, callback=Probe())
    return held, points


def nearest(series, step: int) -> float:
    if series is None:
        return float("nan")
    i = int(np.argmin(np.abs(np.asarray(series.steps) - step)))
    return series.values[i]


def last_100(series, step: int) -> float:
    if series is None:
        return float("nan")
    steps, values = np.asarray(series.steps), np.asarray(series.values)
    before = values[steps <= step][-100:]
    return float(before.mean()) if len(before) else float("nan")


def main() -> None:
    args = parse()
    ours = ScalarReader(args.ours).update().series if args.ours else {}
    held, points = sb3_q_values(args)
    print(f"SB3 DQN on CartPole-v1, dqn.py's settings with {', '.join(f'{k}={v}' for k, v in held.items())}")
    print(f"(epsilon over {args.exploration_steps:,} of {args.total_timesteps:,} steps), seed {args.seed}")
    print("| env step | SB3 mean Q(s, a) | SB3 return (last 100) | ours: losses/q_values | ours: return (last 100) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for step, q, ret in points:
        mine = nearest(ours.get("losses/q_values"), step), last_100(ours.get("charts/episodic_return"), step)
        print(f"| {step:,} | {q:,.1f} | {ret:.1f} | {mine[0]:,.1f} | {mine[1]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
