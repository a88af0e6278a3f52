"""Invariant tier: the training batch of each on-policy script holds exactly the real transitions.

Under next-step autoreset the step after an episode end only resets that env: its observation (the
episode's final one) was not acted on, so it must not enter the batch; every other observation must,
once. The envs here name their observations (seed, episode, step, final), so the test knows the exact
batch each update must see; for real games it knows how many of the rollout's steps were reset steps.
"""

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, script_env
from tests.fake_envpool import game_length
from tests.known_env import episode_length

pytestmark = pytest.mark.quick  # every test here is in the quick tier (README: Test)


def record(tmp_path, module: str, *flags: str, fake_envpool: bool = False) -> tuple[list[np.ndarray], np.ndarray]:
    """Run ``module`` under tests/record_batch.py; return its training batches and per-step reset counts
    (and, as ``record.sizes``, the size of each minibatch the update was handed)."""
    out = tmp_path / "batches.npz"
    env = {"BATCH_RECORD": str(out), **({"FAKE_ENVPOOL": "1"} if fake_envpool else {})}
    cmd = [sys.executable, str(REPO / "tests/record_batch.py"), module, "--no-progress", "--run-name", "r", *flags]
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(env), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = np.load(out)
    batches = [data[f"arr_{i}"] for i in range(len(data.files) - 2)]
    record.sizes = list(data["sizes"])
    return batches, data["resets"]


def stream(seed: int, length, n: int) -> list[tuple[int, int, int, int]]:
    """The observations env ``seed`` hands the policy in its first ``n`` steps: (seed, k, t, final)."""
    out, k = [], 0
    while len(out) < n:
        steps = length(seed, k)
        out += [(seed, k, t, 0) for t in range(steps)] + [(seed, k, steps, 1)]
        k += 1
    return out[:n]


def expected_batches(seeds: list[int], length, num_steps: int, iterations: int) -> list[list[tuple]]:
    streams = [stream(seed, length, num_steps * iterations) for seed in seeds]
    return [
        sorted(row for s in streams for row in s[j * num_steps : (j + 1) * num_steps] if not row[3])
        for j in range(iterations)
    ]


def rows(batch: np.ndarray) -> list[tuple]:
    if batch.ndim == 4:  # Atari frames: pixels (0, 0..3) of the newest frame name the observation
        batch = batch[:, -1, 0, :4]
    return sorted(tuple(int(v) for v in row) for row in batch)


SMALL = ["--num-minibatches", "1", "--update-epochs", "1"]


@pytest.mark.parametrize("vector_mode", ["sync", "async"])
def test_ppo_batches_are_the_real_transitions(tmp_path, vector_mode):
    num_envs, num_steps, iterations, seed = 3, 16, 3, 4
    batches, _ = record(
        tmp_path, "cleanrl.ppo", "--env-id", "tests.known_env:Counting-v0", "--vector-mode", vector_mode,
        "--seed", str(seed), "--num-envs", str(num_envs), "--num-steps", str(num_steps), *SMALL,
        "--total-timesteps", str(num_envs * num_steps * iterations),
    )  # fmt: skip
    expected = expected_batches([seed + i for i in range(num_envs)], episode_length, num_steps, iterations)
    assert sum(len(e) for e in expected) < num_envs * num_steps * iterations  # reset steps do occur
    assert [rows(b) for b in batches] == expected


@pytest.mark.parametrize("vector_mode", ["envpool", "ale"])
def test_envpool_batches_are_the_real_transitions(tmp_path, vector_mode):
    # A lost life terminates the training episode but is a real transition (no reset step follows).
    num_envs, num_steps, iterations, seed = 2, 32, 2, 3
    batches, _ = record(
        tmp_path, "cleanrl.ppo_atari_envpool", "--seed", str(seed), "--num-envs", str(num_envs),
        "--num-steps", str(num_steps), *SMALL, "--total-timesteps", str(num_envs * num_steps * iterations),
        "--no-cuda", "--vector-mode", vector_mode, fake_envpool=True,
    )  # fmt: skip
    expected = expected_batches([seed + i for i in range(num_envs)], game_length, num_steps, iterations)
    assert [rows(b) for b in batches] == expected
    assert record.sizes == [num_envs * num_steps] * iterations  # one minibatch size: the reset steps weigh 0


def test_appo_batches_are_the_real_transitions(tmp_path):
    """Every observation an actor acted on enters a batch once; no episode's final observation does."""
    batches, _ = record(
        tmp_path, "cleanrl.appo", "--env-id", "tests.known_env:Counting-v0", "--num-actors", "2", "--num-envs", "4",
        "--num-steps", "16", *SMALL, "--max-policy-lag", "1000", "--total-timesteps", "640", "--seed", "1",
    )  # fmt: skip
    seen = [row for b in batches for row in rows(b)]
    assert len(batches) == 10 and len(seen) == len(set(seen))  # no transition twice
    assert not any(final for *_, final in seen)  # no reset step
    episodes: dict[tuple[int, int], list[int]] = {}
    for env_seed, k, t, _ in seen:
        episodes.setdefault((env_seed, k), []).append(t)
    complete = [(s, k) for s, k in episodes if (s, k + 1) in episodes]  # a later episode began: this one was whole
    assert len(complete) > 10
    for env_seed, k in complete:  # none lost: every step of the episode was trained on
        assert sorted(episodes[env_seed, k]) == list(range(episode_length(env_seed, k))), (env_seed, k)


COUNTED = {
    "ppo_atari": ("cleanrl.ppo_atari", ["--num-envs", "2", "--num-steps", "128", "--no-cuda"]),
    "ppo_atari_multigpu": ("cleanrl.ppo_atari_multigpu", ["--num-envs", "2", "--num-steps", "128", "--no-cuda"]),
    "ppo_continuous_action": (
        "cleanrl.ppo_continuous_action",
        ["--env-id", "tests.known_env:CountingBox-v0", "--num-envs", "2", "--num-steps", "64"],
    ),
}


@pytest.mark.parametrize("case", list(COUNTED))
def test_batch_size_is_the_number_of_real_transitions(tmp_path, case):
    """Real games (and normalised observations) cannot be named: count the reset steps instead."""
    module, flags = COUNTED[case]
    num_envs, num_steps = int(flags[flags.index("--num-envs") + 1]), int(flags[flags.index("--num-steps") + 1])
    batches, resets = record(tmp_path, module, *flags, *SMALL, "--total-timesteps", str(2 * num_envs * num_steps))
    per_iteration = resets.reshape(2, num_steps).sum(axis=1)
    assert per_iteration.sum() > 0  # some episodes did end
    assert [len(b) for b in batches] == [num_envs * num_steps - r for r in per_iteration]
    if module != "cleanrl.ppo_continuous_action":  # the Atari scripts: one minibatch size, reset steps weigh 0
        assert record.sizes == [num_envs * num_steps] * 2
