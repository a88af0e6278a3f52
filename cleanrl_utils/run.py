"""Run plumbing shared by every script: the command line, the resume rule, logging set-up, signals,
checkpoint writes and the closing line. None of it is an algorithm; all of it is identical everywhere.

The order a script calls these in is the order of a run:

    args, run_dir, checkpoint = setup_run(Args, validate, __file__)  # command line, --resume, validation (exit 2)
    run = Run(args, run_dir, __file__, device=..., checkpoint=...)   # TensorBoard/W&B, Ctrl-C, progress, checkpoints
    ...                                                              # the training loop, which decides when to
    run.save(state, global_step)                                     #   checkpoint and stops on run.stop.signum
    run.close(); run.summary(global_step)                            # one closing line

(The torchrun scripts call ``cleanrl_utils.distributed.setup_ranks`` instead of ``setup_run``.)

The resume rule (one for every script): ``--resume`` keeps the checkpoint's settings. Flags about the
machine and the launch (``LAUNCH_FLAGS``) come from the new command line; flags about what the run
writes and what steps its envs (``OUTPUT_FLAGS``: checkpoint interval and buffer, videos, the vector mode) keep the checkpoint's value unless
given again. Any other flag given with a value different from the checkpoint's is refused with one
line and exit code 2, except ``--total-timesteps``, which may be raised to train longer (a note says
what that does to the schedules).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
import typing
import uuid
from collections import deque
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import tyro

from cleanrl_utils.checkpoint import (
    CheckpointError,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    write_state,
)

T = TypeVar("T")

# Flags that describe the machine or the launch, not the algorithm: on --resume they come from the new
# command line, given or not (a new machine may have other GPUs, threads, or no W&B).
LAUNCH_FLAGS = frozenset(
    {
        "cuda",
        "threads",
        "device_ids",
        "backend",
        "dist_timeout",
        "env_timeout",
        "actor_timeout",
        "env_threads",
        "progress",
        "track",
        "wandb_project_name",
        "wandb_entity",
        "resume",
    }
)
# A single-process run writes a checkpoint at least this often (seconds of wall clock), whatever its
# --checkpoint-interval: a preempted tuner trial or grid task loses at most this much (see
# benchmark/checkpoint_overhead.py for what a checkpoint costs).
CHECKPOINT_SECONDS = 300.0
# Flags about what the run writes and what steps its envs, not how it learns: on --resume they keep the
# checkpoint's value unless the new command line gives one (an async or ALE run resumes as one).
OUTPUT_FLAGS = frozenset({"checkpoint_interval", "checkpoint_buffer", "capture_video", "save_model", "vector_mode"})


def is_main_process() -> bool:
    """Rank 0 of a torchrun launch, or a plain ``python`` launch."""
    return int(os.environ.get("RANK", "0")) == 0


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr (from rank 0 only: every rank exits the same way) and exit code 2."""
    if is_main_process():
        print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def require_positive(args: Any, *names: str) -> None:
    """Each named field (None allowed) must be a positive integer, or a float > 0."""
    for name in names:
        value = getattr(args, name)
        if value is None:
            continue
        if isinstance(value, int) and value <= 0:
            fail(f"{_flag(name)} {value}: must be a positive integer")
        if isinstance(value, float) and not value > 0:
            fail(f"{_flag(name)} {value}: must be > 0")


def require_batch(args: Any) -> None:
    """PPO's rollout batch (num_envs * num_steps) splits into --num-minibatches and fits --total-timesteps."""
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        fail(
            f"--num-minibatches {args.num_minibatches}: must divide the batch size num_envs * num_steps = {batch_size}"
        )
    if args.total_timesteps < batch_size:
        fail(
            f"--total-timesteps {args.total_timesteps}: must be at least one iteration, num_envs * num_steps = {batch_size}"
        )


def warn_if_no_learning(args: Any) -> None:
    """Off-policy scripts: a budget within --learning-starts (CleanRL's smoke tests) only collects experience."""
    if args.total_timesteps <= args.learning_starts:
        note(f"warning: --total-timesteps {args.total_timesteps} <= --learning-starts {args.learning_starts}: "
             "the run only collects experience, no gradient step will be taken")  # fmt: skip


def note(message: str) -> None:
    """One informational line on stderr, from rank 0 only."""
    if is_main_process():
        print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------
def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _bool_fields(args_class: type) -> set[str]:
    hints = typing.get_type_hints(args_class)
    return {f.name for f in dataclasses.fields(args_class) if hints[f.name] is bool}


