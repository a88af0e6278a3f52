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
import json
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tyro

from cleanrl_utils.launch import (
    check_script_args,
    device_slots,
    exp_name,
    last_line,
    launch,
    locate_script,
    script_of,
    stop_group,
    thread_env,
    world_size_of,
)


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
        """Run ``jobs``; Ctrl-C or SIGTERM (a scheduler's, ``kill``) stops the runs with SIGTERM, so each writes
        its checkpoint (they would otherwise die with this process, unsaved), and exits 130 or 143."""
        pending, running, done = list(jobs), {}, []
        start, last_print = time.monotonic(), 0.0

        def stop(signum, frame):
            raise KeyboardInterrupt(signum)

        previous = (
            signal.signal(signal.SIGTERM, stop) if threading.current_thread() is threading.main_thread() else None
        )
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
        except KeyboardInterrupt as e:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the checkpoints short
            signum = int(e.args[0]) if e.args else int(signal.SIGINT)
            print(f"[benchmark] interrupted (signal {signum}): stopping {len(running)} runs (they write a checkpoint)",
                  flush=True)  # fmt: skip
            for _, _, proc, _ in running.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            for _, _, proc, _ in running.values():
                stop_group(proc, signal.SIGTERM)
            raise SystemExit(128 + signum) from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
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
