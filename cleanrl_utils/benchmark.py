"""Run a grid of experiments (commands x env ids x seeds) on a pool of workers with device slots.

    python -m cleanrl_utils.benchmark --env-ids CartPole-v1 Acrobot-v1 \\
        --command "python cleanrl/ppo.py --no-cuda" "python cleanrl/dqn.py" --num-seeds 3 --workers 4
    python -m cleanrl_utils.benchmark --env-ids BreakoutNoFrameskip-v4 --num-seeds 2 --gpus 0 1 \\
        --command "torchrun --standalone --nproc_per_node 2 cleanrl/ppo_atari_multigpu.py" --gpus-per-run 2

Each run gets ``--env-id``, ``--seed`` and a fixed ``--run-name <env>__<exp>__<seed>`` (prefixed
with ``--run-prefix``), so its logs land in ``runs/<run-name>`` and a re-run finds it: with
``--skip-completed`` finished runs are skipped and interrupted ones (checkpoints but no success)
continue with ``--resume``. Every run writes its output to ``<log-dir>/<run-name>.log`` and, when it
ends, its exit code and duration to ``<run-name>.json`` next to it. A run that fails does not stop
the others; at the end one line per failure names its exit code and log, and the exit code is 1.
Ctrl-C stops every run (they checkpoint) and exits 130.

Every command's flags are checked against its script's own validation before anything starts (one
line, exit 2). CleanRL's ``--command``/``--env-ids``/``--num-seeds``/``--workers`` keep their meaning.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import tyro

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Processes: one run is one process group, which dies with the process that started it
# --------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the starting process dies (a killed worker leaves no run behind)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def launch(argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: str | Path | None = None):
    """Start ``argv`` in its own process group, stdout and stderr into ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 30.0) -> int:
    """Send ``sig`` to the run's whole process group; SIGKILL what is left after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group's other members (env workers, torchrun's children)
    return proc.wait()


def last_line(log: Path) -> str:
    """The last non-empty line of a log (usually the error), for one-line failure reports."""
    with contextlib.suppress(OSError):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return lines[-1].strip()[:300]
    return ""


def device_slots(gpus: list[int], runs_per_gpu: int, gpus_per_run: int) -> list[dict[str, str]]:
    """The environment of each device slot: ``CUDA_VISIBLE_DEVICES`` for GPU slots; no GPUs, no slots."""
    groups = [gpus[i : i + gpus_per_run] for i in range(0, len(gpus) - gpus_per_run + 1, gpus_per_run)]
    return [{"CUDA_VISIBLE_DEVICES": ",".join(map(str, g))} for g in groups for _ in range(runs_per_gpu)]


def thread_env(threads: int) -> dict[str, str]:
    return {name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


# --------------------------------------------------------------------------------------------
# A script's own validation, run before anything starts
# --------------------------------------------------------------------------------------------
def script_of(command: list[str]) -> Path | None:
    """The ``.py`` file a command runs (after ``python``, ``torchrun --flags`` and so on)."""
    return next((Path(token) for token in command if token.endswith(".py")), None)


def runnable(path: Path | str) -> str:
    """``path`` as a command typed in the working directory names it: relative when under it, else absolute."""
    path = Path(path).resolve()
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def locate_script(command: list[str]) -> list[str]:
    """``command`` with a project path (``cleanrl/ppo.py``) that is not under the working directory
    replaced by one that runs from here, so that a tool started anywhere prints commands that run."""
    script = script_of(command)
    if script is None or script.exists() or not (REPO / script).exists():
        return command
    return [runnable(REPO / script) if token == str(script) else token for token in command]


def world_size_of(command: list[str]) -> int:
    """Processes a torchrun command starts (``--nproc_per_node`` x ``--nnodes``); 1 otherwise."""
    size = {"nproc_per_node": 1, "nnodes": 1}
    for i, token in enumerate(command):
        for name in size:
            for spelling in (f"--{name}", f"--{name.replace('_', '-')}"):
                if token == spelling and i + 1 < len(command) and command[i + 1].isdigit():
                    size[name] = int(command[i + 1])
                elif token.startswith(spelling + "=") and token.split("=", 1)[1].isdigit():
                    size[name] = int(token.split("=", 1)[1])
    return size["nproc_per_node"] * size["nnodes"]


_MODULES: dict[Path, object] = {}


def load_script(path: Path):
    """Import a training script as a module (its ``main()`` does not run): its ``Args``, ``validate``, networks."""
    path = path.resolve()
    if path not in _MODULES:
        spec = importlib.util.spec_from_file_location(f"_script_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # tyro reads the Args docstrings through inspect
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))
        spec.loader.exec_module(module)
        _MODULES[path] = module
    return _MODULES[path]


def check_script_args(script: Path, argv: list[str], world_size: int = 1):
    """Parse and validate ``argv`` as ``script`` would; returns (args or None, error line or None).

    Scripts without this project's ``Args``/``validate`` pass unchecked (args None, no error).
    """
    module = load_script(script)
    if not hasattr(module, "Args") or not hasattr(module, "validate"):
        return None, None
    from cleanrl_utils.distributed import Ranks
    from cleanrl_utils.run import parse_args

    stderr = io.StringIO()
    saved = {k: os.environ.pop(k) for k in ("RANK", "LOCAL_RANK") if k in os.environ}
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = parse_args(module.Args, world_size, argv)
            if module.validate.__code__.co_argcount == 2:
                module.validate(args, Ranks(world_size=world_size, local_world_size=world_size))
            else:
                module.validate(args)
    except SystemExit as exit_:
        return None, refusal(stderr.getvalue()) or f"exit code {exit_.code}"
    finally:
        os.environ.update(saved)
    return args, None


def refusal(stderr: str) -> str:
    """The one line a refused command line printed: the scripts' ``error: ...`` line, or tyro's error
    box unwrapped (its text without the frame, the title and the help hint)."""
    lines = [line.strip(" │╭╰─╮╯|+-") for line in stderr.splitlines()]
    own = next((line[len("error:") :].strip() for line in lines if line.startswith("error:")), None)
    if own:
        return own
    lines = [line for line in lines if re.search("[A-Za-z]", line) and "--help" not in line]
    if len(lines) > 1 and not re.search("[:'.]", lines[0]):
        lines = lines[1:]
    return " ".join(lines)[:300]


# --------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------
@dataclass
class Job:
    name: str
    argv: list[str]
    log: Path
    run_dir: Path
    gpus: int = 0
    processes: int = 1  # a torchrun command's processes: the workers (cores) it takes in the pool


def exp_name(command: list[str]) -> str:
    """The command's ``--exp-name`` (as the run records it), else its script's name."""
    for i, token in enumerate(command):
        if token in ("--exp-name", "--exp_name") and i + 1 < len(command):
            return command[i + 1]
        if token.startswith(("--exp-name=", "--exp_name=")):
            return token.split("=", 1)[1]
    script = script_of(command)
    return script.stem if script else Path(command[0]).name


def plan_grid(
    commands: list[str], env_ids: list[str], seeds: list[int], prefix: str, log_dir: Path, gpus_per_run: int
) -> list[Job]:
    jobs, names = [], set()
    for command in commands:
        base = locate_script(shlex.split(command))
        exp = exp_name(base)
        for env_id in env_ids:
            for seed in seeds:
                name = f"{prefix}{env_id.replace('/', '-')}__{exp}__{seed}"
                if name in names:
                    raise ValueError(f"two commands give the run name {name}: give them different --exp-name values")
                names.add(name)
                argv = [*base, "--env-id", env_id, "--seed", str(seed), "--run-name", name]
                run_dir = Path("runs") / name
                jobs.append(Job(name, argv, log_dir / f"{name}.log", run_dir, gpus_per_run, world_size_of(base)))
    return jobs


def status_of(job: Job) -> dict | None:
    path = job.log.with_suffix(".json")
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def has_checkpoints(job: Job) -> bool:
    return any((job.run_dir / "checkpoints").glob("ckpt_*.pt"))


def resumable(jobs: list[Job], skip_completed: bool) -> list[Job]:
    """The jobs still to run: with ``skip_completed`` those whose last attempt succeeded are left out and
    interrupted ones (checkpoints, no success) continue with ``--resume``; without it a run directory that
    holds checkpoints raises ValueError (a second grid would train into the first one's runs)."""
    todo = []
    for job in jobs:
        status = status_of(job)
        if skip_completed and status and status["returncode"] == 0:
            continue
        if has_checkpoints(job):
            if not skip_completed:
                raise ValueError(
                    f"{job.run_dir} holds checkpoints: pass --skip-completed (resume it) or another --run-prefix"
                )
            job.argv += ["--resume", str(job.run_dir)]
        todo.append(job)
    return todo


class Pool:
    """Runs jobs, at most ``workers`` processes at a time (a torchrun job counts its processes; one too large
    runs alone), each on a free device slot; prints progress lines."""

    def __init__(self, workers: int, slots: list[dict[str, str]], threads: int, quiet: bool = False):
        self.workers, self.threads, self.quiet = workers, threads, quiet
        self.free_slots = list(slots) if slots else [{} for _ in range(workers)]
        self.workers = min(workers, len(self.free_slots))

    def run(self, jobs: list[Job]) -> list[tuple[Job, int]]:
        pending, running, done = list(jobs), {}, []
        start, last_print = time.monotonic(), 0.0
        try:
            while pending or running:
                busy = sum(job.processes for job, *_ in running.values())
                while pending and self.free_slots and (not running or busy + pending[0].processes <= self.workers):
                    job, slot = pending.pop(0), self.free_slots.pop(0)
                    busy += job.processes
                    env = {**thread_env(self.threads), **slot}
                    if not self.quiet:
                        print(f"[benchmark] start {job.name}: {shlex.join(job.argv)}", flush=True)
                    running[job.name] = (job, slot, launch(job.argv, job.log, env), time.monotonic())
                for name, (job, slot, proc, began) in list(running.items()):
                    code = proc.poll()
                    if code is None:
                        continue
                    del running[name]
                    self.free_slots.append(slot)
                    seconds = time.monotonic() - began
                    job.log.with_suffix(".json").write_text(
                        json.dumps({"returncode": code, "seconds": round(seconds, 1), "command": job.argv})
                    )
                    done.append((job, code))
                    if not self.quiet:
                        state = "done" if code == 0 else f"failed (exit {code}, log {job.log})"
                        print(f"[benchmark] {state}: {job.name} in {seconds:.0f}s", flush=True)
                now = time.monotonic()
                if not self.quiet and now - last_print > 30 and running:
                    last_print = now
                    elapsed = now - start
                    finished = len(done)
                    eta = elapsed / finished * (len(pending) + len(running)) if finished else float("nan")
                    print(
                        f"[benchmark] {finished}/{len(jobs)} finished, {len(running)} running, {len(pending)} "
                        f"waiting; {elapsed / 60:.1f} min elapsed, ETA {eta / 60:.1f} min",
                        flush=True,
                    )
                time.sleep(0.2)
        except KeyboardInterrupt:
            print(f"[benchmark] interrupted: stopping {len(running)} runs (they write a checkpoint)", flush=True)
            for _, _, proc, _ in running.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for _, _, proc, _ in running.values():
                stop_group(proc, signal.SIGTERM)
            raise SystemExit(130) from None
        return done


@dataclass
class Args:
    env_ids: list[str]
    """the env ids of the grid"""
    command: list[str]
    """one or more commands, each run for every env id and seed (e.g. "python cleanrl/ppo.py --no-cuda")"""
    num_seeds: int = 3
    """seeds per (command, env id)"""
    start_seed: int = 1
    """the first seed; seeds are start_seed .. start_seed + num_seeds - 1"""
    workers: int = 1
    """runs at the same time on this machine"""
    gpus: list[int] = field(default_factory=list)
    """GPU indices to share among the runs (none: CPU runs, no device slots)"""
    runs_per_gpu: int = 1
    """runs sharing one GPU slot at the same time"""
    gpus_per_run: int = 1
    """GPUs each run gets (a torchrun command with --nproc_per_node N needs N)"""
    threads_per_run: int = 1
    """OMP/MKL threads of each run"""
    run_prefix: str = ""
    """prefix of every run name, e.g. "bench1/" puts the runs in runs/bench1/"""
    log_dir: str = "runs/logs"
    """where each run's log and exit-status file go"""
    skip_completed: bool = False
    """skip runs whose last attempt succeeded; continue interrupted ones with --resume"""
    dry_run: bool = False
    """print the commands and exit"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)

    def bad(message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)

    for name in ("num_seeds", "workers", "runs_per_gpu", "gpus_per_run", "threads_per_run"):
        if getattr(args, name) < 1:
            bad(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    if args.gpus and len(args.gpus) < args.gpus_per_run:
        bad(f"--gpus-per-run {args.gpus_per_run}: more than the {len(args.gpus)} GPUs given by --gpus")
    seeds = list(range(args.start_seed, args.start_seed + args.num_seeds))
    try:
        jobs = plan_grid(args.command, args.env_ids, seeds, args.run_prefix, Path(args.log_dir), args.gpus_per_run)
    except ValueError as error:
        bad(str(error))
    for job in jobs:  # every command's flags, before anything starts
        script = script_of(job.argv)
        if script is None or not script.exists():
            bad(f"--command {shlex.join(job.argv)}: names no existing .py script")
        _, error = check_script_args(script, job.argv[job.argv.index(str(script)) + 1 :], world_size_of(job.argv))
        if error:
            bad(f"{job.name}: {error}")

    try:
        todo = resumable(jobs, args.skip_completed)
    except ValueError as error:
        bad(str(error))
    skipped = len(jobs) - len(todo)
    if skipped:
        print(f"[benchmark] skipping {skipped} completed runs", flush=True)
    if args.dry_run:
        for job in todo:
            print(shlex.join(job.argv))
        return 0

    slots = device_slots(args.gpus, args.runs_per_gpu, args.gpus_per_run)
    done = Pool(args.workers, slots, args.threads_per_run).run(todo)
    failed = [(job, code) for job, code in done if code != 0]
    print(f"[benchmark] {len(done) - len(failed)} of {len(done)} runs succeeded ({skipped} skipped)", flush=True)
    for job, code in failed:
        print(f"[benchmark] FAILED {job.name}: exit {code}; log {job.log}: {last_line(job.log)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
