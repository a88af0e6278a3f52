"""The replay buffer returns exactly the stored transitions, with frames stored once."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from cleanrl_utils.buffers import ReplayBuffer

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


class FrameEnv(gym.Env):
    """Frames encode (env, episode, step): pixel [0, 2] = the env's first seed, [0, 0] = episode % 251,
    [0, 1] = step. Episodes of seeded random length; every third one ends by truncation."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(0, 255, (6, 6), np.uint8)
        self.action_space = gym.spaces.Discrete(3)
        self.episode, self.t, self.ident = -1, 0, 0

    def _obs(self):
        frame = np.zeros((6, 6), dtype=np.uint8)
        frame[0, 0], frame[0, 1], frame[0, 2] = self.episode % 251, self.t, self.ident
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.ident = seed
        self.episode += 1
        self.t = 0
        self.length = int(self.np_random.integers(2, 12))
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        over = self.t >= self.length
        truncated = over and self.episode % 3 == 2
        return self._obs(), float(action) + 0.5 * self.t, over and not truncated, truncated, {}


def _collect(frame_stack: int, capacity: int, steps: int, num_envs: int = 3, seed: int = 0):
    def make():
        env = FrameEnv()
        return gym.wrappers.FrameStackObservation(env, frame_stack) if frame_stack > 1 else env

    envs = gym.vector.SyncVectorEnv([make for _ in range(num_envs)], autoreset_mode=AutoresetMode.NEXT_STEP)
    obs_shape = envs.single_observation_space.shape
    buffer = ReplayBuffer(capacity, num_envs, obs_shape, (), np.uint8, np.int64, frame_stack=frame_stack, seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = envs.reset(seed=seed)
    done = np.zeros(num_envs, dtype=bool)
    truth = {}  # (env, obs bytes) -> (action, reward, terminated, next_obs) of every real transition
    stacks = []  # the true observation of every step, to check stack rebuilding
    for _ in range(steps):
        action = rng.integers(0, 3, size=num_envs)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        buffer.add(obs, action, reward, terminated, ~done)
        stacks.append(obs.copy())
        for e in range(num_envs):
            if not done[e]:
                truth[(e, obs[e].tobytes(), int(action[e]))] = (
                    float(reward[e]),
                    bool(terminated[e]),
                    next_obs[e].copy(),
                )
        obs, done = next_obs, np.logical_or(terminated, truncated)
    return buffer, truth, stacks


@pytest.mark.parametrize("frame_stack", [1, 4])
def test_samples_are_exactly_stored_transitions(frame_stack):
    buffer, truth, _ = _collect(frame_stack, capacity=3 * 500, steps=400)
    batch = buffer.sample(2000)
    for i in range(2000):
        candidates = [
            (k, v) for k, v in truth.items() if k[1] == batch["obs"][i].tobytes() and k[2] == batch["actions"][i]
        ]
        assert candidates, "sampled a transition that was never a real one (a reset step or a torn stack)"
        (reward, terminated, next_obs) = candidates[0][1]
        assert batch["rewards"][i] == pytest.approx(reward)
        assert bool(batch["terminations"][i]) == terminated
        np.testing.assert_array_equal(batch["next_obs"][i], next_obs)
    # both kinds of episode end are in the data and come back with their real final observation
    finals = [v for v in truth.values() if v[1]]
    assert finals


def test_rebuilt_frame_stacks_equal_the_observed_ones_and_never_mix_episodes():
    buffer, _, stacks = _collect(4, capacity=3 * 1000, steps=600)
    for t in range(3, 599):
        for e in range(3):
            rebuilt = buffer._stack(np.array([t]), np.array([e]))[0]
            np.testing.assert_array_equal(rebuilt, stacks[t][e])
            assert len(set(rebuilt[:, 0, 0].tolist())) == 1  # one episode per stack


def test_ring_wraps_without_handing_out_stale_or_torn_transitions():
    buffer, truth, _ = _collect(4, capacity=3 * 40, steps=500)  # wraps 12 times
    assert buffer.steps == 500
    batch = buffer.sample(500)
    keys = {(k[1], k[2]) for k in truth}
    for i in range(500):
        assert (batch["obs"][i].tobytes(), int(batch["actions"][i])) in keys
        assert batch["obs"][i][-1, 0, 1] + 1 == batch["next_obs"][i][-1, 0, 1]  # consecutive steps
        assert batch["obs"][i][-1, 0, 0] == batch["next_obs"][i][-1, 0, 0]  # of one episode


def test_atari_layout_uses_at_most_30_percent_of_obs_plus_next_obs():
    capacity = 100_000
    buffer = ReplayBuffer(capacity, 8, (4, 84, 84), (), np.uint8, np.int64, frame_stack=4)
    naive = 2 * capacity * 4 * 84 * 84  # obs and next_obs, uint8
    assert buffer.nbytes <= 0.30 * naive
    assert buffer.nbytes / naive == pytest.approx(0.125, abs=0.01)


def test_real_atari_stacks_are_rebuilt_exactly():
    import ale_py

    from cleanrl_utils.atari_wrappers import wrap_atari

    gym.register_envs(ale_py)
    make = lambda: wrap_atari(gym.make("BreakoutNoFrameskip-v4", frameskip=1, obs_type="grayscale"))  # noqa: E731
    envs = gym.vector.SyncVectorEnv([make, make], autoreset_mode=AutoresetMode.NEXT_STEP)
    buffer = ReplayBuffer(2 * 2000, 2, (4, 84, 84), (), np.uint8, np.int64, frame_stack=4)
    obs, _ = envs.reset(seed=3)
    done = np.zeros(2, dtype=bool)
    seen, rng, ends = [], np.random.default_rng(3), 0
    for _ in range(700):
        action = rng.integers(0, 4, size=2)
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        buffer.add(obs, action, reward, terminated, ~done)
        seen.append(obs.copy())
        obs, done = next_obs, np.logical_or(terminated, truncated)
        ends += int(done.sum())
    assert ends >= 4  # lost lives and game overs inside the window
    for t in range(3, 700):
        np.testing.assert_array_equal(buffer._stack(np.array([t, t]), np.array([0, 1])), seen[t])


def test_state_dict_round_trip_continues_identically(tmp_path):
    buffer, _, _ = _collect(4, capacity=3 * 200, steps=300)
    torch.save(buffer.state_dict(), tmp_path / "b.pt")
    restored = ReplayBuffer(3 * 200, 3, (4, 6, 6), (), np.uint8, np.int64, frame_stack=4)
    restored.load_state_dict(torch.load(tmp_path / "b.pt", weights_only=True))
    a, b = buffer.sample(64), restored.sample(64)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
