"""Synchronous PPO against the asynchronous actor-learner, same machine, same run, same total envs.

    python benchmark/appo_throughput.py                      # CartPole and Breakout
    python benchmark/appo_throughput.py --sample-efficiency  # also steps to 450 on CartPole, 3 seeds

CartPole: ppo.py vs appo.py with their default settings (8 envs x 32 steps, 20 epochs, one
minibatch; appo.py: 2 actors x 4 envs). Breakout: ppo_atari.py (sync vector env) vs appo_atari.py
(2 actors x 4 envs, gymnasium and EnvPool backends), 8 envs x 128 steps, 4 epochs x 4 minibatches,
plus the learner-only throughput of appo_atari.py's update at the same settings (its V-trace
forward pass included), with the learner's thread count. Reported per run: SPS, learner and actor
idle fractions, mean policy lag (in updates).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmark"))

from ppo_throughput import learner_only, read_scalars  # noqa: E402


def run(script: str, flags: list[str], threads: int | None = None) -> dict[str, float]:
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    with tempfile.TemporaryDirectory() as cwd:
        cmd = [
            sys.executable,
            str(REPO / "cleanrl" / script),
            "--no-progress",
            "--run-name",
            "b",
            "--checkpoint-interval",
            "0",
            *flags,
        ]
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env=env)
        s = read_scalars(Path(cwd) / "runs/b")
    returns = s.get("charts/episodic_return", [])
    out = {"sps": s["charts/SPS"][-1], "returns": returns}
    for tag in ("learner_idle_fraction", "actor_idle_fraction", "policy_lag"):
        if f"perf/{tag}" in s:
            out[tag] = float(np.mean(s[f"perf/{tag}"][1:]))
    return out


def steps_to(script: str, seed: int, threshold: float = 450.0, total: int = 150_000) -> int | None:
    with tempfile.TemporaryDirectory() as cwd:
        cmd = [
            sys.executable,
            str(REPO / "cleanrl" / script),
            "--no-progress",
            "--run-name",
            "b",
            "--checkpoint-interval",
            "0",
        ]
        cmd += ["--seed", str(seed), "--total-timesteps", str(total)]
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(Path(cwd) / "runs/b"), size_guidance={"scalars": 0})
        acc.Reload()
        events = acc.Scalars("charts/episodic_return")
    values = [e.value for e in events]
    for i in range(19, len(values)):
        if np.mean(values[i - 19 : i + 1]) >= threshold:
            return events[i].step
    return None


def row(name: str, r: dict[str, float], extra: str = "") -> str:
    fmt = lambda k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
    return f"| {name:34} | {r['sps']:6.0f} | {fmt('learner_idle_fraction'):>12} | {fmt('actor_idle_fraction'):>10} | {fmt('policy_lag'):>10} | {extra:>14} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cartpole-steps", type=int, default=60_000)
    parser.add_argument("--atari-iterations", type=int, default=6)
    parser.add_argument("--learner-threads", type=int, default=1, help="torch threads of appo_atari.py's learner")
    parser.add_argument("--sample-efficiency", action="store_true")
    args = parser.parse_args()
    header = f"| {'run':34} | {'SPS':>6} | {'learner idle':>12} | {'actor idle':>10} | {'policy lag':>10} | {'vs baseline':>14} |"
    rule = "|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|"

    print(f"CartPole-v1, defaults of each script, {args.cartpole_steps} steps, {os.cpu_count()} CPUs")
    print(header + "\n" + rule)
    ppo = run("ppo.py", ["--total-timesteps", str(args.cartpole_steps)])
    appo = run("appo.py", ["--total-timesteps", str(args.cartpole_steps)])
    print(row("ppo.py (sync, 8 envs)", ppo, "1.00x"))
    print(row("appo.py (2 actors x 4 envs)", appo, f"{appo['sps'] / ppo['sps']:.2f}x"))

    n, t, e, m = 8, 128, 4, 4
    total = n * t * args.atari_iterations
    common = [
        "--num-envs",
        str(n),
        "--num-steps",
        str(t),
        "--update-epochs",
        str(e),
        "--num-minibatches",
        str(m),
        "--total-timesteps",
        str(total),
        "--no-cuda",
    ]
    import torch

    torch.set_num_threads(args.learner_threads)
    learner = learner_only(n, t, e, m, vtrace_forward=True) / e
    print(
        f"\nBreakout, {n} envs x {t} steps, {e} epochs x {m} minibatches; appo_atari.py learner: {args.learner_threads} thread(s)"
    )
    print(f"learner-only throughput of appo_atari.py's update (V-trace forward + epochs): {learner:.0f} steps/s")
    print(header + "\n" + rule)
    ppo_atari = run("ppo_atari.py", common)
    print(row("ppo_atari.py (sync)", ppo_atari, "1.00x"))
    threads = ["--threads", str(args.learner_threads)]
    for backend, env_id in (("gymnasium", "BreakoutNoFrameskip-v4"), ("envpool", "Breakout-v5")):
        r = run("appo_atari.py", [*common, *threads, "--env-backend", backend, "--env-id", env_id])
        name = f"appo_atari.py ({backend})"
        print(row(name, r, f"{r['sps'] / ppo_atari['sps']:.2f}x") + f" {100 * r['sps'] / learner:.0f}% of learner-only")

    if args.sample_efficiency:
        print("\nCartPole-v1: steps until the mean return of the last 20 episodes reaches 450 (150k budget)")
        print("| seed | ppo.py | appo.py |")
        print("|------|--------|---------|")
        for seed in (1, 2, 3):
            print(
                f"| {seed:4d} | {steps_to('ppo.py', seed) or 'never':>6} | {steps_to('appo.py', seed) or 'never':>7} |"
            )


if __name__ == "__main__":
    main()
