"""Distributed tier: ppo_atari_multigpu.py under torchrun with 2 processes on gloo (CPU)."""

import contextlib
import multiprocessing as mp
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from cleanrl.ppo_atari_multigpu import Agent, all_reduce_mean_
from tests.conftest import (
    REPO,
    SCRIPTS,
    final_checkpoint,
    processes_with_marker,
    read_scalars,
    same_parameters,
    script_env,
    torchrun_cmd,
)

SCRIPT = str(SCRIPTS / "ppo_atari_multigpu.py")
SMALL = [
    "--num-envs",
    "4",
    "--num-steps",
    "32",
    "--update-epochs",
    "2",
    "--num-minibatches",
    "2",
    "--no-cuda",
    "--no-progress",
]


def torchrun(*args: str, nproc: int = 2, cwd, timeout: float = 240, env=None, extra=()) -> subprocess.CompletedProcess:
    cmd = [*torchrun_cmd(nproc, *extra), *args]
    return subprocess.run(cmd, cwd=cwd, env=script_env(env), capture_output=True, text=True, timeout=timeout)


def checked(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


@pytest.mark.parametrize(
    "flags",
    [[], ["--grad-compression", "bf16"], ["--sync-every", "4"], ["--vector-mode", "async"]],
    ids=["exact", "bf16", "local-sgd", "async-envs"],
)
def test_ranks_keep_identical_parameters_and_distinct_seeds(tmp_path, flags):
    checked(torchrun(SCRIPT, *SMALL, "--total-timesteps", "384", "--run-name", "r", *flags, cwd=tmp_path))
    ckpt = final_checkpoint(tmp_path / "runs/r")
    assert ckpt["global_step"] == 384 and ckpt["world_size"] == 2
    digests = [r["parameters_sha256"] for r in ckpt["ranks"]]
    assert len(set(digests)) == 1  # bitwise equal on both ranks (after the end-of-iteration sync for local SGD)
    seeds = [s for r in ckpt["ranks"] for s in r["env_seeds"]]
    assert sorted(seeds) == [1, 2, 3, 4]
    if flags == ["--sync-every", "4"]:
        assert "local_optimizer" in ckpt["ranks"][1]
    scalars = read_scalars(tmp_path / "runs/r")
    assert {"charts/SPS", "perf/SPS_rank0", "perf/SPS_rank1", "perf/comm_time", "losses/value_loss"} <= scalars.keys()
    assert all(v > 0 for _, v in scalars["perf/comm_time"])
    assert all(np.isfinite(v) for _, v in scalars["losses/value_loss"])


def test_async_env_workers_are_not_forked_from_a_rank(tmp_path):
    """Once a process group exists (NCCL's and gloo's threads run), the env workers come from a fork server
    (a fork would copy the locks those threads hold); without one they are forked, which starts faster."""
    import gymnasium as gym

    from cleanrl_utils.envs import async_vector_env

    def kinds() -> list[str]:
        envs = async_vector_env([lambda: gym.make("CartPole-v1")] * 2, "CartPole-v1", 60.0)
        try:
            envs.reset(seed=0)
            envs.step(np.zeros(2, dtype=np.int64))  # and they work
            return [type(p).__name__ for p in envs.env.processes]
        finally:
            envs.close()

    assert kinds() == ["ForkProcess"] * 2
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert kinds() == ["ForkServerProcess"] * 2
    finally:
        dist.destroy_process_group()


def test_single_process_matches_ppo_atari(tmp_path):
    flags = [
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--update-epochs",
        "1",
        "--num-minibatches",
        "2",
        "--no-cuda",
        "--no-progress",
    ]
    flags += ["--total-timesteps", "128", "--run-name", "r", "--threads", "1"]
    for script in ("ppo_atari.py", "ppo_atari_multigpu.py"):
        (tmp_path / script).mkdir()
        env = script_env()
        subprocess.run(
            [sys.executable, str(SCRIPTS / script), *flags],
            cwd=tmp_path / script,
            env=env,
            check=True,
            capture_output=True,
        )
    a = final_checkpoint(tmp_path / "ppo_atari.py/runs/r")["model"]
    b = final_checkpoint(tmp_path / "ppo_atari_multigpu.py/runs/r")["model"]
    assert same_parameters(a, b)


def _grad_worker(rank: int, world: int, init_file: str, compression: str, queue) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    agent = Agent(4)
    data = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=data)
    actions = torch.randint(0, 4, (16,), generator=data)
    half = slice(rank * 8, rank * 8 + 8)
    logprob, entropy, value = agent.evaluate(obs[half], actions[half])
    (-(logprob.mean()) + value.pow(2).mean() - 0.01 * entropy.mean()).backward()
    grads = [p.grad for p in agent.parameters()]
    all_reduce_mean_(grads, world, compression)
    params = [p.data.clone() + rank for p in agent.parameters()]  # different on each rank...
    all_reduce_mean_(params, world)  # ...until averaged (the local-SGD sync)
    # numpy arrays travel by value (torch tensors would be shared through this process, which exits)
    queue.put((rank, [g.numpy().copy() for g in grads], [p.numpy().copy() for p in params]))
    dist.barrier()
    dist.destroy_process_group()


