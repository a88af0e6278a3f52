"""Launcher: run a training script and count where its host waits for the GPU, by the line of cleanrl/ or
cleanrl_utils/ that asked.

    SYNC_REPORT=syncs.json python benchmark/count_syncs.py cleanrl/dqn.py --total-timesteps 3000
    SYNC_REPORT=syncs.json torchrun --nproc-per-node 1 benchmark/count_syncs.py cleanrl/appo.py

On CUDA every synchronizing call is counted, under ``torch.cuda.set_sync_debug_mode("warn")`` (an
``.item()``, a ``.cpu()``, a copy from pageable memory, a data-dependent shape). On a machine without a
GPU the calls that would wait on one are counted instead: the reads of a tensor's value (``item``,
``tolist``, ``bool``/``float``/``int``), copies to the host (``cpu()``) and uploads that skip pinned
memory (``torch.as_tensor``/``torch.tensor`` with a device, ``Tensor.to`` a device without
``non_blocking``), so the CPU dry run of benchmark/gpu_check.py shows the same budget.

Writes (rank 0 under torchrun) to $SYNC_REPORT at exit: ``{"syncs": {"file:line": n}, "checkpoint":
{"file:line": n}, "cudagraphs": {...}}``. Waits made while a checkpoint is written are kept apart (they
happen once per checkpoint, not per step); ``cudagraphs`` says, for a ``--compile --cudagraphs`` run,
how many CUDA graphs torch.compile recorded and how often it skipped one.
"""

import atexit
import collections
import json
import os
import runpy
import sys
import traceback
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OURS = (str(ROOT / "cleanrl") + os.sep, str(ROOT / "cleanrl_utils") + os.sep)
CHECKPOINTING = (str(ROOT / "cleanrl_utils" / "checkpoint.py"),)  # a wait inside these is a checkpoint's
CHECKPOINT_CALLS = {("save", "run.py"), ("parameters_digest", "distributed.py")}  # and inside these calls
counts: dict[str, collections.Counter[str]] = {"syncs": collections.Counter(), "checkpoint": collections.Counter()}
_show = warnings.showwarning
_shown: set[tuple] = set()


def charge(skip: int = 2) -> None:
    """Count one wait against the innermost frame of our own code on the stack (a wait inside torch is charged
    to its caller); under a checkpoint write (checkpoint.py or ``Run.save`` on the stack) in a bucket of its own."""
    stack = traceback.extract_stack()[:-skip]
    ours = [f for f in stack if f.filename.startswith(OURS)]
    if not ours:
        counts["syncs"]["elsewhere"] += 1
        return
    saving = any(
        f.filename.startswith(CHECKPOINTING) or (f.name, Path(f.filename).name) in CHECKPOINT_CALLS for f in ours
    )
    where = f"{Path(ours[-1].filename).relative_to(ROOT)}:{ours[-1].lineno}"
    counts["checkpoint" if saving else "syncs"][where] += 1


def count_warning(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" in str(message):
        charge(skip=2)
    elif (category, filename, lineno) not in _shown:  # other warnings: once each, as usual
        _shown.add((category, filename, lineno))
        _show(message, category, filename, lineno, file, line)


def _from_ours() -> bool:
    return sys._getframe(2).f_code.co_filename.startswith(OURS)


def counted(function, is_wait=lambda *args, **kwargs: True):
    """``function`` that charges a wait when called from our code and ``is_wait`` says it would wait on a GPU."""

    def wrapper(*args, **kwargs):
        if _from_ours() and is_wait(*args, **kwargs):
            charge(skip=2)
        return function(*args, **kwargs)

    return wrapper


def _upload(*args, **kwargs) -> bool:
    """``torch.as_tensor``/``torch.tensor`` with a device: from pageable memory (pinned uploads use ``Tensor.to``)."""
    return kwargs.get("device") is not None


def _blocking_to(self, *args, **kwargs) -> bool:
    """``Tensor.to`` a device from the host without ``non_blocking``: on a GPU, a pageable upload that waits."""
    target = kwargs.get("device", args[0] if args and isinstance(args[0], str | torch.device) else None)
    return target is not None and self.device.type == "cpu" and not kwargs.get("non_blocking", False)


if torch.cuda.is_available():
    warnings.showwarning = count_warning
    warnings.simplefilter("always")  # every occurrence, not the first per line
    torch.set_warn_always(True)
    torch.cuda.set_sync_debug_mode("warn")
else:  # the CPU dry run: the calls that would wait on a GPU
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "cpu"):
        setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))
    torch.Tensor.to = counted(torch.Tensor.to, _blocking_to)
    torch.as_tensor = counted(torch.as_tensor, _upload)
    torch.tensor = counted(torch.tensor, _upload)


def cudagraphs() -> dict[str, int | None]:
    """CUDA graphs torch.compile recorded on this process's GPU, and the times it skipped one (None: unknown)."""
    if "torch._inductor" not in sys.modules or not torch.cuda.is_available():
        return {"recorded": 0, "skipped": 0}
    from torch._dynamo.utils import counters

    recorded = None
    try:  # cudagraph trees number every graph they record: the next number is the count
        from torch._inductor.cudagraph_trees import get_manager

        manager = get_manager(torch.cuda.current_device(), create_if_none_exists=False)
        recorded = 0 if manager is None else next(manager.graph_counter)
    except (ImportError, AttributeError, TypeError):
        pass
    return {"recorded": recorded, "skipped": int(counters["inductor"]["cudagraph_skips"])}


@atexit.register
def report() -> None:
    if os.environ.get("RANK", "0") == "0" and os.environ.get("SYNC_REPORT"):
        out = {kind: dict(c.most_common()) for kind, c in counts.items()} | {"cudagraphs": cudagraphs()}
        Path(os.environ["SYNC_REPORT"]).write_text(json.dumps(out, indent=1))


sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
