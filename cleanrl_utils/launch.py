"""The launch library the tools share (the grid runner, the tuner and its workers, job submission,
evaluation): where the project is, starting and stopping a script's process group, locating and
loading a script, and checking a command line against the script's own validation before anything
starts. Tools import it; the scripts' plumbing never does.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

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
    from cleanrl_utils.arguments import parse_args
    from cleanrl_utils.distributed import Ranks

    stderr = io.StringIO()
    saved = {k: os.environ.pop(k) for k in ("RANK", "LOCAL_RANK") if k in os.environ}
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = parse_args(module.Args, world_size, argv)
            module.validate(args, Ranks(world_size=world_size, local_world_size=world_size))
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


def exp_name(command: list[str]) -> str:
    """The command's ``--exp-name`` (as the run records it), else its script's name."""
    for i, token in enumerate(command):
        if token in ("--exp-name", "--exp_name") and i + 1 < len(command):
            return command[i + 1]
        if token.startswith(("--exp-name=", "--exp_name=")):
            return token.split("=", 1)[1]
    script = script_of(command)
    return script.stem if script else Path(command[0]).name
