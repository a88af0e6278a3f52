"""Launcher: run a training script with ``torch.cuda.set_sync_debug_mode("warn")`` and count the host
syncs it makes, by the line of cleanrl/ or cleanrl_utils/ that asked for them.

    SYNC_REPORT=syncs.json python benchmark/count_syncs.py cleanrl/dqn.py --total-timesteps 3000
    SYNC_REPORT=syncs.json torchrun --nproc-per-node 1 benchmark/count_syncs.py cleanrl/appo.py

Writes ``{"file:line": count}`` (rank 0 under torchrun) to $SYNC_REPORT at exit. Each count is one
synchronizing CUDA call (an ``.item()``, a ``.cpu()``, a copy from pageable memory, a data-dependent
shape): the host waited for the GPU there.
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
counts: collections.Counter[str] = collections.Counter()
_show = warnings.showwarning
_shown: set[tuple] = set()


def where() -> str:
    """The innermost frame of our own code on the stack (a sync inside torch is charged to its caller)."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if frame.filename.startswith(OURS):
            return f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno}"
    return "elsewhere"


def count(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" in str(message):
        counts[where()] += 1
    elif (category, filename, lineno) not in _shown:  # other warnings: once each, as usual
        _shown.add((category, filename, lineno))
        _show(message, category, filename, lineno, file, line)


if torch.cuda.is_available():
    warnings.showwarning = count
    warnings.simplefilter("always")  # every occurrence, not the first per line
    torch.set_warn_always(True)
    torch.cuda.set_sync_debug_mode("warn")


@atexit.register
def report() -> None:
    if os.environ.get("RANK", "0") == "0" and os.environ.get("SYNC_REPORT"):
        Path(os.environ["SYNC_REPORT"]).write_text(json.dumps(dict(counts.most_common()), indent=1))


sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
