"""Optimizer steps that a NaN or an infinity never reaches, decided on the device without a host wait.

Every update site of every script reads like nanoGPT's ``scaler.step(optimizer)``:

    nan_guard = NaNGuard(device)                        # once, beside the optimizer
    ...
    loss.backward()
    grad_norm = nn.utils.clip_grad_norm_(params, max_grad_norm)
    nan_guard.step(optimizer, grad_norm, global_step)   # optimizer.step(), skipped if grad_norm is NaN/inf
    ...
    nan_guard.check(run.last_checkpoint)                # where the run logs: raise if a step was skipped

The optimizer is a fused Adam, whose kernel takes a ``found_inf`` input (the one
``torch.amp.GradScaler`` feeds it): when it is 1 the kernel leaves the weights, the moments and the
step count as they were. ``step`` computes that flag from the checked value on the device, so the
hot loop never waits for the GPU, and remembers the first skipped step there. ``check`` is the one
host read of that record: at logging and right before every checkpoint, so no checkpoint holds
weights trained past a non-finite step and the run stops naming the step and the last good file.
"""

from __future__ import annotations

from pathlib import Path

import torch


class NaNGuard:
    """``optimizer.step()`` unless the checked value is NaN or infinite; the first skipped step is kept."""

    def __init__(self, device: torch.device, what: str = "gradient norm"):
        self.what = what  # what is checked, for the error line
        self.first_skipped = torch.full((), -1, dtype=torch.int64, device=device)  # env step; -1: none

    def step(self, optimizer: torch.optim.Optimizer, value: torch.Tensor, global_step: int) -> None:
        """Step ``optimizer`` (a fused Adam), or skip the step on the device when ``value`` is not finite."""
        if not optimizer.defaults.get("fused"):
            raise TypeError(f"NaNGuard.step needs an optimizer built with fused=True, got {type(optimizer).__name__}")
        found = (~torch.isfinite(value)).any().float()
        self.first_skipped = torch.where((found > 0) & (self.first_skipped < 0), global_step, self.first_skipped)
        optimizer.found_inf = found
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf

    def check(self, last_checkpoint: Path | None, agree=None) -> None:
        """Raise :class:`FloatingPointError` if any step was skipped (one host read). Under torchrun ``agree``
        (``ranks.max``) makes every rank decide the same."""
        first = int(self.first_skipped if agree is None else agree(self.first_skipped))
        if first >= 0:
            raise FloatingPointError(
                f"non-finite {self.what} at step {first}; last good checkpoint: {last_checkpoint or 'none'}"
            )
