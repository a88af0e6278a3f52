"""Smoke tier: every script runs a few iterations as a user launches it (the torchrun scripts with 2
processes on gloo): it trains (its gradient steps run), checkpoints the whole budget, logs finite
losses and the expected scalars, and ends with its closing line; --compile, videos and W&B too.

CI also runs ``-k every_script`` with the oldest torch and gymnasium pyproject.toml allows
(.ci/floors.txt), and ``CLEANRL_EXPECT_FLOORS=1`` makes it check that those are the versions it runs with.
"""

import math
import os
import re
import subprocess
import sys

import gymnasium
import pytest
import torch

from tests.conftest import (
    REPO,
    SCRIPTS,
    final_checkpoint,
    only_run_dir,
    read_scalars,
    run_script,
    script_env,
    torchrun_cmd,
)

ATARI = ["--no-cuda", "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
# the off-policy scripts log their losses every 1000 env steps
DQN_ATARI = ["--no-cuda", "--buffer-size", "1000", "--learning-starts", "500", "--batch-size", "16"]
SAC = ["--no-cuda", "--learning-starts", "500", "--batch-size", "32", "--total-timesteps", "1100"]
# script: (flags, processes, a loss tag it must log)
CASES = {
    "ppo.py": (["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128"], 1, "losses/value_loss"),
    "ppo_atari.py": ([*ATARI, "--total-timesteps", "128"], 1, "losses/value_loss"),
    "ppo_atari_envpool.py": ([*ATARI, "--total-timesteps", "128"], 1, "losses/value_loss"),
    "ppo_continuous_action.py": (
        ["--num-envs", "1", "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", "128"],
        1,
        "losses/value_loss",
    ),
    "dqn.py": (["--learning-starts", "500", "--batch-size", "32", "--total-timesteps", "1100"], 1, "losses/td_loss"),
    "dqn_atari.py": ([*DQN_ATARI, "--total-timesteps", "1100"], 1, "losses/td_loss"),
    "sac_continuous_action.py": (SAC, 1, "losses/qf_loss"),
    "ppo_atari_multigpu.py": ([*ATARI, "--num-envs", "4", "--total-timesteps", "256"], 2, "losses/value_loss"),
    "dqn_atari_multigpu.py": ([*DQN_ATARI, "--num-envs", "2", "--total-timesteps", "1100"], 2, "losses/td_loss"),
    "sac_continuous_action_multigpu.py": ([*SAC, "--num-envs", "2"], 2, "losses/qf_loss"),
    "appo.py": (
        ["--num-actors", "2", "--num-envs", "4", "--num-steps", "16", "--total-timesteps", "128"],
        2,
        "losses/value_loss",
    ),
    "appo_atari.py": (
        ["--no-cuda", "--num-actors", "1", "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128"],
        2,
        "losses/value_loss",
    ),
}

# torchrun scripts: a --resume that trains on to this many steps, which the defaults (not the run's own
# --num-envs, --num-steps, --learning-starts) would refuse as too few
LONGER = {
    "ppo_atari_multigpu.py": 384,
    "dqn_atari_multigpu.py": 1300,
    "sac_continuous_action_multigpu.py": 1300,
    "appo.py": 192,
    "appo_atari.py": 192,
}


@pytest.mark.quick
def test_every_script_is_here():
    assert sorted(CASES) == sorted(p.name for p in SCRIPTS.glob("*.py") if p.name != "__init__.py")


def _floor_pins() -> dict[str, str]:
    lines = (REPO / ".ci/floors.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


@pytest.mark.quick
def test_every_script_floor_ci_installs_is_pyprojects():
    from packaging.version import Version

    pyproject = (REPO / "pyproject.toml").read_text()
    for package, version in _floor_pins().items():
        bounds = re.findall(rf'"{package}(?:\[[^]]*\])?>=([\d.]+)"', pyproject)
        assert bounds and all(Version(b) == Version(version) for b in bounds), (package, bounds, version)


@pytest.mark.quick
def test_every_script_runs_on_the_floors_where_ci_says_so():
    if os.environ.get("CLEANRL_EXPECT_FLOORS") != "1":
        pytest.skip("runs only where CI installed .ci/floors.txt")
    pins = _floor_pins()
    assert torch.__version__.split("+")[0] == pins["torch"]
    assert gymnasium.__version__ == pins["gymnasium"]


@pytest.mark.quick
@pytest.mark.parametrize("script", list(CASES))
def test_every_script_trains_checkpoints_and_closes(tmp_path, script):
    flags, processes, loss_tag = CASES[script]
    start = torchrun_cmd(processes) if processes > 1 else [sys.executable]
    cmd = [*start, str(SCRIPTS / script), "--no-progress", "--run-name", "r", *flags]
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    total = int(flags[flags.index("--total-timesteps") + 1])
    assert f"done: {total:,} steps" in proc.stdout, proc.stdout[-2000:]
    checkpoint = final_checkpoint(tmp_path / "runs/r")
    assert checkpoint["global_step"] == total
    assert checkpoint.get("world_size", 1) == processes
    scalars = read_scalars(tmp_path / "runs/r")
    assert scalars[loss_tag], f"{script} logged no {loss_tag}: no gradient step ran"
    assert all(math.isfinite(v) for _, v in scalars[loss_tag])
    assert all(v > 0 for _, v in scalars["charts/SPS"])
    if script not in LONGER:
        return
    # train on: validated with the run's settings, merged from the checkpoint, not with the defaults
    more = LONGER[script]
    cmd = [*start, str(SCRIPTS / script), "--no-progress", "--resume", "runs/r", "--total-timesteps", str(more)]
    proc = subprocess.run(
        cmd + ["--no-cuda"], cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert f"done: {more:,} steps" in proc.stdout, proc.stdout[-2000:]
    assert final_checkpoint(tmp_path / "runs/r")["global_step"] == more


# --------------------------------------------------------------------------------------------
# The expected scalars, --compile, videos, W&B
# --------------------------------------------------------------------------------------------
COMMON_TAGS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "perf/env_time",
    "perf/inference_time",
    "perf/learn_time",
    "perf/cpu_util",
}

SMALL_ATARI = ["--num-envs", "2", "--num-steps", "128", "--total-timesteps", "512", "--no-cuda"]  # ends some games
SMOKE = {
    "ppo.py": ["--num-envs", "4", "--num-steps", "64", "--total-timesteps", "1024"],
    "ppo.py-async": ["--vector-mode", "async", "--num-envs", "2", "--num-steps", "64", "--total-timesteps", "512"],
    "ppo_atari.py": SMALL_ATARI,
    "ppo_atari.py-async": ["--vector-mode", "async", *SMALL_ATARI],
    "ppo_atari_envpool.py": SMALL_ATARI,
    "ppo_atari_envpool.py-ale": ["--vector-mode", "ale", *SMALL_ATARI],
    # HalfCheetah episodes last 1000 steps, so one ends within the 1024.
    "ppo_continuous_action.py": [
        "--num-steps",
        "1024",
        "--num-minibatches",
        "8",
        "--update-epochs",
        "2",
        "--total-timesteps",
        "1024",
    ],
}


@pytest.mark.parametrize("case", list(SMOKE))
def test_script_writes_expected_scalars(tmp_path, case):
    script = case.split("-")[0]
    run_script(script, *SMOKE[case], "--run-name", "smoke", cwd=tmp_path)
    run_dir = only_run_dir(tmp_path)
    scalars = read_scalars(run_dir)
    assert scalars.keys() >= COMMON_TAGS, COMMON_TAGS - scalars.keys()
    for tag, points in scalars.items():
        if tag.startswith("losses/") and tag != "losses/explained_variance":
            assert all(math.isfinite(v) for _, v in points), tag
    assert all(v > 0 for _, v in scalars["charts/SPS"])
    assert any(v > 0 for _, v in scalars["perf/env_time"])
    assert (run_dir / "checkpoints").is_dir()


def test_capture_video_writes_videos(tmp_path):
    run_script("ppo_atari_envpool.py", *SMALL_ATARI, "--capture-video", "--run-name", "v", cwd=tmp_path)
    assert list((tmp_path / "runs/v/videos").glob("*.mp4"))


def test_track_keeps_the_wandb_key_out_of_every_file(tmp_path):
    secret = "0123456789abcdef0123456789abcdef01234567"
    proc = run_script(
        "ppo.py",
        "--track",
        "--num-envs", "2",
        "--num-steps", "32",
        "--total-timesteps", "128",
        cwd=tmp_path,
        env={"WANDB_API_KEY": secret, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)},
    )  # fmt: skip
    assert secret not in proc.stdout and secret not in proc.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("wandb" in str(p) for p in files)  # W&B did write its offline run
    for path in files:
        assert secret.encode() not in path.read_bytes(), path


def test_a_tracked_run_leaves_runs_readable(tmp_path):
    """W&B's files stay out of runs/ (inside the TensorBoard log directory its mirror of the event files
    mirrored itself): after an offline --track run, runs/ holds one run, no link, and both
    cleanrl_utils.plot and TensorBoard's own reader read it."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    run_script("ppo.py", "--track", "--num-envs", "2", "--num-steps", "32", "--total-timesteps", "256",
               "--run-name", "t", cwd=tmp_path, env={"WANDB_MODE": "offline"})  # fmt: skip
    assert (tmp_path / "wandb").is_dir()  # W&B wrote its offline run, beside runs/
    assert not [p for p in (tmp_path / "runs").rglob("*") if p.is_symlink() or "wandb" in p.name]
    assert only_run_dir(tmp_path).name == "t"
    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(tmp_path / "runs"))
    assert list(multiplexer.Runs()) == ["t"]
    plot = subprocess.run([sys.executable, "-m", "cleanrl_utils.plot", "runs", "--out", "plots"], cwd=tmp_path,
                          env=script_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "plots/curves.png").exists()


@pytest.mark.parametrize("script", ["ppo.py", "ppo_continuous_action.py", "ppo_atari.py"])
def test_compile_trains_on_the_cpu_and_compiles_the_loss_once(tmp_path, script):
    """--compile (torch.compile of the policy step and of the minibatch loss) on the CPU: a few iterations
    train with finite losses, and the fixed-size minibatches never make torch.compile compile again."""
    flags = ["--num-envs", "2", "--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--no-cuda"]
    proc = run_script(script, *flags, "--total-timesteps", "384", "--compile", "--run-name", "c",
                      cwd=tmp_path, env={"TORCH_LOGS": "recompiles"})  # fmt: skip
    assert "Recompiling" not in proc.stderr, proc.stderr[-3000:]
    scalars = read_scalars(tmp_path / "runs/c")
    assert len(scalars["losses/value_loss"]) == 3
    assert all(math.isfinite(v) for tag in ("losses/value_loss", "losses/policy_loss") for _, v in scalars[tag])
