"""Bad input: one line naming the value and the rule, exit code 2, and no run directory."""

import pytest

from tests.conftest import run_script

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)

# (flags, fragment the single error line must contain)
PPO_RULES = [
    (["--num-envs", "0"], "--num-envs 0: must be a positive integer"),
    (["--num-steps", "-4"], "--num-steps -4: must be a positive integer"),
    (["--update-epochs", "0"], "--update-epochs 0: must be a positive integer"),
    (["--num-minibatches", "3"], "--num-minibatches 3: must divide the batch size num_envs * num_steps = 256"),
    (["--total-timesteps", "100"], "--total-timesteps 100: must be at least one iteration"),
    (["--learning-rate", "0"], "--learning-rate 0.0: must be > 0"),
    (["--gamma", "1.5"], "--gamma 1.5: must be in (0, 1]"),
    (["--gae-lambda", "-0.1"], "--gae-lambda -0.1: must be in [0, 1]"),
    (["--env-timeout", "0"], "--env-timeout 0.0: must be > 0"),
    (["--checkpoint-interval", "-1"], "--checkpoint-interval -1: must be >= 0"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id NoSuchEnv-v0: not a registered gymnasium environment"),
    (["--env-id", "no_such_module:Env-v0"], "--env-id no_such_module:Env-v0: not a registered gymnasium environment"),
    (["--env-id", "Pendulum-v1"], "--env-id Pendulum-v1: needs a discrete action space"),
    (["--resume", "does/not/exist"], "--resume does/not/exist: no such file or directory"),
]


def assert_rejected(proc, fragment: str, cwd) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert not (cwd / "runs").exists()


@pytest.mark.parametrize("flags, fragment", PPO_RULES, ids=[" ".join(f) for f, _ in PPO_RULES])
def test_ppo_rejects_bad_input(tmp_path, flags, fragment):
    proc = run_script("ppo.py", *flags, cwd=tmp_path, check=False, timeout=120)
    assert_rejected(proc, fragment, tmp_path)


def test_unparseable_flag_exits_2(tmp_path):
    proc = run_script("ppo.py", "--num-envs", "many", cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    assert "--num-envs" in proc.stderr
    assert not (tmp_path / "runs").exists()


OTHER_RULES = [
    ("ppo_atari.py", ["--env-id", "CartPole-v1"], "--env-id CartPole-v1: not an Atari (ALE) environment"),
    ("ppo_atari.py", ["--num-minibatches", "5"], "--num-minibatches 5: must divide the batch size"),
    ("ppo_atari.py", ["--threads", "0"], "--threads 0: must be a positive integer"),
    ("ppo_atari.py", ["--cudagraphs", "--compile"], "--cudagraphs: needs --compile and CUDA"),
    ("ppo_atari_envpool.py", ["--cudagraphs"], "--cudagraphs: needs --compile and CUDA"),
    ("ppo_atari_envpool.py", ["--env-id", "NoSuchGame-v5"], "--env-id NoSuchGame-v5: not an EnvPool task"),
    ("ppo_atari_envpool.py", ["--env-id", "CartPole-v1"], "--env-id CartPole-v1: not an Atari task of EnvPool"),
    ("ppo_atari_envpool.py", ["--vector-mode", "ale", "--env-id", "NoSuchGame-v5"], "not an Atari game of ale-py"),
    (
        "ppo_atari_envpool.py",
        ["--vector-mode", "ale", "--capture-video"],
        "--capture-video: not with --vector-mode ale",
    ),
    ("ppo_atari_envpool.py", ["--total-timesteps", "512"], "--total-timesteps 512: must be at least one iteration"),
    (
        "ppo_continuous_action.py",
        ["--env-id", "CartPole-v1"],
        "--env-id CartPole-v1: needs a continuous (Box) action space",
    ),
    ("ppo_continuous_action.py", ["--clip-obs", "0"], "--clip-obs 0.0: must be > 0"),
    ("ppo_continuous_action.py", ["--num-envs", "0"], "--num-envs 0: must be a positive integer"),
]


@pytest.mark.parametrize("script, flags, fragment", OTHER_RULES, ids=[f"{s} {' '.join(f)}" for s, f, _ in OTHER_RULES])
def test_other_scripts_reject_bad_input(tmp_path, script, flags, fragment):
    proc = run_script(script, *flags, cwd=tmp_path, check=False, timeout=120)
    assert_rejected(proc, fragment, tmp_path)
