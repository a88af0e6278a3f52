"""Invariant tier: determinism and exact checkpoint/resume."""

import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from cleanrl_utils.tb import ScalarReader
from tests.conftest import SCRIPTS, final_checkpoint, processes_with_marker, run_script, same_parameters, script_env

# script and its small-budget flags
SMALL_PPO = ["--num-envs", "4", "--num-steps", "32", "--update-epochs", "2", "--num-minibatches", "2"]
SMALL_ATARI = ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "1", "--num-minibatches", "2", "--no-cuda"]
CASES = {
    "ppo-sync": ("ppo.py", SMALL_PPO),
    "ppo-async": ("ppo.py", ["--vector-mode", "async", *SMALL_PPO]),
    "ppo_atari-async": ("ppo_atari.py", ["--vector-mode", "async", *SMALL_ATARI]),
    "ppo_continuous_action": (
        "ppo_continuous_action.py",
        ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "2"],
    ),
}


def _batch(flags: list[str]) -> int:
    return int(flags[flags.index("--num-envs") + 1]) * int(flags[flags.index("--num-steps") + 1])


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.quick
def test_resume_continues_exactly(tmp_path, case):
    script, flags = CASES[case]
    total, half = 8 * _batch(flags), 4 * _batch(flags)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    run_script(
        script, *flags, "--total-timesteps", str(total), "--checkpoint-interval", str(half), "--run-name", "r", cwd=a
    )
    mid = tmp_path / "mid.pt"
    shutil.copy(a / f"runs/r/checkpoints/ckpt_{half:08d}.pt", mid)

    # The attempt that wrote the checkpoint logged on past it before it stopped: its event files are there.
    (b / "runs/r").mkdir(parents=True)
    for events in (a / "runs/r").glob("events.out.tfevents.*"):
        shutil.copy(events, b / "runs/r" / events.name)
    # A fresh process resumes from iteration 4 and must end exactly where the uninterrupted run did.
    run_script(script, "--resume", str(mid), cwd=b)
    one_go, resumed = final_checkpoint(a / "runs/r"), final_checkpoint(b / "runs/r")
    midway = torch.load(mid, weights_only=True)
    assert one_go["iteration"] == resumed["iteration"] == 8
    assert one_go["global_step"] == resumed["global_step"] == total
    assert not same_parameters(midway["model"], resumed["model"])  # the resumed run did train
    assert same_parameters(one_go["model"], resumed["model"])
    opt_a, opt_b = one_go["optimizer"]["state"], resumed["optimizer"]["state"]
    assert all(same_parameters(opt_a[k], opt_b[k]) for k in opt_a)
    # the curves read as one run's: the points at the checkpoint's own step kept, those after it once
    curve_a, curve_b = ScalarReader(a / "runs/r").update(), ScalarReader(b / "runs/r").update()
    for tag in ("losses/value_loss", "charts/episodic_return"):
        assert curve_b.get(tag).steps == curve_a.get(tag).steps, tag
        assert curve_b.get(tag).values == curve_a.get(tag).values, tag
    assert half in curve_b.get("losses/value_loss").steps


@pytest.mark.quick
def test_same_seed_same_result_other_seed_differs(tmp_path):
    script, flags = CASES["ppo-sync"]
    finals = {}
    for name, seed in (("first", "1"), ("again", "1"), ("other", "2")):
        cwd = tmp_path / name
        cwd.mkdir()
        run_script(
            script, *flags, "--total-timesteps", str(3 * _batch(flags)), "--seed", seed, "--run-name", "r", cwd=cwd
        )
        finals[name] = final_checkpoint(cwd / "runs/r")["model"]
    assert same_parameters(finals["first"], finals["again"])
    assert not same_parameters(finals["first"], finals["other"])


@pytest.mark.parametrize("vector_mode", ["envpool", "ale"])
def test_envpool_resume_continues_the_run(tmp_path, vector_mode):
    # EnvPool and ALE's vector env have no env state to save: the resumed run is exact in everything but the
    # games, and it steps them with the vector env it ran on.
    flags = ["--num-envs", "2", "--num-steps", "32", "--update-epochs", "1", "--num-minibatches", "2", "--no-cuda"]
    flags += ["--vector-mode", vector_mode]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    run_script(
        "ppo_atari_envpool.py",
        *flags,
        "--total-timesteps",
        "384",
        "--checkpoint-interval",
        "192",
        "--run-name",
        "r",
        cwd=a,
    )
    mid = a / "runs/r/checkpoints/ckpt_00000192.pt"
    proc = run_script("ppo_atari_envpool.py", "--resume", str(mid), cwd=b)
    resumed, midway = final_checkpoint(b / "runs/r"), torch.load(mid, weights_only=True)
    assert resumed["iteration"] == 6 and resumed["global_step"] == 384
    assert resumed["args"]["vector_mode"] == vector_mode
    assert not same_parameters(midway["model"], resumed["model"])
    assert proc.returncode == 0


def test_interrupted_run_checkpoints_and_resumes(tmp_path, marker):
    """Ctrl-C (SIGINT) ends the iteration, writes a checkpoint, stops every worker; --resume finishes the run."""
    flags = ["--vector-mode", "async", *SMALL_PPO, "--total-timesteps", "200000", "--checkpoint-interval", "0"]
    cmd = [sys.executable, str(SCRIPTS / "ppo.py"), "--no-progress", "--run-name", "r", *flags]
    env = script_env({"CLEANRL_TEST_MARKER": marker})
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs/r").glob("events.out.tfevents.*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "stopped by signal 2 at step" in stderr
    time.sleep(0.5)
    assert processes_with_marker(marker) == []
    stopped = final_checkpoint(tmp_path / "runs/r")
    assert 0 < stopped["global_step"] < 200000
    saved_args = stopped["args"]  # what --resume runs/r would continue with
    assert saved_args["total_timesteps"] == 200000 and saved_args["vector_mode"] == "async"


@pytest.mark.quick
def test_a_single_process_run_checkpoints_at_least_every_few_minutes():
    """A slow run (a tuner trial on Atari at a few hundred SPS) writes a checkpoint CHECKPOINT_SECONDS after
    its last one even between --checkpoint-interval steps; torchrun ranks (no agreed clock) and
    --checkpoint-interval 0 (no periodic checkpoints) do not."""
    from types import SimpleNamespace

    from cleanrl_utils.run import CHECKPOINT_SECONDS, Run

    def due(saved_ago: float, interval: int = 500_000, torchrun: bool = False) -> bool:
        run = SimpleNamespace(args=SimpleNamespace(checkpoint_interval=interval), saved_at=time.perf_counter() - saved_ago,
                              last_checkpoint=None, ranks=SimpleNamespace(distributed=torchrun))  # fmt: skip
        return Run.checkpoint_due(run, 1024, 8, False, None)

    assert not due(CHECKPOINT_SECONDS - 5) and due(CHECKPOINT_SECONDS + 1)
    assert not due(CHECKPOINT_SECONDS + 1, interval=0) and not due(CHECKPOINT_SECONDS + 1, torchrun=True)
    assert due(0, interval=1024)  # the step interval still applies
