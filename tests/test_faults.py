"""Faults: failing env workers and unusable checkpoints end the run cleanly and say why."""

import pickle
import time
import zipfile

import pytest
import torch

from cleanrl_utils.checkpoint import CheckpointError, load_checkpoint
from tests.conftest import processes_with_marker, run_script

WORKER_FAULTS = [
    ("RaisingWorker-v0", [], "env worker 1 of tests.known_env:RaisingWorker-v0 raised ValueError: injected failure"),
    ("DyingWorker-v0", [], "env worker 1 of tests.known_env:DyingWorker-v0 died (exit code -9)"),
    (
        "HangingWorker-v0",
        ["--env-timeout", "3"],
        "env worker 1 of tests.known_env:HangingWorker-v0 did not answer step within --env-timeout 3s",
    ),
]


@pytest.mark.parametrize("env_name, flags, message", WORKER_FAULTS, ids=[f[0] for f in WORKER_FAULTS])
def test_async_worker_fault_stops_the_run(tmp_path, marker, env_name, flags, message):
    start = time.monotonic()
    proc = run_script(
        "ppo.py",
        "--env-id", f"tests.known_env:{env_name}",
        "--vector-mode", "async",
        "--num-envs", "3",
        "--num-steps", "16",
        "--total-timesteps", "480",
        "--seed", "1",  # worker 1 is seeded 2, the one that fails
        *flags,
        cwd=tmp_path,
        check=False,
        timeout=120,
        env={"CLEANRL_TEST_MARKER": marker},
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert f"error: {message}" in proc.stderr.splitlines()
    assert elapsed < 60
    time.sleep(0.5)
    assert processes_with_marker(marker) == []


@pytest.fixture
def checkpoint_file(tmp_path):
    run_script(
        "ppo.py", "--num-envs", "2", "--num-steps", "16", "--total-timesteps", "32", "--run-name", "r", cwd=tmp_path
    )
    return tmp_path / "runs/r/checkpoints/ckpt_00000032.pt"


def test_truncated_checkpoint_is_refused(tmp_path, checkpoint_file):
    data = checkpoint_file.read_bytes()
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(truncated)
    cwd = tmp_path / "resume"
    cwd.mkdir()
    proc = run_script("ppo.py", "--resume", str(truncated), cwd=cwd, check=False, timeout=120)
    assert proc.returncode == 2
    assert f"error: checkpoint {truncated} is truncated" in proc.stderr
    assert not (cwd / "runs").exists()


class _RunsCodeOnLoad:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_checkpoint_that_would_run_code_is_refused(tmp_path):
    witness = tmp_path / "code_ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format_version": 2, "model": _RunsCodeOnLoad(witness)}, evil)
    assert zipfile.is_zipfile(evil)
    with pytest.raises(CheckpointError, match="not weights-only"):
        load_checkpoint(evil)
    cwd = tmp_path / "resume"
    cwd.mkdir()
    proc = run_script("ppo.py", "--resume", str(evil), cwd=cwd, check=False, timeout=120)
    assert proc.returncode == 2
    assert "is refused: not weights-only, it asks to import io.open; it was not unpickled" in proc.stderr
    assert not witness.exists()


def test_plain_pickle_is_refused_without_unpickling(tmp_path):
    witness = tmp_path / "code_ran"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(_RunsCodeOnLoad(witness)))
    with pytest.raises(CheckpointError, match="not a torch checkpoint"):
        load_checkpoint(evil)
    assert not witness.exists()


def test_non_finite_loss_stops_without_a_bad_checkpoint(tmp_path):
    # env 1 pays NaN rewards from its 100th step on (iteration 4 of 32 steps, 2 envs); checkpoints every 128 steps.
    proc = run_script(
        "ppo.py",
        "--env-id", "tests.known_env:NaNReward-v0",
        "--num-envs", "2",
        "--num-steps", "32",
        "--total-timesteps", "640",
        "--checkpoint-interval", "128",
        "--seed", "1",
        "--run-name", "r",
        cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    last_good = tmp_path / "runs/r/checkpoints/ckpt_00000128.pt"
    assert (
        "error: non-finite loss at step 256; last good checkpoint: runs/r/checkpoints/ckpt_00000128.pt" in proc.stderr
    )
    assert sorted(p.name for p in last_good.parent.glob("ckpt_*.pt")) == ["ckpt_00000128.pt"]
    assert all(torch.isfinite(v).all() for v in load_checkpoint(last_good)["model"].values())
