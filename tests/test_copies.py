"""Blocks deliberately copied between scripts (each script stays self-contained) stay identical."""

import ast

import pytest

from tests.conftest import SCRIPTS

PPO_SCRIPTS = ["ppo.py", "ppo_atari.py", "ppo_atari_envpool.py", "ppo_continuous_action.py"]
SHARED = ["fail", "layer_init", "compute_gae", "ppo_loss", "StopRequested"]


def _definitions(script: str) -> dict[str, str]:
    tree = ast.parse((SCRIPTS / script).read_text())
    return {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}


@pytest.mark.parametrize("name", SHARED)
def test_copied_blocks_are_identical(name):
    # ppo_atari_multigpu.py prints errors on rank 0 only, so its `fail` differs on purpose.
    scripts = PPO_SCRIPTS + (["ppo_atari_multigpu.py"] if name != "fail" else [])
    sources = {script: _definitions(script).get(name) for script in scripts}
    assert all(sources.values()), [s for s, src in sources.items() if src is None]
    reference = sources["ppo.py"]
    assert all(src == reference for src in sources.values()), [s for s, src in sources.items() if src != reference]


def test_multigpu_keeps_ppo_atari_model_and_env():
    atari, multi = _definitions("ppo_atari.py"), _definitions("ppo_atari_multigpu.py")
    for name in ("Agent", "make_env"):
        assert atari[name] == multi[name], name
