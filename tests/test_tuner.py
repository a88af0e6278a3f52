"""The Optuna tuner: its objective maths, parallel workers on one study (SQLite, journal, PostgreSQL),
a killed worker, live pruning, failing runs, bad input, and the request's command on the real scripts.

Most studies train ``tests/fake_train.py``, whose episodic returns follow a known schedule
(``500 * quality * step / total + seed / 100``), so every objective value is known in advance.
"""

import json
import math
import os
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
    if "://" not in storage:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(storage))
    return optuna.load_study(study_name=study, storage=storage)


def trials_by_state(study: optuna.Study) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in study.get_trials():
        if not t.user_attrs.get("surplus"):
            out.setdefault(t.state.name, []).append(t)
    return out


# --------------------------------------------------------------------------------------------
# The objective's maths
# --------------------------------------------------------------------------------------------
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


def test_shipped_spaces_name_real_flags():
    """Every key of every shipped search space is a flag of its script (a typo would fail every trial)."""
    from cleanrl_utils.benchmark import load_script

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
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
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


def test_killed_worker_fails_its_trial_and_the_study_finishes(tmp_path, marker):
    """SIGKILL one worker mid-trial: its trial is failed and its runs are gone, the others finish the study.
    Then SIGKILL the whole tuner mid-trial: re-running the same command fails the orphaned trial and
    finishes the study (journal storage: no heartbeat, the dead worker's pid tells)."""
    space = write_space(
        tmp_path / "space.json",
        {"quality": {"low": 0.1, "high": 1.0}, "total-timesteps": 2000, "step-time": 0.15},
    )
    args = ("--script", FAKE, "--env-ids", "CartPole-v1", "--space", space, "--pruner", "none")
    args += ("--storage", "study.log", "--study-name", "k", "--num-trials", "4", "--progress-interval", "1")
    env = script_env({"CLEANRL_TEST_MARKER": marker})

    def running_trial(study_file: Path):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if study_file.exists():
                for t in load(str(study_file), "k").get_trials(states=(optuna.trial.TrialState.RUNNING,)):
                    if "worker" in t.user_attrs and list((tmp_path / "runs/k").glob(f"t{t.number:04d}/*/pids")):
                        return t
            time.sleep(0.3)
        raise AssertionError("no trial started within 120 s")

    first = subprocess.Popen([sys.executable, TUNER, *args, "--workers", "2"], cwd=tmp_path, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    victim = running_trial(tmp_path / "study.log")
    os.kill(victim.user_attrs["worker"]["pid"], signal.SIGKILL)
    # wait for the first invocation to be mid-way in another trial, then kill it whole
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = trials_by_state(load(str(tmp_path / "study.log"), "k"))
        if states.get("COMPLETE") and states.get("RUNNING"):
            break
        time.sleep(0.3)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    time.sleep(1.0)
    assert not processes_with_marker(marker), "a killed tuner left workers or runs behind"
    study = load(str(tmp_path / "study.log"), "k")
    killed = next(t for t in study.get_trials() if t.number == victim.number)
    assert killed.state.name == "FAIL" and "died" in killed.user_attrs["error"], killed.user_attrs
    orphaned = [t for t in study.get_trials() if t.state.name == "RUNNING"]
    assert orphaned, "the second kill should leave a trial running in the storage"

    again = run_tuner(tmp_path, *args, "--workers", "1", env={"CLEANRL_TEST_MARKER": marker}, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    states = trials_by_state(load(str(tmp_path / "study.log"), "k"))
    assert len(states["COMPLETE"]) == 4 and "RUNNING" not in states
    for t in orphaned:
        t = next(s for s in states["FAIL"] if s.number == t.number)
        assert "is gone" in t.user_attrs["error"]
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
    ],
)
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


def test_ctrl_c_stops_runs_and_fails_the_trial_then_resumes(tmp_path, marker):
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
    assert [(t.state.name, t.user_attrs.get("error")) for t in study.get_trials()] == [("FAIL", "interrupted")]
    again = run_tuner(tmp_path, *args[1:], env={"CLEANRL_TEST_MARKER": marker})
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(trials_by_state(load(f"sqlite:///{tmp_path}/runs/i/optuna.db", "i"))["COMPLETE"]) == 2