def _cleanrl_booleans(args_class: type, argv: list[str]) -> list[str]:
    """CleanRL's documented command lines write booleans as values (``--autotune False``); tyro wants
    ``--autotune`` / ``--no-autotune``. Rewrite the first form into the second."""
    spellings = {}
    for name in _bool_fields(args_class):
        spellings[_flag(name)] = name
        spellings["--" + name] = name
    out, i = [], 0
    while i < len(argv):
        token = argv[i]
        key, eq, value = token.partition("=")
        if key in spellings and not eq and i + 1 < len(argv) and argv[i + 1].lower() in ("true", "false"):
            key, eq, value, i = key, "=", argv[i + 1], i + 1
        if key in spellings and eq and value.lower() in ("true", "false"):
            out.append(_flag(spellings[key]) if value.lower() == "true" else "--no-" + _flag(spellings[key])[2:])
        else:
            out.append(token)
        i += 1
    return out


def given_flags(args_class: type, argv: list[str]) -> set[str]:
    """Names of the ``Args`` fields that ``argv`` sets explicitly (dashes or underscores, ``--no-`` too)."""
    names = {}
    for f in dataclasses.fields(args_class):
        for spelling in (_flag(f.name), "--" + f.name):
            names[spelling] = f.name
            names["--no-" + spelling[2:]] = f.name
    return {names[token.split("=")[0]] for token in argv if token.split("=")[0] in names}


def parse_args(args_class: type[T], world_size: int = 1, argv: list[str] | None = None) -> T:
    """Parse the command line with tyro; CleanRL's ``--flag True|False`` spelling of booleans is accepted.

    Scripts with both ``num_envs`` (summed over ranks) and ``local_num_envs`` (per rank, CleanRL's
    multigpu flag) take either one and derive the other; giving both is refused.
    """
    argv = _cleanrl_booleans(args_class, sys.argv[1:] if argv is None else argv)
    args = tyro.cli(args_class, args=argv)
    if hasattr(args, "local_num_envs"):
        if {"num_envs", "local_num_envs"} <= given_flags(args_class, argv):
            fail(
                f"--num-envs {args.num_envs} and --local-num-envs {args.local_num_envs}: give one "
                f"(num_envs = local_num_envs x WORLD_SIZE, here {world_size})"
            )
        if args.num_envs is None:
            args.num_envs = args.local_num_envs * world_size
        elif args.num_envs % world_size == 0:
            args.local_num_envs = args.num_envs // world_size
        else:
            fail(f"--num-envs {args.num_envs}: must be a multiple of the number of processes (WORLD_SIZE={world_size})")
    return args


def resumed_args(args: T, checkpoint: dict[str, Any], argv: list[str] | None = None) -> T:
    """Apply the resume rule: the checkpoint's settings, the new launch's ``LAUNCH_FLAGS``; refuse changes."""
    argv = sys.argv[1:] if argv is None else argv
    saved = dict(checkpoint["args"])
    fields = {f.name for f in dataclasses.fields(args)}
    merged = {k: v for k, v in saved.items() if k in fields}
    for name in fields & LAUNCH_FLAGS:
        merged[name] = getattr(args, name)
    for name in sorted(given_flags(type(args), _cleanrl_booleans(type(args), argv)) - LAUNCH_FLAGS):
        new, old = getattr(args, name), saved.get(name)
        if new == old or name in OUTPUT_FLAGS:
            merged[name] = new
            continue
        if name == "total_timesteps" and old is not None:
            merged[name] = new
            _note_longer_run(new, old, checkpoint.get("global_step", 0), saved)
            continue
        fail(
            f"{_flag(name)} {new}: the checkpoint was trained with {old}; --resume keeps the checkpoint's "
            "settings (drop the flag, or start a new run)"
        )
    return type(args)(**merged)


def _note_longer_run(new: int, old: int, done: int, saved: dict[str, Any]) -> None:
    if new <= done:
        fail(f"--total-timesteps {new}: the checkpoint has already trained {done} steps; give more to train on")
    effects = []
    if saved.get("anneal_lr"):
        before, after = 100 * max(1 - done / old, 0), 100 * (1 - done / new)
        effects.append(
            f"the learning rate now anneals linearly to 0 at step {new} instead of {old}, "
            f"so at step {done} it {'rises' if after > before else 'falls'} from {before:.0f}% to {after:.0f}% "
            "of --learning-rate"
        )
    if "exploration_fraction" in saved:
        effects.append(f"epsilon now decays over {saved['exploration_fraction']:g} of {new} steps")
    effects = effects or ["no schedule depends on the total"]
    note(f"--total-timesteps {new}: the run now ends at step {new} instead of {old}; " + "; ".join(effects))


def default_run_name(args: Any, stamp: str | None = None) -> str:
    """``<env-id>__<exp-name>__<seed>__<stamp>`` (the unix time unless a stamp is given), or ``--run-name``."""
    return args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}__{stamp or int(time.time())}"


