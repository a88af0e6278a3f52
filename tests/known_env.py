"""Test environments whose episode returns are known in advance, and ones that fail on purpose.

Importing this module registers them, so scripts can use ``--env-id tests.known_env:KnownReturns-v0``.

``KnownReturns-v0``: episode k of an env first reset with seed s lasts ``episode_length(s, k)``
steps whatever the actions are; step t (1-based) pays reward t, so the return is L (L + 1) / 2.
Every third episode ends by truncation instead of termination, so both paths are exercised.
"""

import os
import signal
import time

import gymnasium as gym
import numpy as np


def episode_length(seed: int, k: int) -> int:
    return 2 + (3 * seed + k) % 5


def episode_ends_by_truncation(k: int) -> bool:
    return k % 3 == 2


def expected_episodes(seed: int, steps: int, length=episode_length) -> list[tuple[int, float, int]]:
    """(vector step at which it ends, return, length) of each episode one env completes in ``steps``.

    Vector steps count from 1; episode k lasts ``length(seed, k)`` steps and step t pays t. Under
    next-step autoreset every episode after the first starts with one reset step that belongs
    to no episode.
    """
    done, used, k = [], 0, 0
    while True:
        n = length(seed, k)
        used += n + (1 if k > 0 else 0)
        if used > steps:
            return done
        done.append((used, n * (n + 1) / 2, n))
        k += 1


class KnownReturnsEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, fail: str | None = None, fail_seed: int = 2, fail_step: int = 20):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.fail, self.fail_seed, self.fail_step = fail, fail_seed, fail_step
        self.first_seed: int | None = None
        self.k = -1
        self.t = 0
        self.total_steps = 0

    def _obs(self):
        return np.array([self.t / 10.0, self.k % 7, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.first_seed is None:
            self.first_seed = 0 if seed is None else seed
        self.k += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self.t += 1
        self.total_steps += 1
        if self.fail and self.first_seed == self.fail_seed and self.total_steps == self.fail_step:
            if self.fail == "raise":
                raise ValueError("injected failure")
            if self.fail == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fail == "hang":
                time.sleep(3600)
        length = episode_length(self.first_seed, self.k)
        over = self.t >= length
        truncated = over and episode_ends_by_truncation(self.k)
        reward = float(self.t)
        if self.fail == "nan" and self.first_seed == self.fail_seed and self.total_steps >= self.fail_step:
            reward = float("nan")
        return self._obs(), reward, over and not truncated, truncated, {}


class CountingEnv(gym.Env):
    """Observations name themselves: [first seed, episode k, step t, 1 if final]. Episode k lasts
    ``episode_length(seed, k)`` steps whatever the actions are (every third one truncated), so the test
    knows exactly which observations a rollout sees and which of them are real transitions: all but
    the final ones, whose next step under next-step autoreset only resets the env."""

    metadata = {"render_modes": []}

    def __init__(self, continuous: bool = False):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if continuous else gym.spaces.Discrete(2)
        self.first_seed: int | None = None
        self.k, self.t = -1, 0

    def _obs(self, final: bool):
        return np.array([self.first_seed, self.k, self.t, float(final)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.first_seed is None:
            self.first_seed = 0 if seed is None else seed
        self.k, self.t = self.k + 1, 0
        return self._obs(False), {}

    def step(self, action):
        self.t += 1
        over = self.t >= episode_length(self.first_seed, self.k)
        truncated = over and episode_ends_by_truncation(self.k)
        return self._obs(over), 1.0, over and not truncated, truncated, {}


gym.register("KnownReturns-v0", entry_point=KnownReturnsEnv)
gym.register("Counting-v0", entry_point=CountingEnv)
gym.register("CountingBox-v0", entry_point=CountingEnv, kwargs={"continuous": True})
gym.register("RaisingWorker-v0", entry_point=KnownReturnsEnv, kwargs={"fail": "raise"})
gym.register("DyingWorker-v0", entry_point=KnownReturnsEnv, kwargs={"fail": "kill"})
gym.register("HangingWorker-v0", entry_point=KnownReturnsEnv, kwargs={"fail": "hang"})
gym.register("NaNReward-v0", entry_point=KnownReturnsEnv, kwargs={"fail": "nan", "fail_step": 100})
