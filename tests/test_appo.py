"""The asynchronous actor-learner (appo.py): V-trace maths, the parameter server, faults, learning."""

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from cleanrl.appo import vtrace
from cleanrl.ppo import compute_gae
from cleanrl_utils.param_server import ParameterServer
from tests.conftest import (
    SCRIPTS,
    final_checkpoint,
    only_run_dir,
    processes_with_marker,
    read_scalars,
    run_script,
    same_parameters,
    script_env,
    torchrun_cmd,
)

# --------------------------------------------------------------------------------------------
# V-trace
# --------------------------------------------------------------------------------------------


@pytest.mark.quick
def test_vtrace_by_hand_with_lag():
    # one env, 3 steps; the behaviour policy made action probabilities 0.5, the target 1.0, 0.25, 0.5.
    behaviour = np.log(np.array([[0.5], [0.5], [0.5]], dtype=np.float32))
    target = np.log(np.array([[1.0], [0.25], [0.5]], dtype=np.float32))
    rewards = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    values = np.array([[0.5], [1.0], [1.5]], dtype=np.float32)
    zeros = np.zeros((3, 1), dtype=np.float32)
    gamma, lam = 0.9, 1.0
    adv, vs = vtrace(
        behaviour, target, rewards, values, np.array([2.0], np.float32), zeros, zeros, gamma, lam, 1.0, 1.0
    )
    # ratios 2, 0.5, 1 -> rho = c = min(1, ratio) = 1, 0.5, 1
    # deltas: t2: 1*(3 + .9*2 - 1.5) = 3.3;  t1: .5*(2 + .9*1.5 - 1) = 1.175;  t0: 1*(1 + .9*1 - .5) = 1.4
    # v_s - V: t2 = 3.3;  t1 = 1.175 + .9*.5*3.3 = 2.66;  t0 = 1.4 + .9*1*2.66 = 3.794
    np.testing.assert_allclose(adv[:, 0], [3.794, 2.66, 3.3], rtol=1e-5)
    np.testing.assert_allclose(vs, adv + values, rtol=1e-6)


@pytest.mark.quick
def test_vtrace_on_policy_is_gae_and_n_step_returns():
    rng = np.random.default_rng(0)
    shape = (16, 3)
    logp = np.log(rng.uniform(0.1, 1.0, shape)).astype(np.float32)
    rewards = rng.normal(size=shape).astype(np.float32)
    values = rng.normal(size=shape).astype(np.float32)
    next_value = rng.normal(size=3).astype(np.float32)
    terminations = (rng.uniform(size=shape) < 0.1).astype(np.float32)
    dones = np.maximum(terminations, (rng.uniform(size=shape) < 0.1)).astype(np.float32)  # some truncations
    for lam in (0.8, 1.0):
        adv, vs = vtrace(logp, logp, rewards, values, next_value, terminations, dones, 0.97, lam, 1.0, 1.0)
        gae, returns = compute_gae(rewards, values, next_value, terminations, dones, 0.97, lam)
        np.testing.assert_allclose(adv, gae, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(vs, returns, rtol=1e-5, atol=1e-5)
    # lambda = 1 without episode ends: the n-step bootstrapped discounted return
    no = np.zeros(shape, dtype=np.float32)
    _, vs = vtrace(logp, logp, rewards, values, next_value, no, no, 0.97, 1.0, 1.0, 1.0)
    n_step = sum(0.97**k * rewards[k, 0] for k in range(16)) + 0.97**16 * next_value[0]
    assert vs[0, 0] == pytest.approx(n_step, rel=1e-5)


# --------------------------------------------------------------------------------------------
# Parameter server
# --------------------------------------------------------------------------------------------


def _reader(server: ParameterServer, duration: float, result) -> None:
    module = nn.Linear(300, 300)  # 90,300 parameters
    version, reads, torn = -1, 0, 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        version = server.pull(module, version)
        flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        reads += 1
        # the writer publishes version k as every parameter == k: anything else is a torn read
        if not bool((flat == version).all()):
            torn += 1
    result.put((reads, torn))


@pytest.mark.quick
def test_parameter_server_never_hands_out_half_written_weights():
    module = nn.Linear(300, 300)
    server = ParameterServer(module)
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(0.0)
    server.publish(module, 0)
    ctx = torch.multiprocessing.get_context("spawn")
    result = ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(server, 3.0, result)) for _ in range(2)]
    for r in readers:
        r.start()
    version, end = 0, time.monotonic() + 3.5
    while time.monotonic() < end:
        version += 1
        with torch.no_grad():
            for p in module.parameters():
                p.fill_(float(version))
        server.publish(module, version)
    outcomes = [result.get(timeout=30) for _ in readers]
    for r in readers:
        r.join(10)
    assert version > 100
    assert all(reads > 20 for reads, _ in outcomes), outcomes
    assert all(torn == 0 for _, torn in outcomes), outcomes


