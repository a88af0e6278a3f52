"""Faults: failing env workers and unusable checkpoints end the run cleanly and say why."""

import pickle
import re
import time
import zipfile
from pathlib import Path

import pytest
import torch

from cleanrl_utils.checkpoint import CheckpointError, load_checkpoint
from tests.conftest import REPO, processes_with_marker, run_script

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


@pytest.mark.quick
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


@pytest.mark.quick
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
        "error: non-finite gradient norm at step 256; last good checkpoint: runs/r/checkpoints/ckpt_00000128.pt"
        in proc.stderr
    )
    assert sorted(p.name for p in last_good.parent.glob("ckpt_*.pt")) == ["ckpt_00000128.pt"]
    assert all(torch.isfinite(v).all() for v in load_checkpoint(last_good)["model"].values())


def test_dqn_reads_the_nan_record_lazily_yet_never_checkpoints_a_non_finite_model(tmp_path):
    """The record of skipped steps is read on logging steps (every 1000 env steps here) and right before
    each checkpoint (every 64): env 1 pays NaN rewards from global step 200, the first NaN batch is
    sampled at step 272 (a burst of 8 drawn at once, seed 1), and the check before the next checkpoint (320)
    stops the run: the checkpoint at 256 is the last good one."""
    proc = run_script(
        "dqn.py",
        "--env-id", "tests.known_env:NaNReward-v0",
        "--num-envs", "2",
        "--total-timesteps", "1000",
        "--learning-starts", "64",
        "--batch-size", "16",
        "--buffer-size", "1000",
        "--checkpoint-interval", "64",
        "--seed", "1",
        "--run-name", "r",
        cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert (
        "error: non-finite gradient norm at step 272; last good checkpoint: runs/r/checkpoints/ckpt_00000256.pt"
        in proc.stderr
    )
    checkpoints = sorted((tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt"))
    assert [p.name for p in checkpoints] == ["ckpt_00000192.pt", "ckpt_00000256.pt"]
    for path in checkpoints:
        assert all(torch.isfinite(v).all() for v in load_checkpoint(path)["model"].values())


@pytest.mark.parametrize("script", ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"])
def test_sac_stops_on_an_infinite_gradient_whose_loss_is_finite(tmp_path, script):
    """The guard reads the gradients' norm, not the loss: backward passes from the 300th on get an infinite
    gradient while every loss stays finite; the run stops with one line, and its checkpoints are finite."""
    flags = ["--env-id", "Pendulum-v1", "--learning-starts", "200", "--batch-size", "32", "--no-cuda"]
    flags += ["--total-timesteps", "2000", "--checkpoint-interval", "300", "--run-name", "r"]
    proc = run_script(script, *flags, cwd=tmp_path, env={"INF_GRAD_AFTER": "300"}, check=False,
                      launcher=REPO / "tests/inject_inf_grad.py")  # fmt: skip
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-3000:]
    assert re.fullmatch(r"error: non-finite gradient norm at step \d+; last good checkpoint: runs/r/checkpoints/"
                        r"ckpt_\d{8}.pt", errors[0]), errors  # fmt: skip
    for path in sorted((tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt")):
        saved = load_checkpoint(path)
        assert all(torch.isfinite(v).all() for key in ("actor", "qf") for v in saved[key].values()), path


@pytest.mark.quick
def test_a_non_finite_gradient_never_reaches_the_weights():
    """NaNGuard.step skips the fused Adam step on the device when the gradient norm is NaN/inf; the host reads
    the record later (NaNGuard.check), and it names the first skipped step and the last good checkpoint."""
    from cleanrl_utils.nan_guard import NaNGuard

    nan_guard = NaNGuard(torch.device("cpu"))
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)

    def train_step(global_step: int, poison: bool) -> None:
        optimizer.zero_grad()
        loss = model(torch.ones(4, 3)).sum() * (float("nan") if poison else 1.0)
        loss.backward()
        nan_guard.step(optimizer, torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5), global_step)

    train_step(1, False)
    nan_guard.check(None)  # nothing skipped yet
    before = {k: v.clone() for k, v in model.state_dict().items()}
    moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]
    train_step(2, True)
    train_step(3, True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(m, optimizer.state[p]["exp_avg"]) for m, p in zip(moments, model.parameters()))
    assert all(int(optimizer.state[p]["step"]) == 1 for p in model.parameters())
    with pytest.raises(
        FloatingPointError, match="^non-finite gradient norm at step 2; last good checkpoint: runs/r/ckpt_1.pt$"
    ):
        nan_guard.check(Path("runs/r/ckpt_1.pt"))
    train_step(4, False)  # a finite step still trains (the run stops at its next check anyway)
    assert not torch.equal(before["weight"], model.weight)
    with pytest.raises(TypeError, match="^NaNGuard.step needs an optimizer built with fused=True, got SGD$"):
        nan_guard.step(torch.optim.SGD(model.parameters(), lr=0.1), torch.tensor(1.0), 5)


READ_BUDGETS = {
    # script: flags, logging points (logs and checkpoints), gradient steps made
    "dqn.py": (["--total-timesteps", "3000", "--learning-starts", "500"], 3 + 1, 156 * 8),
    "sac_continuous_action.py": (
        ["--env-id", "Pendulum-v1", "--total-timesteps", "1500", "--learning-starts", "500", "--batch-size", "32"],
        1 + 1,
        1000,
    ),
    "ppo_atari_multigpu.py": (
        [
            "--num-envs",
            "2",
            "--num-steps",
            "32",
            "--num-minibatches",
            "4",
            "--update-epochs",
            "2",
            "--total-timesteps",
            "256",
        ],  # fmt: skip
        4 + 1,
        32,
    ),
}


@pytest.mark.parametrize("script", list(READ_BUDGETS))
def test_hot_loops_read_no_value_per_gradient_step(tmp_path, script):
    """Losses, the temperature and the NaN record stay on the device: no line reads a tensor's value on
    every gradient step (on a GPU each read is a wait); values are read where they are logged."""
    import json

    flags, logging_points, gradient_steps = READ_BUDGETS[script]
    report = tmp_path / "reads.json"
    run_script(script, *flags, "--no-cuda", cwd=tmp_path, env={"READS_REPORT": str(report)},
               launcher=REPO / "tests/count_reads.py")  # fmt: skip
    reads = json.loads(report.read_text())
    assert reads, "no reads at all: the counter is not wired"
    per_step = {line: n for line, n in reads.items() if n > 2 * logging_points}
    assert per_step == {}, f"read on (nearly) every step of {gradient_steps} gradient steps: {per_step}"


@pytest.mark.parametrize("script", ["ppo.py", "ppo_continuous_action.py", "ppo_atari.py", "ppo_atari_envpool.py",
                                    "ppo_atari_multigpu.py"])  # fmt: skip
def test_the_ppo_rollout_waits_for_the_device_once_per_env_step(tmp_path, script):
    """The envs need the actions on the host; the log-probabilities and values stay on the device until
    the update: one copy to the host per env step (on a GPU, one wait), and no other line copies per step."""
    import json

    num_envs, num_steps, iterations = 2, 32, 2
    report = tmp_path / "reads.json"
    flags = [
        "--num-envs",
        str(num_envs),
        "--num-steps",
        str(num_steps),
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
    ]
    run_script(script, *flags, "--total-timesteps", str(num_envs * num_steps * iterations), "--no-cuda", cwd=tmp_path,
               env={"READS_REPORT": str(report), "READS_COPIES": "1"}, launcher=REPO / "tests/count_reads.py")  # fmt: skip
    reads = json.loads(report.read_text())
    env_steps = num_steps * iterations
    # (a checkpoint's digest copies each of its tensors once: checkpoint.py, once per checkpoint)
    per_step = {line: n for line, n in reads.items() if n >= env_steps and not line.startswith("checkpoint.py:")}
    assert list(per_step.values()) == [env_steps], f"{env_steps} env steps: {per_step}"
