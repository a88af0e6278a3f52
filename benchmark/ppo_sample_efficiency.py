"""Sample efficiency of ppo.py's defaults on CartPole-v1: steps until the policy is solved, per seed.

    python benchmark/ppo_sample_efficiency.py --seeds 1 2 3 4 5

Runs ``python cleanrl/ppo.py --seed S`` (the defaults, 100k steps) for each seed, two at a time,
and prints, per seed, the first step at which the mean return of the last 20 episodes reaches
475 and 500, and the mean over the final 20 episodes.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def first_step(steps: list[int], returns: list[float], threshold: float, window: int = 20) -> int | None:
    for i in range(window - 1, len(returns)):
        if np.mean(returns[i - window + 1 : i + 1]) >= threshold:
            return steps[i]
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    args = parser.parse_args()

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        seeds = list(args.seeds)
        while seeds:
            batch, seeds = seeds[: args.parallel], seeds[args.parallel :]
            procs = []
            for seed in batch:
                cwd = Path(tmp) / f"seed{seed}"
                cwd.mkdir()
                cmd = [sys.executable, str(REPO / "cleanrl/ppo.py"), "--no-progress", "--seed", str(seed)]
                cmd += ["--run-name", "r", "--total-timesteps", str(args.total_timesteps), "--checkpoint-interval", "0"]
                procs.append(
                    (seed, cwd, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                )
            for seed, cwd, proc in procs:
                assert proc.wait() == 0, f"seed {seed} failed"
                acc = EventAccumulator(str(cwd / "runs/r"), size_guidance={"scalars": 0})
                acc.Reload()
                events = acc.Scalars("charts/episodic_return")
                steps, returns = [e.step for e in events], [e.value for e in events]
                rows.append(
                    (seed, first_step(steps, returns, 475), first_step(steps, returns, 500), np.mean(returns[-20:]))
                )

    print(f"CartPole-v1, ppo.py defaults, {args.total_timesteps} steps; mean of the last 20 episodes")
    print("| seed | steps to 475 | steps to 500 | final mean |")
    print("|------|--------------|--------------|------------|")
    for seed, s475, s500, final in rows:
        print(f"| {seed:4d} | {s475 or 'never':>12} | {s500 or 'never':>12} | {final:10.1f} |")


if __name__ == "__main__":
    main()
