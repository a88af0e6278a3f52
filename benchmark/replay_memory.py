"""Replay memory for Atari, and the speed of the single-process vs the 2-process off-policy scripts.

    python benchmark/replay_memory.py                 # memory table + SPS table (about 6 minutes)
    python benchmark/replay_memory.py --section memory

Memory: bytes allocated for 1M Atari transitions (4 x 84 x 84 uint8 stacks) in the naive layout
(separate ``obs`` and ``next_obs`` stacks per transition, plus action, reward and done) and in
cleanrl_utils.buffers.ReplayBuffer (one frame per step), and per rank when the replay is sharded
over 1, 2, 4 and 8 ranks (dqn_atari_multigpu.py: buffer_size / world_size per rank). The
allocation is checked against the process's resident memory after actually filling 100k
transitions (pages are committed as they are written).

Speed: dqn_atari.py vs dqn_atari_multigpu.py and sac_continuous_action.py vs
sac_continuous_action_multigpu.py under torchrun with 2 processes (gloo, one torch thread each),
with the same global flags, so both runs are the same algorithm. SPS is measured over the learning
phase only (TensorBoard wall times between the first and last SPS point after learning starts).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cleanrl_utils.buffers import ReplayBuffer  # noqa: E402

TRANSITIONS = 1_000_000
STACK = (4, 84, 84)


def naive_bytes(n: int) -> int:
    """obs + next_obs uint8 stacks, int64 action, float32 reward, bool done: what a plain buffer holds."""
    return n * (2 * int(np.prod(STACK)) + 8 + 4 + 1)


def memory_section() -> None:
    ours = ReplayBuffer(TRANSITIONS, 1, STACK, (), np.uint8, np.int64, frame_stack=4).nbytes
    naive = naive_bytes(TRANSITIONS)
    print("\n1M Atari transitions, one node")
    print("| layout | bytes | GB | vs naive |")
    print("|---|---|---|---|")
    print(f"| naive obs + next_obs stacks | {naive} | {naive / 1e9:.2f} | 100.0% |")
    print(f"| ReplayBuffer (one frame per step) | {ours} | {ours / 1e9:.2f} | {100 * ours / naive:.1f}% |")

    # measured: fill 100k transitions and read the resident memory growth
    process = psutil.Process()
    before = process.memory_info().rss
    n = 100_000
    buffer = ReplayBuffer(n, 1, STACK, (), np.uint8, np.int64, frame_stack=4)
    rng = np.random.default_rng(0)
    stack = rng.integers(0, 255, size=(1, *STACK), dtype=np.uint8)
    for t in range(n):
        buffer.add(stack, np.array([t % 4]), np.array([1.0]), np.array([False]), np.array([True]))
    grown = process.memory_info().rss - before
    print(
        f"\nmeasured after filling {n} transitions: resident memory grew {grown / 1e6:.0f} MB "
        f"(allocated {buffer.nbytes / 1e6:.0f} MB, {grown / n:.0f} bytes per transition)"
    )

    print("\nsharded over ranks (dqn_atari_multigpu.py, --buffer-size 1000000)")
    print("| ranks | per rank GB | per rank vs naive single node |")
    print("|---|---|---|")
    for ranks in (1, 2, 4, 8):
        shard = ReplayBuffer(TRANSITIONS // ranks, 1, STACK, (), np.uint8, np.int64, frame_stack=4).nbytes
        print(f"| {ranks} | {shard / 1e9:.2f} | {100 * shard / naive:.1f}% |")


def learning_sps(run_dir: Path, learning_starts: int) -> float:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    points = [e for e in acc.Scalars("charts/SPS") if e.step > learning_starts]
    first, last = points[0], points[-1]
    return (last.step - first.step) / (last.wall_time - first.wall_time)


def run(script: str, flags: list[str], learning_starts: int, nproc: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as cwd:
        launcher = (
            [sys.executable]
            if nproc == 1
            else [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        )
        cmd = [
            *launcher,
            str(REPO / "cleanrl" / script),
            "--no-progress",
            "--run-name",
            "b",
            "--checkpoint-interval",
            "0",
            *flags,
        ]
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env=env)
        return learning_sps(Path(cwd) / "runs/b", learning_starts)


def speed_section() -> None:
    cases = [
        (
            "DQN Breakout (2 envs, batch 64, 1 grad step / 4 env steps)",
            "dqn_atari.py",
            "dqn_atari_multigpu.py",
            ["--no-cuda", "--threads", "1", "--num-envs", "2", "--batch-size", "64", "--buffer-size", "20000",
             "--learning-starts", "2000", "--total-timesteps", "8000"],
            2000,
        ),
        (
            "SAC HalfCheetah (2 envs, batch 256, 1 update / vector step)",
            "sac_continuous_action.py",
            "sac_continuous_action_multigpu.py",
            ["--no-cuda", "--threads", "1", "--num-envs", "2", "--batch-size", "256", "--learning-starts", "2000",
             "--total-timesteps", "6000"],
            2000,
        ),
    ]  # fmt: skip
    print("\nsame global flags, 1 process vs torchrun 2 processes (gloo, 1 thread each), SPS while learning")
    print("| run | 1 process | 2 processes | speed-up |")
    print("|---|---|---|---|")
    for label, single, multi, flags, learning_starts in cases:
        one = run(single, flags, learning_starts, 1)
        two = run(multi, flags, learning_starts, 2)
        print(f"| {label} | {one:.0f} | {two:.0f} | {two / one:.2f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=["all", "memory", "speed"], default="all")
    section = parser.parse_args().section
    if section in ("all", "memory"):
        memory_section()
    if section in ("all", "speed"):
        speed_section()


if __name__ == "__main__":
    main()
