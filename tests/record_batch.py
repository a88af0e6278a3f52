"""Launcher: run a script recording the observations of every training batch.

    BATCH_RECORD=out.npz python tests/record_batch.py cleanrl.ppo [flags]

Training calls of ``Agent.evaluate`` (gradients on) receive the minibatches; with one epoch of one
minibatch each call is one update's whole batch. The scripts with fixed-size minibatches (a
``minibatch_loss`` whose rows weigh 0 or 1) record the rows that weigh 1, and each minibatch's size. The launcher also records, for every step of a
gymnasium ``SyncVectorEnv``, how many envs that step only resets (its autoreset flags), so a test
knows how many real transitions a rollout held. ``FAKE_ENVPOOL=1`` swaps in tests/fake_envpool.py (for EnvPool and ALE).
"""

import atexit
import importlib
import os
import sys

import numpy as np
import torch
from gymnasium.vector import SyncVectorEnv

batches: list[np.ndarray] = []
sizes: list[int] = []
resets: list[int] = []


def record(module) -> None:
    evaluate_, step_ = module.Agent.evaluate, SyncVectorEnv.step

    def evaluate(self, x, action):
        if torch.is_grad_enabled() and not torch.is_inference_mode_enabled():
            batches.append(x.detach().cpu().numpy().copy())
            sizes.append(len(x))
        return evaluate_(self, x, action)

    def step(self, actions):
        resets.append(int(np.sum(self._autoreset_envs)))
        return step_(self, actions)

    SyncVectorEnv.step = step
    if hasattr(module, "minibatch_loss"):
        loss_ = module.minibatch_loss

        def minibatch_loss(agent, mb, **coefs):
            batches.append(mb["obs"][mb["weights"] > 0].detach().cpu().numpy().copy())
            sizes.append(len(mb["obs"]))
            return loss_(agent, mb, **coefs)

        module.minibatch_loss = minibatch_loss
    else:
        module.Agent.evaluate = evaluate


def save() -> None:
    arrays = {f"arr_{i}": batch for i, batch in enumerate(batches)}
    np.savez(os.environ["BATCH_RECORD"], resets=np.array(resets, dtype=np.int64), sizes=np.array(sizes), **arrays)


if __name__ == "__main__":  # not in the processes an actor-learner script spawns
    module = importlib.import_module(sys.argv[1])
    record(module)
    if os.environ.get("FAKE_ENVPOOL"):
        from tests.fake_envpool import patch

        patch()
    atexit.register(save)
    sys.argv = [module.__file__, *sys.argv[2:]]
    module.main()