def find_checkpoint(args: Any, stamp: str | None = None, restarted: bool = False) -> tuple[str, Path | None]:
    """Which run this launch is and which checkpoint it continues: (run name, checkpoint file or None).

    ``--resume`` names a checkpoint or a run directory. Without it, a run directory that already holds
    checkpoints is refused (it would be overwritten), unless this launch restarts that very run (a
    torchrun restart: the run name carries torchrun's run id), which continues from its newest file.
    Raises :class:`CheckpointError`.
    """
    run_name = default_run_name(args, stamp)
    if args.resume:
        return run_name, resolve_resume(args.resume)
    found = list_checkpoints(Path("runs") / run_name / "checkpoints")
    if found and not restarted:
        raise CheckpointError(f"runs/{run_name} holds checkpoints: pass --resume runs/{run_name} or another --run-name")
    return run_name, found[-1] if found else None


def read_checkpoint(path: Path, script: str) -> dict[str, Any]:
    """Load ``path`` (digest verified) and check that ``script`` wrote it; raises :class:`CheckpointError`."""
    checkpoint = load_checkpoint(path)
    if checkpoint.get("script") != script:
        raise CheckpointError(f"checkpoint {path} was written by {checkpoint.get('script')}, not by {script}")
    return checkpoint


def setup_run(args_class: type[T], validate, script_file: str) -> tuple[T, Path, dict[str, Any] | None]:
    """A single-process run's set-up: parse the command line, find and read the checkpoint to continue (the
    resume rule applies), validate. Returns (args, run directory, checkpoint or None). Every refusal is
    one line and exit code 2, before any env or run directory exists."""
    args = parse_args(args_class)
    checkpoint = None
    try:
        run_name, path = find_checkpoint(args)
        if path is not None:
            checkpoint = read_checkpoint(path, Path(script_file).name)
    except CheckpointError as e:
        fail(str(e))
    if checkpoint is not None:
        run_name = checkpoint["run_name"]
        note(f"resuming from {path}")
    return settled_args(args, checkpoint, validate), Path("runs") / run_name, checkpoint


def settled_args(args: T, checkpoint: dict[str, Any] | None, validate, *context: Any) -> T:
    """The run's settings, validated: the command line, or with a checkpoint to continue, its settings
    under the resume rule (``--total-timesteps`` longer than saved is checked against the run's
    ``--num-envs``, not the defaults). Every script validates here, single-process and torchrun alike."""
    if checkpoint is not None:
        args = resumed_args(args, checkpoint)
    validate(args, *context)
    return args


# --------------------------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------------------------
def start_logging(
    args: Any, run_dir: Path, wandb_id: str | None, resumed_at: int | None, config: dict[str, Any] | None = None
):
    """TensorBoard writer in ``run_dir`` (and a W&B run with ``--track``); returns (writer, wandb_id).

    The W&B id is kept in checkpoints, so a resumed run continues the same W&B run; a resumed writer
    drops the events the previous attempt logged after its checkpoint (``purge_step``: ``resumed_at`` is
    the first step the resumed run may log, one past the checkpoint's, whose own points are kept).
    """
    from torch.utils.tensorboard import SummaryWriter

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
            dir=str(run_dir),
            save_code=True,
        )
    # flushed every 5 s: the tuner and dashboards read the event file while the run grows
    writer = _writer_class(SummaryWriter)(str(run_dir), purge_step=resumed_at, flush_secs=5)
    writer.add_text(
        "hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in hyperparameters.items())
    )
    writer.add_text("hardware", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in hardware().items()))
    return writer, wandb_id


