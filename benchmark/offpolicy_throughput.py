"""CPU cost of the off-policy scripts beside Stable-Baselines3, the same algorithm and sizes, on this machine.

    python benchmark/offpolicy_throughput.py                           # SAC, DQN CartPole, DQN Breakout
    python benchmark/offpolicy_throughput.py --section sac --repeats 5
    python benchmark/offpolicy_throughput.py --section sac dqn --baseline 4776e9f  # also an earlier commit's scripts

SAC: sac_continuous_action.py and SB3's SAC on HalfCheetah-v4, 12k steps of which the first 5k are
uniform random actions (both scripts' default start): 256-256 networks, batch 256, one critic step per
env step (ours: the actor twice every second step, SB3: once every step: the same gradient steps).
DQN CartPole: dqn.py (``--no-double-q``: SB3's DQN is not Double DQN) and SB3's DQN with dqn.py's
defaults: a 256-256 network, 8 gradient steps of batch 128 every 16 env steps, a target copy every 128,
30k steps. DQN Breakout: dqn_atari.py (``--no-double-q``) and SB3's DQN with the Nature CNN, the
standard Atari preprocessing and a stack of 4 frames, one gradient step of batch 32 every 4 env steps,
a target copy every 1,000, 5k random steps first, 20k in all. One torch thread each.

Each configuration runs ``--repeats`` times, the order rotated each round (A B C, B C A, ...), so a slow
spell of the machine falls on every configuration alike; the median is reported. Two measures:

* whole process: the run's user + system CPU seconds from start to exit (imports, env creation, the
  random warm-up and the learning phase), read from the operating system for the finished process;
* learning phase: SPS and CPU ms per env step between the first and the last logging point after
  learning starts (start-up, warm-up and compilation left out): ours from TensorBoard (wall time,
  ``perf/cpu_util``), SB3's from a callback (wall clock and process CPU time at the same steps).

``--baseline REV`` adds our scripts as of commit REV (exported with ``git archive``), alternated with the
rest, to show what a change bought. Compare only figures from the same table: the machine's speed drifts.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
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
elif kind == "dqn":
    model = DQN("MlpPolicy", "CartPole-v1", learning_rate=5e-4, buffer_size=100_000, learning_starts=starts,
                batch_size=128, train_freq=16, gradient_steps=8, target_update_interval=128,
                exploration_fraction=0.16, exploration_final_eps=0.01, max_grad_norm=10,
                policy_kwargs={"net_arch": [256, 256]}, seed=1, device="cpu")
else:
    import ale_py, gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack
    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=1, seed=1), n_stack=4)
    model = DQN("CnnPolicy", env, learning_rate=1e-4, buffer_size=total, learning_starts=starts, batch_size=32,
                train_freq=4, gradient_steps=1, target_update_interval=1000, exploration_fraction=0.1,
                exploration_final_eps=0.01, max_grad_norm=10, optimize_memory_usage=False,
                replay_buffer_kwargs={"handle_timeout_termination": False}, seed=1, device="cpu")
clock = Clock()
model.learn(total, callback=clock)
print(json.dumps(clock.points))
"""


