"""Trials per hour of the tuner with 1 and 2 workers on this machine, and trials stopped by pruning.

    python benchmark/tuner_speedup.py --trials 8 --repeats 2 --total-timesteps 16384

Each measurement is a fresh study of ``ppo.py`` on CartPole-v1 (the shipped search space, the given
budget per run, median pruning after 3 trials). The configurations alternate (1, 2, 1, 2, ...) so a
noisy stretch of the machine hits both; the table gives trials per hour of wall time, CPU seconds
per trial (tuner and runs together) and the trials pruned.
"""

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]


def measure(workers: int, trials: int, total: int, seed: int) -> tuple[float, float, int, int]:
    with tempfile.TemporaryDirectory() as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        cmd = [sys.executable, str(REPO / "cleanrl_utils/tuner.py"), "--algorithm", "ppo", "--env-ids", "CartPole-v1"]
        cmd += ["--num-trials", str(trials), "--workers", str(workers), "--total-timesteps", str(total)]
        cmd += ["--pruner-startup-trials", "3", "--sampler-seed", str(seed), "--study-name", "s"]
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        study = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp}/runs/s/optuna.db")
        states = [t.state for t in study.get_trials()]
        pruned = sum(s == optuna.trial.TrialState.PRUNED for s in states)
        complete = sum(s == optuna.trial.TrialState.COMPLETE for s in states)
        return wall, cpu, pruned, complete


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--total-timesteps", type=int, default=16384)
    args = parser.parse_args()
    results: dict[int, list] = {1: [], 2: []}
    for repeat in range(args.repeats):
        for workers in (1, 2):
            results[workers].append(measure(workers, args.trials, args.total_timesteps, seed=repeat))
            wall, cpu, pruned, complete = results[workers][-1]
            print(
                f"# repeat {repeat} workers {workers}: {wall:.1f}s wall, {cpu:.1f} CPU s, {pruned} pruned", flush=True
            )
    print(
        f"\n{os.cpu_count()} cores; ppo.py CartPole-v1, {args.total_timesteps:,} steps per trial, {args.trials} trials"
    )
    print("| workers | trials/hour | wall s per study | CPU s per trial | pruned / trials | speed-up |")
    print("|---|---|---|---|---|---|")
    base = None
    for workers, rows in results.items():
        wall = sum(r[0] for r in rows) / len(rows)
        cpu = sum(r[1] for r in rows) / len(rows) / args.trials
        pruned = sum(r[2] for r in rows)
        rate = args.trials / wall * 3600
        base = base or rate
        print(f"| {workers} | {rate:,.0f} | {wall:.1f} | {cpu:.2f} | {pruned} / {args.trials * len(rows)} | "
              f"{rate / base:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
