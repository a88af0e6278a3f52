"""What checkpointing costs a run, and how much of a run a preemption can lose, at the scripts' defaults.

    python benchmark/checkpoint_overhead.py --repeats 2

Tuner trials run the scripts with their own ``--checkpoint-interval`` default. For each script the same
run is timed without periodic checkpoints (``--checkpoint-interval 0``: only the final one) and with
one every ``K`` steps, alternating (0, K, 0, K, ...) so a noisy stretch of the machine hits both. The
cost of one checkpoint is the difference divided by the checkpoints written (it includes gathering
the state: env snapshots, replay). Where that difference drowns in the machine's noise, the write
itself bounds it from below: the run's final checkpoint is loaded and written again (torch.save,
fsync, rename; the median of 5). At the default interval D a single-process run writes one every
min(D / SPS, CHECKPOINT_SECONDS = 300) seconds (the most a preemption loses: cleanrl_utils/run.py
also checkpoints every 5 minutes of wall clock), and spends the larger cost over that period on
them (the overhead). Off-policy runs include their replay buffer (``--checkpoint-buffer``, which
exact resume needs).
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cleanrl_utils.run import CHECKPOINT_SECONDS  # noqa: E402

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


def measure(
    script: str, flags: list[str], total: int, interval: int, extra: list[str]
) -> tuple[float, float, float, float]:
    """(wall s, CPU s) of one run, and (MB, median s to write it again) of its final checkpoint."""
    from cleanrl_utils.checkpoint import list_checkpoints, load_checkpoint, write_state

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
        final = list_checkpoints(Path(tmp) / "runs/r/checkpoints")[-1]
        state = {k: v for k, v in load_checkpoint(final).items() if k not in ("format_version", "sha256")}
        writes = []
        for _ in range(5):
            start = time.perf_counter()
            write_state(state, Path(tmp) / "again.pt")
            writes.append(time.perf_counter() - start)
        return wall, cpu, final.stat().st_size / 2**20, statistics.median(writes)


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
                wall, cpu, *_ = runs[interval][-1]
                print(f"# {script} repeat {repeat} interval {interval}: {wall:.1f}s wall, {cpu:.1f} CPU s", flush=True)
        wall0 = min(r[0] for r in runs[0])  # the least disturbed run of each kind
        wallk = min(r[0] for r in runs[k])
        cpu0 = min(r[1] for r in runs[0])
        cpuk = min(r[1] for r in runs[k])
        extra_checkpoints = total // k - 1  # the final checkpoint is in both
        cost = max(0.0, wallk - wall0) / extra_checkpoints
        cpu_cost = max(0.0, cpuk - cpu0) / extra_checkpoints
        size = max(r[2] for r in runs[k])
        write = statistics.median(r[3] for rs in runs.values() for r in rs)
        sps = total / wall0
        d = default_interval(script)
        between = min(d / sps, CHECKPOINT_SECONDS)
        overhead = max(cost, write) / between * 100
        rows.append((script, sps, cpu0 / total * 1e3, cost * 1e3, cpu_cost * 1e3, size, write * 1e3, d, between,
                     overhead))  # fmt: skip
    print(f"\n{os.cpu_count()} cores, CPU device; best of {args.repeats} runs of each kind")
    print("| script | SPS | CPU ms/step | ms per checkpoint (run difference) | CPU ms per checkpoint | checkpoint MB "
          "| ms to write it | default interval | s between checkpoints | overhead |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for script, sps, cpu_step, cost, cpu_cost, size, write, d, between, overhead in rows:
        print(f"| {script} | {sps:,.0f} | {cpu_step:.2f} | {cost:.0f} | {cpu_cost:.0f} | {size:.1f} | {write:.0f} "
              f"| {d:,} | {between:,.0f} | {overhead:.2f}% |")  # fmt: skip


if __name__ == "__main__":
    main()
