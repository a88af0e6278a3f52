"""benchmark/gpu_check.py, the one prepared check for a GPU machine, proved on the CPU as far as it can be:
every command it builds runs its script on CUDA (CUDA faked here), a run that times out leaves no
process behind, and its SPS leaves start-up and compilation out."""

import importlib
import importlib.util
import sys
import time

import psutil
import pytest
import torch

from cleanrl_utils import arguments, distributed
from cleanrl_utils.tb import ScalarReader, Series
from tests.conftest import REPO, SCRIPTS, processes_with_marker, script_env


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmark/gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _commands(gpu_check):
    """(script, command, torchrun) of every run the check makes in GPU mode: part 1, then part 2."""
    for check in gpu_check.checks(quick=False):
        yield check.script, gpu_check.command(check.script, check.flags, check.torchrun, False, []), check.torchrun
    for _, script, flags, torchrun in gpu_check.throughput_runs(quick=False):
        yield script, gpu_check.command(script, flags, torchrun, False, []), torchrun


def test_every_command_of_the_check_trains_on_cuda(gpu_check, monkeypatch):
    """On a GPU machine (faked: one visible GPU) each script's own parser and validation, given the command
    the check builds, choose CUDA, and NCCL for the torchrun ones; nothing is refused (exit 2)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    seen = set()
    for script, cmd, torchrun in _commands(gpu_check):
        path = str(SCRIPTS / script)
        assert cmd.count(path) == 1, cmd
        argv = cmd[cmd.index(path) + 1 :]
        assert (cmd[1:3] == ["-m", "torch.distributed.run"]) == torchrun, cmd
        module = importlib.import_module(f"cleanrl.{script.removesuffix('.py')}")
        args = arguments.parse_args(module.Args, 1, argv)
        module.validate(args, distributed.Ranks(world_size=1, local_world_size=1, distributed=torchrun))
        device = distributed.select_device(
            args.cuda and torch.cuda.is_available(), 0, getattr(args, "device_ids", None)
        )
        assert device == torch.device("cuda", 0), script
        if torchrun:
            assert args.backend == "nccl", script
        assert args.cuda, f"{script}: the check would run it on the CPU ({' '.join(argv)})"
        seen.add(script)
    assert len(seen) == 12


def test_a_run_that_times_out_leaves_no_process_behind(gpu_check, tmp_path, marker):
    """torchrun starts each worker in a session of its own (as the child here): on a timeout the run's whole
    process tree goes, within seconds, and no orphan keeps the check waiting on its output."""
    code = "import subprocess, time; subprocess.Popen(['sleep', '60'], start_new_session=True); time.sleep(60)"
    env = script_env({"CLEANRL_TEST_MARKER": marker})
    start = time.monotonic()
    exit_code, wall, _, tail = gpu_check.run([sys.executable, "-c", code], tmp_path, env, timeout=3)
    assert exit_code == 124 and "timed out after 3s" in tail and time.monotonic() - start < 15
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in processes_with_marker(marker) if p.status() != psutil.STATUS_ZOMBIE]
    assert left == [], [p.cmdline() for p in left]


def test_sps_leaves_the_first_iteration_out(gpu_check):
    """A run whose first iteration took 30 s (CUDA start-up, compilation) and the next three 1 s each."""
    reader = ScalarReader(".")
    reader.series["charts/SPS"] = Series(steps=[1024, 2048, 3072, 4096], values=[34, 66, 95, 124],
                                         wall_times=[1030.0, 1031.0, 1032.0, 1033.0])  # fmt: skip
    assert gpu_check.sps_after_first(reader) == pytest.approx(1024.0)
    reader.series["charts/SPS"] = Series(steps=[1024], values=[34], wall_times=[1030.0])
    assert gpu_check.sps_after_first(reader) != gpu_check.sps_after_first(reader)  # NaN: one point says nothing


def test_the_rows_the_target_needs_run_first(gpu_check, monkeypatch):
    """A check cut short by its time budget still has the rows that say whether 12,000 SPS is reached."""
    monkeypatch.setattr(gpu_check, "HAVE_ENVPOOL", True)
    names = [name for name, *_ in gpu_check.throughput_runs(quick=False)]
    assert names[:2] == [
        "ppo_atari_envpool.py, 64 envs --no-torch-deterministic",
        "ppo_atari_envpool.py, 64 envs --no-torch-deterministic --compile --cudagraphs",
    ], names


@pytest.mark.parametrize("script", ["sac_continuous_action.py", "dqn.py", "appo.py"])
def test_the_cpu_dry_run_counts_the_waits_within_each_scripts_budget(gpu_check, tmp_path, script):
    """The check's CPU dry run counts the calls that would wait on a GPU (value reads, copies to the host,
    uploads that skip pinned memory): each script stays within the budget README and docs/reference.md state
    (the actions once per env step; APPO's learner one read per update and its logging), checkpoints apart."""
    import json

    check = next(c for c in gpu_check.checks(quick=True, cpu=True) if c.script == script)
    report = tmp_path / "syncs.json"
    cmd = gpu_check.command(check.script, check.flags, check.torchrun, True, [str(REPO / "benchmark/count_syncs.py")])
    env = script_env({"SYNC_REPORT": str(report)})
    code, _, _, tail = gpu_check.run(cmd, tmp_path, env, timeout=240)
    assert code == 0, tail
    counts = json.loads(report.read_text())
    waits = sum(counts["syncs"].values())
    assert waits > 0 and sum(counts["checkpoint"].values()) > 0, counts  # the counter is wired, both buckets
    assert gpu_check.per_step(check, waits) <= check.budget, counts["syncs"]
