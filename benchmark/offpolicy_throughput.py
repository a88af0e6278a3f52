"""Throughput of the off-policy scripts beside Stable-Baselines3, the same algorithm and sizes, on this machine.

    python benchmark/offpolicy_throughput.py                  # SAC and DQN, 3 runs of each, alternated
    python benchmark/offpolicy_throughput.py --section sac --repeats 2

SAC: sac_continuous_action.py (eager and ``--compile``) and SB3's SAC on HalfCheetah-v4: 256-256
networks, batch 256, one critic step per env step (ours: the actor twice every second step, SB3: once
every step: the same gradient steps), 1,000 random steps first. DQN: dqn.py (``--no-double-q``: SB3's
DQN is not Double DQN) and SB3's DQN on CartPole-v1 with dqn.py's defaults: a 256-256 network,
8 gradient steps of batch 128 every 16 env steps, a target copy every 128. One torch thread each.

Each configuration runs ``--repeats`` times, the order rotated each round (A B C, B C A, ...); the
median is reported. SPS and CPU time are measured over the learning phase only (from the first
logging point after learning starts to the last), so start-up, the random warm-up and compilation
are left out: ours from its TensorBoard points (wall time, ``perf/cpu_util``), SB3's from a callback
(wall clock and the process's CPU time at the same steps).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SB3 = """
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.callbacks import BaseCallback

kind, total, starts, log_every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

class Clock(BaseCallback):
    points = []
    def _on_step(self):
        if self.num_timesteps > starts and self.num_timesteps % log_every == 0:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            self.points.append((self.num_timesteps, time.perf_counter(), usage.ru_utime + usage.ru_stime))
        return True

if kind == "sac":
    model = SAC("MlpPolicy", "HalfCheetah-v4", learning_starts=starts, batch_size=256, buffer_size=total,
                policy_kwargs={"net_arch": [256, 256]}, train_freq=1, gradient_steps=1, seed=1, device="cpu")
else:
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=5e-4, buffer_size=100_000, learning_starts=starts,
                batch_size=128, train_freq=16, gradient_steps=8, target_update_interval=128,
                exploration_fraction=0.16, exploration_final_eps=0.01, max_grad_norm=10,
                policy_kwargs={"net_arch": [256, 256]}, seed=1, device="cpu")
clock = Clock()
model.learn(total, callback=clock)
print(json.dumps(clock.points))
"""


def learning_phase(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(SPS, CPU ms per step) between the first and the last (step, wall seconds, CPU seconds) point."""
    (s0, w0, c0), (s1, w1, c1) = points[0], points[-1]
    return (s1 - s0) / (w1 - w0), 1000 * (c1 - c0) / (s1 - s0)


def ours(script: str, flags: list[str], starts: int) -> tuple[float, float]:
    sys.path.insert(0, str(REPO))
    from cleanrl_utils.tb import ScalarReader

    with tempfile.TemporaryDirectory() as cwd:
        cmd = [sys.executable, str(REPO / "cleanrl" / script), "--no-progress", "--run-name", "bench", "--threads", "1"]
        cmd += ["--checkpoint-interval", "0", "--no-cuda", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
        subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
        scalars = ScalarReader(Path(cwd) / "runs/bench").update()
        sps, util = scalars.get("charts/SPS"), scalars.get("perf/cpu_util")
    points, cpu = [], 0.0
    for i, (step, wall) in enumerate(zip(sps.steps, sps.wall_times)):
        if step <= starts:
            continue
        if points:  # perf/cpu_util: percent of one core since the previous point
            cpu += util.values[i] / 100 * (wall - points[-1][1])
        points.append((step, wall, cpu))
    return learning_phase(points)


def sb3(kind: str, total: int, starts: int, log_every: int) -> tuple[float, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", SB3, kind, str(total), str(starts), str(log_every)], env=env,
                         check=True, capture_output=True, text=True)  # fmt: skip
    return learning_phase(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(title: str, configs: dict, repeats: int) -> None:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: A B C, B C A, ...
            results[name].append(configs[name]())
            print(f"  {name}: {results[name][-1][0]:.0f} SPS", file=sys.stderr, flush=True)
    print(f"\n{title}; {repeats} runs of each, order rotated; medians; learning phase only")
    print("| implementation | SPS | CPU ms / step | runs (SPS) | SPS / SB3 |")
    print("| --- | ---: | ---: | --- | ---: |")
    base = statistics.median(s for s, _ in results["stable-baselines3"])
    for name, runs in results.items():
        sps, cpu = statistics.median(s for s, _ in runs), statistics.median(c for _, c in runs)
        print(f"| {name} | {sps:.0f} | {cpu:.2f} | {' '.join(f'{s:.0f}' for s, _ in runs)} | {sps / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=["sac", "dqn", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sac-steps", type=int, default=6000, help="env steps per SAC run (1,000 random first)")
    parser.add_argument("--dqn-steps", type=int, default=30000, help="env steps per DQN run (1,000 random first)")
    args = parser.parse_args()
    if args.section in ("sac", "all"):
        n = args.sac_steps
        flags = ["--env-id", "HalfCheetah-v4", "--total-timesteps", str(n), "--learning-starts", "1000"]
        flags += ["--buffer-size", str(n)]
        measure(
            f"SAC, HalfCheetah-v4, {n} steps, 256-256, batch 256, 1 torch thread",
            {
                "sac_continuous_action.py": lambda: ours("sac_continuous_action.py", flags, 1000),
                "sac_continuous_action.py --compile": lambda: ours(
                    "sac_continuous_action.py", [*flags, "--compile"], 1000
                ),
                "stable-baselines3": lambda: sb3("sac", n, 1000, 1000),
            },
            args.repeats,
        )
    if args.section in ("dqn", "all"):
        n = args.dqn_steps
        flags = ["--total-timesteps", str(n), "--no-double-q"]
        measure(
            f"DQN, CartPole-v1, {n} steps, 256-256, 8 x batch 128 every 16 steps, 1 torch thread",
            {
                "dqn.py": lambda: ours("dqn.py", flags, 1000),
                "dqn.py --compile": lambda: ours("dqn.py", [*flags, "--compile"], 1000),
                "stable-baselines3": lambda: sb3("dqn", n, 1000, 1000),
            },
            args.repeats,
        )


if __name__ == "__main__":
    main()
