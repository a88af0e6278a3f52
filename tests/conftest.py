"""Helpers shared by the test tiers: run a script as a user would (``run_script``, ``torchrun_cmd``), read what it
logged (``read_scalars``), find its checkpoints and its processes.

Where the test of a feature is (tiers: ``-m quick`` is the first; ``-m slow`` trains for a real budget):

| feature | file |
|---|---|
| GAE, V-trace, the PPO update and its minibatches | test_ppo_math.py, test_maths.py (distributions, TD targets) |
| which transitions reach a batch; episode statistics | test_batches.py, test_episode_stats.py |
| every script runs, logs, checkpoints; --compile, videos, W&B | test_smoke.py |
| CleanRL's command lines, bad input (exit 2), the resume rule, devices, full disks | test_contract.py |
| exact resume, env state in checkpoints | test_resume.py, test_env_state.py |
| faults: NaNs, dying env workers, host reads per step | test_faults.py |
| torchrun: 2 processes, restarts, elastic re-split, two nodes | test_distributed.py |
| off-policy: replay, SAC/DQN and their data-parallel variants | test_buffers.py, test_offpolicy.py |
| the actor-learner scripts | test_appo.py |
| ALE's vector env against gymnasium's | test_ale.py |
| code copied between scripts stays identical; sizes; the import layers | test_copies.py, test_layout.py |
| the tools: grid runner and learning suites, tuner, population-based training (test_pbt.py), plots, evaluation, SLURM/AWS Batch | test_benchmark.py, test_tuner.py, test_plot.py, test_tb.py, test_enjoy.py, test_submit.py |
| learning within a step budget | test_learning.py (slow) |
| what a GPU run relies on, proved on the CPU | test_gpu_check.py |
"""

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
    from cleanrl_utils.tb import ScalarReader

    reader = ScalarReader(run_dir).update()
    return {tag: list(zip(series.steps, series.values)) for tag, series in reader.series.items()}


def torchrun_cmd(nproc: int, *flags: str) -> list[str]:
    """The start of a ``torchrun --standalone --nproc-per-node=<nproc> <flags>`` command, as this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *flags]


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
