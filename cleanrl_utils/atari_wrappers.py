"""The standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018) on gymnasium 1.x.

gymnasium's ``AtariPreprocessing`` already does no-op resets, frame skipping with a max-pool over
the last two frames, and the 84x84 grayscale resize. Two pieces it lacks are here:
``EpisodicLifeEnv`` (a lost life ends the *training* episode, but the game is only reset on a real
game over; gymnasium's ``terminal_on_life_loss`` would reset the whole game) and ``FireResetEnv``
(press FIRE after every reset, for games that wait for it).

:func:`wrap_atari` builds the whole stack in the order that keeps the episode statistics right:
``RecordEpisodeStatistics`` sits inside the life/reward wrappers, so ``charts/episodic_return`` is
the raw game score over all lives, not a clipped per-life return.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, RecordEpisodeStatistics, TransformReward


class EpisodicLifeEnv(gym.Wrapper):
    """Signal ``terminated`` when a life is lost; reset the emulator only on a real game over."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            # A lost life, not a game over: continue the same game with one no-op step.
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireResetEnv(gym.Wrapper):
    """Press FIRE (then UP) after reset, for games that do not start until FIRE is pressed."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if len(meanings) < 3 or meanings[1] != "FIRE":
            raise ValueError("FireResetEnv needs an action set whose action 1 is FIRE")

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


def wrap_atari(env: gym.Env, frame_stack: int = 4, noop_max: int = 30, frame_skip: int = 4) -> gym.Env:
    """Apply the standard preprocessing to a raw ALE env made with ``frameskip=1``.

    Observations come out as ``uint8`` arrays of shape ``(frame_stack, 84, 84)``; rewards are
    clipped to their sign; a lost life terminates the training episode; ``info["episode"]``
    carries the raw score and length of each full game.
    """
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=84, terminal_on_life_loss=False)
    env = RecordEpisodeStatistics(env)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = TransformReward(env, lambda r: float(np.sign(r)))
    env = FrameStackObservation(env, frame_stack)
    return env
