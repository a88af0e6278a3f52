"""What checkpointing costs a run, and how much of a run a preemption can lose, at the scripts' defaults.

    python benchmark/checkpoint_overhead.py --repeats 2

Tuner trials run the scripts with their own ``--checkpoint-interval`` default. For each script the same
run is timed without periodic checkpoints (``--checkpoint-interval 0``: only the final one) and with
one every ``K`` steps, alternating (0, K, 0, K, ...) so a noisy stretch of the machine hits both. The
cost of one checkpoint is the difference divided by the checkpoints written; at the default interval D
a run then writes one every D / SPS seconds (the most a preemption loses), and spends
cost / (D / SPS) of its time on them (the overhead). Off-policy runs include their replay buffer
(``--checkpoint-buffer``, which exact resume needs).
"""

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# script, flags, total steps, K (the measured interval), extra flags for the measured runs
CASES = [
    ("ppo.py", ["--env-id", "CartPole-v1"], 40_960, 2_048, []),
    ("dqn.py", ["--env-id", "CartPole-v1", "--learning-starts", "2000"], 12_000, 500, ["--checkpoint-buffer"]),
    ("ppo_atari.py", ["--env-id", "BreakoutNoFrameskip-v4"], 8_192, 1_024, []),
    ("sac_continuous_action.py", ["--env-id", "Pendulum-v1", "--learning-starts", "1000"], 3_000, 200,
     ["--checkpoint-buffer"]),
]  # fmt: skip


def default_interval(script: str) -> int:
    text = (REPO / "cleanrl" / script).read_text()
    return int(re.search(r"checkpoint_interval: int = ([\d_]+)", text).group(1).replace("_", ""))


def measure(script: str, flags: list[str], total: int, interval: int, extra: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, checkpoints written) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, str(REPO / "cleanrl" / script), *flags, "--total-timesteps", str(total)]
        cmd += ["--checkpoint-interval", str(interval), *extra, "--no-cuda", "--no-progress", "--run-name", "r"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(REPO)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, env=env)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        written = total // interval if interval else 1
        return wall, cpu, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--scripts", nargs="*", default=[c[0] for c in CASES])
    args = parser.parse_args()
    rows = []
    for script, flags, total, k, extra in [c for c in CASES if c[0] in args.scripts]:
        runs: dict[int, list] = {0: [], k: []}
        for repeat in range(args.repeats):
            for interval in (0, k):
                runs[interval].append(measure(script, flags, total, interval, extra))
                wall, cpu, _ = runs[interval][-1]
                print(f"# {script} repeat {repeat} interval {interval}: {wall:.1f}s wall, {cpu:.1f} CPU s", flush=True)
        wall0 = min(r[0] for r in runs[0])  # the least disturbed run of each kind
        wallk = min(r[0] for r in runs[k])
        cpu0 = min(r[1] for r in runs[0])
        cpuk = min(r[1] for r in runs[k])
        extra_checkpoints = total // k - 1  # the final checkpoint is in both
        cost = max(0.0, wallk - wall0) / extra_checkpoints
        cpu_cost = max(0.0, cpuk - cpu0) / extra_checkpoints
        sps = total / wall0
        d = default_interval(script)
        between = d / sps
        rows.append((script, sps, cpu0 / total * 1e3, cost * 1e3, cpu_cost * 1e3, d, between, cost / between * 100))
    print(f"\n{os.cpu_count()} cores, CPU device; best of {args.repeats} runs of each kind")
    print("| script | SPS | CPU ms/step | ms per checkpoint (wall) | CPU ms per checkpoint | default interval "
          "| s between checkpoints | overhead |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for script, sps, cpu_step, cost, cpu_cost, d, between, overhead in rows:
        print(f"| {script} | {sps:,.0f} | {cpu_step:.2f} | {cost:.0f} | {cpu_cost:.0f} | {d:,} | {between:,.0f} "
              f"| {overhead:.2f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
