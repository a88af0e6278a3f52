"""Launcher: run a script and count its host reads of tensor values, by the line that made them.

python tests/count_reads.py cleanrl/dqn.py [flags]   (with READS_REPORT=<file> in the environment)

A read is ``Tensor.item()``, ``tolist()``, ``bool()``/``float()``/``int()`` of a tensor (and, with
READS_COPIES=1 in the environment, ``Tensor.cpu()``: a copy to the host), called from cleanrl/ or
cleanrl_utils/. On a GPU each one is a wait for the device; on the CPU they can still be counted, so a
test can check that no hot loop reads a value per step.
"""

import atexit
import collections
import json
import os
import runpy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
OURS = (str(ROOT / "cleanrl") + os.sep, str(ROOT / "cleanrl_utils") + os.sep)
reads: collections.Counter[str] = collections.Counter()


def counted(method):
    def read(self, *args, **kwargs):
        caller = sys._getframe(1)
        if caller.f_code.co_filename.startswith(OURS):
            reads[f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"] += 1
        return method(self, *args, **kwargs)

    return read


for name in (
    "item",
    "tolist",
    "__bool__",
    "__float__",
    "__int__",
    *(("cpu",) if os.environ.get("READS_COPIES") else ()),
):
    setattr(torch.Tensor, name, counted(getattr(torch.Tensor, name)))


@atexit.register
def report() -> None:
    Path(os.environ["READS_REPORT"]).write_text(json.dumps(reads))


sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
