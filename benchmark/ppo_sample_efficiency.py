"""Sample efficiency of ppo.py's defaults on CartPole-v1: steps until the policy is solved, per seed.

    python benchmark/ppo_sample_efficiency.py --seeds 1 2 3 4 5

Runs ``python cleanrl/ppo.py --seed S`` (the defaults, 100k steps) for each seed, two at a time
(``cleanrl_utils/benchmark.py``'s pool),
and prints, per seed, the first step at which the mean return of the last 20 episodes reaches
475 and 500, and the mean over the final 20 episodes.
"""

import argparse
import os
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

    from cleanrl_utils.benchmark import Job, Pool
    from cleanrl_utils.tb import ScalarReader

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        jobs = []
        for seed in args.seeds:
            cmd = [sys.executable, str(REPO / "cleanrl/ppo.py"), "--no-progress", "--seed", str(seed)]
            cmd += [
                "--run-name",
                f"s{seed}",
                "--total-timesteps",
                str(args.total_timesteps),
                "--checkpoint-interval",
                "0",
            ]
            jobs.append(Job(f"s{seed}", cmd, Path(tmp) / f"s{seed}.log", Path(tmp) / "runs" / f"s{seed}"))
        for job, code in Pool(args.parallel, [], threads=1, quiet=True).run(jobs):
            assert code == 0, f"{job.name} failed, see {job.log}"
        for seed, job in zip(args.seeds, jobs):
            series = ScalarReader(job.run_dir).update().get("charts/episodic_return")
            steps, returns = series.steps, series.values
            rows.append(
                (seed, first_step(steps, returns, 475), first_step(steps, returns, 500), np.mean(returns[-20:]))
            )
        os.chdir(REPO)

    print(f"CartPole-v1, ppo.py defaults, {args.total_timesteps} steps; mean of the last 20 episodes")
    print("| seed | steps to 475 | steps to 500 | final mean |")
    print("|------|--------------|--------------|------------|")
    for seed, s475, s500, final in rows:
        print(f"| {seed:4d} | {s475 or 'never':>12} | {s500 or 'never':>12} | {final:10.1f} |")


if __name__ == "__main__":
    main()
