"""One prepared check for a machine with an NVIDIA GPU (run it through benchmark/gpu_check.sh).

1. Every script runs a few iterations on CUDA: the torchrun ones at world size 1 with NCCL (and the
   gloo side group for objects), each under ``torch.cuda.set_sync_debug_mode("warn")``. For each
   script it prints the lines where the host waited for the GPU, how often, and how often per loop
   iteration (an env step for DQN/SAC, a rollout + update for PPO/APPO). Lines that sync on every
   iteration are the price of CPU envs (the actions go back to the host); everything else should
   happen once per logging interval at most.
2. Throughput: ``ppo_atari_envpool.py`` at 8, 32 and 64 envs, and ``ppo_atari.py`` against
   ``ppo_atari_multigpu.py`` at world size 1, with SPS, CPU seconds per step and the env /
   inference / learn shares from the runs' ``perf/*`` scalars (which share bounds the run).

    bash benchmark/gpu_check.sh                       # about 6 minutes on one H200 with 16 cores
    python benchmark/gpu_check.py --cpu --quick       # the harness itself, on a machine without a GPU
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cleanrl_utils.tb import ScalarReader  # noqa: E402

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None


@dataclass
class Check:
    script: str
    flags: list[str]
    iterations: int  # loop iterations the flags make (env steps of the vector env, or rollouts + updates)
    unit: str
    torchrun: bool = False
    extra: list[str] = field(default_factory=list)


def checks(quick: bool) -> list[Check]:
    """Small budgets: a few iterations of every script (CartPole / Pendulum stand in for MuJoCo)."""
    k = 1 if quick else 2
    atari = ["--env-id", "BreakoutNoFrameskip-v4"]
    dqn = ["--learning-starts", "500", "--train-frequency", "4", "--batch-size", "32", "--buffer-size", "10000"]
    sac = ["--env-id", "Pendulum-v1", "--learning-starts", "500", "--batch-size", "64", "--num-envs", "1"]
    appo = ["--num-actors", "2", "--num-envs", "8", "--num-steps", "64", "--update-epochs", "2"]
    return [
        Check(
            "ppo.py", ["--num-envs", "4", "--num-steps", "128", "--total-timesteps", str(4096 * k)], 8 * k, "rollout"
        ),
        Check("ppo_atari.py", [*atari, "--num-envs", "8", "--total-timesteps", str(4096 * k)], 4 * k, "rollout"),
        Check("ppo_atari_envpool.py", ["--num-envs", "8", "--total-timesteps", str(4096 * k)], 4 * k, "rollout"),
        Check(
            "ppo_continuous_action.py",
            ["--env-id", "Pendulum-v1", "--num-envs", "1", "--total-timesteps", str(4096 * k)],
            2 * k,
            "rollout",
        ),
        Check("dqn.py", [*dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step"),
        Check("dqn_atari.py", [*atari, *dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step"),
        Check("sac_continuous_action.py", [*sac, "--total-timesteps", str(1000 * k)], 1000 * k, "env step"),
        Check(
            "ppo_atari_multigpu.py",
            [*atari, "--num-envs", "8", "--total-timesteps", str(4096 * k)],
            4 * k,
            "rollout",
            True,
        ),
        Check("dqn_atari_multigpu.py", [*atari, *dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step", True),
        Check(
            "sac_continuous_action_multigpu.py", [*sac, "--total-timesteps", str(1000 * k)], 1000 * k, "env step", True
        ),
        Check("appo.py", [*appo, "--total-timesteps", str(4096 * k)], 8 * k, "update", True),
        Check("appo_atari.py", [*atari, *appo, "--total-timesteps", str(4096 * k)], 8 * k, "update", True),
    ]


def command(script: str, flags: list[str], torchrun: bool, cpu: bool, launcher: list[str]) -> list[str]:
    machine = ["--no-cuda"] if cpu else []
    if torchrun:
        machine += ["--backend", "gloo" if cpu else "nccl"]
        start = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    else:
        start = [sys.executable]
    return [*start, *launcher, str(ROOT / "cleanrl" / script), "--no-progress", *machine, *flags]


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, CPU seconds of the children, last lines of output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, out = 124, f"timed out after {timeout:.0f}s: {(e.stderr or b'')[-2000:]!r}"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu, "\n".join(out.strip().splitlines()[-6:])


def source_line(location: str) -> str:
    path, _, line = location.rpartition(":")
    try:
        return (ROOT / path).read_text().splitlines()[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return ""


def sync_section(args, work: Path, env: dict[str, str]) -> bool:
    print("\n## 1. Every script on", "the CPU (harness check: no sync counts)" if args.cpu else "CUDA", flush=True)
    launcher = [str(ROOT / "benchmark" / "count_syncs.py")]
    all_ok = True

    def one(check: Check):
        cwd = work / check.script.removesuffix(".py")
        cwd.mkdir()
        report = cwd / "syncs.json"
        cmd = command(check.script, check.flags, check.torchrun, args.cpu, launcher)
        code, wall, _, tail = run(cmd, cwd, {**env, "SYNC_REPORT": str(report)}, args.timeout)
        syncs = json.loads(report.read_text()) if report.exists() else {}
        return check, code, wall, tail, syncs

    todo = [c for c in checks(args.quick) if HAVE_ENVPOOL or "envpool" not in c.script]
    if not HAVE_ENVPOOL:
        print("envpool is not installed: ppo_atari_envpool.py is left out")
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(one, todo))
    print("\n| script | launch | exit | seconds | host syncs | per iteration |")
    print("| --- | --- | --- | --- | --- | --- |")
    for check, code, wall, _, syncs in results:
        total = sum(syncs.values())
        per = f"{total / check.iterations:.2f} per {check.unit}" if not args.cpu else "n/a"
        launch = f"torchrun x1, {'gloo' if args.cpu else 'nccl + gloo side group'}" if check.torchrun else "python"
        print(f"| {check.script} | {launch} | {code} | {wall:.0f} | {total if not args.cpu else 'n/a'} | {per} |")
    for check, code, _, tail, syncs in results:
        if code != 0:
            all_ok = False
            print(f"\n{check.script} FAILED (exit {code}):\n{tail}")
        if syncs:
            print(f"\n{check.script}: where the host waited ({check.iterations} iterations, one per {check.unit})")
            for location, n in syncs.items():
                print(f"  {n:7d}  {n / check.iterations:6.2f}/it  {location:42s} {source_line(location)[:70]}")
    return all_ok


def shares(run_dir: Path) -> dict[str, float]:
    reader = ScalarReader(run_dir).update()
    sums = {k: sum(reader.get(f"perf/{k}").values) for k in ("env_time", "inference_time", "learn_time", "comm_time")}
    busy = sum(v for k, v in sums.items() if k != "comm_time") or float("nan")
    sps = reader.get("charts/SPS").values
    return {"sps": sps[-1] if sps else float("nan"), **{k: v / busy for k, v in sums.items()}}


def throughput_section(args, work: Path, env: dict[str, str]) -> bool:
    print("\n## 2. Throughput (alone on the machine, one run at a time)", flush=True)
    iters = 4 if args.quick else 12
    runs = []
    for envs in () if not HAVE_ENVPOOL else (8,) if args.quick else (8, 32, 64):
        flags = ["--num-envs", str(envs), "--total-timesteps", str(envs * 128 * iters)]
        runs.append((f"ppo_atari_envpool.py, {envs} envs", "ppo_atari_envpool.py", flags, False, envs * 128 * iters))
    atari = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--total-timesteps", str(8 * 128 * iters)]
    runs.append(("ppo_atari.py, 8 envs", "ppo_atari.py", atari, False, 8 * 128 * iters))
    runs.append(("ppo_atari_multigpu.py, 8 envs, world size 1", "ppo_atari_multigpu.py", atari, True, 8 * 128 * iters))
    print("\n| run | exit | SPS | CPU s / 1k steps | env | inference | learn | comm | bound by |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for i, (name, script, flags, torchrun, steps) in enumerate(runs):
        cwd = work / f"throughput{i}"
        cwd.mkdir()
        code, wall, cpu, tail = run(
            command(script, [*flags, "--run-name", "r"], torchrun, args.cpu, []), cwd, env, args.timeout
        )
        if code != 0:
            ok = False
            print(f"| {name} | {code} | failed: {tail.splitlines()[-1] if tail else ''} |||||||")
            continue
        s = shares(cwd / "runs" / "r")
        bound = max(
            ("env", s["env_time"]), ("inference", s["inference_time"]), ("learn", s["learn_time"]), key=lambda kv: kv[1]
        )[0]
        print(
            f"| {name} | {code} | {s['sps']:,.0f} | {cpu / steps * 1000:.2f} | {s['env_time']:.0%} | "
            f"{s['inference_time']:.0%} | {s['learn_time']:.0%} | {s['comm_time']:.0%} | {bound} |"
        )
    print("\nThe figure to beat for ppo_atari_envpool.py on one H200 with 16 cores: 12,000 SPS.")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="check the harness on a machine without a GPU")
    parser.add_argument("--quick", action="store_true", help="smaller budgets, one throughput run per kind")
    parser.add_argument("--parallel", type=int, default=3, help="scripts checked at the same time in part 1")
    parser.add_argument("--timeout", type=float, default=240, help="seconds one run may take")
    parser.add_argument("--only", choices=["syncs", "throughput"], help="run one part")
    args = parser.parse_args()

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA device visible to torch (pass --cpu to check the harness itself)", file=sys.stderr)
        raise SystemExit(2)
    print(f"# GPU check ({time.strftime('%Y-%m-%d %H:%M')})")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, NCCL "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}")  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    start = time.perf_counter()
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        if args.only in (None, "syncs"):
            ok &= sync_section(args, Path(tmp), env)
        if args.only in (None, "throughput"):
            ok &= throughput_section(args, Path(tmp), env)
    print(f"\n{'all ran' if ok else 'SOME RUNS FAILED'}; {time.perf_counter() - start:.0f}s in all")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
