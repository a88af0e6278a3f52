"""CleanRL's own test command lines for the scripts we share, run as CleanRL writes them (from a directory
whose cleanrl/ is ours), and what each must mean: the run trains its --total-timesteps with the
flags given; --save-model writes runs/<run>/<exp-name>.cleanrl_model and logs a 10-episode evaluation;
a budget below --learning-starts warns once and takes no gradient step."""

import re
import shlex
import subprocess
import sys

import pytest
import torch

from cleanrl_utils.checkpoint import load_checkpoint
from tests.conftest import REPO, read_scalars, script_env

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)

# tests/test_*.py of CleanRL (vwxyzjn/cleanrl) for ppo, ppo_atari, ppo_atari_envpool, ppo_atari_multigpu,
# ppo_continuous_action, dqn, dqn_atari and sac_continuous_action
CLEANRL_COMMANDS = [
    "python cleanrl/ppo.py --num-envs 1 --num-steps 64 --total-timesteps 256",
    "python cleanrl/dqn.py --learning-starts 200 --total-timesteps 205",
    "python cleanrl/ppo_atari.py --num-envs 1 --num-steps 64 --total-timesteps 256",
    "python cleanrl/dqn_atari.py --learning-starts 10 --total-timesteps 16 --buffer-size 10 --batch-size 4",
    "python cleanrl/dqn_atari.py --save-model --learning-starts 10 --total-timesteps 16 --buffer-size 10 --batch-size 4",
    "torchrun --standalone --nnodes=1 --nproc_per_node=2 cleanrl/ppo_atari_multigpu.py --num-envs 8 --num-steps 32 "
    "--total-timesteps 256",
    "python cleanrl/ppo_atari_envpool.py --num-envs 8 --num-steps 32 --total-timesteps 256",
    "python cleanrl/sac_continuous_action.py --env-id Hopper-v4 --batch-size 128 --total-timesteps 135",
    "python cleanrl/ppo_continuous_action.py --env-id Hopper-v4 --num-envs 1 --num-steps 64 --total-timesteps 128",
    "python cleanrl/ppo_continuous_action.py --env-id dm_control/cartpole-balance-v0 --num-envs 1 --num-steps 64 "
    "--total-timesteps 128",
]  # fmt: skip
NEEDS = {"ppo_atari_envpool": "envpool", "Hopper-v4": "mujoco", "dm_control/": "shimmy"}


@pytest.mark.parametrize("command", CLEANRL_COMMANDS, ids=lambda c: re.sub(r"\W+", "-", c.split("cleanrl/")[1])[:60])
def test_cleanrl_command_line_runs_and_means_what_it_means_in_cleanrl(tmp_path, command):
    for needle, module in NEEDS.items():
        if needle in command:
            pytest.importorskip(module)
    (tmp_path / "cleanrl").symlink_to(REPO / "cleanrl")  # `python cleanrl/<script>.py` as in a CleanRL checkout
    argv = shlex.split(command)
    argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]] if argv[0] == "torchrun" else argv
    argv[0] = sys.executable if argv[0] == "python" else argv[0]
    proc = subprocess.run(argv, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    flags = dict(zip(argv, argv[1:], strict=False))
    total = int(flags["--total-timesteps"])
    (last,) = [sorted(d.glob("ckpt_*.pt"))[-1] for d in (tmp_path / "runs").rglob("checkpoints")]
    checkpoint = load_checkpoint(last)
    assert checkpoint["global_step"] == total
    for flag in ("--num-envs", "--num-steps", "--learning-starts", "--buffer-size", "--batch-size", "--env-id"):
        if flag in flags:  # the flags mean what they say
            saved = checkpoint["args"][flag[2:].replace("-", "_")]
            assert str(saved) == flags[flag], (flag, saved)
    run_dir = last.parent.parent
    scalars = read_scalars(run_dir)
    if "--save-model" in argv:
        model = load_checkpoint(run_dir / "dqn_atari.cleanrl_model")
        assert all(torch.equal(model["model"][k], v) for k, v in checkpoint["model"].items())
        assert [step for step, _ in scalars["eval/episodic_return"]] == list(range(10))
        assert f"model saved to {(run_dir / 'dqn_atari.cleanrl_model').relative_to(tmp_path)}" in proc.stderr
    else:
        assert not list(run_dir.glob("*.cleanrl_model")) and "eval/episodic_return" not in scalars
    warning = "no gradient step will be taken"
    off_policy = "dqn" in command or "sac_" in command
    if off_policy and total <= int(flags.get("--learning-starts", 5000 if "sac_" in command else 10_000)):
        assert proc.stderr.count(warning) == 1 and not any(tag.startswith("losses/") for tag in scalars)
    else:
        assert warning not in proc.stderr
