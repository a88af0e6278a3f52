"""Smoke tier: each script runs a few iterations and writes the expected, finite scalars."""

import math

import pytest

from tests.conftest import only_run_dir, read_scalars, run_script

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
