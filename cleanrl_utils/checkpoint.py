"""Checkpoint I/O shared by every script.

A checkpoint is one dict (model, optimizer, args, step counters, RNG states, environment state)
saved with ``torch.save``. It is written to a temporary file in the same directory, flushed to
disk and renamed over the final name, so a crash mid-write never leaves a half-written
checkpoint under a real name. It is read with ``torch.load(weights_only=True)``: only tensors
and plain containers are ever unpickled, so a file that would run code on load is refused
instead of executed.

Everything that is not a tensor or a plain Python value (numpy arrays, numpy RNG states, bytes,
deques) goes through :func:`encode` / :func:`decode`, which map it onto tensors and dicts.

Integrity: every checkpoint carries the SHA-256 of its content (every tensor's bytes, dtype and shape
and every plain value, in order), recomputed and compared on load. A file damaged on disk or in
transit is refused with one line instead of training on silently wrong weights. A write that fails
(a full disk) leaves no temporary file and keeps the previous checkpoints.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import random
import re
import zipfile
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT_VERSION = 2  # 2: content digest and the writing script's name
_NAME = re.compile(r"^ckpt_(\d{8})\.pt$")


class CheckpointError(Exception):
    """A checkpoint that cannot be used: missing, truncated, not weights-only, or of another format."""


# --------------------------------------------------------------------------------------------
# A codec from numpy-flavoured Python values to what torch's weights-only unpickler accepts.
# --------------------------------------------------------------------------------------------
class Unencodable(TypeError):
    """Raised by :func:`encode` for a value it has no safe representation for."""


def encode(value: Any) -> Any:
    """Map ``value`` onto tensors, numbers, strings and plain containers (lossless)."""
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, np.ndarray | np.generic):
        if value.dtype.hasobject:
            raise Unencodable(f"numpy array of dtype {value.dtype}")
        array = np.array(value, order="C")  # 0-d for a scalar (ascontiguousarray would make it 1-d)
        return {
            "__ndarray__": torch.from_numpy(array.reshape(-1).view(np.uint8).copy()),
            "dtype": array.dtype.str,
            "shape": tuple(array.shape),
            "scalar": isinstance(value, np.generic),
        }
    # After the numpy branch: np.float64 is also a Python float, and must keep its dtype.
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor):
        return value
    if isinstance(value, bytes):
        return {"__bytes__": torch.frombuffer(bytearray(value), dtype=torch.uint8)}
    if isinstance(value, deque):
        return {"__deque__": [encode(v) for v in value], "maxlen": value.maxlen}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(encode(v) for v in value)
    if isinstance(value, dict):
        if any(isinstance(k, str) and k.startswith("__") for k in value):
            raise Unencodable("dict with a reserved '__' key")
        return {k: encode(v) for k, v in value.items()}
    raise Unencodable(type(value).__name__)


def decode(value: Any) -> Any:
    """Inverse of :func:`encode`."""
    if isinstance(value, dict):
        if "__generator__" in value:
            state = value["__generator__"]
            generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
            generator.bit_generator.state = state
            return generator
        if "__ndarray__" in value:
            raw = value["__ndarray__"].numpy().tobytes()
            array = np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
            return array[()] if value["scalar"] else array
        if "__bytes__" in value:
            return value["__bytes__"].numpy().tobytes()
        if "__deque__" in value:
            return deque((decode(v) for v in value["__deque__"]), maxlen=value["maxlen"])
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(decode(v) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# RNG states of this process.
# --------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The state of Python's, numpy's legacy and torch's random generators, and of the CUDA generator of
    this process's device (the current one: ``torch.cuda.set_device`` picks it), if CUDA is in use.

    One CUDA state, not one per visible GPU: a run resumes on a machine with another GPU count or
    index, and the generator it restores is the one its rank draws from.
    """
    state = {
        "python": encode(random.getstate()),
        "numpy": encode(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore ``rng_state()``; the CUDA state goes to the current device. Resuming on the CPU leaves it
    unused (a GPU run's sampling is then no longer bit-exact: CPU and CUDA kernels draw differently)."""
    random.setstate(decode(state["python"]))
    np.random.set_state(decode(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())


# --------------------------------------------------------------------------------------------
# Integrity.
# --------------------------------------------------------------------------------------------
def content_digest(value: Any) -> str:
    """SHA-256 of a checkpoint's content: tensors by dtype, shape and bytes; plain values by type and repr."""
    digest = hashlib.sha256()

    def visit(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            digest.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        elif isinstance(v, dict):
            digest.update(f"D{len(v)}".encode())
            for k, item in v.items():
                digest.update(repr(k).encode())
                visit(item)
        elif isinstance(v, list | tuple):
            digest.update(f"{type(v).__name__}{len(v)}".encode())
            for item in v:
                visit(item)
        else:
            digest.update(f"{type(v).__name__}:{v!r}".encode())

    visit(value)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# Files.
# --------------------------------------------------------------------------------------------
def checkpoint_path(directory: str | os.PathLike, iteration: int) -> Path:
    return Path(directory) / f"ckpt_{iteration:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoint files in ``directory``, oldest first (temporary files are never listed)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _NAME.match(p.name))


def save_checkpoint(state: dict[str, Any], directory: str | os.PathLike, iteration: int, keep: int = 2) -> Path:
    """Write ``state`` atomically as ``directory/ckpt_<iteration>.pt``; keep the newest ``keep`` files.

    Raises :class:`CheckpointError` (one line, the cause) when the write fails; the previous files stay.
    """
    directory = Path(directory)
    final = write_state(state, checkpoint_path(directory, iteration))
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


class _Writes:
    """A file for torch.save that keeps the OSError a write raised (torch replaces it with its own error)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def write_state(state: dict[str, Any], final: Path) -> Path:
    """Write ``state`` (with its layout version and digest) to ``final`` atomically and durably."""
    directory = final.parent
    tmp = directory / f".{final.name}.tmp{os.getpid()}"
    writer = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            writer = _Writes(f)
            torch.save({"format_version": FORMAT_VERSION, "sha256": content_digest(state), **state}, writer)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except (OSError, RuntimeError) as e:
        # torch reports a failed write (ENOSPC, EFBIG, EIO) as a RuntimeError of its own ("unexpected pos"):
        # the OSError its writer met says why.
        e = (writer and writer.error) or e
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1]
        raise CheckpointError(f"writing checkpoint {final} failed ({reason})") from None
    finally:
        tmp.unlink(missing_ok=True)
    # Make the rename itself durable before older checkpoints are deleted.
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict[str, Any], lr: float) -> None:
    """``optimizer.load_state_dict(state)``, then the run's own learning rate: a resumed run may have changed it
    (the resume rule's allow-list), and the saved state would otherwise put the old one back."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["lr"] = lr


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`; raise :class:`CheckpointError` otherwise.

    Only ``weights_only=True`` loading is ever attempted: a file that needs arbitrary unpickling
    (and so could run code) is refused, never executed.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"checkpoint {path} is truncated or not a torch checkpoint (no valid zip archive)")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        wanted = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        reason = f"it asks to import {wanted.group(1)}" if wanted else "it holds more than tensors and plain values"
        raise CheckpointError(
            f"checkpoint {path} is refused: not weights-only, {reason}; it was not unpickled"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt: {first_line}") from None
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has layout version {version}, this version of the scripts reads layout "
            f"{FORMAT_VERSION} (it was written by an older version: retrain, or resume it with that version)"
        )
    saved_digest = state.pop("sha256", None)
    state.pop("format_version")
    if saved_digest != content_digest(state):
        raise CheckpointError(f"checkpoint {path} is corrupt: its content does not match the digest written with it")
    return state


def resolve_resume(path: str | os.PathLike) -> Path:
    """``--resume`` takes a checkpoint file or a run directory; return the checkpoint file to load."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path, path / "checkpoints"):
            found = list_checkpoints(candidate)
            if found:
                return found[-1]
        raise CheckpointError(f"--resume {path}: no ckpt_*.pt file in it or in its checkpoints/ folder")
    if not path.exists():
        raise CheckpointError(f"--resume {path}: no such file or directory")
    return path
