"""enjoy.py: a checkpoint of a known policy on a deterministic env gives the known returns."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_utils import enjoy
from cleanrl_utils.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from tests.conftest import run_script


def known_returns(seeds: list[int]) -> list[float]:
    """CartPole-v1 under the rule 'push towards where the pole falls' (pole angle > 0)."""
    env = gym.make("CartPole-v1")
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(obs[2] > 0))
            total += reward
            done = terminated or truncated
        out.append(total)
    return out


@pytest.mark.quick
def test_known_policy_gives_known_returns(tmp_path, capsys):
    run_script("ppo.py", "--total-timesteps", "256", "--checkpoint-interval", "0", "--run-name", "r", cwd=tmp_path)
    run_dir = tmp_path / "runs" / "r"
    checkpoint = load_checkpoint(list_checkpoints(run_dir / "checkpoints")[-1])
    # the rule above written into ppo.py's actor: hidden unit 0 carries the pole angle,
    # the logits are (-h, +h): the greedy action is 1 exactly when the angle is > 0
    model = {k: torch.zeros_like(v) for k, v in checkpoint["model"].items()}
    model["actor.0.weight"][0] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    model["actor.2.weight"][0, 0] = 1.0
    model["actor.4.weight"][:, 0] = torch.tensor([-1.0, 1.0])
    save_checkpoint({**checkpoint, "model": model}, run_dir / "checkpoints", 10**6)

    assert enjoy.main([str(run_dir), "--episodes", "4", "--seed", "7", "--greedy"]) == 0
    out = capsys.readouterr().out
    expected = known_returns([7, 8, 9, 10])
    assert len(set(expected)) > 1  # the seeds matter: a policy ignoring them would not match
    returns = [float(line.split("return ")[1]) for line in out.splitlines() if line.startswith("episode")]
    assert returns == expected
    assert f"mean return {np.mean(expected):.2f} +- {np.std(expected):.2f} over 4 episodes" in out


def test_bad_input(tmp_path, capsys):
    assert enjoy.main([str(tmp_path / "missing.pt")]) == 2
    assert enjoy.main([str(tmp_path), "--episodes", "0"]) == 2
    err = capsys.readouterr().err
    assert "missing.pt: no such file" in err and "--episodes 0: must be a positive integer" in err


@pytest.mark.parametrize("script", ["dqn.py", "sac_continuous_action.py"])
def test_other_families_load_and_play(tmp_path, capsys, script):
    env = "Pendulum-v1" if script.startswith("sac") else "CartPole-v1"
    run_script(script, "--env-id", env, "--total-timesteps", "600", "--learning-starts", "300", "--run-name", "r",
               "--checkpoint-interval", "0", "--no-cuda", cwd=tmp_path)  # fmt: skip
    assert enjoy.main([str(tmp_path / "runs/r"), "--episodes", "2", "--greedy"]) == 0
    returns = [
        float(line.split("return ")[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("episode")
    ]
    assert len(returns) == 2 and all(np.isfinite(returns))