def _all_reduced(tmp_path, compression: str):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init_file = str(tmp_path / f"init_{compression}")
    procs = [ctx.Process(target=_grad_worker, args=(r, 2, init_file, compression, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, grads, params = queue.get(timeout=120)
        results[rank] = ([torch.from_numpy(g) for g in grads], [torch.from_numpy(p) for p in params])
    for p in procs:
        p.join(30)
    return results


@pytest.mark.parametrize("compression, tolerance", [("none", 1e-5), ("bf16", 1e-2)])
@pytest.mark.quick
def test_all_reduced_gradient_equals_the_combined_batch_gradient(tmp_path, compression, tolerance):
    """2 ranks x 8 samples, averaged, equal 1 process x 16 samples (the loss is a mean over samples).

    Tolerance: 1e-5 of the largest gradient entry in fp32 (summation order); 1e-2 with bf16 on the
    wire (8 mantissa bits: a relative rounding error of at most 2**-8 = 0.4% per value).
    """
    results = _all_reduced(tmp_path, compression)
    torch.manual_seed(0)
    agent = Agent(4)
    data = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=data)
    actions = torch.randint(0, 4, (16,), generator=data)
    logprob, entropy, value = agent.evaluate(obs, actions)
    (-(logprob.mean()) + value.pow(2).mean() - 0.01 * entropy.mean()).backward()
    for rank in (0, 1):
        for reduced, p in zip(results[rank][0], agent.parameters()):
            scale = p.grad.abs().max().item()
            assert (reduced - p.grad).abs().max().item() <= tolerance * scale + 1e-12
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0]))  # same bits on every rank
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1]))  # parameters equal after a sync
    assert torch.allclose(results[0][1][0], next(agent.parameters()).data + 0.5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.quick
def test_two_nodes_on_localhost(tmp_path):
    port = _free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}", "--nproc-per-node=1"]
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=twonodes", SCRIPT]
        cmd += [*SMALL, "--total-timesteps", "256", "--run-name", "r"]
        procs.append(
            subprocess.Popen(
                cmd, cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    ckpt = final_checkpoint(tmp_path / "runs/r")
    assert ckpt["world_size"] == 2 and ckpt["global_step"] == 256
    assert len({r["parameters_sha256"] for r in ckpt["ranks"]}) == 1


def _kill_rank_after_checkpoint(tmp_path, marker: str, rank: str) -> None:
    deadline = time.monotonic() + 180
    while not (tmp_path / "runs/r/checkpoints/ckpt_00000256.pt").exists():
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.1)
    for proc in processes_with_marker(marker):
        env = proc.environ()
        if (
            env.get("RANK") == rank
            and env.get("TORCHELASTIC_RESTART_COUNT") == "0"
            and "ppo_atari_multigpu" in " ".join(proc.cmdline())
        ):
            proc.kill()
            return
    raise AssertionError("rank not found")


@pytest.mark.parametrize("restarts", [1, 0])
def test_killed_rank(tmp_path, marker, restarts):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        f"--max-restarts={restarts}",
    ]
    cmd += [SCRIPT, *SMALL, "--total-timesteps", "1024", "--checkpoint-interval", "256", "--run-name", "r"]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=script_env({"CLEANRL_TEST_MARKER": marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _kill_rank_after_checkpoint(tmp_path, marker, "1")
    out, _ = proc.communicate(timeout=240)
    time.sleep(0.5)
    assert processes_with_marker(marker) == []
    final = final_checkpoint(tmp_path / "runs/r")
    if restarts:
        assert proc.returncode == 0, out[-4000:]
        assert "resuming from runs/r/checkpoints/ckpt_" in out
        assert final["global_step"] == 1024 and final["iteration"] == 8
        assert len({r["parameters_sha256"] for r in final["ranks"]}) == 1
    else:
        assert proc.returncode != 0
        assert 0 < final["global_step"] < 1024  # the last checkpoint before the kill loads


def _watch_records(watch) -> list[dict]:
    import json

    return [json.loads((watch / f"rank{r}.json").read_text()) for r in range(2)]


def _rank_of(proc) -> str | None:
    """The RANK of a live process (None once it has ended, or is a zombie)."""
    with contextlib.suppress(Exception):  # it may end meanwhile
        return None if proc.status() == "zombie" else proc.environ().get("RANK")
    return None


def test_the_peer_watch_names_a_rank_that_stops_while_this_one_waits_on_the_gpu(tmp_path, marker):
    """Under NCCL a stopped peer leaves the others blocked in a CUDA wait, where no Python runs: the peer watch
    (a thread beating on the store) names it in one line after --dist-timeout, and the live rank exits 1."""
    cmd = [*torchrun_cmd(2), str(REPO / "tests/peer_stops.py")]
    env = script_env({"CLEANRL_TEST_MARKER": marker, "WATCH_TIMEOUT": "3"})
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, said = [], float("inf")
    reader = threading.Thread(target=lambda: out.extend(line.rstrip("\n") for line in proc.stdout), daemon=True)
    reader.start()
    try:
        while time.monotonic() - start < 60 and not any(line.startswith("error:") for line in out):
            time.sleep(0.1)  # (without the watch the ranks sleep 120 s, and the stopped one never ends)
        said = time.monotonic() - start
        deadline = time.monotonic() + 10  # and the live rank has ended itself
        while any(_rank_of(p) == "0" for p in processes_with_marker(marker)):
            assert time.monotonic() < deadline, "rank 0 still runs after its line"
            time.sleep(0.1)
    finally:
        for p in processes_with_marker(marker):
            p.send_signal(signal.SIGKILL)
    reader.join(timeout=10)
    assert said < 30, "\n".join(out[-50:])  # not the 120 s the ranks would otherwise wait
    lines = [line for line in out if line.startswith("error:")]
    assert lines == ["error: rank 1 stopped answering: no reply within --dist-timeout 3s at step 4096; "
                     "last good checkpoint: none"], "\n".join(out[-50:])  # fmt: skip


def test_a_restart_whose_rank_0_lacks_the_newest_checkpoint_is_refused(tmp_path, marker):
    """Only rank 0 writes checkpoints, on its own node. A torchrun restart that puts rank 0 on a node without
    them (faked here: the files are moved away while the ranks are stopped, then both are killed) says so in
    one line instead of training the run again from step 0."""
    cmd = torchrun_cmd(2, "--max-restarts=1")
    cmd += [SCRIPT, *SMALL, "--total-timesteps", "2048", "--checkpoint-interval", "256", "--run-name", "r"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=script_env({"CLEANRL_TEST_MARKER": marker}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    checkpoints = tmp_path / "runs/r/checkpoints"
    deadline = time.monotonic() + 180
    while not (checkpoints / "ckpt_00000256.pt").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "no checkpoint"
        time.sleep(0.1)
    ranks = [
        p
        for p in processes_with_marker(marker)
        if "RANK" in p.environ() and "ppo_atari_multigpu" in " ".join(p.cmdline())
    ]
    assert len(ranks) == 2
    for p in ranks:
        p.suspend()
    newest = sorted(checkpoints.glob("ckpt_*.pt"))[-1].name
    checkpoints.rename(tmp_path / "elsewhere")
    for p in ranks:
        p.kill()
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0, out[-3000:]
    step = int(newest[5:13])
    assert re.search(
        rf"error: torchrun restarted runs/r with rank 0 on \S+, which has no checkpoint of it; the newest "
        rf"\(step {step}\) is on \S+: give the nodes one shared runs/ directory, or keep rank 0's node",
        out,
    ), out[-3000:]
    assert not list(checkpoints.glob("ckpt_*.pt"))  # nothing trained again from step 0


def test_nan_on_one_rank_stops_every_rank(tmp_path):
    # rank 1's envs pay NaN from their 70th step (iteration 3 of 32 steps); checkpoints every 2 iterations.
    watch = tmp_path / "watch"
    watch.mkdir()
    proc = torchrun(
        str(REPO / "tests/watch_collectives.py"), str(REPO / "tests/inject_nan.py"), SCRIPT, *SMALL,
        "--total-timesteps", "768", "--checkpoint-interval", "256", "--run-name", "r",
        cwd=tmp_path, env={"NAN_RANK": "1", "NAN_AFTER_STEPS": "70", "WATCH_DIR": str(watch)},
    )  # fmt: skip
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    message = "error: non-finite gradient norm at step 384; last good checkpoint: runs/r/checkpoints/ckpt_00000256.pt"
    assert output.count(message) == 1, output[-4000:]
    assert sorted(p.name for p in (tmp_path / "runs/r/checkpoints").glob("ckpt_*.pt")) == ["ckpt_00000256.pt"]
    assert [r["destroyed"] for r in _watch_records(watch)] == [1, 1]  # both ranks left the process group


def test_ctrl_c_checkpoints_every_rank_at_one_iteration(tmp_path, marker):
    watch = tmp_path / "watch"
    watch.mkdir()
    cmd = torchrun_cmd(2)
    cmd += [str(REPO / "tests/watch_collectives.py"), SCRIPT]
    cmd += [*SMALL, "--total-timesteps", "100000", "--checkpoint-interval", "0", "--run-name", "r"]
    proc = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=script_env({"CLEANRL_TEST_MARKER": marker, "WATCH_DIR": str(watch)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not list((tmp_path / "runs/r").glob("events.out.tfevents.*")):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: every process of the group
    out, _ = proc.communicate(timeout=120)
    time.sleep(0.5)
    assert processes_with_marker(marker) == []
    assert "stopped by signal 2 at step" in out, out[-4000:]
    ckpt = final_checkpoint(tmp_path / "runs/r")
    assert 0 < ckpt["global_step"] < 100000 and len(ckpt["ranks"]) == 2
    assert len({r["parameters_sha256"] for r in ckpt["ranks"]}) == 1
    assert [r["destroyed"] for r in _watch_records(watch)] == [1, 1]  # both ranks left the process group


@pytest.mark.quick
def test_bad_input_is_reported_once_before_the_process_group(tmp_path):
    proc = torchrun(SCRIPT, "--num-envs", "3", "--no-cuda", cwd=tmp_path, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert output.count("error: --num-envs 3: must be a multiple of the number of processes (WORLD_SIZE=2)") == 1
    assert "exitcode  : 2" in output
    assert not (tmp_path / "runs").exists()


def test_existing_run_directory_is_not_overwritten(tmp_path):
    checked(torchrun(SCRIPT, *SMALL, "--total-timesteps", "128", "--run-name", "r", nproc=1, cwd=tmp_path))
    proc = torchrun(SCRIPT, *SMALL, "--total-timesteps", "128", "--run-name", "r", nproc=1, cwd=tmp_path)
    assert proc.returncode != 0
    assert "error: runs/r holds checkpoints: pass --resume runs/r or another --run-name" in proc.stderr
    np.testing.assert_equal(final_checkpoint(tmp_path / "runs/r")["global_step"], 128)


def test_object_collectives_use_the_side_group_and_no_rank_leaves_a_checkpoint_early(tmp_path):
    """The run plan, checkpoint and resume objects travel over the gloo side group, never the default group
    (under NCCL they would be staged through GPU memory and sent after the call returned), and so do the
    host-level agreements (the barrier after the rollouts, the max of the NaN record and of the stop signal:
    under NCCL a lost peer would abort the process in a CUDA sync, with no line); no rank returns from a
    collective checkpoint before rank 0 has written it (rank 0's writes take 2 s longer here); every rank
    leaves the process group at the end."""
    import json

    launcher = str(REPO / "tests/watch_collectives.py")
    records = []
    for i, flags in enumerate(
        (["--run-name", "r", "--total-timesteps", "256"], ["--resume", "runs/r", "--total-timesteps", "384"])
    ):
        watch = tmp_path / f"watch{i}"
        watch.mkdir()
        checked(
            torchrun(
                launcher, SCRIPT, *SMALL, "--checkpoint-interval", "128", *flags,
                cwd=tmp_path, env={"WATCH_DIR": str(watch), "WATCH_SLOW_WRITE": "2"},
            )
        )  # fmt: skip
        records.append([json.loads((watch / f"rank{r}.json").read_text()) for r in range(2)])
    for run_records in records:
        for rank, record in enumerate(run_records):
            called = {c["name"] for c in record["collectives"]}
            assert {"broadcast_object_list", "gather_object", "barrier", "all_reduce_max"} <= called, (rank, called)
            assert [c for c in record["collectives"] if c["default_group"]] == [], rank
            assert record["destroyed"] == 1, rank
        written = run_records[0]["written"]
        assert len(written) == len(run_records[1]["returned"]) > 0
        for returned, done in zip(run_records[1]["returned"], written):
            assert returned >= done, f"rank 1 left a checkpoint {done - returned:.2f}s before rank 0 had written it"
    assert "scatter_object_list" in {c["name"] for c in records[1][1]["collectives"]}  # the resume hands out parts


# --------------------------------------------------------------------------------------------
# Elastic resume: a run saved on 2 processes continues on 1 or 4
# --------------------------------------------------------------------------------------------
def test_resume_on_another_world_size_continues_every_env(tmp_path):
    """Saved at 2 ranks, resumed at 1 and at 4: the same global envs, step counter and parameters, and
    every env's state and next observation exactly as saved (env i stays env i); a world size that
    does not divide the envs is refused with one line naming the sizes that work."""
    from cleanrl_utils.checkpoint import content_digest
    from cleanrl_utils.reshard import _derived

    checked(torchrun(SCRIPT, *SMALL, "--total-timesteps", "256", "--run-name", "r", cwd=tmp_path))
    saved = final_checkpoint(tmp_path / "runs/r")
    assert saved["world_size"] == 2 and saved["global_step"] == 256
    saved_envs = [content_digest(s) for r in saved["ranks"] for s in r["envs"]["envs"]]
    saved_obs = torch.cat([r["next_obs"] for r in saved["ranks"]])
    mid = tmp_path / "mid.pt"
    mid.write_bytes(next((tmp_path / "runs/r/checkpoints").glob("ckpt_00000256.pt")).read_bytes())
    for world_size in (1, 4):
        cwd = tmp_path / f"on{world_size}"
        cwd.mkdir()
        proc = checked(torchrun(str(REPO / "tests/record_resume.py"), "cleanrl.ppo_atari_multigpu", "--resume", str(mid),
                                "--total-timesteps", "384", "--no-cuda", "--no-progress", nproc=world_size, cwd=cwd,
                                env={"RESUME_RECORD": str(cwd / "record")}))  # fmt: skip
        assert f"(2 processes -> {world_size})" in proc.stdout + proc.stderr
        records = [torch.load(cwd / f"record/rank{r}.pt", weights_only=True) for r in range(world_size)]
        assert [d for rec in records for d in rec["envs"]] == saved_envs  # every env's state, in global order
        assert torch.equal(torch.cat([rec["first_obs"] for rec in records]), saved_obs.float())
        assert {rec["parameters_sha256"] for rec in records} == {saved["ranks"][0]["parameters_sha256"]}
        # ranks that existed keep their generators; a new rank's are derived from a saved one and its index
        old = saved["ranks"]
        expected = [old[r]["rng"]["torch"] if r < len(old) else _derived(old[r % len(old)]["rng"], r)["torch"]
                    for r in range(world_size)]  # fmt: skip
        assert all(torch.equal(rec["torch_rng"], rng) for rec, rng in zip(records, expected, strict=True))
        assert len({content_digest(rec["torch_rng"]) for rec in records}) == world_size  # no two ranks alike
        resumed = final_checkpoint(cwd / "runs/r")
        assert resumed["world_size"] == world_size and resumed["global_step"] == 384
        assert [s for r in resumed["ranks"] for s in r["env_seeds"]] == [1, 2, 3, 4]
        assert len({r["parameters_sha256"] for r in resumed["ranks"]}) == 1
    proc = torchrun(SCRIPT, "--resume", str(mid), "--total-timesteps", "384", "--no-cuda", nproc=3, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "exitcode  : 2" in output
    line = "4 envs in all (saved by 2 processes) do not split among 3 processes; resume on 1, 2, 4 processes"
    assert output.count(line) == 1, output[-3000:]


def _node(port: int, host: bool, cwd, marker: str, log) -> subprocess.Popen:
    """One torchrun agent of an elastic launch (1 to 2 nodes of one process each) on localhost."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=1"]
    cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=elastic"]
    cmd += [f"--rdzv-conf=is_host={str(host).lower()},last_call_timeout=1", SCRIPT, *SMALL, "--update-epochs", "1"]
    cmd += ["--total-timesteps", "6144", "--checkpoint-interval", "128", "--run-name", "r"]
    # torch's shared rendezvous store does not let a node join a running launch (see README)
    env = script_env({"CLEANRL_TEST_MARKER": marker, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)


def _newest_checkpoint_at(run_dir, world_size: int, after: int, deadline: float) -> int:
    """Wait for a checkpoint newer than step ``after`` written by ``world_size`` processes; its step."""
    while True:
        found = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
        if found and int(found[-1].stem[5:]) > after:
            with contextlib.suppress(Exception):  # (a file being replaced while read)
                ckpt = torch.load(found[-1], weights_only=False, map_location="cpu")
                if ckpt["world_size"] == world_size:
                    return ckpt["global_step"]
        assert time.monotonic() < deadline, f"no checkpoint of {world_size} processes after step {after}"
        time.sleep(0.2)


def test_elastic_launch_continues_when_a_node_joins_and_when_one_is_lost(tmp_path, marker):
    """torchrun --nnodes=1:2: node A trains alone, node B joins (torchrun restarts the workers at world
    size 2 without counting a restart), then B is killed and not restarted (one counted restart): the
    run continues from its newest checkpoint each time and finishes on the remaining node."""
    import psutil

    port, deadline = _free_port(), time.monotonic() + 200
    with open(tmp_path / "a.log", "w") as log_a, open(tmp_path / "b.log", "w") as log_b:
        a = _node(port, True, tmp_path, marker, log_a)
        try:
            alone = _newest_checkpoint_at(tmp_path / "runs/r", 1, 0, deadline)
            b = _node(port, False, tmp_path, marker, log_b)
            joined = _newest_checkpoint_at(tmp_path / "runs/r", 2, alone, deadline)
            for proc in [psutil.Process(b.pid), *psutil.Process(b.pid).children(recursive=True)]:
                proc.kill()  # the node is lost: its agent and its worker (not in the agent's process group)
            a.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            for proc in processes_with_marker(marker):
                proc.kill()
    out = (tmp_path / "a.log").read_text()
    assert a.returncode == 0, out[-4000:]
    assert "holds checkpoints" not in out and "(1 processes -> 2)" in out and "(2 processes -> 1)" in out, out[-4000:]
    final = final_checkpoint(tmp_path / "runs/r")
    assert final["world_size"] == 1 and final["global_step"] == 6144 and alone < joined < 6144
    assert [s for r in final["ranks"] for s in r["env_seeds"]] == [1, 2, 3, 4]
    time.sleep(0.5)
    assert processes_with_marker(marker) == []


@pytest.mark.quick
def test_reshard_keeps_every_env_where_it_was_and_derives_new_ranks_generators():
    """The elastic re-split without torchrun: 2 ranks x 2 envs saved, re-split for 1 and 4 ranks. Env i stays
    env i (its snapshot, wrapper rows, next observation, done flag, seed and replay ring); ranks that existed
    keep their generators, new ones get their own; 3 ranks do not divide 4 envs and are refused."""
    from cleanrl_utils.checkpoint import CheckpointError, decode, encode, rng_state
    from cleanrl_utils.reshard import reshard

    def part(rank: int) -> dict:
        envs = [2 * rank, 2 * rank + 1]  # rank-major global env indices
        torch.manual_seed(rank)
        return {
            "next_obs": torch.tensor([[float(e)] for e in envs]),
            "next_done": torch.tensor([e % 2 == 1 for e in envs]),
            "env_seeds": [100 + e for e in envs],
            "envs": {"envs": [f"env{e}" for e in envs], "wrappers": [{"returns": encode(np.array([10.0 * e for e in envs])),
                                                                        "episodes": encode(np.int64(rank))}]},
            "replay": {"frames": torch.tensor([[e * 1000 + t for e in envs] for t in range(3)]), "steps": 3,
                       "rng": np.random.default_rng(rank).bit_generator.state},
            "rng": rng_state(),
            "parameters_sha256": "one model",
        }  # fmt: skip

    saved = [part(0), part(1)]
    (one,) = reshard(saved, 1)
    assert one["next_obs"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert one["next_done"].tolist() == [False, True, False, True] and one["env_seeds"] == [100, 101, 102, 103]
    assert one["envs"]["envs"] == ["env0", "env1", "env2", "env3"]
    assert decode(one["envs"]["wrappers"][0]["returns"]).tolist() == [0.0, 10.0, 20.0, 30.0]
    assert one["replay"]["frames"].tolist() == [[t, 1000 + t, 2000 + t, 3000 + t] for t in range(3)]
    assert torch.equal(one["rng"]["torch"], saved[0]["rng"]["torch"]) and one["parameters_sha256"] == "one model"
    four = reshard(saved, 4)
    assert [p["env_seeds"] for p in four] == [[100], [101], [102], [103]]
    assert [p["envs"]["envs"] for p in four] == [["env0"], ["env1"], ["env2"], ["env3"]]
    assert [p["replay"]["frames"].flatten().tolist() for p in four] == [
        [e * 1000 + t for t in range(3)] for e in range(4)
    ]
    torch_states = [p["rng"]["torch"] for p in four]
    assert torch.equal(torch_states[1], saved[1]["rng"]["torch"])  # rank 1 existed: its own generators
    assert all(not torch.equal(torch_states[i], torch_states[j]) for i in range(4) for j in range(i))  # no two alike
    assert torch.equal(reshard(saved, 4)[3]["rng"]["torch"], torch_states[3])  # derived deterministically
    with pytest.raises(
        CheckpointError, match="4 envs in all .saved by 2 processes. do not split among 3 processes; resume on 1, 2, 4"
    ):
        reshard(saved, 3)
