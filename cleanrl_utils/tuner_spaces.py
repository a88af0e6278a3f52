"""What the tuner searches and how it scores a trial: the search spaces shipped per script (keys are
the scripts' flags), the script an algorithm uses for an env family, and the objective of a run and
of a trial. No Optuna storage, no processes: the trial's life cycle is ``cleanrl_utils.trials``, the
workers and runs ``cleanrl_utils.tuner``.

A space maps a flag to ``{"low", "high"[, "log", "int"]}`` (a range), a list (a choice) or any other
value (fixed). The budget (``total-timesteps``) is fixed.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import optuna

from cleanrl_utils.scores import aggregate, atari_game

MUJOCO = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Humanoid", "Swimmer", "Reacher", "InvertedPendulum", "Pusher")

# --------------------------------------------------------------------------------------------
# Search spaces: keys are the scripts' flags; {"low", "high"[, "log", "int"]} is a range,
# a list is a choice, anything else a fixed value. The budget (total-timesteps) is fixed.
# --------------------------------------------------------------------------------------------
SPACES: dict[str, dict[str, Any]] = {
    "cleanrl/ppo.py": {
        "learning-rate": {"low": 1e-4, "high": 3e-3, "log": True},
        "num-steps": [16, 32, 64, 128],
        "num-minibatches": [1, 2, 4],
        "update-epochs": [4, 10, 20],
        "gamma": [0.95, 0.98, 0.99],
        "gae-lambda": [0.8, 0.9, 0.95],
        "ent-coef": [0.0, 0.001, 0.01],
        "vf-coef": {"low": 0.25, "high": 1.0},
        "max-grad-norm": {"low": 0.3, "high": 5.0, "log": True},
        "total-timesteps": 100_000,
    },
    "cleanrl/ppo_atari.py": {
        "learning-rate": {"low": 1e-4, "high": 1e-3, "log": True},
        "num-steps": [64, 128, 256],
        "num-minibatches": [2, 4, 8],
        "update-epochs": [2, 4, 8],
        "clip-coef": [0.1, 0.2, 0.3],
        "ent-coef": [0.001, 0.01, 0.03],
        "vf-coef": {"low": 0.25, "high": 1.0},
        "total-timesteps": 2_000_000,
    },
    "cleanrl/ppo_continuous_action.py": {
        "learning-rate": {"low": 1e-4, "high": 1e-3, "log": True},
        "num-steps": [512, 1024, 2048],
        "num-minibatches": [8, 16, 32],
        "update-epochs": [5, 10, 20],
        "gae-lambda": [0.9, 0.95, 0.98],
        "ent-coef": [0.0, 0.001],
        "total-timesteps": 500_000,
    },
    "cleanrl/dqn.py": {
        "learning-rate": {"low": 1e-4, "high": 2e-3, "log": True},
        "batch-size": [64, 128, 256],
        "train-frequency": [4, 8, 16],
        "gradient-steps": [1, 4, 8],
        "target-network-frequency": [128, 500, 1000],
        "exploration-fraction": {"low": 0.05, "high": 0.3},
        "gamma": [0.98, 0.99],
        "total-timesteps": 60_000,
    },
    "cleanrl/dqn_atari.py": {
        "learning-rate": {"low": 3e-5, "high": 3e-4, "log": True},
        "batch-size": [32, 64],
        "target-network-frequency": [1000, 4000],
        "exploration-fraction": [0.05, 0.1, 0.2],
        "total-timesteps": 2_000_000,
    },
    "cleanrl/sac_continuous_action.py": {
        "policy-lr": {"low": 1e-4, "high": 1e-3, "log": True},
        "q-lr": {"low": 3e-4, "high": 3e-3, "log": True},
        "batch-size": [128, 256, 512],
        "tau": [0.005, 0.01, 0.02],
        "gamma": [0.98, 0.99],
        "total-timesteps": 300_000,
    },
    "cleanrl/appo.py": {
        "learning-rate": {"low": 1e-4, "high": 3e-3, "log": True},
        "num-steps": [16, 32, 64],
        "update-epochs": [4, 10, 20],
        "max-policy-lag": [2, 4, 8],
        "gamma": [0.95, 0.98, 0.99],
        "total-timesteps": 150_000,
    },
    "cleanrl/appo_atari.py": {
        "learning-rate": {"low": 1e-4, "high": 1e-3, "log": True},
        "num-steps": [64, 128],
        "num-minibatches": [2, 4],
        "update-epochs": [2, 4],
        "clip-coef": [0.1, 0.2],
        "total-timesteps": 2_000_000,
    },
}
# algorithm family -> env family -> script
FAMILIES: dict[str, dict[str, str]] = {
    "ppo": {"classic": "cleanrl/ppo.py", "atari": "cleanrl/ppo_atari.py", "mujoco": "cleanrl/ppo_continuous_action.py"},
    "dqn": {"classic": "cleanrl/dqn.py", "atari": "cleanrl/dqn_atari.py"},
    "sac": {"mujoco": "cleanrl/sac_continuous_action.py"},
    "appo": {"classic": "cleanrl/appo.py", "atari": "cleanrl/appo_atari.py"},
}


class TunerError(Exception):
    """Bad input to the tuner: one line, exit code 2 from the command line."""


def env_family(env_id: str) -> str:
    if atari_game(env_id):
        return "atari"
    if env_id.split("-v")[0] in MUJOCO:
        return "mujoco"
    return "classic"


def script_for(algorithm: str, env_ids: list[str]) -> str:
    """The script of ``algorithm`` for these envs (ppo: ppo.py for classic control, ppo_atari.py for Atari...)."""
    if algorithm not in FAMILIES:
        raise TunerError(f"--algorithm {algorithm}: must be one of {', '.join(FAMILIES)} (or give --script)")
    kinds = {env_family(env_id) for env_id in env_ids}
    if len(kinds) > 1:
        raise TunerError(f"--env-ids {' '.join(env_ids)}: mixes {' and '.join(sorted(kinds))} envs; tune them apart")
    kind = kinds.pop()
    if kind not in FAMILIES[algorithm]:
        raise TunerError(f"--algorithm {algorithm}: has no script for {kind} envs ({', '.join(env_ids)})")
    return FAMILIES[algorithm][kind]


def load_space(path: str | Path) -> dict[str, Any]:
    """A search space from a JSON or TOML file."""
    path = Path(path)
    try:
        text = path.read_text()
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as error:
        raise TunerError(f"--space {path}: {error}") from None


def space_params_fn(space: dict[str, Any]) -> Callable[[optuna.Trial], dict[str, Any]]:
    """Turn a search-space dict into a CleanRL-style ``params_fn(trial) -> {flag: value}``."""
    for key, spec in space.items():
        if isinstance(spec, dict) and not ({"low", "high"} <= set(spec) and set(spec) <= {"low", "high", "log", "int"}):
            raise TunerError(f"search space {key}: a range is {{low, high[, log, int]}}, got {spec}")
        if isinstance(spec, list) and not spec:
            raise TunerError(f"search space {key}: an empty list of choices")

    def params_fn(trial: optuna.Trial) -> dict[str, Any]:
        params = {}
        for key, spec in space.items():
            if isinstance(spec, dict):
                is_int = spec.get("int", isinstance(spec["low"], int) and isinstance(spec["high"], int))
                suggest = trial.suggest_int if is_int else trial.suggest_float
                params[key] = suggest(key, spec["low"], spec["high"], log=spec.get("log", False))
            elif isinstance(spec, list):
                params[key] = trial.suggest_categorical(key, spec)
            else:
                params[key] = spec
        return params

    return params_fn


def flag_args(params: dict[str, Any]) -> list[str]:
    """``{"learning-rate": 0.001, "anneal_lr": False}`` -> ``--learning-rate 0.001 --anneal-lr False``."""
    argv = []
    for key, value in params.items():
        argv += [f"--{key.replace('_', '-').lstrip('-')}", str(value)]
    return argv


# --------------------------------------------------------------------------------------------
# The objective of one run, and of a trial
# --------------------------------------------------------------------------------------------
def run_score(steps: list[int], values: list[float], objective: str, window: int, upto: float = math.inf):
    """The score of one run from its points up to env step ``upto``; None before any episode ended.

    ``last``: the mean of the last ``window`` values. ``auc``: the area under the curve of the values
    against env steps, divided by the steps it spans (a run that learns early scores higher).
    """
    points = [(s, v) for s, v in zip(steps, values) if s <= upto]
    if not points:
        return None
    s, v = np.array([p[0] for p in points], dtype=np.float64), np.array([p[1] for p in points], dtype=np.float64)
    if objective == "last" or len(points) == 1 or s[-1] == s[0]:
        return float(v[-window:].mean())
    return float(np.trapezoid(v, s) / (s[-1] - s[0]))


def trial_value(scores: dict[str, list[float]], how: str) -> float:
    """Aggregate normalised run scores ``{env_id: [score per seed]}`` into one value.

    mean/median/max/min: over envs of each env's mean over seeds; iqm: over all runs pooled (rliable's IQM).
    """
    if how == "iqm":
        return aggregate([s for per_env in scores.values() for s in per_env], "iqm")
    return aggregate([float(np.mean(per_env)) for per_env in scores.values()], how)
