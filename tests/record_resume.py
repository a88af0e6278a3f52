"""Launcher: run a torchrun script and record, on every rank, what it restored from a checkpoint.

    RESUME_RECORD=dir torchrun --nproc-per-node=M tests/record_resume.py cleanrl.ppo_atari_multigpu --resume ...

Writes ``dir/rank<r>.pt`` with the digest of every env's state right after the script restored it
(``set_vector_state``, captured again), and the observations, parameters and torch generator the
policy's first action is computed from, so a test can compare them with what the checkpoint saved.
"""

import importlib
import os
import sys
from pathlib import Path

import torch

import cleanrl_utils.envs as envs_module
from cleanrl_utils.checkpoint import content_digest
from cleanrl_utils.distributed import parameters_digest

record: dict = {}
out = Path(os.environ["RESUME_RECORD"]) / f"rank{os.environ.get('RANK', '0')}.pt"
restore = envs_module.set_vector_state


def set_vector_state(envs, state) -> None:
    restore(envs, state)
    record["envs"] = [content_digest(s) for s in envs_module.get_vector_state(envs)["envs"]]


envs_module.set_vector_state = set_vector_state
module = importlib.import_module(sys.argv[1])
act = module.Agent.act


def first_act(self, x):
    if "first_obs" not in record:
        record["first_obs"], record["parameters_sha256"] = x.detach().cpu().clone(), parameters_digest(self)
        record["torch_rng"] = torch.get_rng_state()  # the generator the first actions are sampled with
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(record, out)
    return act(self, x)


module.Agent.act = first_act
sys.argv = [module.__file__, *sys.argv[2:]]
module.main()
