"""The command line and the resume rule, one for every script (Sample Factory's ``cfg/arguments.py`` is the
model): parsing ``Args`` with tyro (CleanRL's spellings too), the input rules every script's ``validate``
uses (one line on stderr, exit code 2), and which run a launch is and what it keeps from the checkpoint
it continues.

The resume rule: ``--resume`` keeps the checkpoint's settings. Flags about the machine and the launch
(``LAUNCH_FLAGS``) come from the new command line; flags about what the run writes and what steps its
envs (``OUTPUT_FLAGS``: checkpoint interval and buffer, videos, the vector mode) keep the checkpoint's
value unless given again. Any other flag given with a value different from the checkpoint's is refused
with one line and exit code 2, except ``--total-timesteps``, which may be raised to train longer (a note
says what that does to the schedules), and the flags in the script's ``Args.RESUMABLE`` (learning rates,
loss coefficients, discounts...), whose new values apply from the checkpoint's step on (a note says so).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import typing
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import tyro

from cleanrl_utils.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, resolve_resume

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
        "compile",
        "cudagraphs",
        "torch_deterministic",
        "track",
        "wandb_project_name",
        "wandb_entity",
        "resume",
    }
)
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


def check_run(args: Any) -> None:
    """The rules every script shares, checked before its own ``validate``: a seed numpy and torch take, a run
    name that stays inside ``runs/``, and W&B's key for ``--track``."""
    if not 0 <= args.seed < 2**32:
        fail(f"--seed {args.seed}: must be in [0, 2**32)")
    parts = (args.run_name or "x").split("/")  # nested names group runs (the tools' runs/<study>/<trial>/...)
    if "\\" in (args.run_name or "") or any(not part or part.startswith(".") for part in parts):
        fail(f"--run-name {args.run_name}: must be a name (or names joined by /) inside runs/: no '..', no "
             "leading '/' or '.', no '\\'")  # fmt: skip
    mode = os.environ.get("WANDB_MODE", "").lower()
    if args.track and not os.environ.get("WANDB_API_KEY") and mode not in ("offline", "disabled", "dryrun"):
        fail("--track: W&B's key is read from WANDB_API_KEY only, and it is not set (or set WANDB_MODE=offline)")


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
# The command line and the resume rule
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
    multigpu flag) take either one: ``--local-num-envs`` becomes ``num_envs = local_num_envs x WORLD_SIZE``;
    giving both is refused. (The per-rank share of the run's settled ``num_envs`` is derived once, by
    :func:`share_envs` in ``cleanrl_utils.run.setup``.)
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
        elif args.num_envs % world_size:
            fail(f"--num-envs {args.num_envs}: must be a multiple of the number of processes (WORLD_SIZE={world_size})")
    return args


def share_envs(args: Any, world_size: int) -> None:
    """Set ``args.local_num_envs``, the per-rank share of the run's global ``num_envs`` (scripts with both)."""
    if hasattr(args, "local_num_envs"):
        args.local_num_envs = args.num_envs // world_size


def resumed_args(args: T, checkpoint: dict[str, Any], argv: list[str] | None = None) -> T:
    """Apply the resume rule: the checkpoint's settings, the new launch's ``LAUNCH_FLAGS``, the new values of the
    settings the script's ``Args.RESUMABLE`` allows to change (one line says what changed); refuse other changes."""
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
        if name in getattr(type(args), "RESUMABLE", ()):
            merged[name] = new
            note(f"{_flag(name)} {new}: changed on resume (trained so far with {old}), from step "
                 f"{checkpoint.get('global_step', 0):,} on")  # fmt: skip
            continue
        allowed = ", ".join(_flag(n) for n in getattr(type(args), "RESUMABLE", ())) or "none"
        fail(
            f"{_flag(name)} {new}: the checkpoint was trained with {old}; --resume keeps the checkpoint's "
            f"settings; only {allowed} may change (drop the flag, or start a new run)"
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
    if saved.get("exploration_fraction") is not None:
        effects.append(f"epsilon now decays over {saved['exploration_fraction']:g} of {new} steps")
    effects = effects or ["no schedule depends on the total"]
    note(f"--total-timesteps {new}: the run now ends at step {new} instead of {old}; " + "; ".join(effects))


def default_run_name(args: Any, stamp: str | None = None) -> str:
    """``<env-id>__<exp-name>__<seed>__<stamp>`` (the unix time unless a stamp is given), or ``--run-name``."""
    env = args.env_id.replace("/", "-")  # (ALE/Pong-v5, dm_control/...: one directory, not two)
    return args.run_name or f"{env}__{args.exp_name}__{args.seed}__{stamp or int(time.time())}"


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
    checkpoint["path"] = str(path)  # the run's last good checkpoint until it writes one (not saved again)
    return checkpoint
