"""Throughput of the PPO scripts, every configuration measured in the same run on this machine.

    python benchmark/ppo_throughput.py --section atari      # Breakout, 8 envs
    python benchmark/ppo_throughput.py --section cartpole   # ppo.py against Stable-Baselines3

Atari: env-only stepping (gymnasium sync, gymnasium async, EnvPool: the scripts' own env
factories, random actions), learner-only update throughput (the ppo_atari.py network, loss and
optimizer on a random rollout of the same size, same epochs and minibatches), and full training
of ppo_atari.py (sync, async) and ppo_atari_envpool.py with their perf/* breakdown. Each
script's training SPS is compared with the slower of its two limits (its env backend alone, the
learner alone).

CartPole: ppo.py and SB3's PPO with the same envs, rollout length, epochs and minibatch size
(4 envs x 128 steps, 4 epochs, 4 minibatches of 128), one torch thread each, alternated
A-B-A-B; the median of each is reported. Requires the `bench` extra (stable-baselines3).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def env_only_sps(kind: str, num_envs: int, steps: int) -> float:
    """Vector env steps per second (summed over envs) with random actions."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    rng = np.random.default_rng(0)
    if kind == "envpool":
        from cleanrl.ppo_atari_envpool import make_envs

        envs = make_envs("Breakout-v5", num_envs, seed=1, num_threads=0, capture_video=False)
    else:
        from cleanrl.ppo_atari import make_env

        fns = [make_env("BreakoutNoFrameskip-v4", i, False, "") for i in range(num_envs)]
        cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
        envs = cls(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    envs.reset(seed=1) if kind != "envpool" else envs.reset()
    dtype = np.int32 if kind == "envpool" else np.int64
    actions = rng.integers(0, envs.single_action_space.n, size=(steps, num_envs)).astype(dtype)
    for a in actions[:20]:
        envs.step(a)
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * num_envs / elapsed


def learner_only(
    num_envs: int, num_steps: int, epochs: int, minibatches: int, repeats: int = 2, vtrace_forward: bool = False
) -> float:
    """Samples per second of ppo_atari.py's update phase (forward, backward, clip, Adam).

    ``vtrace_forward`` adds what appo_atari.py's learner does first: one forward pass over the
    whole batch (the current policy's log-probabilities and values for the V-trace targets).
    """
    import torch

    from cleanrl.ppo_atari import Agent, ppo_loss

    batch = num_envs * num_steps
    agent = Agent(4).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    obs = torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (batch,))
    old_logprob, advantages, returns, values = (torch.randn(batch) for _ in range(4))

    def update():
        if vtrace_forward:
            with torch.inference_mode():
                agent.evaluate(obs, actions)
        for _ in range(epochs):
            for mb in torch.tensor_split(torch.randperm(batch), minibatches):
                newlogprob, entropy, newvalue = agent.evaluate(obs[mb], actions[mb])
                pg_loss, v_loss = ppo_loss(
                    newlogprob, old_logprob[mb], advantages[mb], newvalue, values[mb], returns[mb], 0.1, True
                )
                loss = pg_loss - 0.01 * entropy.mean() + 0.5 * v_loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                optimizer.step()

    update()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        update()
    return repeats * epochs * batch / (time.perf_counter() - start)


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train(script: str, flags: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run a script; return its final SPS and its mean perf/* seconds per iteration."""
    with tempfile.TemporaryDirectory() as cwd:
        cmd = [
            sys.executable,
            str(REPO / "cleanrl" / script),
            "--no-progress",
            "--run-name",
            "bench",
            "--checkpoint-interval",
            "0",
            *flags,
        ]
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env={**os.environ, **(env or {})})
        s = read_scalars(Path(cwd) / "runs/bench")
    # The first iteration includes warm-up (allocations, first conv plans); leave it out of the means.
    return {
        "sps": s["charts/SPS"][-1],
        "env": float(np.mean(s["perf/env_time"][1:])),
        "inference": float(np.mean(s["perf/inference_time"][1:])),
        "learn": float(np.mean(s["perf/learn_time"][1:])),
        "cpu": float(np.mean(s["perf/cpu_util"][1:])),
    }


def atari(args: argparse.Namespace) -> None:
    n, t, e, m = args.num_envs, args.num_steps, args.update_epochs, args.num_minibatches
    print(f"Breakout, {n} envs x {t} steps, {e} epochs x {m} minibatches, {os.cpu_count()} CPUs, torch threads default")
    env_sps = {kind: env_only_sps(kind, n, args.env_steps) for kind in ("sync", "async", "envpool")}
    learner_samples = learner_only(n, t, e, m)
    learner_sps = learner_samples / e
    flags = ["--num-envs", str(n), "--num-steps", str(t), "--update-epochs", str(e), "--num-minibatches", str(m)]
    flags += ["--total-timesteps", str(n * t * args.iterations)]
    runs = {
        "ppo_atari.py sync": (train("ppo_atari.py", flags), "sync"),
        "ppo_atari.py async": (train("ppo_atari.py", [*flags, "--vector-mode", "async"]), "async"),
        "ppo_atari_envpool.py": (train("ppo_atari_envpool.py", flags), "envpool"),
    }

    print("\nLimits (measured in this run)")
    print(f"| {'what':34} | {'steps/s':>9} |")
    print(f"|{'-' * 36}|{'-' * 11}|")
    for kind, sps in env_sps.items():
        print(
            f"| env-only, gymnasium {kind:14} | {sps:9.0f} |"
            if kind != "envpool"
            else f"| env-only, EnvPool {'':16} | {sps:9.0f} |"
        )
    print(f"| learner-only ({learner_samples:.0f} samples/s / {e} ep) | {learner_sps:9.0f} |")

    print("\nTraining")
    header = f"| {'script':22} | {'SPS':>6} | {'env s/it':>8} | {'infer s/it':>10} | {'learn s/it':>10} | {'CPU %':>6} | {'limit':>6} | {'of limit':>8} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, (r, kind) in runs.items():
        limit = min(env_sps[kind], learner_sps)
        print(
            f"| {name:22} | {r['sps']:6.0f} | {r['env']:8.2f} | {r['inference']:10.2f} | {r['learn']:10.2f} "
            f"| {r['cpu']:6.0f} | {limit:6.0f} | {100 * r['sps'] / limit:7.0f}% |"
        )


def sb3_sps(total: int) -> float:
    code = f"""
import time, torch
torch.set_num_threads(1)
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
env = make_vec_env("CartPole-v1", n_envs=4, seed=1)
model = PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, device="cpu", seed=1, verbose=0)
start = time.perf_counter()
model.learn({total})
print({total} / (time.perf_counter() - start))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return float(out.stdout.strip().splitlines()[-1])


def cartpole(args: argparse.Namespace) -> None:
    total = args.cartpole_steps
    flags = [
        "--num-envs",
        "4",
        "--num-steps",
        "128",
        "--update-epochs",
        "4",
        "--num-minibatches",
        "4",
        "--threads",
        "1",
    ]
    flags += ["--total-timesteps", str(total)]
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(train("ppo.py", flags, env={"OMP_NUM_THREADS": "1"})["sps"])
        theirs.append(sb3_sps(total))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        f"CartPole-v1, 4 envs x 128 steps, 4 epochs x 4 minibatches, 1 torch thread, {total} steps, {args.repeats} runs each"
    )
    print(f"| {'implementation':24} | {'SPS (median)':>12} | {'runs':>28} |")
    print(f"|{'-' * 26}|{'-' * 14}|{'-' * 30}|")
    print(f"| {'cleanrl/ppo.py':24} | {a:12.0f} | {' '.join(f'{x:.0f}' for x in ours):>28} |")
    print(f"| {'stable-baselines3 PPO':24} | {b:12.0f} | {' '.join(f'{x:.0f}' for x in theirs):>28} |")
    print(f"ratio ppo.py / SB3: {a / b:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=["atari", "cartpole", "all"], default="all")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=5, help="training iterations per Atari script")
    parser.add_argument("--env-steps", type=int, default=300, help="vector steps per env-only measurement")
    parser.add_argument("--cartpole-steps", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.section in ("atari", "all"):
        atari(args)
    if args.section in ("cartpole", "all"):
        print()
        cartpole(args)


if __name__ == "__main__":
    main()
