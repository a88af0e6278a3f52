"""The life of a run, identical in every script: its set-up (command line, resume rule, ranks and
checkpoint to continue), logging, signals, checkpoint writes and the closing line.

The order a script calls these in is the order of a run (a plain ``python`` launch is rank 0 of 1):

    args, ranks, run_dir, checkpoint = setup(Args, validate, __file__)  # exit 2 on bad input, before any work
    run = Run(args, run_dir, __file__, ranks=ranks, checkpoint=checkpoint)  # TensorBoard/W&B, Ctrl-C, progress
    ...                                                                 # the training loop, which decides when to
    run.save(state, global_step)                                        #   checkpoint (torchrun: own=this rank's
    run.close(); run.summary(global_step)                               #   part) and stops on run.stop.signum

The command line and the resume rule are ``cleanrl_utils.arguments``'; ranks, process groups and the
run plan ``cleanrl_utils.distributed``'.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch

from cleanrl_utils.arguments import (
    check_run,
    fail,
    is_main_process,
    note,
    parse_args,
    require_positive,
    resumed_args,
    share_envs,
)
from cleanrl_utils.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, write_state
from cleanrl_utils.distributed import Ranks, check_devices

T = TypeVar("T")
# A single-process run writes a checkpoint at least this often (seconds of wall clock), whatever its
# --checkpoint-interval: a preempted tuner trial or grid task loses at most this much (see
# benchmark/checkpoint_overhead.py for what a checkpoint costs).
CHECKPOINT_SECONDS = 300.0
# A run given CLEANRL_STOP_AT_STEP=N stops (exit code 0) after its first checkpoint at or past step N: a
# tool that trains a run in segments (cleanrl_utils/pbt.py) ends each one exactly on a checkpoint.
STOP_AT_STEP = "CLEANRL_STOP_AT_STEP"


def setup(args_class: type[T], validate, script_file: str) -> tuple[T, Ranks, Path, dict[str, Any] | None]:
    """Every script's set-up: this process's rank (torchrun's environment; a ``python`` launch is rank 0 of
    1), the command line, validation, the device and process group, and the run plan. Returns (args,
    ranks, run directory, this rank's checkpoint or None); the device is ``ranks.device``.

    Validation is one line and exit 2: for a new run before any process group or run directory, for
    ``--resume`` once the checkpoint's settings are merged (every rank alike). A script without
    distributed flags (``--dist-timeout``) runs on one process and refuses WORLD_SIZE > 1. The per-rank
    share of the envs, ``args.local_num_envs``, is derived here, once, from the run's settled ``num_envs``.
    """
    ranks = Ranks.from_env()
    multi = any(f.name == "dist_timeout" for f in dataclasses.fields(args_class))
    if not multi:
        if ranks.world_size > 1:
            fail(f"{Path(script_file).name} runs on one process (WORLD_SIZE={ranks.world_size}): launch it with python")
        ranks = Ranks()  # no process group, whatever launched it
    args = parse_args(args_class, ranks.world_size)
    check_run(args)
    if args.resume is None:
        validate(args, ranks)  # a new run: all of it is refused before any process group
    elif multi:  # what joining needs (launch flags: the new ones count); the rest once the checkpoint is read
        require_positive(args, "dist_timeout")
        check_devices(args, ranks.local_world_size)
    ranks.join_process_group(args.cuda, getattr(args, "backend", None), getattr(args, "device_ids", None),
                             getattr(args, "dist_timeout", 600.0))  # fmt: skip
    run_dir, checkpoint = ranks.plan(args, script_file)
    if checkpoint is not None:  # the same settings on every rank: all exit 2 alike
        args = resumed_args(args, checkpoint)
        validate(args, ranks)
    share_envs(args, ranks.world_size)  # args.local_num_envs: this world size's share of the global --num-envs
    return args, ranks, run_dir, checkpoint


_held: list[Any] = []  # the run-directory locks this process holds, for its life


def hold_run_dir(run_dir: Path) -> str | None:
    """One live run per run directory: an exclusive lock (``flock``) on ``<run_dir>/.lock``, held for the life of
    this process; the kernel drops it when the process ends, however it ends, so the successor of a killed
    run takes it over. Returns None, or the one line that says another live run holds it."""
    import fcntl
    import socket

    run_dir.mkdir(parents=True, exist_ok=True)
    lock = open(run_dir / ".lock", "a+")  # noqa: SIM115 (held open on purpose, for the life of the process)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        return f"{run_dir} is in use by a live run ({holder}): wait for it to end, or give another --run-name"
    with contextlib.suppress(OSError):  # (who holds it is a courtesy: a full disk may refuse it)
        lock.truncate(0)
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        lock.flush()
    _held.append(lock)
    return None


# --------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------
def start_logging(
    args: Any, run_dir: Path, wandb_id: str | None, resumed_at: int | None, config: dict[str, Any] | None = None
):
    """TensorBoard writer in ``run_dir`` (and a W&B run with ``--track``); returns (writer, wandb_id).

    The W&B id is kept in checkpoints, so a resumed run continues the same W&B run; a resumed writer
    drops the events the previous attempt logged after its checkpoint (``purge_step``: ``resumed_at`` is
    the first step the resumed run may log, one past the checkpoint's, whose own points are kept). W&B's
    own files go where W&B puts them (``./wandb``, or ``$WANDB_DIR``), never below ``runs/``: its copy of the
    event files there would be read as runs of their own, and inside ``run_dir`` it would mirror itself.
    """
    from torch.utils.tensorboard import SummaryWriter

    from cleanrl_utils.tb import format_table

    hyperparameters = {**dataclasses.asdict(args), **(config or {})}
    if args.track:
        import wandb

        wandb_id = wandb_id or uuid.uuid4().hex[:12]
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=hyperparameters,
            name=run_dir.name,
            id=wandb_id,
            resume="allow",
            save_code=True,
        )
    # flushed every 5 s: the tuner and dashboards read the event file while the run grows
    writer = _writer_class(SummaryWriter)(str(run_dir), purge_step=resumed_at, flush_secs=5)
    writer.add_text("hyperparameters", format_table(hyperparameters))
    writer.add_text("hardware", format_table(hardware()))
    return writer, wandb_id


def hardware() -> dict[str, str]:
    """What the run ran on, recorded with it for throughput tables (``cleanrl_utils/plot.py``)."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "host": platform.node(),
        "cpu": cpu,
        "cpu_count": str(os.cpu_count()),
        "gpu": ", ".join(gpus) or "none",
        "torch": torch.__version__,
    }


def _writer_class(summary_writer: type) -> type:
    """TensorBoard's writer, whose failed write (a full disk) raises :class:`LogWriteError` in the main
    thread instead of a traceback from its writer thread; once failed, it writes nothing more."""

    class Writer(summary_writer):
        failed = False
        run = None  # the Run (set by it): its last good checkpoint is named in the error line

        def _guard(self, write, *args, **kwargs):
            if self.failed:
                return None
            try:
                return write(*args, **kwargs)
            except OSError as e:
                self.failed = True
                error = LogWriteError(
                    f"writing the TensorBoard log {self.log_dir} failed ({e.strerror or e}); "
                    f"last good checkpoint: {getattr(self.run, 'last_checkpoint', None) or 'none'}"
                )
                error.reason = e.strerror or str(e)
                raise error from None

        def add_scalar(self, *args, **kwargs):
            return self._guard(super().add_scalar, *args, **kwargs)

        def add_text(self, *args, **kwargs):
            return self._guard(super().add_text, *args, **kwargs)

        def flush(self):
            return self._guard(super().flush)

        def close(self):
            if self.failed:  # its thread is gone; what is left to write cannot be written
                self.file_writer = None
                self.all_writers = {}
            return self._guard(super().close)

    return Writer


def _quiet_log_thread(hook=threading.excepthook):
    """TensorBoard's writer thread dies with its OSError; the main thread says it as one line instead."""

    def excepthook(info):
        if not (issubclass(info.exc_type, OSError) and type(info.thread).__name__ == "_AsyncWriterThread"):
            hook(info)

    return excepthook


threading.excepthook = _quiet_log_thread()


def stop_logging(writer, track: bool) -> None:
    if writer is not None:
        writer.close()
    if track:
        import wandb

        wandb.finish()


# --------------------------------------------------------------------------------------------
# Signals
# --------------------------------------------------------------------------------------------
class StopRequested:
    """Turns SIGINT/SIGTERM into a flag checked once per iteration, so the run can checkpoint and exit."""

    def __init__(self):
        self.signum: int | None = None
        self.first_at = 0.0
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handler)

    def _handler(self, signum, frame):
        # A second Ctrl-C stops at once. One within a second of the first is the same Ctrl-C arriving
        # twice: the terminal signals the whole process group, and torchrun forwards it as well.
        if self.signum is None:
            self.signum, self.first_at = signum, time.monotonic()
        elif time.monotonic() - self.first_at > 1.0:
            raise KeyboardInterrupt