def learning_phase(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(SPS, CPU ms per step) between the first and the last (step, wall seconds, CPU seconds) point."""
    (s0, w0, c0), (s1, w1, c1) = points[0], points[-1]
    return (s1 - s0) / (w1 - w0), 1000 * (c1 - c0) / (s1 - s0)


def run_process(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[str, float]:
    """Run ``cmd`` to its end; its stdout and the user + system CPU seconds of the process (and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ours(tree: Path, script: str, flags: list[str], starts: int) -> dict[str, float]:
    sys.path.insert(0, str(REPO))
    from cleanrl_utils.tb import ScalarReader

    with tempfile.TemporaryDirectory() as cwd:
        cmd = [sys.executable, str(tree / "cleanrl" / script), "--no-progress", "--run-name", "bench", "--threads", "1"]
        cmd += ["--checkpoint-interval", "0", "--no-cuda", *flags]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(tree)}
        _, cpu_total = run_process(cmd, cwd, env)
        scalars = ScalarReader(Path(cwd) / "runs/bench").update()
        sps, util = scalars.get("charts/SPS"), scalars.get("perf/cpu_util")
    points, cpu = [], 0.0
    for i, (step, wall) in enumerate(zip(sps.steps, sps.wall_times)):
        if step <= starts:
            continue
        if points:  # perf/cpu_util: percent of one core since the previous point
            cpu += util.values[i] / 100 * (wall - points[-1][1])
        points.append((step, wall, cpu))
    phase_sps, phase_cpu = learning_phase(points)
    return {"cpu": cpu_total, "sps": phase_sps, "ms": phase_cpu}


def sb3(kind: str, total: int, starts: int, log_every: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", SB3, kind, str(total), str(starts), str(log_every)]
    with tempfile.TemporaryDirectory() as cwd:
        out, cpu_total = run_process(cmd, cwd, env)
    phase_sps, phase_cpu = learning_phase(json.loads(out.strip().splitlines()[-1]))
    return {"cpu": cpu_total, "sps": phase_sps, "ms": phase_cpu}


def measure(title: str, configs: dict[str, Callable[[], dict[str, float]]], repeats: int) -> None:
    results: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: A B C, B C A, ...
            results[name].append(configs[name]())
            last = results[name][-1]
            print(f"  {name}: {last['cpu']:.1f} CPU s, {last['sps']:.0f} SPS", file=sys.stderr, flush=True)
    median = {name: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for name, runs in results.items()}
    base = median["stable-baselines3"]
    print(f"\n{title}; {repeats} runs of each, order rotated; medians")
    print("| implementation | whole process: CPU s | runs (CPU s) | SB3 / this | learning phase: SPS | CPU ms / step"
          " | SB3 / this |")  # fmt: skip
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name, m in median.items():
        runs = " ".join(f"{run['cpu']:.1f}" for run in results[name])
        print(f"| {name} | {m['cpu']:.1f} | {runs} | {base['cpu'] / m['cpu']:.2f} | {m['sps']:.0f} | {m['ms']:.2f} "
              f"| {base['ms'] / m['ms']:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--section", nargs="+", choices=["sac", "dqn", "dqn_atari"], default=["sac", "dqn", "dqn_atari"]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", help="also run the scripts of this commit (git archive), alternated")
    parser.add_argument("--compile", action="store_true", help="also run our scripts with --compile")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"": REPO}
        if args.baseline:
            baseline = Path(tmp) / "baseline"
            baseline.mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline], capture_output=True)
            if archive.returncode != 0:
                sys.exit(f"--baseline {args.baseline}: not a commit of this repository")
            subprocess.run(["tar", "x", "-C", str(baseline)], input=archive.stdout, check=True)
            trees[f" ({args.baseline})"] = baseline

        def ours_configs(script: str, flags: list[str], starts: int) -> dict[str, Callable[[], dict[str, float]]]:
            configs = {}
            for label, tree in trees.items():
                configs[script + label] = lambda tree=tree: ours(tree, script, flags, starts)
            if args.compile:
                configs[f"{script} --compile"] = lambda: ours(REPO, script, [*flags, "--compile"], starts)
            return configs

        if "sac" in args.section:
            flags = ["--env-id", "HalfCheetah-v4", "--total-timesteps", "12000", "--learning-starts", "5000"]
            flags += ["--buffer-size", "12000"]
            configs = ours_configs("sac_continuous_action.py", flags, 5000)
            configs["stable-baselines3"] = lambda: sb3("sac", 12000, 5000, 1000)
            measure("SAC, HalfCheetah-v4, 12k steps (5k random), 256-256, batch 256, 1 torch thread", configs,
                    args.repeats)  # fmt: skip
        if "dqn" in args.section:
            flags = ["--total-timesteps", "30000", "--no-double-q"]
            configs = ours_configs("dqn.py", flags, 1000)
            configs["stable-baselines3"] = lambda: sb3("dqn", 30000, 1000, 1000)
            measure("DQN, CartPole-v1, 30k steps, 256-256, 8 x batch 128 every 16 steps, 1 torch thread", configs,
                    args.repeats)  # fmt: skip
        if "dqn_atari" in args.section:
            flags = ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "20000", "--learning-starts", "5000"]
            flags += ["--buffer-size", "20000", "--no-double-q", "--exploration-fraction", "0.1"]
            configs = ours_configs("dqn_atari.py", flags, 5000)
            configs["stable-baselines3"] = lambda: sb3("dqn_atari", 20000, 5000, 1000)
            measure("DQN, Breakout, 20k steps (5k random), Nature CNN, batch 32 every 4 steps, 1 torch thread",
                    configs, args.repeats)  # fmt: skip


if __name__ == "__main__":
    main()
