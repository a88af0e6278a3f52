"""A stand-in for ``envpool.make`` (and ale-py's ``AtariVectorEnv``) on Atari games whose scores are known.

It follows EnvPool's gymnasium API and semantics: next-step autoreset after a game over or a
truncation (the following step ignores the action, returns reward 0, ``elapsed_step`` 0), episodic
life (a lost life sets ``terminated`` but the game goes on without a reset step), clipped rewards
with the raw score in ``info["reward"]`` and game over in ``info["terminated"]``.

Game k of the env seeded s lasts ``game_length(s, k)`` steps, loses a life at a third and at two
thirds of it, and step t pays a raw reward of t, so its score is L (L + 1) / 2. Every third game
ends by truncation.
"""

import runpy
import sys

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from tests.known_env import expected_episodes


def game_length(seed: int, k: int) -> int:
    return 6 + (seed + 2 * k) % 7


def expected_games(seed: int, steps: int) -> list[tuple[int, float, int]]:
    """(vector step at which it ends, score, length) of each game one env completes in ``steps``."""
    return expected_episodes(seed, steps, length=game_length)


class FakeAtariPool:
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": ["rgb_array"]}

    def __init__(self, num_envs: int, seed: int):
        self.num_envs = num_envs
        self.single_observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        self.single_action_space = gym.spaces.Discrete(4)
        self.seeds = [seed + i for i in range(num_envs)]
        self.k = np.zeros(num_envs, dtype=np.int64)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.pending_reset = np.zeros(num_envs, dtype=bool)

    def _obs(self):
        # pixels (0, 0..3) of every frame name the observation: seed, game k, step t, game over (reset step next)
        obs = np.zeros((self.num_envs, 4, 84, 84), dtype=np.uint8)
        obs[:, :, 0, 0] = np.array(self.seeds)[:, None] % 256
        obs[:, :, 0, 1] = self.k[:, None] % 256
        obs[:, :, 0, 2] = self.t[:, None] % 256
        obs[:, :, 0, 3] = self.pending_reset[:, None]
        return obs

    def reset(self):
        return self._obs(), {"elapsed_step": self.t.astype(np.int32)}

    def step(self, actions):
        assert actions.shape == (self.num_envs,) and actions.dtype == np.int32
        reward = np.zeros(self.num_envs, dtype=np.float32)
        raw = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        game_over = np.zeros(self.num_envs, dtype=np.int32)
        for i in range(self.num_envs):
            if self.pending_reset[i]:
                self.pending_reset[i] = False
                self.k[i] += 1
                self.t[i] = 0
                continue
            self.t[i] += 1
            length = game_length(self.seeds[i], int(self.k[i]))
            raw[i], reward[i] = self.t[i], 1.0
            if self.t[i] == length:
                self.pending_reset[i] = True
                if self.k[i] % 3 == 2:
                    truncated[i] = True
                else:
                    terminated[i], game_over[i] = True, 1
            elif self.t[i] in (length // 3, 2 * length // 3):
                terminated[i] = True  # a lost life
        info = {"reward": raw, "terminated": game_over, "elapsed_step": self.t.astype(np.int32)}
        return self._obs(), reward, terminated, truncated, info

    def render(self, env_ids):
        return np.zeros((len(env_ids), 210, 160, 3), dtype=np.uint8)

    def close(self):
        pass


def make(task_id, env_type, num_envs, seed, **kwargs):
    assert env_type == "gymnasium"
    return FakeAtariPool(num_envs, seed)


class FakeALEVector:
    """The same games behind ale-py's ``AtariVectorEnv`` (as ``ALEVectorEnv`` makes it: no episodic life,
    no reward clipping): raw rewards, ``terminated`` only on a game over, a lost life only lowers
    ``info["lives"]`` (3 per game, 0 at its game over), next-step autoreset; env i is seeded seed + i."""

    def __init__(self, game, num_envs, **kwargs):
        assert not kwargs["episodic_life"] and not kwargs["reward_clipping"]
        self.num_envs = num_envs
        self.metadata = FakeAtariPool.metadata
        self.single_observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        self.single_action_space = gym.spaces.Discrete(4)

    def reset(self, seed):
        self.pool = FakeAtariPool(self.num_envs, seed)
        self.lives = np.full(self.num_envs, 3, dtype=np.int32)
        obs, _ = self.pool.reset()
        return obs, {"lives": self.lives.copy(), "env_id": np.arange(self.num_envs, dtype=np.int32)}

    def step(self, actions):
        resetting = self.pool.pending_reset.copy()
        obs, _, terminated, truncated, info = self.pool.step(actions)
        game_over = info["terminated"].astype(bool)
        self.lives[resetting] = 3
        self.lives -= terminated & ~game_over  # a lost life: the game goes on
        self.lives[game_over] = 0
        return obs, info["reward"], game_over, truncated, {"lives": self.lives.copy()}

    def close(self):
        pass


def patch() -> None:
    """Swap the fake games in for EnvPool's and ALE's vector envs."""
    import ale_py.vector_env
    import envpool

    envpool.make = make
    ale_py.vector_env.AtariVectorEnv = FakeALEVector


if __name__ == "__main__":
    # python tests/fake_envpool.py cleanrl/ppo_atari_envpool.py [flags]: run the script on fake games.
    patch()
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