# --------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------
class RunError(RuntimeError):
    """A fault that ends the run with one line and exit code 1 (a failed checkpoint write, a dead worker)."""

    on_every_rank = True  # met by every rank alike (rank 0 reports it), or by one rank only (it reports it)


class LogWriteError(RunError):
    """The TensorBoard log could not be written (a full disk)."""


# What ends a run with one line and exit code 1 rather than a traceback.
RUN_ERRORS: tuple[type[BaseException], ...] = (RunError, FloatingPointError)


class Checkpoints:
    """Writes the run's checkpoints (``run_dir/checkpoints/ckpt_<global step>.pt``, the newest ``keep``).

    Every file also records which script wrote it and its settings, so ``--resume`` can refuse a
    checkpoint of another script. A write that fails (a full disk) keeps the previous checkpoint,
    leaves no temporary file, and raises :class:`CheckpointError`.
    """

    def __init__(self, run_dir: Path, script_file: str, args: Any, keep: int = 2):
        self.directory = run_dir / "checkpoints"
        self.script = Path(script_file).name
        self.args = dataclasses.asdict(args)
        # the run directory below runs/ (a --run-name may have several parts, e.g. <study>/<trial>/<env>)
        self.run_name = run_dir.relative_to("runs").as_posix() if run_dir.parts[:1] == ("runs",) else run_dir.name
        self.keep = keep

    def save(self, state: dict[str, Any], global_step: int) -> Path:
        full = {"script": self.script, "args": self.args, "run_name": self.run_name, **state}
        return save_checkpoint(full, self.directory, global_step, keep=self.keep)