def hardware() -> dict[str, str]:
    """What the run ran on, recorded with it for throughput tables (``cleanrl_utils/plot.py``)."""
    import platform

    import torch

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
        checkpoints = None  # the run's Checkpoints (set by Run): the last good one is named in the error line

        def _guard(self, write, *args, **kwargs):
            if self.failed:
                return None
            try:
                return write(*args, **kwargs)
            except OSError as e:
                self.failed = True
                raise LogWriteError(
                    f"writing the TensorBoard log {self.log_dir} failed ({e.strerror or e}); "
                    f"last good checkpoint: {getattr(self.checkpoints, 'last', None) or 'none'}"
                ) from None

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
    """Writes the run's checkpoints (``run_dir/checkpoints/ckpt_<global step>.pt``) and remembers the last good one.

    Every file also records which script wrote it and its settings, so ``--resume`` can refuse a
    checkpoint of another script. A write that fails (a full disk) keeps the previous checkpoint,
    leaves no temporary file, and raises :class:`RunError` naming both.
    """

    def __init__(self, run_dir: Path, script_file: str, args: Any, last: Path | None = None, keep: int = 2):
        self.directory = run_dir / "checkpoints"
        self.script = Path(script_file).name
        self.args = dataclasses.asdict(args)
        # the run directory below runs/ (a --run-name may have several parts, e.g. <study>/<trial>/<env>)
        self.run_name = run_dir.relative_to("runs").as_posix() if run_dir.parts[:1] == ("runs",) else run_dir.name
        self.last = last
        self.keep = keep

    def save(self, state: dict[str, Any], global_step: int) -> Path:
        full = {"script": self.script, "args": self.args, "run_name": self.run_name, **state}
        try:
            self.last = save_checkpoint(full, self.directory, global_step, keep=self.keep)
        except CheckpointError as e:
            raise RunError(f"{e}; last good checkpoint: {self.last or 'none'}") from None
        return self.last


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

    Under torchrun ``ranks`` (``cleanrl_utils.distributed.Ranks``) says whether this process logs (rank 0
    alone does; elsewhere ``writer`` is None), and :meth:`close` leaves the process group, on every exit path.
    """

    def __init__(self, args: Any, run_dir: Path, script_file: str, *, device, checkpoint=None, ranks=None):
        from cleanrl_utils.monitor import Progress, ResourceMonitor

        self.args, self.run_dir, self.ranks = args, run_dir, ranks
        self.is_main = ranks is None or ranks.is_main
        global_step = checkpoint["global_step"] if checkpoint is not None else 0
        self.wandb_id = checkpoint and checkpoint.get("wandb_id")
        self.writer = None
        if self.is_main:  # the run directory exists only from here on
            config = {"world_size": ranks.world_size} if ranks is not None else None
            resumed_at = checkpoint and global_step + 1  # the checkpoint's own step was logged before it was saved
            self.writer, self.wandb_id = start_logging(args, run_dir, self.wandb_id, resumed_at, config)
        self.checkpoints = Checkpoints(run_dir, script_file, args, last=checkpoint and checkpoint.get("path"))
        if self.writer is not None:
            self.writer.checkpoints = self.checkpoints
        self.stop = StopRequested()
        enabled = args.progress and self.is_main
        self.progress = Progress(args.total_timesteps, global_step, run_dir.name, enabled=enabled)
        self.monitor = ResourceMonitor(device)
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.start_step, self.start_time = global_step, time.perf_counter()
        self.saved_at = self.start_time  # when the last checkpoint was written (or the run started)
        self.trained_at: float | None = None  # when training ended, if an evaluation followed

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint this run wrote or resumed from (None before the first)."""
        return self.checkpoints.last

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
        if final or signum or interval_crossed(global_step, steps_done, self.args.checkpoint_interval):
            return True
        # one process (a tuner trial, a grid task): also every CHECKPOINT_SECONDS, so that a preemption loses
        # at most that much of a slow run (torchrun ranks would have to agree on the clock: they do not)
        interval = self.args.checkpoint_interval  # (0: no periodic checkpoints at all)
        return interval > 0 and self.ranks is None and time.perf_counter() - self.saved_at >= CHECKPOINT_SECONDS

    def save(self, state: dict[str, Any], global_step: int) -> Path:
        """Write ``state`` (plus the W&B id) as this run's checkpoint at ``global_step``."""
        path = self.checkpoints.save({**state, "wandb_id": self.wandb_id}, global_step)
        self.saved_at = time.perf_counter()
        return path

    def save_model(self, keys: list[str], epsilon: float = 0.0, episodes: int = 10) -> Path:
        """``--save-model`` (CleanRL's meaning), after the final checkpoint: its ``keys`` (the weights) as
        runs/<run>/<exp-name>.cleanrl_model, evaluated for ``episodes`` episodes by cleanrl_utils/enjoy.py
        (each return logged as eval/episodic_return at step 0, 1, ...)."""
        from cleanrl_utils.enjoy import evaluate

        self.trained_at = time.perf_counter()
        path = self.run_dir / f"{self.args.exp_name}.cleanrl_model"
        try:
            final = load_checkpoint(self.checkpoints.last)
            write_state({k: final[k] for k in ("script", "args", "run_name", *keys)}, path)
        except CheckpointError as e:
            raise RunError(str(e)) from None
        note(f"model saved to {path}; evaluating it for {episodes} episodes")
        returns = evaluate(path, episodes, seed=self.args.seed, greedy=False, epsilon=epsilon)
        for i, episodic_return in enumerate(returns):
            self.writer.add_scalar("eval/episodic_return", episodic_return, i)
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
            if self.ranks is not None:
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
            f"{score}; run {self.run_dir}, checkpoint {self.checkpoints.last or 'none'}; "
            f"tensorboard --logdir {self.run_dir.parent}",
            flush=True,
        )
