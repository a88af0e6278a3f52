"""The Optuna tuner: its objective maths, parallel workers on one study (SQLite, journal, PostgreSQL),
a killed worker, live pruning, failing runs, bad input, and the request's command on the real scripts.

Most studies train ``tests/fake_train.py``, whose episodic returns follow a known schedule
(``500 * quality * step / total + seed / 100``), so every objective value is known in advance.
"""

import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import psutil
import pytest

from cleanrl_utils import tuner
from cleanrl_utils.scores import aggregate, atari_game, normalize, reference_scores
from cleanrl_utils.tb import ScalarReader
from cleanrl_utils.trials import open_storage
from tests.conftest import REPO, processes_with_marker, script_env

FAKE = str(REPO / "tests" / "fake_train.py")
TUNER = str(REPO / "cleanrl_utils" / "tuner.py")


def expected_last(quality: float, seed: int, total: int, num_steps: int, window: int) -> float:
    """The mean of the fake run's last ``window`` returns, computed from its schedule."""
    values = [500 * quality * s / total + seed / 100 for s in range(num_steps, total + 1, num_steps)]
    return float(np.mean(np.float32(values[-window:])))


def run_tuner(cwd: Path, *args: str, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, TUNER, *args],
        cwd=cwd,
        env=script_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc


def load(storage: str, study: str) -> optuna.Study:
    """The study as the tuner opens it (a journal file path or a URL; a new database's tables made once)."""
    return optuna.load_study(study_name=study, storage=open_storage(storage))


def trials_by_state(study: optuna.Study) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in study.get_trials():
        if not t.user_attrs.get("surplus"):
            out.setdefault(t.state.name, []).append(t)
    return out


# --------------------------------------------------------------------------------------------
# The objective's maths
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_run_score_and_aggregation():
    steps, values = [100, 200, 300, 400], [0.0, 10.0, 20.0, 40.0]
    assert tuner.run_score(steps, values, "last", 2) == 30.0
    assert tuner.run_score(steps, values, "last", 10) == 17.5
    assert tuner.run_score(steps, values, "last", 2, upto=250) == 5.0  # only points at or before step 250
    assert tuner.run_score(steps, values, "last", 2, upto=50) is None
    # trapezoid area: (5 + 15 + 30) * 100 over 300 steps
    assert tuner.run_score(steps, values, "auc", 2) == pytest.approx(50.0 / 3)
    scores = {"a": [0.0, 1.0], "b": [2.0, 2.0], "c": [10.0, 10.0]}  # env means 0.5, 2, 10
    assert tuner.trial_value(scores, "mean") == pytest.approx(12.5 / 3)
    assert tuner.trial_value(scores, "median") == 2.0
    # 6 runs pooled; trim_mean cuts int(6 * 0.25) = 1 from each end: drop 0 and one 10
    assert tuner.trial_value(scores, "iqm") == pytest.approx(np.mean([1.0, 2.0, 2.0, 10.0]))
    assert aggregate([1, 2, 3, 4, 5, 6, 7, 100], "iqm") == pytest.approx(4.5)


