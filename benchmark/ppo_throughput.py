"""Throughput of the PPO scripts, every configuration measured in the same run on this machine.

    python benchmark/ppo_throughput.py --section atari      # Breakout, 8 envs
    python benchmark/ppo_throughput.py --section cartpole   # ppo.py against Stable-Baselines3

Atari: env-only stepping (gymnasium sync, gymnasium async, EnvPool, ALE's AtariVectorEnv: the
scripts' own env factories, random actions), learner-only update throughput (the ppo_atari.py
network, loss and optimizer on a random rollout of the same size, same epochs and minibatches), and
full training of ppo_atari.py (sync, async) and ppo_atari_envpool.py (EnvPool, ALE) with their perf/*
breakdown. Each
script's training SPS is compared with the slower of its two limits (its env backend alone, the
learner alone).

Beside Stable-Baselines3 (``--section sb3``; ``cartpole`` for its first table): ppo.py and SB3's PPO on
CartPole with the same envs, rollout length, epochs and minibatch size (4 envs x 128 steps, 4 epochs, 4
minibatches of 128, one torch thread), and ppo_atari_envpool.py (``--vector-mode ale``) and ppo_atari.py
against SB3's PPO with the Nature CNN on Breakout (8 envs x 128 steps, 4 epochs, 4 minibatches of 256, two
torch threads); rounds rotated, medians; whole-process CPU seconds (the measure to compare) and the
training SPS. Requires the `bench` extra (stable-baselines3).

Compare (``--section compare --baseline REV``): the scripts of this tree against those of an earlier
commit (exported with ``git archive``), on CartPole (ppo.py, SB3's sizes and its own defaults),
HalfCheetah (ppo_continuous_action.py) and Breakout (ppo_atari.py, sync and async; ppo_atari_envpool.py;
ppo_atari_multigpu.py as one process), run alternately (baseline, this tree, baseline, ...), plus this
tree's ``--compile`` runs. SPS counts from the first logged
iteration to the last (start-up and compilation left out); CPU seconds per 1k steps are the run's
processes' user + system time over the whole run.

    python benchmark/ppo_throughput.py --section compare --baseline 77ec0fb
    python benchmark/ppo_throughput.py --section compare --baseline 64d17a5 --only CartPole HalfCheetah --repeats 5
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


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (its threads included) and its live child processes."""
    import psutil

    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def env_only_sps(kind: str, num_envs: int, steps: int) -> tuple[float, float]:
    """Vector env steps per second (summed over envs) with random actions, and CPU ms per env step."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode

    rng = np.random.default_rng(0)
    if kind in ("envpool", "ale"):
        from cleanrl.ppo_atari_envpool import make_envs

        envs = make_envs("Breakout-v5", num_envs, seed=1, num_threads=0, capture_video=False, vector_mode=kind)
    else:
        from cleanrl.ppo_atari import make_env

        fns = [make_env("BreakoutNoFrameskip-v4", i, False, "") for i in range(num_envs)]
        cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
        envs = cls(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    envs.reset(seed=1) if kind in ("sync", "async") else envs.reset()
    dtype = np.int64 if kind in ("sync", "async") else np.int32
    actions = rng.integers(0, envs.single_action_space.n, size=(steps, num_envs)).astype(dtype)
    for a in actions[:20]:
        envs.step(a)
    start, cpu = time.perf_counter(), cpu_seconds()
    for a in actions:
        envs.step(a)
    elapsed, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    envs.close()
    return steps * num_envs / elapsed, 1000 * cpu / (steps * num_envs)


def learner_only(
    num_envs: int, num_steps: int, epochs: int, minibatches: int, repeats: int = 2, vtrace_forward: bool = False
) -> float:
    """Samples per second of ppo_atari.py's update phase (forward, backward, clip, Adam).

    ``vtrace_forward`` adds what appo_atari.py's learner does first: one forward pass over the
    whole batch (the current policy's log-probabilities and values for the V-trace targets).
    """
    import torch

    from cleanrl.ppo_atari import Agent, minibatch_loss
    from cleanrl.ppo_atari import minibatches as ppo_minibatches

    batch = num_envs * num_steps
    agent = Agent(4).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5, fused=True)
    data = {
        "obs": torch.randint(0, 256, (batch, 4, 84, 84), dtype=torch.uint8),
        "actions": torch.randint(0, 4, (batch,)),
    }
    data |= {k: torch.randn(batch) for k in ("logprobs", "advantages", "returns", "values")}
    data["weights"] = torch.ones(batch)

    def update():
        if vtrace_forward:
            with torch.inference_mode():
                agent.evaluate(data["obs"], data["actions"])
        for _ in range(epochs):
            for mb in ppo_minibatches(data, minibatches, norm_adv=True):
                loss, _ = minibatch_loss(agent, mb, clip_coef=0.1, clip_vloss=True, ent_coef=0.01, vf_coef=0.5)
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
    kinds = ("sync", "async", "envpool", "ale")
    measured = {kind: [] for kind in kinds}
    for _ in range(args.repeats):  # alternated, the median of each: the machine's speed drifts
        for kind in kinds:
            measured[kind].append(env_only_sps(kind, n, args.env_steps))
    env_sps = {kind: statistics.median(sps for sps, _ in runs) for kind, runs in measured.items()}
    env_cpu = {kind: statistics.median(cpu for _, cpu in runs) for kind, runs in measured.items()}
    learner_samples = learner_only(n, t, e, m)
    learner_sps = learner_samples / e
    flags = ["--num-envs", str(n), "--num-steps", str(t), "--update-epochs", str(e), "--num-minibatches", str(m)]
    flags += ["--total-timesteps", str(n * t * args.iterations)]
    configs = {
        "ppo_atari.py sync": ("ppo_atari.py", flags, "sync"),
        "ppo_atari.py async": ("ppo_atari.py", [*flags, "--vector-mode", "async"], "async"),
        "ppo_atari_envpool.py": ("ppo_atari_envpool.py", flags, "envpool"),
        "ppo_atari_envpool.py ale": ("ppo_atari_envpool.py", [*flags, "--vector-mode", "ale"], "ale"),
    }
    trained = {name: [] for name in configs}
    for _ in range(args.repeats):  # alternated; the run with the median SPS of each is reported
        for name, (script, script_flags, _kind) in configs.items():
            trained[name].append(train(script, script_flags))
    runs = {
        name: (sorted(trained[name], key=lambda r: r["sps"])[(len(trained[name]) - 1) // 2], configs[name][2])
        for name in configs
    }

    print("\nLimits (measured in this run)")
    print(f"| {'what':34} | {'steps/s':>9} | {'CPU ms/step':>11} |")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 13}|")
    names = {"sync": "gymnasium sync", "async": "gymnasium async", "envpool": "EnvPool", "ale": "ALE AtariVectorEnv"}
    for kind, sps in env_sps.items():
        print(f"| env-only, {names[kind]:24} | {sps:9.0f} | {env_cpu[kind]:11.3f} |")
    print(f"| learner-only ({learner_samples:.0f} samples/s / {e} ep) | {learner_sps:9.0f} | {'':11} |")

    print("\nTraining")
    header = f"| {'script':24} | {'SPS':>6} | {'env s/it':>8} | {'infer s/it':>10} | {'learn s/it':>10} | {'CPU %':>6} | {'CPU ms/step':>11} | {'limit':>6} | {'of limit':>8} |"
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for name, (r, kind) in runs.items():
        limit = min(env_sps[kind], learner_sps)
        print(
            f"| {name:24} | {r['sps']:6.0f} | {r['env']:8.2f} | {r['inference']:10.2f} | {r['learn']:10.2f} "
            f"| {r['cpu']:6.0f} | {10 * r['cpu'] / r['sps']:11.2f} | {limit:6.0f} | {100 * r['sps'] / limit:7.0f}% |"
        )


def start_run(tree: Path, script: str, flags: list[str], cwd: str, core: int | None = None) -> subprocess.Popen:
    """Start ``tree``'s script in ``cwd`` (pinned to ``core`` with taskset when given)."""
    cmd = [sys.executable, str(tree / "cleanrl" / script), "--no-progress", "--run-name", "bench"]
    cmd = [*(["taskset", "-c", str(core)] if core is not None else []), *cmd, "--checkpoint-interval", "0", *flags]
    env = {**os.environ, "PYTHONPATH": str(tree), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    with open(Path(cwd) / "stderr.txt", "w") as stderr:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def finish_run(proc: subprocess.Popen, cwd: str, total: int) -> tuple[float, float]:
    """(SPS from the first logged iteration to the last, CPU seconds of the run's processes per 1k steps)."""
    sys.path.insert(0, str(REPO))
    from cleanrl_utils.tb import ScalarReader

    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{proc.args} exited {proc.returncode}:\n{(Path(cwd) / 'stderr.txt').read_text()[-3000:]}")
    series = ScalarReader(Path(cwd) / "runs/bench").update().get("charts/SPS")
    sps = (series.steps[-1] - series.steps[0]) / (series.wall_times[-1] - series.wall_times[0])
    return sps, 1000 * (rusage.ru_utime + rusage.ru_stime) / total


def timed_runs(runs: list[tuple[Path, str, list[str]]], paired: bool) -> list[tuple[float, float]]:
    """Run each (tree, script, flags) one after the other, or, ``paired``, all at once, run i pinned to core i:
    concurrent runs meet the same machine, whatever else it is doing."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        cwds = [tempfile.mkdtemp(dir=tmp) for _ in runs]
        procs = []
        for i, ((tree, script, flags), cwd) in enumerate(zip(runs, cwds)):
            procs.append(start_run(tree, script, flags, cwd, i if paired else None))
            if not paired:
                total = int(flags[flags.index("--total-timesteps") + 1])
                results.append(finish_run(procs[-1], cwd, total))
        if paired:
            for proc, cwd, (_, _, flags) in zip(procs, cwds, runs):
                results.append(finish_run(proc, cwd, int(flags[flags.index("--total-timesteps") + 1])))
    return results


def compare(args: argparse.Namespace) -> None:
    """This tree against ``--baseline`` on the same configurations, alternated, and this tree's --compile runs."""
    n, iters = args.num_envs, args.iterations
    atari = [
        "--num-envs",
        str(n),
        "--num-steps",
        str(args.num_steps),
        "--total-timesteps",
        str(n * args.num_steps * iters),
    ]
    cartpole = ["--num-envs", "4", "--num-steps", "128", "--update-epochs", "4", "--num-minibatches", "4"]
    cartpole += ["--threads", "1", "--total-timesteps", str(args.cartpole_steps)]
    cheetah = [
        "--num-steps",
        "1024",
        "--num-minibatches",
        "16",
        "--total-timesteps",
        str(1024 * args.cheetah_iterations),
    ]
    configs = [
        ("CartPole, ppo.py", "ppo.py", cartpole, False),
        (
            "CartPole, ppo.py (defaults: 8 x 32, 20 epochs)",
            "ppo.py",
            ["--total-timesteps", str(args.cartpole_steps)],
            False,
        ),
        ("HalfCheetah, ppo_continuous_action.py", "ppo_continuous_action.py", cheetah, False),
        ("Breakout, ppo_atari.py sync", "ppo_atari.py", [*atari, "--no-cuda"], False),
        ("Breakout, ppo_atari.py async", "ppo_atari.py", [*atari, "--no-cuda", "--vector-mode", "async"], False),
        ("Breakout, ppo_atari_envpool.py", "ppo_atari_envpool.py", [*atari, "--no-cuda"], False),
        ("Breakout, ppo_atari_multigpu.py (1 process)", "ppo_atari_multigpu.py", [*atari, "--no-cuda"], False),
        ("CartPole, ppo.py --compile", "ppo.py", [*cartpole, "--compile"], True),
        ("HalfCheetah, ppo_continuous_action.py --compile", "ppo_continuous_action.py", [*cheetah, "--compile"], True),
        ("Breakout, ppo_atari.py sync --compile", "ppo_atari.py", [*atari, "--no-cuda", "--compile"], True),
        ("Breakout, ppo_atari_envpool.py --compile", "ppo_atari_envpool.py", [*atari, "--no-cuda", "--compile"], True),
    ]
    configs = [c for c in configs if any(word in c[0] for word in args.only)] if args.only else configs
    with tempfile.TemporaryDirectory() as tmp:
        baseline = Path(tmp) / "baseline"
        baseline.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.baseline], check=True, capture_output=True)
        subprocess.run(["tar", "x", "-C", str(baseline)], input=archive.stdout, check=True)
        results: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for repeat in range(args.repeats):
            for name, script, flags, current_only in configs:
                labels = [("this tree", REPO)] if current_only else [("baseline", baseline), ("this tree", REPO)]
                if repeat % 2:  # alternated: which of the two runs first (or, paired, on which core)
                    labels.reverse()
                measured = timed_runs([(tree, script, flags) for _, tree in labels], args.paired)
                for (label, _), result in zip(labels, measured):
                    results.setdefault((name, label), []).append(result)
                    print(f"  {name} [{label}]: {result[0]:.0f} SPS", file=sys.stderr, flush=True)
    how = "paired (both at once, one core each, cores swapped)" if args.paired else "alternated"
    print(f"This tree against {args.baseline}; {args.repeats} runs of each, {how}; {os.cpu_count()} CPUs")
    print(f"Breakout: {n} envs x {args.num_steps} steps, {iters} iterations; CartPole: {args.cartpole_steps} steps")
    print("\n| configuration | baseline SPS | this tree SPS | ratio | baseline CPU s/1k | this tree CPU s/1k |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    eager = {}
    for name, _, _, current_only in configs:
        ours = results[name, "this tree"]
        sps, cpu = statistics.median(r[0] for r in ours), statistics.median(r[1] for r in ours)
        if current_only:
            plain = eager[name.removesuffix(" --compile")]
            print(
                f"| {name} | (eager, this tree) {plain[0]:.0f} | {sps:.0f} | {sps / plain[0]:.2f} | {plain[1]:.3f} | {cpu:.3f} |"
            )
            continue
        theirs = results[name, "baseline"]
        base_sps, base_cpu = statistics.median(r[0] for r in theirs), statistics.median(r[1] for r in theirs)
        eager[name] = (sps, cpu)
        print(f"| {name} | {base_sps:.0f} | {sps:.0f} | {sps / base_sps:.2f} | {base_cpu:.3f} | {cpu:.3f} |")
    print("\nSPS: medians, from the first logged iteration to the last (compilation left out); ratio = this tree /")
    print("baseline (for --compile rows: compiled / eager, both this tree).")


SB3_PPO = """
import resource, sys, time, json
import torch
kind, total, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_atari_env, make_vec_env
from stable_baselines3.common.vec_env import VecFrameStack

class Clock(BaseCallback):  # (step, wall, CPU seconds) at the start of every rollout
    points = []
    def _on_rollout_start(self):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.points.append((self.num_timesteps, time.perf_counter(), usage.ru_utime + usage.ru_stime))
    def _on_step(self):
        return True

if kind == "cartpole":
    env = make_vec_env("CartPole-v1", n_envs=4, seed=1)
    model = PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=4, device="cpu", seed=1)
else:
    import ale_py, gymnasium as gym
    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env("BreakoutNoFrameskip-v4", n_envs=8, seed=1), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=128, batch_size=256, n_epochs=4, device="cpu", seed=1)
clock = Clock()
model.learn(total, callback=clock)
print(json.dumps(clock.points))
"""


def whole_process(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[str, float]:
    """Run ``cmd`` to its end: its stdout and its user + system CPU seconds (threads and children included)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return out, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def ours_vs_sb3(script: str, flags: list[str], total: int, threads: int) -> dict[str, float]:
    """One run of our script: whole-process CPU seconds, and SPS from the first logged iteration to the last."""
    sys.path.insert(0, str(REPO))
    from cleanrl_utils.tb import ScalarReader

    with tempfile.TemporaryDirectory() as cwd:
        cmd = [sys.executable, str(REPO / "cleanrl" / script), "--no-progress", "--run-name", "bench"]
        cmd += ["--checkpoint-interval", "0", "--threads", str(threads), "--total-timesteps", str(total), *flags]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "WANDB_MODE": "offline"}
        _, cpu = whole_process(cmd, env, cwd)
        series = ScalarReader(Path(cwd) / "runs/bench").update().get("charts/SPS")
    sps = (series.steps[-1] - series.steps[0]) / (series.wall_times[-1] - series.wall_times[0])
    return {"cpu": cpu, "sps": sps}


def sb3_run(kind: str, total: int, threads: int) -> dict[str, float]:
    import json

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with tempfile.TemporaryDirectory() as cwd:
        out, cpu = whole_process([sys.executable, "-c", SB3_PPO, kind, str(total), str(threads)], env, cwd)
    points = json.loads(out.strip().splitlines()[-1])[1:]  # from the second rollout on, as ours
    (s0, w0, _), (s1, w1, _) = points[0], points[-1]
    return {"cpu": cpu, "sps": (s1 - s0) / (w1 - w0)}


def sb3(args: argparse.Namespace) -> None:
    """Our PPO scripts beside Stable-Baselines3's PPO with the same sizes: CartPole (4 envs x 128 steps, 4 epochs
    of 4 minibatches, 1 torch thread) and Breakout (8 envs x 128 steps, 4 epochs of 4 minibatches, the Nature
    CNN, 2 torch threads), alternated in rounds; whole-process CPU seconds and the training SPS."""
    cart = ["--num-envs", "4", "--num-steps", "128", "--update-epochs", "4", "--num-minibatches", "4"]
    atari = ["--num-envs", "8", "--num-steps", "128", "--update-epochs", "4", "--num-minibatches", "4"]
    breakout = 8 * 128 * args.sb3_iterations
    sections = {
        f"CartPole-v1, {args.cartpole_steps} steps, 1 torch thread": {
            "ppo.py": lambda: ours_vs_sb3("ppo.py", cart, args.cartpole_steps, 1),
            "stable-baselines3": lambda: sb3_run("cartpole", args.cartpole_steps, 1),
        },
        f"Breakout, {breakout} steps, 2 torch threads": {
            "ppo_atari_envpool.py --vector-mode ale": lambda: ours_vs_sb3(
                "ppo_atari_envpool.py", [*atari, "--vector-mode", "ale"], breakout, 2
            ),
            "ppo_atari.py (sync)": lambda: ours_vs_sb3(
                "ppo_atari.py", [*atari, "--env-id", "BreakoutNoFrameskip-v4"], breakout, 2
            ),
            "stable-baselines3": lambda: sb3_run("breakout", breakout, 2),
        },
    }
    if args.section == "cartpole":
        sections = dict(list(sections.items())[:1])
    for title, configs in sections.items():
        results = {name: [] for name in configs}
        names = list(configs)
        for r in range(args.repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: A B C, B C A, ...
                results[name].append(configs[name]())
                print(f"  {name}: {results[name][-1]['cpu']:.1f} CPU s", file=sys.stderr, flush=True)
        steps = args.cartpole_steps if title.startswith("CartPole") else breakout
        med = {n: {k: statistics.median(run[k] for run in runs) for k in ("cpu", "sps")} for n, runs in results.items()}
        base = med["stable-baselines3"]
        print(f"\n{title}; {args.repeats} runs of each, order rotated; medians; {os.cpu_count()} CPUs")
        print("| implementation | CPU s (whole process) | CPU ms / step | runs (CPU s) | SB3 / this | SPS (training) |")
        print("| --- | ---: | ---: | --- | ---: | ---: |")
        for name, m in med.items():
            runs = " ".join(f"{run['cpu']:.1f}" for run in results[name])
            print(f"| {name} | {m['cpu']:.1f} | {1000 * m['cpu'] / steps:.3f} | {runs} | {base['cpu'] / m['cpu']:.2f} "
                  f"| {m['sps']:.0f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=["atari", "cartpole", "sb3", "all", "compare"], default="all")
    parser.add_argument("--baseline", default="HEAD", help="the commit --section compare measures against")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=5, help="training iterations per Atari script")
    parser.add_argument("--env-steps", type=int, default=300, help="vector steps per env-only measurement")
    parser.add_argument("--cartpole-steps", type=int, default=50_000)
    parser.add_argument("--sb3-iterations", type=int, default=20, help="Breakout iterations beside SB3 (sb3)")
    parser.add_argument("--cheetah-iterations", type=int, default=8, help="iterations of 1024 steps (compare)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="compare: only the configurations whose name holds one of these")
    parser.add_argument(
        "--paired", action="store_true", help="compare: run baseline and this tree at once, one core each"
    )
    args = parser.parse_args()
    if args.section == "compare":
        compare(args)
        return
    if args.section in ("atari", "all"):
        atari(args)
    if args.section in ("cartpole", "sb3", "all"):
        print()
        sb3(args)


if __name__ == "__main__":
    main()