# --------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------

SMALL = ["--num-actors", "2", "--num-envs", "4", "--num-steps", "16", "--update-epochs", "2"]


def test_appo_writes_its_scalars(tmp_path):
    run_script("appo.py", *SMALL, "--total-timesteps", "2048", cwd=tmp_path)
    scalars = read_scalars(only_run_dir(tmp_path))
    for tag in ("charts/episodic_return", "charts/SPS", "losses/value_loss", "perf/learner_idle_fraction",
                "perf/actor_idle_fraction", "perf/queue_depth", "perf/policy_lag", "perf/learn_time"):  # fmt: skip
        assert tag in scalars, tag
    assert all(0.0 <= v <= 1.0 for _, v in scalars["perf/learner_idle_fraction"])
    assert all(0 <= v <= 8 for _, v in scalars["perf/policy_lag"])  # never above --max-policy-lag
    assert all(np.isfinite(v) for _, v in scalars["losses/value_loss"])


@pytest.mark.parametrize(
    "env_name, message",
    [
        ("RaisingWorker-v0", "raised ValueError: injected failure"),
        ("DyingWorker-v0", "died (exit code -9)"),
    ],
)
def test_failing_actor_stops_the_run(tmp_path, marker, env_name, message):
    # actor 0 steps envs seeded 1 and 2: the env seeded 2 fails at its 20th step
    start = time.monotonic()
    proc = run_script(
        "appo.py", "--env-id", f"tests.known_env:{env_name}", *SMALL, "--total-timesteps", "4096", "--seed", "1",
        cwd=tmp_path, check=False, timeout=120, env={"CLEANRL_TEST_MARKER": marker},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: actor 0 of tests.known_env:{env_name} {message}"], proc.stderr
    assert time.monotonic() - start < 60
    time.sleep(0.5)
    assert processes_with_marker(marker) == []


def test_killed_learner_leaves_no_actor_behind(tmp_path, marker):
    cmd = [
        sys.executable,
        str(SCRIPTS / "appo.py"),
        "--no-progress",
        *SMALL,
        "--total-timesteps",
        "10000000",
        "--run-name",
        "r",
    ]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=script_env({"CLEANRL_TEST_MARKER": marker}), stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not list((tmp_path / "runs/r").glob("events.out.tfevents.*")):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(2)
    proc.kill()
    proc.wait(10)
    deadline = time.monotonic() + 15  # actors notice the learner is gone within a second or two
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_with_marker(marker) == []


def test_two_learners_under_torchrun_stay_equal(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(SCRIPTS / "appo.py"),
    ]
    cmd += ["--no-progress", "--num-actors", "1", "--num-envs", "4", "--num-steps", "16", "--update-epochs", "2"]
    cmd += ["--total-timesteps", "1024", "--run-name", "r"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ckpt = final_checkpoint(tmp_path / "runs/r")
    digests = [part["parameters_sha256"] for part in ckpt["ranks"]]
    assert len(digests) == 2 and len(set(digests)) == 1
    assert ckpt["global_step"] == 1024


def test_appo_learns_cartpole_within_150k_steps(tmp_path):
    """At least 2 of 3 seeds reach a mean return of 450 over their last 20 episodes (stops early once 2 have)."""
    reached = []
    for seed in (1, 2, 3):
        cwd = tmp_path / f"seed{seed}"
        cwd.mkdir()
        run_script(
            "appo.py", "--seed", str(seed), "--run-name", "r", "--checkpoint-interval", "0", cwd=cwd, timeout=600
        )
        returns = [v for _, v in read_scalars(cwd / "runs/r")["charts/episodic_return"]]
        reached.append(np.mean(returns[-20:]) >= 450)
        if sum(reached) >= 2:
            break
    assert sum(reached) >= 2, reached


SMALL_ATARI = [
    "--num-actors",
    "2",
    "--num-envs",
    "4",
    "--num-steps",
    "64",
    "--update-epochs",
    "1",
    "--num-minibatches",
    "2",
    "--no-cuda",
]


@pytest.mark.parametrize(
    "backend, env_id", [("gymnasium", "BreakoutNoFrameskip-v4"), ("envpool", "Breakout-v5"), ("ale", "Breakout-v5")]
)
def test_appo_atari_runs_with_either_backend(tmp_path, backend, env_id):
    run_script(
        "appo_atari.py",
        *SMALL_ATARI,
        "--env-backend",
        backend,
        "--env-id",
        env_id,
        "--total-timesteps",
        "1024",
        "--run-name",
        "r",
        cwd=tmp_path,
    )
    scalars = read_scalars(tmp_path / "runs/r")
    assert {"charts/SPS", "losses/value_loss", "perf/learner_idle_fraction", "perf/policy_lag"} <= scalars.keys()
    assert all(np.isfinite(v) for _, v in scalars["losses/value_loss"])
    assert final_checkpoint(tmp_path / "runs/r")["global_step"] == 1024
    # whole games over all lives (random play ends a few Breakout games in 256 steps per env): raw scores
    games = scalars["charts/episodic_return"]
    assert games and all(v == int(v) >= 0 for _, v in games)
    assert all(length > 100 for _, length in scalars["charts/episodic_length"])  # five lives, not one


@pytest.mark.parametrize(
    "script, flags, fragment",
    [
        ("appo.py", ["--num-envs", "5"], "--num-envs 5: must be a multiple of WORLD_SIZE x --num-actors = 2"),
        ("appo.py", ["--max-policy-lag", "-1"], "--max-policy-lag -1: must be >= 0"),
        ("appo.py", ["--total-timesteps", "100"], "--total-timesteps 100: must be at least one update"),
        ("appo_atari.py", ["--env-id", "CartPole-v1"], "--env-id CartPole-v1: not an Atari (ALE) environment"),
        (
            "appo_atari.py",
            ["--env-backend", "envpool", "--env-id", "NoSuchGame-v5"],
            "--env-id NoSuchGame-v5: not an EnvPool task",
        ),
    ],
)
def test_appo_rejects_bad_input(tmp_path, script, flags, fragment):
    proc = run_script(script, *flags, cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0], proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("learners, resumed_by", [(1, 1), (2, 2), (2, 1)])
def test_appo_resumes_from_its_checkpoint(tmp_path, learners, resumed_by):
    """The learners continue from the saved weights, optimizer, version and counters (actors start new
    episodes), also on another number of learners (the global --num-envs is kept)."""
    flags = ["--num-actors", "1", "--num-envs", "4", "--num-steps", "16", "--update-epochs", "2"]
    flags += ["--total-timesteps", "1024", "--checkpoint-interval", "512", "--run-name", "r", "--no-progress"]

    def launch(n: int) -> list[str]:
        return torchrun_cmd(n) if n > 1 else [sys.executable]

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    resume = ["--resume", str(a / "runs/r/checkpoints/ckpt_00000512.pt"), "--no-progress"]
    for cwd, extra, n in ((a, flags, learners), (b, resume, resumed_by)):
        proc = subprocess.run(
            [*launch(n), str(SCRIPTS / "appo.py"), *extra],
            cwd=cwd,
            env=script_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(a / "runs/r/checkpoints/ckpt_00000512.pt", weights_only=True)
    final = final_checkpoint(b / "runs/r")
    assert (saved["update"], saved["version"], saved["global_step"]) == (8, 8, 512)  # 64 steps per update
    assert (final["update"], final["version"], final["global_step"]) == (16, 16, 1024)
    assert not same_parameters(saved["model"], final["model"])
    # Adam's step count: 16 updates x 2 epochs, so the resumed run kept the saved optimizer state
    assert all(int(state["step"]) == 32 for state in final["optimizer"]["state"].values())
    assert len(final["ranks"]) == resumed_by and len({r["parameters_sha256"] for r in final["ranks"]}) == 1
    assert (f"({learners} processes -> {resumed_by})" in proc.stdout + proc.stderr) == (learners != resumed_by)
    assert min(step for step, _ in read_scalars(b / "runs/r")["charts/SPS"]) == 512 + 64  # logs go on after it
