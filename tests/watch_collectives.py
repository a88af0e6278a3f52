"""Launcher: run a torchrun script while recording its object collectives, its host-level agreements,
its collective checkpoints and whether it left the process group.

torchrun ... tests/watch_collectives.py cleanrl/ppo_atari_multigpu.py [flags]
(with WATCH_DIR in the environment; rank 0's checkpoint writes take WATCH_SLOW_WRITE extra seconds;
the script may be another launcher, such as tests/inject_nan.py, followed by the script)

Each rank writes WATCH_DIR/rank<r>.json: every object collective, barrier and MAX all_reduce (the
agreements) it called (name, and whether it ran on the default group), how often it called
destroy_process_group, and, per collective checkpoint, when the call returned; rank 0 also records
when each of its writes finished.
"""

import atexit
import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch.distributed as dist

import cleanrl_utils.distributed as distributed
import cleanrl_utils.run as run

record = {"collectives": [], "returned": [], "written": [], "destroyed": 0}
rank = int(os.environ.get("RANK", 0))


def watched(name, function):
    def call(*args, group=None, **kwargs):
        on_default = group is None or group is dist.GroupMember.WORLD or group == dist.group.WORLD
        record["collectives"].append({"name": name, "default_group": on_default})
        return function(*args, group=group, **kwargs)

    return call


for name in ("gather_object", "broadcast_object_list", "scatter_object_list", "all_gather_object", "barrier"):
    setattr(dist, name, watched(name, getattr(dist, name)))
_all_reduce = dist.all_reduce


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, **kwargs):
    if op == dist.ReduceOp.MAX:  # an agreement (gradients and parameters are summed)
        return watched("all_reduce_max", _all_reduce)(tensor, op=op, group=group, **kwargs)
    return _all_reduce(tensor, op=op, group=group, **kwargs)


dist.all_reduce = all_reduce
_destroy = dist.destroy_process_group


def destroy_process_group(*args, **kwargs):
    record["destroyed"] += 1
    return _destroy(*args, **kwargs)


dist.destroy_process_group = destroy_process_group

_save = run.save_checkpoint


def slow_save(*args, **kwargs):
    time.sleep(float(os.environ.get("WATCH_SLOW_WRITE", "0")))
    path = _save(*args, **kwargs)
    record["written"].append(time.time())
    return path


run.save_checkpoint = slow_save
_collective_save = distributed.Ranks.save_collectively


def timed_collective_save(self, *args, **kwargs):
    path = _collective_save(self, *args, **kwargs)
    record["returned"].append(time.time())
    return path


distributed.Ranks.save_collectively = timed_collective_save


@atexit.register
def dump():
    Path(os.environ["WATCH_DIR"], f"rank{rank}.json").write_text(json.dumps(record))


sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
