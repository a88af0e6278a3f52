"""Blocks deliberately copied between scripts (each script stays self-contained) stay identical."""

import ast

import pytest

from tests.conftest import SCRIPTS

# name -> the scripts that must hold the very same definition
COPIES = {
    "fail": ["ppo.py", "ppo_atari.py", "ppo_atari_envpool.py", "ppo_continuous_action.py"],
    "fail (rank 0 prints)": ["ppo_atari_multigpu.py", "appo.py", "appo_atari.py"],
    "layer_init": [
        "ppo.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_continuous_action.py",
        "ppo_atari_multigpu.py",
        "appo.py",
        "appo_atari.py",
    ],
    "compute_gae": [
        "ppo.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_continuous_action.py",
        "ppo_atari_multigpu.py",
    ],
    "ppo_loss": [
        "ppo.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_continuous_action.py",
        "ppo_atari_multigpu.py",
        "appo.py",
        "appo_atari.py",
    ],
    "StopRequested": [
        "ppo.py",
        "ppo_atari.py",
        "ppo_atari_envpool.py",
        "ppo_continuous_action.py",
        "ppo_atari_multigpu.py",
        "appo.py",
        "appo_atari.py",
    ],
    "all_reduce_mean_": ["ppo_atari_multigpu.py", "appo.py", "appo_atari.py"],
    "vtrace": ["appo.py", "appo_atari.py"],
    "Agent (MLP)": ["ppo.py", "appo.py"],
    "Agent (Nature CNN)": ["ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py", "appo_atari.py"],
    "make_env (Atari)": ["ppo_atari.py", "ppo_atari_multigpu.py", "dqn_atari.py", "dqn_atari_multigpu.py"],
    "make_env (SAC)": ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"],
    "fail (off-policy)": ["dqn.py", "dqn_atari.py", "sac_continuous_action.py"],
    "fail (rank 0 prints, off-policy)": [
        "ppo_atari_multigpu.py",
        "dqn_atari_multigpu.py",
        "sac_continuous_action_multigpu.py",
    ],
    "StopRequested (off-policy)": [
        "ppo.py",
        "dqn.py",
        "dqn_atari.py",
        "dqn_atari_multigpu.py",
        "sac_continuous_action.py",
        "sac_continuous_action_multigpu.py",
    ],
    "td_target": ["dqn.py", "dqn_atari.py", "dqn_atari_multigpu.py"],
    "linear_schedule": ["dqn.py", "dqn_atari.py", "dqn_atari_multigpu.py"],
    "QNetwork (Nature CNN)": ["dqn_atari.py", "dqn_atari_multigpu.py"],
    "Actor": ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"],
    "SoftQNetwork": ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"],
    "soft_q_target": ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"],
    "polyak_update_": ["sac_continuous_action.py", "sac_continuous_action_multigpu.py"],
    "init_distributed": ["ppo_atari_multigpu.py", "dqn_atari_multigpu.py", "sac_continuous_action_multigpu.py"],
    "parameters_digest": ["ppo_atari_multigpu.py", "dqn_atari_multigpu.py", "sac_continuous_action_multigpu.py"],
    "all_reduce_mean_ (off-policy)": [
        "ppo_atari_multigpu.py",
        "dqn_atari_multigpu.py",
        "sac_continuous_action_multigpu.py",
    ],
}


def _definitions(script: str) -> dict[str, str]:
    tree = ast.parse((SCRIPTS / script).read_text())
    return {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)}


@pytest.mark.parametrize("label", list(COPIES))
def test_copied_blocks_are_identical(label):
    name = label.split(" ")[0]
    sources = {script: _definitions(script).get(name) for script in COPIES[label]}
    assert all(sources.values()), [s for s, src in sources.items() if src is None]
    reference = next(iter(sources.values()))
    assert all(src == reference for src in sources.values()), [s for s, src in sources.items() if src != reference]
