"""A parameter server in shared memory: the learner publishes weights with a version number, actor
processes pull the newest version. Single writer, any number of readers, no locks.

Why no lock: an actor killed while holding a lock would freeze the learner at its next publish.
Instead, reads use a sequence counter (a seqlock): the writer makes the counter odd, writes the
weights, stores the version and a checksum, and makes the counter even again. A reader copies the
weights and accepts the copy only if the counter was even and unchanged around the copy *and*
the copy's checksum matches the published one. The checksum makes the check hold on CPUs that
may reorder memory accesses (Arm), where the counter alone would not be enough.
"""

import time

import torch
import torch.nn as nn


def _flat_parameters(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).cpu()


def _checksum(flat: torch.Tensor) -> int:
    """Sum of the float32 bit patterns as integers: exact, so any summation order (or thread count,
    which differs between the learner and the actors) gives the same number."""
    return int(flat.view(torch.int32).sum(dtype=torch.int64))


class ParameterServer:
    """Shared-memory weights of ``module``'s shape. Create it before starting the readers and pass it
    to them (its tensors travel as shared memory with torch.multiprocessing)."""

    def __init__(self, module: nn.Module):
        self.buffer = torch.zeros(sum(p.numel() for p in module.parameters()), dtype=torch.float32).share_memory_()
        # [sequence (odd while writing), version]
        self.counters = torch.zeros(2, dtype=torch.int64).share_memory_()
        self.checksum = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.counters[1] = -1  # nothing published yet

    def publish(self, module: nn.Module, version: int) -> None:
        """Learner side: make ``module``'s current weights the newest version."""
        flat = _flat_parameters(module)
        self.counters[0] += 1
        self.buffer.copy_(flat)
        self.counters[1] = version
        self.checksum[0] = _checksum(flat)
        self.counters[0] += 1

    @property
    def version(self) -> int:
        return int(self.counters[1])

    def pull(self, module: nn.Module, have_version: int, timeout: float = 10.0) -> int:
        """Reader side: load the newest weights into ``module`` unless it already has them.

        Returns the version now in ``module``. Retries while a publish is in progress.
        """
        deadline = time.monotonic() + timeout
        scratch = torch.empty_like(self.buffer)
        while True:
            before = int(self.counters[0])
            version = int(self.counters[1])
            if before % 2 == 0:
                if version == have_version:
                    return version
                scratch.copy_(self.buffer)
                checksum = int(self.checksum[0])
                if int(self.counters[0]) == before and _checksum(scratch) == checksum:
                    offset = 0
                    with torch.no_grad():
                        for p in module.parameters():
                            p.copy_(scratch[offset : offset + p.numel()].view_as(p))
                            offset += p.numel()
                    return version
            if time.monotonic() > deadline:
                raise TimeoutError("could not read a consistent set of weights from the parameter server")
            time.sleep(0.0005)