def interval_crossed(global_step: int, steps_done: int, interval: int) -> bool:
    """Did the last ``steps_done`` env steps (ending at ``global_step``) cross a multiple of ``interval``?"""
    return interval > 0 and global_step // interval > (global_step - steps_done) // interval


def report_and_exit(error: BaseException) -> NoReturn:
    """One line for a run error, said by rank 0 or by the one rank that met it; exit code 1."""
    global _reported
    if (is_main_process() or not getattr(error, "on_every_rank", True)) and not _reported:
        print(f"error: {error}", file=sys.stderr, flush=True)
    _reported = True
    raise SystemExit(1)


_reported = False  # a run says its first error only: a full disk fails the checkpoint and the log alike


# --------------------------------------------------------------------------------------------
# One run on this process
# --------------------------------------------------------------------------------------------
class Run:
    """What every script keeps for the life of a run: the TensorBoard writer (and W&B with ``--track``),
    the Ctrl-C/SIGTERM flag, console progress, resource figures, the checkpoint writer, the recent
    episode returns and the clock. The training loop decides everything; this only records.

    ``ranks`` (``cleanrl_utils.distributed.Ranks``, from :func:`setup`) says whether this process logs (rank 0
    alone does; elsewhere ``writer`` is None), and :meth:`close` leaves the process group, on every exit path.
    The run owns its last good checkpoint, ``last_checkpoint``: the one it resumed from, then each it wrote.
    """

    def __init__(self, args: Any, run_dir: Path, script_file: str, *, ranks: Ranks, checkpoint=None):
        from cleanrl_utils.monitor import Progress, ResourceMonitor

        self.args, self.run_dir, self.ranks = args, run_dir, ranks
        self.is_main = ranks.is_main
        global_step = checkpoint["global_step"] if checkpoint is not None else 0
        self.wandb_id = checkpoint and checkpoint.get("wandb_id")
        self.last_checkpoint: Path | None = Path(checkpoint["path"]) if checkpoint is not None else None
        self.writer = None
        new_dir = not run_dir.exists()
        in_use = hold_run_dir(run_dir) if self.is_main else None  # one live run per run directory
        if ranks.broadcast(in_use):  # every rank stops alike
            fail(in_use)
        if self.is_main:  # the run directory exists only from here on
            config = {"world_size": ranks.world_size} if ranks.distributed else None
            resumed_at = checkpoint and global_step + 1  # the checkpoint's own step was logged before it was saved
            try:
                self.writer, self.wandb_id = start_logging(args, run_dir, self.wandb_id, resumed_at, config)
                self.writer.run = self
                self.writer.flush()  # the event file's first records: a full disk says so here, in one line
            except (OSError, LogWriteError) as e:
                if new_dir:  # leave no empty run directory behind
                    shutil.rmtree(run_dir, ignore_errors=True)
                reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or str(e)
                report_and_exit(LogWriteError(f"writing the TensorBoard log {run_dir} failed ({reason}); "
                                              f"last good checkpoint: {self.last_checkpoint or 'none'}"))  # fmt: skip
        self.checkpoints = Checkpoints(run_dir, script_file, args)
        self.stop = StopRequested()
        enabled = args.progress and self.is_main
        self.progress = Progress(args.total_timesteps, global_step, run_dir.name, enabled=enabled)
        self.monitor = ResourceMonitor(ranks.device)
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.start_step, self.start_time = global_step, time.perf_counter()
        self.saved_at = self.start_time  # when the last checkpoint was written (or the run started)
        self.trained_at: float | None = None  # when training ended, if an evaluation followed

    def sps(self, global_step: int) -> float:
        """Env steps per second of this launch (all ranks together)."""
        return (global_step - self.start_step) / (time.perf_counter() - self.start_time)

    def log_episode(self, global_step: int, episodic_return: float, episodic_length: int) -> None:
        self.recent_returns.append(episodic_return)
        self.writer.add_scalar("charts/episodic_return", episodic_return, global_step)
        self.writer.add_scalar("charts/episodic_length", episodic_length, global_step)

    def log_progress(self, global_step: int) -> None:
        """``charts/SPS``, the resource figures (``perf/cpu_util``, GPU memory) and the console line."""
        sps = self.sps(global_step)
        self.writer.add_scalar("charts/SPS", sps, global_step)
        for name, value in self.monitor.sample().items():
            self.writer.add_scalar(f"perf/{name}", value, global_step)
        returns = self.recent_returns
        self.progress.update(global_step, sps, sum(returns) / len(returns) if returns else None)

    def checkpoint_due(self, global_step: int, steps_done: int, final: bool, signum: int | None) -> bool:
        """At the end, when a signal asked for it, or every ``--checkpoint-interval`` env steps.

        ``signum`` is this process's ``stop.signum``, or under torchrun the one all ranks agreed on:
        never read the flag twice, a signal arriving in between would make the ranks disagree.
        """
        self.ranks.step, self.ranks.last_checkpoint = global_step, self.last_checkpoint  # for the peer watch's line
        if final or signum or interval_crossed(global_step, steps_done, self.args.checkpoint_interval):
            return True
        # one process (a tuner trial, a grid task): also every CHECKPOINT_SECONDS, so that a preemption loses
        # at most that much of a slow run (torchrun ranks would have to agree on the clock: they do not)
        interval = self.args.checkpoint_interval  # (0: no periodic checkpoints at all)
        return interval > 0 and not self.ranks.distributed and time.perf_counter() - self.saved_at >= CHECKPOINT_SECONDS

    def save(self, state: dict[str, Any], global_step: int, own: dict[str, Any] | None = None) -> Path:
        """Write this run's checkpoint at ``global_step``: ``state`` (plus the W&B id) and, under torchrun, every
        rank's ``own`` part (CPU data), in one file that rank 0 writes; every rank returns its path once it is
        on disk. A failed write keeps the last good checkpoint and raises :class:`RunError` naming it."""
        full = {**state, "wandb_id": self.wandb_id}
        try:
            if own is None:
                path = self.checkpoints.save(full, global_step)
            else:

                def write(parts: list[dict[str, Any]]) -> Path:  # rank 0, once every part has arrived
                    written = self.checkpoints.save({**full, "world_size": self.ranks.world_size, "ranks": parts},
                                                    global_step)  # fmt: skip
                    self.last_checkpoint = written  # on disk now: good even if a peer stops before it hears so
                    return written

                path = self.ranks.save_collectively(write, own, global_step, self.checkpoints.run_name)
        except CheckpointError as e:
            raise RunError(f"{e}; last good checkpoint: {self.last_checkpoint or 'none'}") from None
        self.last_checkpoint, self.saved_at = path, time.perf_counter()
        if global_step >= int(os.environ.get(STOP_AT_STEP) or sys.maxsize):  # every rank: the same step
            note(f"stopped at step {global_step} as {STOP_AT_STEP} asked; checkpoint {path}")
            raise SystemExit(0)  # asked for, not a fault: torchrun fails a launch whose ranks exit non-zero
        return path

    def save_model(self, keys: list[str]) -> Path:
        """``--save-model`` (CleanRL's meaning), after the final checkpoint: its ``keys`` (the weights) as
        runs/<run>/<exp-name>.cleanrl_model, which the script then evaluates (cleanrl_utils/enjoy.py)."""
        self.trained_at = time.perf_counter()  # the closing line's wall time leaves the evaluation out
        path = self.run_dir / f"{self.args.exp_name}.cleanrl_model"
        try:
            final = load_checkpoint(self.last_checkpoint)
            write_state({k: final[k] for k in ("script", "args", "run_name", *keys)}, path)
        except CheckpointError as e:
            raise RunError(str(e)) from None
        note(f"model saved to {path}")
        return path

    def exit_on_signal(self, signum: int, path: Path | None, global_step: int) -> NoReturn:
        """After the checkpoint a signal asked for: say where it is and exit with 128 + the signal number."""
        note(f"stopped by signal {signum} at step {global_step}; checkpoint {path}")
        raise SystemExit(128 + signum)

    def close(self) -> None:
        """Close the logs (and, under torchrun, leave the process group): in the ``finally`` of every script."""
        self.progress.close()
        try:
            if self.is_main:
                stop_logging(self.writer, self.args.track)
        except LogWriteError as e:  # the last flush met a full disk
            report_and_exit(e)
        finally:
            self.ranks.close()

    def summary(self, global_step: int) -> None:
        """One line at the end of a run: what it did, how fast, how well, and where to look."""
        if not self.is_main:
            return
        seconds = (self.trained_at or time.perf_counter()) - self.start_time  # (not the --save-model evaluation)
        steps = global_step - self.start_step
        returns = list(self.recent_returns)
        score = (
            f"mean return {sum(returns) / len(returns):.2f} over the last {len(returns)} episodes"
            if returns
            else "no episode ended"
        )
        print(
            f"done: {global_step:,} steps ({steps:,} in {seconds:.1f}s, {steps / max(seconds, 1e-9):,.0f} SPS); "
            f"{score}; run {self.run_dir}, checkpoint {self.last_checkpoint or 'none'}; "
            f"tensorboard --logdir {self.run_dir.parent}",
            flush=True,
        )
