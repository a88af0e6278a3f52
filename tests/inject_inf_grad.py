"""Launcher: run a script whose backward passes get an infinite gradient from the N-th on, the loss itself finite.

INF_GRAD_AFTER=N python tests/inject_inf_grad.py cleanrl/sac_continuous_action.py [flags]
"""

import os
import runpy
import sys

import torch

_backward, calls = torch.Tensor.backward, [0]


def backward(self, gradient=None, *args, **kwargs):
    calls[0] += 1
    if calls[0] > int(os.environ["INF_GRAD_AFTER"]) and self.dim() == 0:
        gradient = torch.full_like(self, float("inf"))  # d(loss) = inf: every gradient is inf/NaN, the loss is not
    return _backward(self, gradient, *args, **kwargs)


torch.Tensor.backward = backward
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
