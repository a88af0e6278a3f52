"""The elastic re-split: the per-rank parts of a checkpoint written by N processes, made into parts for M.

Pure functions over checkpoint dicts (no process group: unit-tested without torchrun). Rank 0 calls
:func:`reshard` when a torchrun run resumes on another number of processes (``cleanrl_utils.distributed``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from cleanrl_utils.checkpoint import CheckpointError, content_digest, decode, encode

# What a rank's part of a checkpoint may hold, and how each is re-split (anything else is refused):
PER_ENV = ("next_obs", "next_done", "env_seeds")  # one row per env: concatenated in rank order, split again
DERIVED = ("rng", "action_space_rng")  # a rank's own generators: kept for ranks < N, derived for the others
COPIED = ("parameters_sha256",)  # equal on every rank (one model)


def reshard(parts: list[dict[str, Any]], world_size: int, path: str = "the checkpoint") -> list[dict[str, Any]]:
    """Re-split the per-rank parts of a checkpoint written by ``len(parts)`` processes for ``world_size``.

    Env ``i`` of the saved run (rank-major: rank r's env j is global env ``r * local + j``) continues
    as env ``i`` of the new one: its simulator state, vector-wrapper rows, next observation and done
    flag, and its replay ring (``replay``: one ring per env, so every stored transition lands in
    exactly one new shard). New rank r keeps old rank r's generators where it exists and gets
    generators seeded from them and r otherwise; local-SGD Adam moments (``local_optimizer``) are
    averaged: the ranks' parameters were just averaged, and the mean of their moment estimates is the
    estimate for the averaged model (a split would have nothing to split along). Raises
    CheckpointError (one line) when the envs do not divide among ``world_size`` processes.
    """
    n = len(parts)
    keys = set(parts[0])
    unknown = keys - {*PER_ENV, *DERIVED, *COPIED, "envs", "replay", "local_optimizer"}
    if unknown:
        raise CheckpointError(f"{path}: its per-process {', '.join(sorted(unknown))} cannot be re-split")
    total = sum(len(p["env_seeds"]) for p in parts) if "env_seeds" in keys else None
    if total is not None and total % world_size:
        works = ", ".join(str(m) for m in range(1, total + 1) if total % m == 0)
        raise CheckpointError(
            f"{path}: {total} envs in all (saved by {n} processes) do not split among {world_size} processes; "
            f"resume on {works} processes"
        )
    out: list[dict[str, Any]] = [{} for _ in range(world_size)]
    for r, part in enumerate(out):
        for key in COPIED:
            if key in keys:
                part[key] = parts[0][key]
        for key in DERIVED:
            if key in keys:
                part[key] = parts[r][key] if r < n else _derived(parts[r % n][key], r)
    if "local_optimizer" in keys:
        average = _mean_state([p["local_optimizer"] for p in parts])
        for part in out:
            part["local_optimizer"] = average
    if total is None:
        return out
    for key in PER_ENV:
        if key in keys:
            rows = _split(_concat([p[key] for p in parts]), world_size)
            for part, chunk in zip(out, rows):
                part[key] = chunk
    if "envs" in keys:
        snapshots = _split([s for p in parts for s in p["envs"]["envs"]], world_size)
        layers = [_split_layer([p["envs"]["wrappers"][i] for p in parts], world_size, n)
                  for i in range(len(parts[0]["envs"]["wrappers"]))]  # fmt: skip
        for r, part in enumerate(out):
            part["envs"] = {"envs": snapshots[r], "wrappers": [layer[r] for layer in layers]}
    if "replay" in keys:
        for part, replay in zip(out, _split_replay([p["replay"] for p in parts], world_size, path)):
            part["replay"] = replay
    return out


def _concat(chunks: list[Any]) -> Any:
    return torch.cat(chunks) if isinstance(chunks[0], torch.Tensor) else [x for c in chunks for x in c]


def _split(rows: Any, m: int) -> list[Any]:
    k = len(rows) // m
    return [rows[i * k : (i + 1) * k] for i in range(m)]


def _split_layer(states: list[dict[str, Any]], m: int, n: int) -> list[dict[str, Any]]:
    """A vector wrapper's state (e.g. RecordEpisodeStatistics): its per-env arrays re-split, the rest
    (counters and queues of finished episodes: statistics, not dynamics) kept by rank r < N, rank 0's otherwise."""
    out = [dict(states[r] if r < n else states[0]) for r in range(m)]
    local = None
    for name in states[0]:
        values = [decode(s[name]) for s in states]
        if isinstance(values[0], np.ndarray) and values[0].ndim >= 1:
            local = local or len(values[0])
            if all(len(v) == local for v in values):
                for part, chunk in zip(out, _split(np.concatenate(values), m)):
                    part[name] = encode(chunk)
    return out


def _split_replay(replays: list[dict[str, Any]], m: int, path: str) -> list[dict[str, Any]]:
    """Per-env rings (``cleanrl_utils.buffers.ReplayBuffer``, env on axis 1) regrouped into ``m`` shards."""
    if len({int(r["steps"]) for r in replays}) != 1:
        raise CheckpointError(f"{path}: its replay shards hold different numbers of steps")
    arrays = [k for k, v in replays[0].items() if isinstance(v, torch.Tensor)]
    joined = {k: torch.cat([r[k] for r in replays], dim=1) for k in arrays}
    k = joined[arrays[0]].shape[1] // m
    n = len(replays)
    return [
        {
            **{name: joined[name][:, i * k : (i + 1) * k].clone() for name in arrays},
            "steps": replays[0]["steps"],
            "rng": replays[i]["rng"] if i < n else _derived(replays[i % n]["rng"], i),
        }
        for i in range(m)
    ]


def _seed_from(state: Any, rank: int) -> int:
    return int(content_digest({"state": state, "rank": rank})[:16], 16)


def _derived(state: Any, rank: int) -> Any:
    """Generators for a new rank, seeded deterministically from an old rank's and the new rank's index:
    ``rng_state()``'s dict (python, numpy, torch; CUDA then starts from the script's seed) or a numpy
    bit generator's state."""
    seed = _seed_from(state, rank)
    if isinstance(state, dict) and "torch" in state:
        return {
            "python": encode(random.Random(seed).getstate()),
            "numpy": encode(np.random.RandomState(seed % 2**32).get_state()),
            "torch": torch.Generator().manual_seed(seed % 2**63).get_state(),
        }
    return np.random.default_rng(seed).bit_generator.state


def _mean_state(states: list[Any]) -> Any:
    """The element-wise mean of optimizer state dicts (floating tensors averaged, the rest rank 0's)."""
    first = states[0]
    if isinstance(first, torch.Tensor) and first.is_floating_point() and first.ndim > 0:
        return torch.stack(states).mean(0)
    if isinstance(first, dict):
        return {k: _mean_state([s[k] for s in states]) for k in first}
    if isinstance(first, list):
        return [_mean_state(list(items)) for items in zip(*states)]
    return first
