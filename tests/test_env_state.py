"""Invariant tier: checkpoint codec round trips and exact env snapshots."""

import random
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
import torch

from cleanrl_utils.checkpoint import decode, encode, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from cleanrl_utils.envs import EnvSnapshot, get_vector_state, set_vector_state

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def test_codec_round_trip_keeps_types_and_values(tmp_path):
    value = {
        "f64": np.float64(0.1),
        "i32": np.int32(-7),
        "arr": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "gen": np.random.default_rng(5),
        "dq": deque([np.zeros(2), np.ones(2)], maxlen=4),
        "raw": b"\x00\x01binary",
        "nested": [(1, 2.5, None, "s", True)],
    }
    save_checkpoint({"v": encode(value)}, tmp_path, 1)
    out = decode(load_checkpoint(tmp_path / "ckpt_00000001.pt")["v"])
    assert type(out["f64"]) is np.float64 and out["f64"] == value["f64"]
    assert type(out["i32"]) is np.int32 and out["i32"] == -7
    assert out["arr"].dtype == np.uint32 and np.array_equal(out["arr"], value["arr"])
    assert out["gen"].random() == np.random.default_rng(5).random()
    assert isinstance(out["dq"], deque) and out["dq"].maxlen == 4 and np.array_equal(out["dq"][1], np.ones(2))
    assert out["raw"] == value["raw"]
    assert out["nested"] == [(1, 2.5, None, "s", True)]


def test_rng_state_round_trip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = rng_state()
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_save_keeps_only_the_newest_checkpoints(tmp_path):
    for it in range(1, 5):
        save_checkpoint({"it": it}, tmp_path, it, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_00000003.pt", "ckpt_00000004.pt"]


def _atari():
    import ale_py

    from cleanrl_utils.atari_wrappers import wrap_atari

    gym.register_envs(ale_py)
    return wrap_atari(gym.make("BreakoutNoFrameskip-v4"))


def _mujoco():
    pytest.importorskip("mujoco")
    return gym.wrappers.ClipAction(gym.make("HalfCheetah-v4"))


MAKERS = {
    "cartpole": lambda: gym.make("CartPole-v1"),
    "pendulum": lambda: gym.wrappers.NormalizeObservation(gym.make("Pendulum-v1")),
    "breakout": _atari,
    "halfcheetah": _mujoco,
}


def _rollout(envs, actions):
    out = []
    for a in actions:
        obs, rew, term, trunc, _ = envs.step(a)
        out.append((obs.copy(), rew.copy(), term.copy(), trunc.copy()))
    return out


@pytest.mark.parametrize("name", list(MAKERS))
def test_vector_env_snapshot_continues_identically(name):
    def make():
        envs = gym.vector.SyncVectorEnv([lambda: EnvSnapshot(MAKERS[name]()) for _ in range(2)])
        return gym.wrappers.vector.RecordEpisodeStatistics(envs, stats_key="vector_episode")

    rng = np.random.default_rng(0)
    a = make()
    a.reset(seed=[3, 4])
    a.action_space.seed(0)
    _rollout(a, [a.action_space.sample() for _ in range(rng.integers(40, 60))])
    snapshot = get_vector_state(a)
    actions = [a.action_space.sample() for _ in range(250)]
    expected = _rollout(a, actions)

    b = make()
    b.reset(seed=[11, 12])  # a different history; the snapshot must override all of it
    set_vector_state(b, snapshot)
    got = _rollout(b, actions)
    for (eo, er, et, etr), (go, gr, gt, gtr) in zip(expected, got):
        np.testing.assert_array_equal(eo, go)
        np.testing.assert_array_equal(er, gr)
        np.testing.assert_array_equal(et, gt)
        np.testing.assert_array_equal(etr, gtr)
    assert list(a.return_queue) == list(b.return_queue)
    a.close(), b.close()
