"""Every script, once, for a few iterations with its default env, as a user launches it (the torchrun
scripts with 2 processes on gloo): it trains (its gradient steps run), checkpoints the whole budget,
logs finite losses and ends with its closing line.

CI also runs this file with the oldest torch and gymnasium pyproject.toml allows (.ci/floors.txt), and
``CLEANRL_EXPECT_FLOORS=1`` makes it check that those are the versions it runs with.
"""

import math
import os
import re
import subprocess
import sys

import gymnasium
import pytest
import torch

from tests.conftest import REPO, SCRIPTS, final_checkpoint, read_scalars, script_env

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)

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


def test_every_script_is_here():
    assert sorted(CASES) == sorted(p.name for p in SCRIPTS.glob("*.py") if p.name != "__init__.py")


def _floor_pins() -> dict[str, str]:
    lines = (REPO / ".ci/floors.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def test_the_floors_ci_installs_are_pyprojects():
    from packaging.version import Version

    pyproject = (REPO / "pyproject.toml").read_text()
    for package, version in _floor_pins().items():
        bounds = re.findall(rf'"{package}(?:\[[^]]*\])?>=([\d.]+)"', pyproject)
        assert bounds and all(Version(b) == Version(version) for b in bounds), (package, bounds, version)


def test_the_floors_are_what_runs():
    if os.environ.get("CLEANRL_EXPECT_FLOORS") != "1":
        pytest.skip("runs only where CI installed .ci/floors.txt")
    pins = _floor_pins()
    assert torch.__version__.split("+")[0] == pins["torch"]
    assert gymnasium.__version__ == pins["gymnasium"]


@pytest.mark.parametrize("script", list(CASES))
def test_the_script_trains_checkpoints_and_closes(tmp_path, script):
    flags, processes, loss_tag = CASES[script]
    if processes > 1:
        start = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    else:
        start = [sys.executable]
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
