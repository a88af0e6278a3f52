"""Invariant tier: logged episode statistics equal the true ones under next-step autoreset."""

import pytest

from tests.conftest import REPO, only_run_dir, read_scalars, run_script
from tests.known_env import expected_episodes

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def logged_episodes(cwd) -> list[tuple[int, float, int]]:
    """(global step, return, length) of every episode the run in ``cwd`` logged, sorted."""
    scalars = read_scalars(only_run_dir(cwd))
    pairs = zip(scalars["charts/episodic_return"], scalars["charts/episodic_length"])
    return sorted((step, ret, int(length)) for (step, ret), (_, length) in pairs)


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_ppo_logs_the_true_episode_returns(tmp_path, vector_mode):
    num_envs, num_steps, iterations, seed = 3, 16, 3, 5
    run_script(
        "ppo.py",
        "--env-id", "tests.known_env:KnownReturns-v0",
        "--vector-mode", vector_mode,
        "--seed", str(seed),
        "--num-envs", str(num_envs),
        "--num-steps", str(num_steps),
        "--num-minibatches", "2",
        "--update-epochs", "1",
        "--total-timesteps", str(num_envs * num_steps * iterations),
        cwd=tmp_path,
    )  # fmt: skip
    logged = logged_episodes(tmp_path)
    expected = sorted(
        (end * num_envs, ret, length)
        for i in range(num_envs)
        for end, ret, length in expected_episodes(seed + i, num_steps * iterations)
    )
    assert len(expected) > 3 * num_envs  # several episodes per env, both endings
    assert logged == expected


@pytest.mark.parametrize("vector_mode", ["envpool", "ale"])
def test_envpool_script_logs_whole_game_scores_under_next_step_autoreset(tmp_path, vector_mode):
    from tests.fake_envpool import expected_games

    num_envs, num_steps, iterations, seed = 3, 16, 4, 3
    run_script(
        "ppo_atari_envpool.py",
        "--seed", str(seed),
        "--num-envs", str(num_envs),
        "--num-steps", str(num_steps),
        "--num-minibatches", "2",
        "--update-epochs", "1",
        "--total-timesteps", str(num_envs * num_steps * iterations),
        "--no-cuda",
        "--vector-mode", vector_mode,
        cwd=tmp_path,
        launcher=REPO / "tests/fake_envpool.py",
    )  # fmt: skip
    logged = logged_episodes(tmp_path)
    expected = sorted(
        (end * num_envs, score, length)
        for i in range(num_envs)
        for end, score, length in expected_games(seed + i, num_steps * iterations)
    )
    assert len(expected) > 3 * num_envs
    assert logged == expected
