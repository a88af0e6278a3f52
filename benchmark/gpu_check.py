"""One prepared check for a machine with an NVIDIA GPU (run it through benchmark/gpu_check.sh).

1. Every script runs a few iterations on CUDA (``--cuda``: four scripts default to the CPU): the
   torchrun ones at world size 1 with NCCL (and the gloo side group for objects and agreements),
   each under ``torch.cuda.set_sync_debug_mode("warn")``. For each script it prints the lines where
   the host waited for the GPU, how often, and how often per loop iteration (an env step for
   DQN/SAC, a rollout + update for PPO, an update for APPO's learner) and per env step, with the
   waits made while checkpoints are written counted apart. The budget: one wait per env step (CPU envs
   need the actions) plus the logging points; a row over it fails. Then one script of every family
   again with ``--compile --cudagraphs`` (one under torchrun with NCCL; APPO, which has no CUDA graph,
   with ``--compile``): a row whose CUDA graphs did not engage fails. With ``--cpu`` (the dry run) the
   calls that would wait on a GPU are counted instead (value reads, copies to the host, uploads that
   skip pinned memory), against the same budgets.
2. Throughput: ``ppo_atari_envpool.py`` at 8, 32 and 64 envs with and without ``--compile`` (and at
   64 with determinism off, then with ``--compile --cudagraphs`` too), and ``ppo_atari.py`` against
   ``ppo_atari_multigpu.py`` at world size 1, with SPS (from the second iteration on), CPU seconds
   per step and the env / inference / learn shares from the runs' ``perf/*`` scalars.

Every run's whole process tree (torchrun starts its workers in sessions of their own) is killed on a
timeout; every row is printed as it finishes, the rows the 12,000 SPS target needs first; rows past
``--budget`` seconds are skipped with a line, so the check ends in time with what it measured.

    bash benchmark/gpu_check.sh                       # under 8 minutes on one H200 with 16 cores
    python benchmark/gpu_check.py --cpu --quick       # the harness itself, on a machine without a GPU
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cleanrl_utils.tb import ScalarReader  # noqa: E402

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None


@dataclass
class Check:
    script: str
    flags: list[str]
    iterations: int  # loop iterations the flags make (rollouts + updates, updates, or env steps)
    unit: str
    env_steps: int  # vector env steps per iteration (the host needs the actions of each: 1 sync is the floor)
    torchrun: bool = False
    budget: float = 1.1  # waits per env step allowed outside checkpoints (per iteration when env_steps is 0)

    @property
    def name(self) -> str:
        speed = [f for f in self.flags if f in ("--compile", "--cudagraphs")]
        return " ".join([self.script, *speed])


def checks(quick: bool, cpu: bool = False) -> list[Check]:
    """Small budgets: a few iterations of every script (CartPole / Pendulum stand in for MuJoCo), then one script
    of every family again with ``--compile --cudagraphs`` (APPO has no CUDA graph: its policy acts in CPU
    worker processes), one of them under torchrun with NCCL. The CPU dry run leaves ``--cudagraphs`` out."""
    k = 1 if quick else 2
    atari = ["--env-id", "BreakoutNoFrameskip-v4"]
    dqn = ["--learning-starts", "100", "--train-frequency", "4", "--batch-size", "32", "--buffer-size", "10000"]
    sac = ["--env-id", "Pendulum-v1", "--learning-starts", "100", "--batch-size", "64", "--num-envs", "1"]
    appo = ["--num-actors", "2", "--num-envs", "8", "--num-steps", "64", "--update-epochs", "2"]
    ppo = ["--num-envs", "8", "--num-steps", "128"]
    # budgets: the actions once per env step, plus the logging points (every 1,000 env steps for DQN and SAC,
    # every iteration for PPO); APPO's learner reads V-trace's inputs once per update, and logs every update
    plain = [
        Check("ppo.py", [*ppo, "--total-timesteps", str(4096 * k)], 4 * k, "rollout", 128),
        Check("ppo_atari.py", [*atari, *ppo, "--total-timesteps", str(4096 * k)], 4 * k, "rollout", 128),
        Check("ppo_atari_envpool.py", [*ppo, "--total-timesteps", str(4096 * k)], 4 * k, "rollout", 128),
        Check(
            "ppo_continuous_action.py",
            ["--env-id", "Pendulum-v1", "--num-envs", "1", "--total-timesteps", str(4096 * k)],
            2 * k,
            "rollout",
            2048,
        ),
        Check("dqn.py", [*dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step", 1),
        Check("dqn_atari.py", [*atari, *dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step", 1),
        Check("sac_continuous_action.py", [*sac, "--total-timesteps", str(1000 * k)], 1000 * k, "env step", 1),
        Check("ppo_atari_multigpu.py", [*atari, *ppo, "--total-timesteps", str(4096 * k)], 4 * k, "rollout", 128, True),
        Check(
            "dqn_atari_multigpu.py", [*atari, *dqn, "--total-timesteps", str(1500 * k)], 1500 * k, "env step", 1, True
        ),
        Check(
            "sac_continuous_action_multigpu.py",
            [*sac, "--total-timesteps", str(1000 * k)],
            1000 * k,
            "env step",
            1,
            True,
        ),
        Check("appo.py", [*appo, "--total-timesteps", str(4096 * k)], 8 * k, "update", 0, True, 12),
        Check("appo_atari.py", [*atari, *appo, "--total-timesteps", str(4096 * k)], 8 * k, "update", 0, True, 12),
    ]
    fast = ["--compile"] if cpu else ["--compile", "--cudagraphs"]
    families = ["ppo_atari_envpool.py" if HAVE_ENVPOOL else "ppo_atari.py", "dqn_atari.py", "sac_continuous_action.py",
                "ppo_atari_multigpu.py"]  # fmt: skip
    compiled = [Check(c.script, [*c.flags, *fast], c.iterations, c.unit, c.env_steps, c.torchrun, c.budget)
                for c in plain if c.script in families]  # fmt: skip
    compiled += [Check(c.script, [*c.flags, "--compile"], c.iterations, c.unit, c.env_steps, c.torchrun, c.budget)
                 for c in plain if c.script == "appo_atari.py"]  # fmt: skip
    return plain + compiled


def command(script: str, flags: list[str], torchrun: bool, cpu: bool, launcher: list[str]) -> list[str]:
    """The command line of one check: on CUDA (``--cuda``: four scripts default to the CPU), the torchrun
    ones under NCCL; with ``cpu`` (the harness check) on the CPU and gloo."""
    machine = ["--no-cuda"] if cpu else ["--cuda"]
    if torchrun:
        machine += ["--backend", "gloo" if cpu else "nccl"]
        start = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
    else:
        start = [sys.executable]
    return [*start, *launcher, str(ROOT / "cleanrl" / script), "--no-progress", *machine, *flags]


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, float, float, str]:
    """(exit code, wall seconds, CPU seconds of the children, last lines of output).

    On a timeout the run's whole process tree is killed (torchrun's workers, which run in sessions of their
    own, the actors and env workers), found before anything is killed, so no orphan keeps the output pipe
    open; anything left in its process group after a normal exit goes too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, _ = proc.communicate()
        code, out = 124, f"{out}\ntimed out after {timeout:.0f}s (process group killed)"
    kill_group(proc.pid)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, wall, cpu, "\n".join(out.strip().splitlines()[-6:])


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (listed first: once a parent dies its children move to init)."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(tree, timeout=10)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def source_line(location: str) -> str:
    path, _, line = location.rpartition(":")
    try:
        return (ROOT / path).read_text().splitlines()[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return ""


def per_step(check: Check, waits: int) -> float:
    """Waits per env step (per iteration for the APPO learner, whose env steps happen in other processes)."""
    return waits / (check.iterations * (check.env_steps or 1))


def cudagraphs_engaged(check: Check, report: dict) -> str | None:
    """Why a ``--cudagraphs`` run's CUDA graphs did not engage (torch.compile skipped one, or recorded none),
    or None when they did (or the run asked for none)."""
    if "--cudagraphs" not in check.flags:
        return None
    graphs = report.get("cudagraphs", {})
    if graphs.get("skipped"):
        return f"torch.compile skipped CUDA graphs {graphs['skipped']} times (the run fell back to --compile alone)"
    if graphs.get("recorded") == 0:
        return "no CUDA graph was recorded"
    return None


def sync_section(args, work: Path, env: dict[str, str]) -> bool:
    print("\n## 1. Every script on", "the CPU (dry run: the calls that would wait on a GPU)" if args.cpu else "CUDA",
          flush=True)  # fmt: skip
    launcher = [str(ROOT / "benchmark" / "count_syncs.py")]
    all_ok = True

    def one(i: int, check: Check):
        cwd = work / f"{i:02d}_{check.script.removesuffix('.py')}"
        cwd.mkdir()
        report = cwd / "syncs.json"
        cmd = command(check.script, check.flags, check.torchrun, args.cpu, launcher)
        code, wall, _, tail = run(cmd, cwd, {**env, "SYNC_REPORT": str(report)}, args.timeout)
        syncs = json.loads(report.read_text()) if report.exists() else {}
        return check, code, wall, tail, syncs

    todo = [c for c in checks(args.quick, args.cpu) if HAVE_ENVPOOL or "envpool" not in c.script]
    if not HAVE_ENVPOOL:
        print("envpool is not installed: ppo_atari_envpool.py is left out")
    what = "would-be waits" if args.cpu else "host syncs"
    print(f"\n| script | launch | exit | seconds | {what} | per iteration | per env step | budget | checkpoints |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    results = []
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(one, i, c) for i, c in enumerate(todo)]
        for future in concurrent.futures.as_completed(futures):  # each row as it ends
            check, code, wall, _, report = result = future.result()
            results.append(result)
            total = sum(report.get("syncs", {}).values())
            per_step_waits = per_step(check, total)
            over = code == 0 and per_step_waits > check.budget
            launch = f"torchrun x1, {'gloo' if args.cpu else 'nccl + gloo side group'}" if check.torchrun else "python"
            per_env_step = f"{per_step_waits:.2f}" if check.env_steps else "n/a"
            unit = "env step" if check.env_steps else check.unit
            print(f"| {check.name} | {launch} | {code} | {wall:.0f} | {total} | {total / check.iterations:.2f} per "
                  f"{check.unit} | {per_env_step} | {check.budget:g} per {unit}{' OVER' if over else ''} | "
                  f"{sum(report.get('checkpoint', {}).values())} |", flush=True)  # fmt: skip
    for check, code, _, tail, report in results:
        if code != 0:
            all_ok = False
            print(f"\n{check.name} FAILED (exit {code}):\n{tail}")
        if per_step(check, sum(report.get("syncs", {}).values())) > check.budget:
            all_ok = False
            unit = "env step" if check.env_steps else check.unit
            print(f"\n{check.name} OVER BUDGET: more than {check.budget:g} waits per {unit} outside checkpoints")
        why = cudagraphs_engaged(check, report) if code == 0 else None
        if why:
            all_ok = False
            print(f"\n{check.name} FAILED: {why}")
        if report.get("syncs"):
            print(f"\n{check.name}: where the host waited ({check.iterations} iterations, one per {check.unit})")
            print("  (goal: the actions once per env step; nothing per gradient step outside logging)")
            for location, n in report["syncs"].items():
                print(f"  {n:7d}  {n / check.iterations:6.2f}/it  {location:42s} {source_line(location)[:70]}")
        if report.get("checkpoint"):
            print(f"  while writing checkpoints: {report['checkpoint']}")
    return all_ok


def sps_after_first(reader: ScalarReader) -> float:
    """Env steps per second from the first logged iteration to the last, read off ``charts/SPS``'s steps and
    wall times: CUDA start-up, the first cuDNN plans and torch.compile's compilation are left out."""
    series = reader.get("charts/SPS")
    if len(series.steps) < 2:
        return float("nan")
    return (series.steps[-1] - series.steps[0]) / (series.wall_times[-1] - series.wall_times[0])


def shares(run_dir: Path) -> dict[str, float]:
    """SPS (after the first iteration) and the env / inference / learn / comm shares of the busy time."""
    reader = ScalarReader(run_dir).update()
    keys = ("env_time", "inference_time", "learn_time", "comm_time")
    sums = {k: sum(reader.get(f"perf/{k}").values[1:]) for k in keys}  # the first iteration left out here too
    busy = sum(v for k, v in sums.items() if k != "comm_time") or float("nan")
    return {"sps": sps_after_first(reader), **{k: v / busy for k, v in sums.items()}}


def throughput_runs(quick: bool) -> list[tuple[str, str, list[str], bool]]:
    """(name, script, flags, torchrun), the most telling first: the rows the 12,000 SPS target needs, then the
    rest; the check stops adding rows at its time budget (each --compile row pays for its own compilation:
    the shapes differ with the number of envs)."""
    iters = 4 if quick else 8

    def envpool(envs: int, *extra: str) -> tuple[str, str, list[str], bool]:
        flags = ["--num-envs", str(envs), "--total-timesteps", str(envs * 128 * iters), *extra]
        return (f"ppo_atari_envpool.py, {envs} envs {' '.join(extra)}".strip(), "ppo_atari_envpool.py", flags, False)

    atari = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", "8", "--total-timesteps", str(8 * 128 * iters)]
    same_envs = [("ppo_atari.py, 8 envs", "ppo_atari.py", atari, False)]
    same_envs.append(("ppo_atari_multigpu.py, 8 envs, world size 1", "ppo_atari_multigpu.py", atari, True))
    if not HAVE_ENVPOOL:
        return same_envs
    if quick:
        return [envpool(8), envpool(8, "--compile"), *same_envs]
    fast = ("--no-torch-deterministic", "--compile", "--cudagraphs")  # the target's rows: all speed flags on
    return [envpool(64, fast[0]), envpool(64, *fast), envpool(64), envpool(64, "--compile"), envpool(8),
            envpool(32), *same_envs, envpool(32, "--compile"), envpool(8, "--compile")]  # fmt: skip


def throughput_section(args, work: Path, env: dict[str, str], deadline: float) -> bool:
    print("\n## 2. Throughput (alone on the machine, one run at a time)", flush=True)
    if not HAVE_ENVPOOL:
        print("envpool is not installed: its rows are left out")
    print("\n| run | exit | SPS | CPU s / 1k steps | env | inference | learn | comm | bound by |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for i, (name, script, flags, torchrun) in enumerate(throughput_runs(args.quick)):
        left = deadline - time.perf_counter()
        if left < 60:
            print(f"| {name} | skipped: the check's time budget (--budget) is spent |||||||")
            continue
        cwd = work / f"throughput{i}"
        cwd.mkdir()
        cmd = command(script, [*flags, "--run-name", "r", "--checkpoint-interval", "0"], torchrun, args.cpu, [])
        code, wall, cpu, tail = run(cmd, cwd, env, min(args.timeout, left))
        if code == 124 and left < args.timeout:
            print(f"| {name} | cut short: the check's time budget (--budget) ran out after {left:.0f}s |||||||")
            continue
        if code != 0:
            ok = False
            print(f"| {name} | {code} | failed: {tail.splitlines()[-1] if tail else ''} |||||||")
            continue
        s = shares(cwd / "runs" / "r")
        steps = int(flags[flags.index("--total-timesteps") + 1])
        bound = max(
            ("env", s["env_time"]), ("inference", s["inference_time"]), ("learn", s["learn_time"]), key=lambda kv: kv[1]
        )[0]
        print(
            f"| {name} | {code} | {s['sps']:,.0f} | {cpu / steps * 1000:.2f} | {s['env_time']:.0%} | "
            f"{s['inference_time']:.0%} | {s['learn_time']:.0%} | {s['comm_time']:.0%} | {bound} |",
            flush=True,
        )
    print("\nSPS from the first logged iteration to the last (start-up and compilation left out); CPU seconds over")
    print("the whole run. The figure to beat for ppo_atari_envpool.py on one H200 with 16 cores: 12,000 SPS.")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="check the harness on a machine without a GPU")
    parser.add_argument("--quick", action="store_true", help="smaller budgets, one throughput run per kind")
    parser.add_argument("--parallel", type=int, default=4, help="scripts checked at the same time in part 1")
    parser.add_argument("--timeout", type=float, default=240, help="seconds one run may take")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole check, rows past it skipped (default: 450 on a GPU, none with --cpu)",
    )
    parser.add_argument("--only", choices=["syncs", "throughput"], help="run one part")
    args = parser.parse_args()
    if args.budget is None:
        args.budget = float("inf") if args.cpu else 450.0

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
            ok &= throughput_section(args, Path(tmp), env, start + args.budget)
    print(f"\n{'all ran' if ok else 'SOME RUNS FAILED'}; {time.perf_counter() - start:.0f}s in all")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
