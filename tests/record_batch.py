"""Launcher: run a script with its ``Agent.evaluate`` recording the observations of every training batch.

    BATCH_RECORD=out.npz python tests/record_batch.py cleanrl.ppo [flags]

Training calls of ``Agent.evaluate`` (gradients on) receive the minibatches; with one epoch of one
minibatch each call is one update's whole batch. The launcher also records, for every step of a
gymnasium ``SyncVectorEnv``, how many envs that step only resets (its autoreset flags), so a test
knows how many real transitions a rollout held. ``FAKE_ENVPOOL=1`` swaps in tests/fake_envpool.py.
"""

import atexit
import importlib
import os
import sys

import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv

batches: list[np.ndarray] = []
resets: list[int] = []


def record(module) -> None:
    evaluate_, step_ = module.Agent.evaluate, SyncVectorEnv.step

    def evaluate(self, x, action):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            batches.append(x.detach().cpu().numpy().copy())
        return evaluate_(self, x, action)

    def step(self, actions):
        resets.append(int(np.sum(self._autoreset_envs)))
        return step_(self, actions)

    module.Agent.evaluate, SyncVectorEnv.step = evaluate, step


def save() -> None:
    arrays = {f"arr_{i}": batch for i, batch in enumerate(batches)}
    np.savez(os.environ["BATCH_RECORD"], resets=np.array(resets, dtype=np.int64), **arrays)


if __name__ == "__main__":  # not in the processes an actor-learner script spawns
    module = importlib.import_module(sys.argv[1])
    record(module)
    if os.environ.get("FAKE_ENVPOOL"):
        import envpool

        from tests.fake_envpool import make

        envpool.make = make
    atexit.register(save)
    sys.argv = [module.__file__, *sys.argv[2:]]
    module.main()