@pytest.mark.quick
def test_reference_scores():
    for spelling in ("BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "Breakout-v5", "BreakoutDeterministic-v4"):
        assert atari_game(spelling) == "Breakout"
    assert reference_scores("PongNoFrameskip-v4") == (-20.7, 14.6)
    assert normalize(30.5, reference_scores("BreakoutNoFrameskip-v4")) == pytest.approx(1.0)
    assert normalize(250.0, reference_scores("CartPole-v1")) == 0.5
    assert normalize(-250.0, reference_scores("Acrobot-v1")) == 0.5
    assert reference_scores("HalfCheetah-v4") is None
    assert reference_scores("HalfCheetah-v4", {"HalfCheetah-v4": [0, 10000]}) == (0.0, 10000.0)
    assert tuner.script_for("ppo", ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"]) == "cleanrl/ppo_atari.py"
    assert tuner.script_for("ppo", ["CartPole-v1", "Acrobot-v1"]) == "cleanrl/ppo.py"
    assert tuner.script_for("sac", ["Hopper-v4"]) == "cleanrl/sac_continuous_action.py"


@pytest.mark.quick
def test_shipped_spaces_name_real_flags():
    """Every key of every shipped search space is a flag of its script (a typo would fail every trial)."""
    from cleanrl_utils.launch import load_script

    for script, space in tuner.SPACES.items():
        fields = {f.replace("_", "-") for f in load_script(REPO / script).Args.__dataclass_fields__}
        assert set(space) <= fields, (script, set(space) - fields)


# --------------------------------------------------------------------------------------------
# Studies of the stand-in script
# --------------------------------------------------------------------------------------------
def write_space(path: Path, space: dict) -> str:
    path.write_text(json.dumps(space))
    return str(path)


def test_two_workers_sqlite_exact_trials_values_reach_runs(tmp_path):
    """2 workers, one SQLite study: exactly --num-trials finished trials; a trial whose values fail the
    script's validation is not run and not counted; every sampled value reaches its runs; each trial's
    value is the normalised mean of the last returns, known from the schedule."""
    space = write_space(
        tmp_path / "space.json",
        {
            "quality": {"low": 0.1, "high": 1.0},
            "num-steps": [50, 100, 300],  # 300 does not divide 500: those trials fail validation, not the tuner
            "step-time": [0.01, 0.02],
            "total-timesteps": 500,
        },
    )
    proc = run_tuner(
        tmp_path,
        *("--script", FAKE, "--env-ids", "CartPole-v1", "Acrobot-v1", "--num-seeds", "2", "--num-trials", "5"),
        *("--workers", "2", "--space", space, "--pruner", "none", "--metric-last-n-average-window", "3"),
        *("--study-name", "s", "--sampler", "random", "--sampler-seed", "3", "--progress-interval", "1"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = load(f"sqlite:///{tmp_path}/runs/s/optuna.db", "s")
    states = trials_by_state(study)
    assert len(states["COMPLETE"]) == 5 and "RUNNING" not in states and "PRUNED" not in states, states.keys()
    for t in states.get("FAIL", []):
        assert t.params["num-steps"] == 300 and t.user_attrs["error"].startswith("invalid: --num-steps 300")
        assert not list((tmp_path / "runs" / "s").glob(f"t{t.number:04d}"))  # never started
    for t in states["COMPLETE"]:
        assert t.params["num-steps"] in (50, 100)
        runs = t.user_attrs["runs"]
        assert sorted((r["env_id"], r["seed"]) for r in runs) == [
            ("Acrobot-v1", 1),
            ("Acrobot-v1", 2),
            ("CartPole-v1", 1),
            ("CartPole-v1", 2),
        ]
        normalized = {}
        for r in runs:
            hp = ScalarReader(tmp_path / r["run_dir"]).update().hyperparameters()
            for key, value in t.user_attrs["params"].items():
                assert hp[key.replace("-", "_")] == str(value), (key, hp)  # the run got the sampled value
            assert (hp["env_id"], hp["seed"]) == (r["env_id"], str(r["seed"]))
            expected = expected_last(t.params["quality"], r["seed"], 500, t.params["num-steps"], 3)
            assert r["score"] == pytest.approx(expected, rel=1e-6)
            assert r["sps"] == 1000.0 + r["seed"]
            normalized.setdefault(r["env_id"], []).append(normalize(expected, reference_scores(r["env_id"])))
        assert t.value == pytest.approx(np.mean([np.mean(v) for v in normalized.values()]), rel=1e-6)
    best = json.loads((tmp_path / "runs/s/best_params.json").read_text())
    assert best["value"] == max(t.value for t in states["COMPLETE"])
    assert "--quality" in proc.stdout and "reproduce with" in proc.stdout
    # the same command with another setting is a different study: refused, nothing runs
    again = run_tuner(tmp_path, "--script", FAKE, "--env-ids", "CartPole-v1", "--study-name", "s", "--num-trials", "1")
    assert again.returncode == 2 and "was started with env_ids" in again.stderr, again.stderr


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 (Debian's postgresql package), stopped after the test."""
    bindir = next((d for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)
    runuser = shutil.which("runuser", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if bindir is None or runuser is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs Debian's postgresql)")
    import pwd
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="cleanrl-pg-"))  # outside pytest's root-only tmp tree
    data = root / "data"
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if os.geteuid() == 0:
        os.chown(root, pwd.getpwnam(user).pw_uid, -1)

    def as_user(*cmd):
        prefix = [runuser, "-u", user, "--"] if os.geteuid() == 0 else []
        return subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True, timeout=120)

    as_user(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    port = 54000 + os.getpid() % 1000
    as_user(
        str(bindir / "pg_ctl"),
        *("-D", str(data), "-l", str(root / "log"), "-w", "start"),
        "-o",
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"  # the form --help and README give
    finally:
        as_user(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def test_postgresql_study_two_workers(tmp_path, postgres):
    space = write_space(tmp_path / "space.json", {"quality": {"low": 0.1, "high": 1.0}, "total-timesteps": 300})
    proc = run_tuner(
        tmp_path,
        *("--script", FAKE, "--env-ids", "CartPole-v1", "--num-trials", "4", "--workers", "2", "--space", space),
        *("--storage", postgres, "--study-name", "pg", "--pruner", "none", "--metric-last-n-average-window", "1"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    states = trials_by_state(load(postgres, "pg"))
    assert len(states["COMPLETE"]) == 4 and set(states) == {"COMPLETE"}, states.keys()
    for t in states["COMPLETE"]:  # last return of seed 1: 500 q + 0.01, normalised by CartPole's 0..500
        assert t.value == pytest.approx(float(np.float32(500 * t.params["quality"] + 0.01)) / 500, rel=1e-6)


def _open_together(url: str, barrier, results) -> None:
    barrier.wait()
    try:
        optuna.create_study(study_name="s", storage=open_storage(url), load_if_exists=True)
        results.put("ok")
    except Exception as error:
        results.put(f"{type(error).__name__}: {str(error)[:200]}")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_processes_opening_a_new_database_together_all_get_the_study(tmp_path, request, kind):
    """A SLURM array's tasks start at once and each opens the storage: they race to create the tables of a
    new database, and none may lose (the loser's CREATE TABLE or version row is refused by the winner's)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")  # nothing is connected before the fork
    postgres = request.getfixturevalue("postgres") if kind == "postgresql" else None
    for round_ in range(6):  # without the retry, 4 processes lose at least once in most rounds
        if postgres:
            url = postgres.rsplit("/", 1)[0] + f"/r{round_}"
            subprocess.run(["psql", postgres, "-qc", f"CREATE DATABASE r{round_}"], check=True, capture_output=True)
        else:
            url = f"sqlite:///{tmp_path / f'r{round_}.db'}"
        barrier, results = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open_together, args=(url, barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        assert outcomes == ["ok"] * 4, outcomes
        assert [s.study_name for s in optuna.get_all_study_summaries(url)] == ["s"]


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # free again once closed: nothing listens there


@pytest.mark.parametrize(
    "storage, content",
    [
        ("postgresql://postgres@127.0.0.1:{port}/postgres", None),
        ("sqlite:///not-a-db.sqlite", b"this is not an SQLite database" * 100),
        ("journal.log", b"{not json\n"),
    ],
    ids=["closed port", "not a database", "garbled journal"],
)
def test_a_storage_that_cannot_be_used_is_one_line_and_leaves_no_directory(tmp_path, storage, content):
    storage = storage.format(port=_closed_port())
    if content is not None:
        (tmp_path / storage.removeprefix("sqlite:///")).write_bytes(content)
    proc = run_tuner(tmp_path, "--script", FAKE, "--env-ids", "CartPole-v1", "--storage", storage,
                     "--study-name", "broken", "--num-trials", "1", timeout=120)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: --storage {storage}: "), lines
    assert not (tmp_path / "runs" / "broken").exists()


def wait_for(condition, what: str, timeout: float = 120.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def lineages(study: optuna.Study) -> dict[int, optuna.trial.FrozenTrial]:
    """Lineage number -> its last trial (the one that counts)."""
    out = {}
    for t in sorted(study.get_trials(), key=lambda t: t.number):
        if not t.user_attrs.get("surplus") and t.state.name != "WAITING":
            out[t.user_attrs.get("lineage", t.number)] = t
    return out


def test_killed_worker_trial_resumes_from_its_checkpoints(tmp_path, marker):
    """SIGKILL the worker mid-trial: the tuner starts another worker, which resumes the trial (same
    parameters, same run directory, ``--resume`` from the run's last checkpoint) instead of replacing
    it; the resumed trial reports and ends exactly as the same trial run without interruption, and
    counts once. Nothing is left running."""
    space = {"quality": {"low": 0.1, "high": 1.0}, "total-timesteps": 2000, "step-time": 0.12}
    space = write_space(tmp_path / "space.json", {**space, "checkpoint-interval": 500})
    args = ("--script", FAKE, "--env-ids", "CartPole-v1", "--space", space, "--pruner", "none", "--sampler", "random")
    args += (
        "--sampler-seed",
        "3",
        "--num-trials",
        "1",
        "--progress-interval",
        "1",
        "--metric-last-n-average-window",
        "5",
    )
    whole = run_tuner(tmp_path, *args, "--storage", "u.log", "--study-name", "u")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    uninterrupted = lineages(load(str(tmp_path / "u.log"), "u"))[0]

    env = script_env({"CLEANRL_TEST_MARKER": marker})
    first = subprocess.Popen([sys.executable, TUNER, *args, "--storage", "k.log", "--study-name", "k"], cwd=tmp_path,
                             env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    checkpoints = tmp_path / "runs/k/t0000/CartPole-v1__1/checkpoints"

    def reported_and_saved():  # mid-trial: the pruner has had reports, the run has a checkpoint
        if not list(checkpoints.glob("ckpt_*.pt")):
            return None
        trial = next(iter(load(str(tmp_path / "k.log"), "k").get_trials()), None)
        return trial if trial and trial.intermediate_values else None

    victim = wait_for(reported_and_saved, "a report and a checkpoint", every=0.1)
    os.kill(victim.user_attrs["worker"]["pid"], signal.SIGKILL)  # its runs die with it (PDEATHSIG)
    time.sleep(0.5)
    saved = int(sorted(checkpoints.glob("ckpt_*.pt"))[-1].stem.split("_")[1])
    assert saved < 2000, "the run had finished before the worker was killed"
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0, out
    assert "lost" in out and "resumes trial 0" in out, out

    study = load(str(tmp_path / "k.log"), "k")
    lost = next(t for t in study.get_trials() if t.number == 0)
    assert lost.state.name == "FAIL" and "signal 9" in study.user_attrs["error:0"], study.user_attrs
    assert lost.intermediate_values, "killed before the first report: the test would not see them carried over"
    resumed = lineages(study)[0]
    assert resumed.number != 0 and resumed.state.name == "COMPLETE"
    assert resumed.user_attrs["resume_of"] == 0 and resumed.user_attrs["resumes"] == 1
    assert resumed.params == uninterrupted.params
    assert resumed.user_attrs["resumed_from"] == {"k/t0000/CartPole-v1__1": saved}
    log = (tmp_path / "runs/k/logs/t0000__CartPole-v1__1.log").read_text()
    assert f"resuming after step {saved}" in log, log  # trained on from the checkpoint, not from step 0
    series = ScalarReader(tmp_path / "runs/k/t0000/CartPole-v1__1").update().get("charts/episodic_return")
    assert series.steps == list(range(100, 2001, 100))  # every point once: none lost, none repeated
    # exactly the uninterrupted trial: the same reports to the pruner, the same value, counted once
    assert resumed.intermediate_values == uninterrupted.intermediate_values
    assert resumed.value == uninterrupted.value
    assert [t.state.name for t in lineages(study).values()] == ["COMPLETE"]
    assert not processes_with_marker(marker)


def test_killed_tuner_resumes_the_orphaned_trial_exactly_on_the_real_script(tmp_path, marker):
    """SIGKILL the whole tuner (a lost node) mid-trial of ``cleanrl/ppo.py``; re-running the command
    finds the trial's worker gone, resumes the trial from its PPO checkpoint, and ends with the value of
    the same trial run without interruption (exact resume)."""
    space = {"learning-rate": {"low": 1e-3, "high": 3e-3, "log": True}, "num-envs": 2, "num-steps": 64}
    space |= {"update-epochs": 2, "total-timesteps": 6400, "checkpoint-interval": 640}
    space = write_space(tmp_path / "space.json", space)
    args = ("--script", "cleanrl/ppo.py", "--env-ids", "CartPole-v1", "--space", space, "--pruner", "none")
    args += ("--sampler", "random", "--sampler-seed", "5", "--num-trials", "1", "--metric-last-n-average-window", "10")
    whole = run_tuner(tmp_path, *args, "--study-name", "u")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    uninterrupted = lineages(load(f"sqlite:///{tmp_path}/runs/u/optuna.db", "u"))[0]
    reproduce = [line for line in whole.stdout.split("reproduce with:")[1].splitlines() if line.startswith("  python")]
    assert reproduce and all((tmp_path / shlex.split(line)[1]).is_file() for line in reproduce), reproduce

    env = script_env({"CLEANRL_TEST_MARKER": marker})
    first = subprocess.Popen([sys.executable, TUNER, *args, "--study-name", "k"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    checkpoints = tmp_path / "runs/k/t0000/CartPole-v1__1/checkpoints"
    wait_for(lambda: list(checkpoints.glob("ckpt_*.pt")), "the first checkpoint", every=0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    wait_for(lambda: not processes_with_marker(marker), "the killed tuner's workers and runs to be gone", 30)
    saved = int(sorted(checkpoints.glob("ckpt_*.pt"))[-1].stem.split("_")[1])
    assert saved < 6400, "the run had finished before the tuner was killed"

    again = run_tuner(tmp_path, *args, "--study-name", "k", env={"CLEANRL_TEST_MARKER": marker})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "is gone" in again.stdout and "resumes trial 0" in again.stdout, again.stdout
    resumed = lineages(load(f"sqlite:///{tmp_path}/runs/k/optuna.db", "k"))[0]
    assert resumed.user_attrs["resumed_from"] == {"k/t0000/CartPole-v1__1": saved}
    log = (tmp_path / "runs/k/logs/t0000__CartPole-v1__1.log").read_text()
    assert f"ckpt_{saved:08d}.pt" in log, log
    assert resumed.state.name == "COMPLETE" and resumed.value == uninterrupted.value
    assert resumed.intermediate_values == uninterrupted.intermediate_values
    assert not processes_with_marker(marker)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_run_signalled_alone_resumes_on_sigterm_and_fails_on_sigkill(tmp_path, marker, signum):
    """A run signalled while its worker is not. SIGTERM (an operator's kill, a per-process preemption): it
    writes its checkpoint and exits 143, and its trial is lost and resumed from that checkpoint. SIGKILL
    (the kernel's out-of-memory killer): a crash like any other, the trial fails and is not retried."""
    space = {"quality": [0.5], "total-timesteps": 2000, "step-time": 0.1, "checkpoint-interval": 500}
    args = ("--script", FAKE, "--env-ids", "CartPole-v1", "--space", write_space(tmp_path / "space.json", space))
    args += ("--pruner", "none", "--study-name", "s", "--num-trials", "1", "--progress-interval", "1")
    args += ("--max-failures", "1")
    env = script_env({"CLEANRL_TEST_MARKER": marker})
    tuner_proc = subprocess.Popen([sys.executable, TUNER, *args], cwd=tmp_path, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    run_dir = tmp_path / "runs/s/t0000/CartPole-v1__1"
    wait_for(lambda: list((run_dir / "checkpoints").glob("ckpt_*.pt")), "the run's first checkpoint")
    os.kill(int((run_dir / "pids").read_text().split()[0]), signum)  # the run alone
    out, _ = tuner_proc.communicate(timeout=120)
    study = load(f"sqlite:///{tmp_path}/runs/s/optuna.db", "s")
    log = (tmp_path / "runs/s/logs/t0000__CartPole-v1__1.log").read_text()
    if signum == signal.SIGKILL:
        assert tuner_proc.returncode == 1 and "resumes" not in out, out  # no trial completed
        assert [t.state.name for t in study.get_trials()] == ["FAIL"]
        assert "exited -9" in study.get_trials()[0].user_attrs["error"]
    else:
        assert tuner_proc.returncode == 0, out
        stopped = int(log.split("stopped by signal 15 at step ")[1].split()[0])
        assert "SIGTERM" in study.user_attrs["error:0"] and "resumes trial 0" in out, out
        (resumed,) = lineages(study).values()
        assert resumed.state.name == "COMPLETE"
        assert resumed.user_attrs["resumed_from"] == {"s/t0000/CartPole-v1__1": stopped}
        assert f"resuming after step {stopped}" in log
    assert not processes_with_marker(marker)


PRUNE_SCRIPT = """
import sys, optuna
from cleanrl_utils.tuner import Tuner
good = int(sys.argv[1])
Tuner(
    script=sys.argv[2],
    metric="charts/episodic_return",
    target_scores={"CartPole-v1": [0, 500]},
    params_fn=lambda trial: {
        "quality": 1.0 if trial.number < good else 0.05,
        "step-time": 0.02 if trial.number < good else 0.1,
        "total-timesteps": 2000,
    },
    metric_last_n_average_window=1,
    pruner=optuna.pruners.MedianPruner(n_startup_trials=good, n_warmup_steps=0),
    storage="sqlite:///p.db",
    study_name="p",
    poll=0.2,
).tune(num_trials=good + 1, num_seeds=1)
"""


def test_trial_below_the_others_is_pruned_and_its_processes_are_gone(tmp_path):
    """Three trials learn; the fourth's live return falls below their median at the first report:
    it is pruned long before its budget, and its training process no longer exists."""
    (tmp_path / "prune.py").write_text(PRUNE_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "prune.py", "3", FAKE], cwd=tmp_path, env=script_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = load(f"sqlite:///{tmp_path}/p.db", "p")
    states = trials_by_state(study)
    assert len(states["COMPLETE"]) == 3 and len(states["PRUNED"]) == 1, states.keys()
    pruned = states["PRUNED"][0]
    assert pruned.number == 3
    step, value = max(pruned.intermediate_values.items())
    # the value it was pruned on is its live normalised return at that fraction of the budget
    assert value == pytest.approx(float(np.float32(500 * 0.05 * step / 100 + 0.01)) / 500, rel=1e-5)
    assert step < 100 and pruned.user_attrs["pruned_at"] == step
    run_dir = tmp_path / "runs/p/t0003/CartPole-v1__1"
    pid = int((run_dir / "pids").read_text().split()[0])
    assert not psutil.pid_exists(pid)
    assert ScalarReader(run_dir).update().last_step() < 1000  # stopped early: the fake run takes 2 s to 1000


def test_crashing_and_nan_runs_fail_their_trial_not_the_tuner(tmp_path):
    space = write_space(tmp_path / "space.json", {"crash-at": [0.5], "total-timesteps": 400})
    proc = run_tuner(
        tmp_path,
        *("--script", FAKE, "--env-ids", "CartPole-v1", "--num-trials", "1", "--space", space, "--max-failures", "2"),
        *("--study-name", "c", "--pruner", "none"),
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # no trial completed
    states = trials_by_state(load(f"sqlite:///{tmp_path}/runs/c/optuna.db", "c"))
    assert len(states["FAIL"]) == 2 and set(states) == {"FAIL"}
    for t in states["FAIL"]:
        error = t.user_attrs["error"]
        assert "exited 3: error: planned crash" in error and f"t{t.number:04d}__CartPole-v1__1.log" in error
        assert Path(tmp_path / error.split("; log ")[1]).exists()
    assert "2 trials failed" in proc.stdout

    space = write_space(tmp_path / "nan.json", {"nan-at": [0.5], "total-timesteps": 400})
    proc = run_tuner(
        tmp_path,
        *("--script", FAKE, "--env-ids", "CartPole-v1", "--num-trials", "1", "--space", space, "--max-failures", "1"),
        *("--study-name", "n", "--pruner", "none"),
    )
    states = trials_by_state(load(f"sqlite:///{tmp_path}/runs/n/optuna.db", "n"))
    assert proc.returncode == 1 and "non-finite loss" in states["FAIL"][0].user_attrs["error"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--algorithm", "ppo", "--script", FAKE, "--env-ids", "CartPole-v1"], "give one of --algorithm"),
        (["--algorithm", "ppo", "--env-ids", "CartPole-v1", "BreakoutNoFrameskip-v4"], "mixes atari and classic"),
        (["--algorithm", "sac", "--env-ids", "CartPole-v1"], "--algorithm sac: has no script for classic"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "MyEnv-v0"], "--env-ids MyEnv-v0: no reference scores"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "--fixed", "qualty=1"], "qualty not flags of fake_train.py"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "--fixed", "quality"], "--fixed quality: must be KEY=VALUE"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "--workers", "0"], "--workers 0: must be a positive"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "--report-every", "0"], "--report-every 0.0: must be in"),
        (["--script", "nope.py", "--env-ids", "CartPole-v1"], "--script nope.py: no such file"),
        (["--script", FAKE, "--env-ids", "CartPole-v1", "--max-resumes", "-1"], "--max-resumes -1: must be >= 0"),
    ],
)
@pytest.mark.quick
def test_bad_input_exits_2_before_any_study(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert tuner.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------------------------
# The real scripts
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env_ids, script, budget",
    [
        (["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"], "ppo_atari", ["--fixed", "num-envs=2", "--total-timesteps", "2048"]),
        (["CartPole-v1"], "ppo", ["--total-timesteps", "2048"]),
    ],
)  # fmt: skip
def test_request_command_runs_the_real_scripts(tmp_path, env_ids, script, budget):
    """The request's command form (``--algorithm ppo --env-ids ... --num-trials``) with a tiny budget:
    it picks the script by env, every value of the trial reaches the run's recorded hyperparameters,
    and the trial's value is the normalised mean of the returns the run logged."""
    proc = run_tuner(tmp_path, "--algorithm", "ppo", "--env-ids", *env_ids, "--num-trials", "1", *budget, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    best = json.loads(next((tmp_path / "runs").glob("*/best_params.json")).read_text())
    assert best["script"] == f"cleanrl/{script}.py"
    assert set(best["params"]) == set(tuner.SPACES[best["script"]]) | ({"num-envs"} if "--fixed" in budget else set())
    normalized = []
    for run in best["runs"]:
        reader = ScalarReader(tmp_path / run["run_dir"]).update()
        hp = reader.hyperparameters()
        for key, value in best["params"].items():
            assert hp[key.replace("-", "_")] == str(value), (key, hp[key.replace("-", "_")], value)
        returns = reader.get("charts/episodic_return").values
        assert returns and run["score"] == pytest.approx(np.mean(returns[-50:]), rel=1e-6)
        normalized.append(normalize(run["score"], reference_scores(run["env_id"])))
    assert math.isclose(best["value"], np.mean(normalized), rel_tol=1e-6)


@pytest.mark.quick
def test_claim_never_overshoots_the_budget():
    """Two workers ask at the same moment for the last trial: the second one stands down."""
    study = optuna.create_study()
    done = study.ask()
    study.tell(done, 1.0)
    first = tuner.claim_trial(study, num_trials=2)  # a worker takes the last slot...
    second = tuner.claim_trial(study, num_trials=2)  # ...and another asks before it finished
    assert first is not None and second is None
    surplus = [t for t in study.get_trials() if t.user_attrs.get("surplus")]
    assert len(surplus) == 1 and surplus[0].number == 2 and surplus[0].state.name == "FAIL"
    study.tell(first, state=optuna.trial.TrialState.FAIL)  # the running one failed: the slot is free again
    assert tuner.claim_trial(study, num_trials=2) is not None


@pytest.mark.quick
def test_lost_trial_is_resumed_once_per_loss_until_max_resumes():
    """The life cycle in an in-memory study: a lost trial's parameters come back as one retry (a second
    report of the same loss adds none that runs), the retry fills the lineage's place in the budget,
    and a lineage lost more than --max-resumes times fails with a line saying so."""
    from cleanrl_utils import trials

    study = optuna.create_study()
    first = study.ask()
    x = first.suggest_float("x", 0.0, 1.0)
    first.set_user_attr("params", {"x": x, "total-timesteps": 100})
    line = trials.lose_trial(study, study.trials[0], "its worker is gone", max_resumes=2)
    assert "resumes (resume 1 of at most 2)" in line
    assert trials.lose_trial(study, study.trials[0], "its worker is gone", max_resumes=2) is None  # told twice
    retry = trials.claim_trial(study, num_trials=1)
    assert retry is not None and retry.suggest_float("x", 0.0, 1.0) == x and retry.user_attrs["lineage"] == 0
    assert retry.user_attrs["params"] == {"x": x, "total-timesteps": 100} and retry.user_attrs["resumes"] == 1
    assert trials.claim_trial(study, num_trials=1) is None  # the duplicate retry stands down...
    assert trials.claim_trial(study, num_trials=1) is None  # ...and a new trial: the lineage fills the budget
    count = trials.census(study)
    assert (count.running, count.failed, count.resumed, count.waiting) == (1, 0, 1, 0)

    for resumes in (2, 3):
        lost = next(t for t in study.get_trials() if t.state.name == "RUNNING")
        line = trials.lose_trial(study, lost, "no heartbeat", max_resumes=2)
        if resumes == 2:
            assert trials.claim_trial(study, num_trials=1).user_attrs["resumes"] == 2
    assert "already resumed 2 times (--max-resumes 2): failed" in line
    count = trials.census(study)
    assert (count.running, count.failed, count.resumed, count.waiting, count.finished) == (0, 1, 2, 0, 0)
    assert "--max-resumes 2" in trials.error_of(study, count.counted[0])


@pytest.mark.quick
def test_a_retry_claimed_before_its_lost_trial_is_failed_runs_and_the_lineage_counts_once():
    """lose_trial enqueues the retry, then fails the lost trial; a worker (another SLURM task) that claims the
    retry in between finds the lost trial still running: the retry runs and fails the lost trial itself (it
    once stood down, and the lineage was dropped for a new trial). A retry whose lost trial finished after all
    stands down."""
    from cleanrl_utils import trials

    study = optuna.create_study()
    lost = study.ask()
    lost.suggest_float("x", 0.0, 1.0)
    enqueue, claimed = study.enqueue_trial, []

    def enqueue_then_another_worker_claims(*args, **kwargs):
        enqueue(*args, **kwargs)
        claimed.append(trials.claim_trial(study, num_trials=1))

    study.enqueue_trial = enqueue_then_another_worker_claims
    trials.lose_trial(study, study.trials[0], "its worker is gone", max_resumes=2)
    study.enqueue_trial = enqueue
    (retry,) = claimed
    assert retry is not None and retry.user_attrs["resume_of"] == 0 and study.trials[0].state.name == "FAIL"
    assert trials.error_of(study, study.trials[0]) == "its worker is gone; resumed by a retry"
    assert trials.claim_trial(study, num_trials=1) is None  # no new trial: the lineage fills the budget
    study.tell(retry, 1.0)
    count = trials.census(study)
    assert (count.complete, count.failed, count.resumed, [t.number for t in count.counted]) == (1, 0, 1, [1])

    finished = study.ask()  # its worker completes it after a watcher thought it lost
    study.enqueue_trial({}, user_attrs={"lineage": finished.number, "resume_of": finished.number, "resumes": 1})
    study.tell(finished, 2.0)
    assert trials.claim_trial(study, num_trials=3) is None
    assert study.trials[-1].user_attrs.get("surplus") and study.trials[finished.number].state.name == "COMPLETE"


def test_watcher_finds_a_silent_remote_worker_by_its_own_clock():
    """A trial of a worker on another host is lost when its heartbeat stays unchanged for the grace
    period as this watcher sees it (hosts' clocks need not agree); one that beats is not; a local
    worker whose process is gone is lost at once."""
    from cleanrl_utils import trials

    study = optuna.create_study()
    remote, beating, local = study.ask(), study.ask(), study.ask()
    for trial in (remote, beating):
        trial.set_user_attr("worker", {"host": "another-host", "pid": 1, "started": 0.0})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    local.set_user_attr("worker", {**trials.worker_record(), "pid": int(gone.stdout)})
    watcher = trials.Watcher(grace=0.3)
    assert [(t.number, why) for t, why in watcher.lost(study)] == [
        (2, f"its worker (pid {gone.stdout.strip()}) is gone")
    ]
    for beat in range(1, 6):
        beating.set_user_attr("beat", beat)
        time.sleep(0.1)
        lost = [t.number for t, _ in watcher.lost(study)]
    assert lost == [0, 2], lost
    heartbeat = trials.Heartbeat(beating, interval=0.05)  # the worker's own thread keeps it alive
    time.sleep(0.5)
    assert [t.number for t, _ in watcher.lost(study)] == [0, 2]
    heartbeat.stop()


def test_ctrl_c_checkpoints_the_runs_and_the_same_command_resumes_the_trial(tmp_path, marker):
    space = write_space(tmp_path / "space.json", {"quality": [0.5], "total-timesteps": 2000, "step-time": 0.3})
    args = [TUNER, "--script", FAKE, "--env-ids", "CartPole-v1", "--space", space, "--pruner", "none"]
    args += ["--study-name", "i", "--num-trials", "2", "--progress-interval", "1"]
    env = script_env({"CLEANRL_TEST_MARKER": marker})
    # as from a terminal: a shell runs background jobs with SIGINT ignored, and Python keeps it ignored
    proc = subprocess.Popen([sys.executable, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    pids = tmp_path / "runs/i/t0000/CartPole-v1__1/pids"
    deadline = time.monotonic() + 60
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids.exists(), "the first trial did not start within 60 s"
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in out, out
    assert not processes_with_marker(marker)
    study = load(f"sqlite:///{tmp_path}/runs/i/optuna.db", "i")
    # the runs checkpointed on SIGTERM; the trial waits to resume (a retry of the same parameters)
    saved = sorted((tmp_path / "runs/i/t0000/CartPole-v1__1/checkpoints").glob("ckpt_*.pt"))
    assert saved, "the interrupted run wrote no checkpoint"
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]
    assert "SIGTERM" in study.user_attrs["error:0"] and study.get_trials()[1].user_attrs["resume_of"] == 0
    again = run_tuner(tmp_path, *args[1:], env={"CLEANRL_TEST_MARKER": marker})
    assert again.returncode == 0, again.stdout + again.stderr
    study = load(f"sqlite:///{tmp_path}/runs/i/optuna.db", "i")
    assert [t.state.name for t in lineages(study).values()] == ["COMPLETE", "COMPLETE"]
    step = int(saved[-1].stem.split("_")[1])
    assert lineages(study)[0].user_attrs["resumed_from"] == {"i/t0000/CartPole-v1__1": step} and step > 0


def test_a_seeded_study_run_again_draws_new_parameters_for_each_new_trial(tmp_path):
    """--sampler-seed seeds each trial's draw from the seed and the trial's number: the same command run
    again (or a worker that replaces a lost one) tries a new configuration, never trial 0's again."""
    space = write_space(tmp_path / "space.json", {"quality": {"low": 0.1, "high": 1.0}, "total-timesteps": 300})
    base = ("--script", FAKE, "--env-ids", "CartPole-v1", "--space", space, "--study-name", "seeded")
    base += ("--sampler", "random", "--sampler-seed", "5", "--pruner", "none", "--metric-last-n-average-window", "1")
    first = run_tuner(tmp_path, *base, "--num-trials", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_tuner(tmp_path, *base, "--num-trials", "2")
    assert again.returncode == 0, again.stdout + again.stderr
    done = trials_by_state(load(f"sqlite:///{tmp_path}/runs/seeded/optuna.db", "seeded"))
    qualities = [t.params["quality"] for t in sorted(done["COMPLETE"], key=lambda t: t.number)]
    assert len(qualities) == 2 and qualities[0] != qualities[1], qualities
    (tmp_path / "other").mkdir()
    other = run_tuner(tmp_path / "other", *base, "--num-trials", "1")
    assert other.returncode == 0, other.stdout + other.stderr
    replay = trials_by_state(load(f"sqlite:///{tmp_path}/other/runs/seeded/optuna.db", "seeded"))["COMPLETE"]
    assert replay[0].params["quality"] == qualities[0]  # seeded: the same study started anew draws the same trial 0


@pytest.mark.quick
def test_a_recorded_run_group_is_signalled_only_while_its_leader_is_the_process_recorded():
    """A dead worker's state file names its runs' process groups with each leader's start time: a group
    whose id an unrelated process holds now (a pid reused after a killed tuner) is left alone."""
    from cleanrl_utils.tuner_worker import started, stop_recorded_groups

    def group() -> subprocess.Popen:
        return subprocess.Popen(["sleep", "60"], start_new_session=True)

    stranger, ours = group(), group()
    try:
        stop_recorded_groups([[stranger.pid, started(stranger.pid) - 5.0], [ours.pid, started(ours.pid)]])
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None  # not the process that was recorded: still alive
    finally:
        stranger.kill()
        ours.kill()
