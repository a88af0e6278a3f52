"""Helpers shared by the test tiers: run a script as a user would, read what it logged."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "cleanrl"

# In-process tests share two cores with the scripts they launch: keep torch to one thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("WANDB_MODE", "offline")
torch.set_num_threads(1)


def script_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "WANDB_MODE": "offline",
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    return env


def run_script(
    script: str,
    *args: str,
    cwd: Path,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    check: bool = True,
    launcher: Path | None = None,
) -> subprocess.CompletedProcess:
    """Run ``cleanrl/<script>`` with ``args`` in ``cwd``; fail the test on a non-zero exit if ``check``.

    ``launcher`` runs the script through a helper (e.g. tests/fake_envpool.py) instead of directly.
    """
    cmd = [sys.executable, *([str(launcher)] if launcher else []), str(SCRIPTS / script), "--no-progress", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=script_env(env), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files of ``run_dir``: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def only_run_dir(cwd: Path) -> Path:
    runs = list((cwd / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def final_checkpoint(run_dir: Path) -> dict:
    ckpts = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert ckpts, f"no checkpoint in {run_dir}"
    return torch.load(ckpts[-1], weights_only=True)


def same_parameters(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def marker() -> str:
    """A unique environment variable value: processes carrying it belong to this test."""
    return uuid.uuid4().hex


def processes_with_marker(value: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("CLEANRL_TEST_MARKER") == value:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
