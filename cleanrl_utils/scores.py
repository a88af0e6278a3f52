"""Reference scores and score aggregation shared by the tuner and the plots.

A normalised score is ``(score - low) / (high - low)``: 0 at ``low``, 1 at ``high``. For Atari,
``low`` is a uniformly random policy and ``high`` a professional human tester, the scores
published with the Nature DQN and used across the literature (DQN Zoo's table, 30 no-op starts);
an agent at 1.0 plays as well as the human. For classic control the bounds are the worst and the
best return an episode can have (CartPole-v1: 0 and 500), as CleanRL's tuning examples use them.
"""

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# game: (random, human)
ATARI_SCORES: dict[str, tuple[float, float]] = {
    "Alien": (227.8, 7127.7), "Amidar": (5.8, 1719.5), "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3), "Asteroids": (719.1, 47388.7), "Atlantis": (12850.0, 29028.1),
    "BankHeist": (14.2, 753.1), "BattleZone": (2360.0, 37187.5), "BeamRider": (363.9, 16926.5),
    "Berzerk": (123.7, 2630.4), "Bowling": (23.1, 160.7), "Boxing": (0.1, 12.1),
    "Breakout": (1.7, 30.5), "Centipede": (2090.9, 12017.0), "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4), "Defender": (2874.5, 18688.9), "DemonAttack": (152.1, 1971.0),
    "DoubleDunk": (-18.6, -16.4), "Enduro": (0.0, 860.5), "FishingDerby": (-91.7, -38.7),
    "Freeway": (0.0, 29.6), "Frostbite": (65.2, 4334.7), "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4), "Hero": (1027.0, 30826.4), "IceHockey": (-11.2, 0.9),
    "Jamesbond": (29.0, 302.8), "Kangaroo": (52.0, 3035.0), "Krull": (1598.0, 2665.5),
    "KungFuMaster": (258.5, 22736.3), "MontezumaRevenge": (0.0, 4753.3), "MsPacman": (307.3, 6951.6),
    "NameThisGame": (2292.3, 8049.0), "Phoenix": (761.4, 7242.6), "Pitfall": (-229.4, 6463.7),
    "Pong": (-20.7, 14.6), "PrivateEye": (24.9, 69571.3), "Qbert": (163.9, 13455.0),
    "Riverraid": (1338.5, 17118.0), "RoadRunner": (11.5, 7845.0), "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7), "Skiing": (-17098.1, -4336.9), "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7), "StarGunner": (664.0, 10250.0), "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3), "TimePilot": (3568.0, 5229.2), "Tutankham": (11.4, 167.6),
    "UpNDown": (533.4, 11693.2), "Venture": (0.0, 1187.5), "VideoPinball": (16256.9, 17667.9),
    "WizardOfWor": (563.5, 4756.5), "YarsRevenge": (3092.9, 54576.9), "Zaxxon": (32.5, 9173.3),
}  # fmt: skip

# env id: (worst, best) episode return
CLASSIC_SCORES: dict[str, tuple[float, float]] = {
    "CartPole-v0": (0.0, 200.0),
    "CartPole-v1": (0.0, 500.0),
    "Acrobot-v1": (-500.0, 0.0),
    "MountainCar-v0": (-200.0, -100.0),
    "Pendulum-v1": (-1600.0, 0.0),
}

AGGREGATIONS = ("mean", "average", "median", "iqm", "max", "min")


def atari_game(env_id: str) -> str | None:
    """The game of an ALE id in any spelling: BreakoutNoFrameskip-v4, ALE/Breakout-v5, Breakout-v5."""
    match = re.fullmatch(r"(?:ALE/)?([A-Za-z]+?)(?:NoFrameskip|Deterministic)?-v\d+", env_id)
    if match is None:
        return None
    name = match.group(1)
    for game in ATARI_SCORES:
        if game.lower() == name.lower():
            return game
    return None


def reference_scores(env_id: str, table: dict[str, Sequence[float]] | None = None) -> tuple[float, float] | None:
    """(low, high) for ``env_id``: from ``table`` if it names it, else the built-in tables, else None."""
    if table and env_id in table:
        low, high = table[env_id]
        return float(low), float(high)
    if env_id in CLASSIC_SCORES:
        return CLASSIC_SCORES[env_id]
    game = atari_game(env_id)
    return ATARI_SCORES[game] if game else None


def normalize(score: float, reference: tuple[float, float] | None) -> float:
    """``score`` on the 0 (low) to 1 (high) scale of ``reference``; the raw score without one."""
    if reference is None:
        return float(score)
    low, high = reference
    return (float(score) - low) / (high - low)


def iqm(values: Sequence[float]) -> float:
    """Interquartile mean: the mean of the middle 50% (rliable's definition, 25% trimmed each side)."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(values, dtype=np.float64), proportiontocut=0.25, axis=None))


def aggregate(values: Sequence[float], how: str) -> float:
    """Mean (CleanRL's ``average``), median, IQM, max or min of ``values``."""
    values = np.asarray(values, dtype=np.float64)
    if how in ("mean", "average"):
        return float(values.mean())
    if how == "median":
        return float(np.median(values))
    if how == "iqm":
        return iqm(values)
    if how == "max":
        return float(values.max())
    if how == "min":
        return float(values.min())
    raise ValueError(f"aggregation {how!r}: must be one of {', '.join(AGGREGATIONS)}")


def load_reference_file(path: str | Path) -> dict[str, tuple[float, float]]:
    """A JSON file ``{"env-id": [low, high], ...}``; raises ValueError naming a bad entry."""
    data = json.loads(Path(path).read_text())
    table = {}
    for env_id, pair in data.items():
        if not (isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(v, int | float) for v in pair)):
            raise ValueError(f"{path}: {env_id}: must be [low, high], got {pair!r}")
        if not math.isfinite(pair[0]) or not math.isfinite(pair[1]) or pair[0] == pair[1]:
            raise ValueError(f"{path}: {env_id}: low and high must be finite and differ, got {pair!r}")
        table[env_id] = (float(pair[0]), float(pair[1]))
    return table
