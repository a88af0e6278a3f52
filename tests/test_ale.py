"""ALE's own vector env behind EnvPool's interface (``cleanrl_utils.envs.ALEVectorEnv``).

Against gymnasium's ``AtariPreprocessing`` on the same game and actions, frame for frame: the same
screens, raw and clipped rewards, game overs, lost lives as ``atari_wrappers.EpisodicLifeEnv`` signals
them (without a reset step: the game goes on), the next-step reset after a game over, and the whole-game
score and length that ``EnvPoolGames`` logs equal to ``RecordEpisodeStatistics``'. No-op starts and
FIRE on reset are off here, since ALE draws the no-ops from its own generator. The script on ALE:
its batches and game scores on known games (tests/test_batches.py, tests/test_episode_stats.py, through
tests/fake_envpool.py), a real run (tests/test_smoke.py) and its resume (tests/test_resume.py).
"""

import ale_py
import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import AtariPreprocessing, RecordEpisodeStatistics

from cleanrl_utils.envs import ALEVectorEnv, EnvPoolGames

gym.register_envs(ale_py)


def reference(env_id: str) -> gym.Env:
    env = gym.make(env_id, frameskip=1, obs_type="grayscale")  # NoFrameskip-v4: no sticky actions, like ALE's here
    return RecordEpisodeStatistics(AtariPreprocessing(env, noop_max=0, frame_skip=4, screen_size=84))


@pytest.mark.quick
@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"])
def test_ale_vector_env_plays_the_games_of_gymnasium_preprocessing(env_id):
    num_envs = 2
    ale = ALEVectorEnv(env_id, num_envs, seed=1, noop_max=0, fire_reset=False)
    refs = [reference(env_id) for _ in range(num_envs)]
    obs, _ = ale.reset()
    for i, ref in enumerate(refs):
        assert np.array_equal(obs[i, -1], ref.reset(seed=i)[0])  # the newest frame of the stack
    lives = [ref.unwrapped.ale.lives() for ref in refs]
    games, rng = EnvPoolGames(num_envs), np.random.default_rng(0)
    over_at = {}  # the step at which env i's game ended: ALE's next step of that env only resets it
    expected, logged, life_losses, steps = {}, {}, 0, 0
    while len(over_at) < num_envs or steps <= max(over_at.values()) + 1:
        actions = rng.integers(0, ale.single_action_space.n, num_envs).astype(np.int32)
        obs, reward, terminated, truncated, info = ale.step(actions)
        steps += 1
        for i, ref in enumerate(refs):
            if i in over_at:
                if steps == over_at[i] + 1:  # the reset step: no reward, no ending, a new game's first screen
                    assert (reward[i], info["reward"][i], terminated[i], truncated[i]) == (0, 0, False, False)
                    assert np.array_equal(obs[i, -1], reference(env_id).reset(seed=0)[0])
                continue
            frame, raw, game_over, cut, ref_info = ref.step(int(actions[i]))
            assert np.array_equal(obs[i, -1], frame), (env_id, i, steps)
            assert (info["reward"][i], reward[i]) == (raw, np.sign(raw))
            assert (bool(info["terminated"][i]), bool(truncated[i])) == (game_over, cut)
            now = ref.unwrapped.ale.lives()
            assert bool(terminated[i]) == (game_over or 0 < now < lives[i])  # a lost life ends the training episode
            life_losses += bool(terminated[i]) and not game_over
            lives[i] = now
            if game_over or cut:
                over_at[i] = steps
                expected[i] = (float(ref_info["episode"]["r"]), int(ref_info["episode"]["l"]))
        for i, score, length in games.update(info, truncated):
            logged.setdefault(i, (score, length))
        assert steps < 5000
    assert logged == expected
    assert life_losses > 0 or env_id.startswith("Pong")  # Breakout has lives to lose; Pong has none
    ale.close()
