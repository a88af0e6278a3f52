"""Launcher: run a script with NaN rewards on one rank, from a given step on.

torchrun ... tests/inject_nan.py cleanrl/ppo_atari_multigpu.py [flags]
(with NAN_RANK and NAN_AFTER_STEPS in the environment)
"""

import os
import runpy
import sys

import gymnasium as gym

import cleanrl_utils.atari_wrappers as atari_wrappers

_wrap_atari = atari_wrappers.wrap_atari


class NaNRewardAfter(gym.Wrapper):
    def __init__(self, env: gym.Env, after: int):
        super().__init__(env)
        self.after, self.steps = after, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return obs, float("nan") if self.steps > self.after else reward, terminated, truncated, info


def wrap_atari(env, **kwargs):
    env = _wrap_atari(env, **kwargs)
    if os.environ.get("RANK", "0") == os.environ["NAN_RANK"]:
        env = NaNRewardAfter(env, int(os.environ["NAN_AFTER_STEPS"]))
    return env


atari_wrappers.wrap_atari = wrap_atari
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
