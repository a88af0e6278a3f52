"""Population-based training (cleanrl_utils/pbt.py): explore's maths, who copies whom (on frozen trials), the
copied checkpoint (own step, own generators, the leader's weights), and small populations of the real ppo.py:
the mutated learning rate reaches the logs, lineage and schedules, a lost worker, bad input."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch
import tyro
from optuna.trial import TrialState, create_trial

from cleanrl_utils import pbt
from cleanrl_utils.checkpoint import list_checkpoints, load_checkpoint
from cleanrl_utils.trials import open_storage
from tests.conftest import REPO, read_scalars, script_env

PBT = [sys.executable, "-m", "cleanrl_utils.pbt"]
SMALL = ["--extra=--num-envs 2 --num-steps 64 --num-minibatches 2 --update-epochs 2"]


# --------------------------------------------------------------------------------------------
# Explore
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_perturb_multiplies_discounts_as_their_distance_to_one_steps_integers_and_clamps():
    rng = np.random.default_rng(0)
    lr = {"low": 1e-4, "high": 3e-3, "log": True}
    seen = {pbt.perturb("learning-rate", 1e-3, lr, rng, 0.0) for _ in range(50)}
    assert sorted(seen) == pytest.approx([8e-4, 1.2e-3])
    gamma = {"low": 0.9, "high": 0.9999}
    seen = sorted({round(pbt.perturb("gamma", 0.99, gamma, rng, 0.0), 10) for _ in range(50)})
    assert seen == pytest.approx([0.988, 0.992])  # 1 - 0.01 * 1.2, 1 - 0.01 * 0.8: never past 1
    assert sorted({pbt.perturb("gae-lambda", 0.95, {"low": 0.8, "high": 0.99}, rng, 0.0) for _ in range(50)}) == (
        pytest.approx([0.94, 0.96])
    )
    epochs = {"low": 1, "high": 10}
    assert {pbt.perturb("update-epochs", 4, epochs, rng, 0.0) for _ in range(50)} == {3, 5}
    assert {pbt.perturb("update-epochs", 10, epochs, rng, 0.0) for _ in range(50)} == {9, 10}  # clamped
    assert {pbt.perturb("learning-rate", 2.9e-3, lr, rng, 0.0) for _ in range(50)} >= {3e-3}  # clamped to high
    choices = [0.0, 0.001, 0.01]
    assert {pbt.perturb("ent-coef", 0.001, choices, rng, 0.0) for _ in range(50)} == {0.0, 0.01}  # a neighbour
    drawn = [pbt.perturb("learning-rate", 1e-3, lr, rng, 1.0) for _ in range(200)]  # always drawn anew
    assert min(drawn) >= 1e-4 and max(drawn) <= 3e-3 and len(set(drawn)) == 200
    # flags outside the space are carried over unchanged
    assert pbt.explore({"learning-rate": 1e-3, "seed-like": 7}, {"learning-rate": lr}, rng, 0.0)["seed-like"] == 7


# --------------------------------------------------------------------------------------------
# Exploit: who copies whom
# --------------------------------------------------------------------------------------------
def segment(member: int, step: int, score: float | None, **extra) -> optuna.trial.FrozenTrial:
    attrs = {"member": member, "generation": step // 100, "start": step - 100, "end": step, "step": step,
             "score": score, "params": {"learning-rate": 1e-3 * (member + 1)}, **extra}  # fmt: skip
    return create_trial(state=TrialState.COMPLETE, value=score if score is not None else -math.inf, user_attrs=attrs)


@pytest.mark.quick
def test_choose_leader_bottom_copies_top_with_a_checkpoint_never_right_after_a_copy_and_only_at_its_step():
    rng = np.random.default_rng(0)
    yes = lambda m: True  # noqa: E731
    four = [segment(0, 100, 10.0), segment(1, 100, 20.0), segment(2, 100, 30.0), segment(3, 100, 40.0)]
    assert pbt.choose_leader(0, 100, four, 0.25, rng, yes) == 3  # bottom quarter copies the top quarter
    assert pbt.choose_leader(1, 100, four, 0.25, rng, yes) is None  # not in the bottom quarter
    assert pbt.choose_leader(3, 100, four, 0.25, rng, yes) is None
    assert {pbt.choose_leader(0, 100, four, 0.5, rng, yes) for _ in range(40)} == {2, 3}
    # never from a member without a checkpoint: the next of the top, or nobody
    assert {pbt.choose_leader(0, 100, four, 0.5, rng, lambda m: m != 3) for _ in range(20)} == {2}
    assert pbt.choose_leader(0, 100, four, 0.25, rng, lambda m: m != 3) is None
    # a member that restarted from a copy in this segment is not judged yet
    copied = [*four[1:], segment(0, 100, 10.0, copied=True, parent=3, parent_step=100)]
    assert pbt.choose_leader(0, 100, copied, 0.25, rng, yes) is None
    # a lagging member is compared with the others' scores at or before its own step
    ahead = [segment(m, 200, 1000.0) for m in (1, 2, 3)]  # later and better: not comparable with step 100
    assert pbt.choose_leader(0, 100, four + ahead, 0.25, rng, yes) == 3
    lagging = [segment(0, 100, 35.0), *four[1:], *ahead]
    assert pbt.choose_leader(0, 100, lagging, 0.25, rng, yes) is None  # second of four at step 100
    # a failed or running segment has no score to compare
    running = create_trial(state=TrialState.FAIL, user_attrs={"member": 3, "step": 100, "score": 99.0, "params": {}})
    assert pbt.standing([*four[:3], running], 100).keys() == {0, 1, 2}
    # a single member has nobody to copy
    assert pbt.choose_leader(0, 100, four[:1], 0.25, rng, yes) is None
    # the first members to end a segment wait for a quorum: a pair is not ranked when 3 must be
    assert pbt.choose_leader(0, 100, [four[0], four[3]], 0.5, rng, yes, quorum=3) is None
    assert pbt.choose_leader(0, 100, [four[0], four[1], four[3]], 0.5, rng, yes, quorum=3) == 3


@pytest.mark.quick
def test_next_segment_ranks_a_member_only_when_the_population_s_quorum_has_scores(tmp_path, monkeypatch):
    """8 members, --quorum 0.5: the worst of 3 scored members is not judged; the worst of 4 copies."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.json").write_text(json.dumps({"learning-rate": {"low": 1e-4, "high": 1e-2, "log": True}}))
    population = pbt.build(tyro.cli(pbt.Args, args=["--script", "cleanrl/ppo.py", "--population", "8", "--quorum",
                                                    "0.5", "--total-timesteps", "1000", "--ready", "100", "--space",
                                                    "space.json", "--study-name", "pop"]))  # fmt: skip

    class Copied(Exception):
        pass

    def copy_leader(*args):
        raise Copied(args)

    monkeypatch.setattr(pbt, "copy_leader", copy_leader)
    monkeypatch.setattr(pbt.Population, "has_checkpoint", lambda self, member: True)
    scored = [segment(m, 100, 10.0 * (m + 1)) for m in range(4)]

    class Study:
        def __init__(self, trials):
            self.trials = trials

        def get_trials(self, deepcopy=True):
            return self.trials

    nxt = pbt.next_segment(population, Study(scored[:3]), scored[0], 100)
    assert nxt is not None and nxt["start"] == 100 and "parent" not in nxt  # 3 of 8 scored: not judged
    with pytest.raises(Copied):
        pbt.next_segment(population, Study(scored), scored[0], 100)  # 4 of 8: the worst copies


@pytest.mark.quick
def test_schedule_follows_the_lineage_back_through_copies():
    """Member 0 trained 0-100 with lr A, copied member 2 at 100 (member 2 had 0-100 with lr C), then 100-200
    with lr A': its weights saw C then A'."""

    def seg(member, start, step, lr, **extra):
        attrs = {"member": member, "generation": start // 100, "start": start, "end": step, "step": step,
                 "score": 1.0, "params": {"learning-rate": lr}, **extra}  # fmt: skip
        return create_trial(state=TrialState.COMPLETE, value=1.0, user_attrs=attrs)

    segments = [seg(0, 0, 100, 1.0), seg(2, 0, 100, 3.0), seg(0, 100, 200, 3.6, copied=True, parent=2, parent_step=100),
                seg(2, 100, 200, 2.4)]  # fmt: skip

    class Study:
        def get_trials(self, deepcopy=False):
            return segments

    population = pbt.Population(pbt.Args(), Path("x.py"), "p", "sqlite://", {}, ())
    assert pbt.schedule(population, Study(), 0) == [(0, {"learning-rate": 3.0}), (100, {"learning-rate": 3.6})]
    assert pbt.schedule(population, Study(), 2) == [(0, {"learning-rate": 3.0}), (100, {"learning-rate": 2.4})]


@pytest.mark.quick
def test_reseeded_copy_draws_differently_from_its_leader_and_from_other_copies():
    from cleanrl_utils.checkpoint import rng_state

    torch.manual_seed(3)
    np.random.seed(3)
    state = {"rng": rng_state(), "ranks": [{"rng": rng_state()}, {"rng": rng_state()}], "agent": {"w": torch.ones(2)}}
    a = pbt.reseeded(state, [1, 0, 1])
    b = pbt.reseeded(state, [1, 1, 1])
    again = pbt.reseeded(state, [1, 0, 1])
    for key in ("torch", "numpy"):
        assert repr(a["rng"][key]) != repr(state["rng"][key]) and repr(a["rng"][key]) != repr(b["rng"][key])
        assert repr(a["rng"][key]) == repr(again["rng"][key])  # deterministic given the salt
        assert repr(a["ranks"][0]["rng"][key]) != repr(a["ranks"][1]["rng"][key])
    assert a["agent"] is state["agent"]  # the weights are the leader's


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--population", "1"], "--population 1: a population needs at least 2 members"),
        (["--fraction", "0.7"], "--fraction 0.7: must be in (0, 0.5]"),
        (["--quorum", "0"], "--quorum 0.0: must be in (0, 1]"),
        (["--ready", "0"], "--ready 0: must be a positive integer"),
        (["--space", "SPACE"], "--space: num-steps may not change on resume (the script allows --learning-rate"),
        (["--extra=--num-envs 0"], "member 0: --num-envs 0"),
    ],
)
def test_bad_input_one_line_exit_2_before_any_run(tmp_path, flags, message):
    (tmp_path / "space.json").write_text(
        json.dumps({"num-steps": [16, 32], "learning-rate": {"low": 1e-4, "high": 1e-3}})
    )
    flags = [f.replace("SPACE", str(tmp_path / "space.json")) for f in flags]
    proc = subprocess.run([*PBT, *flags], cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.quick
def test_a_worker_s_process_count_is_its_own_the_population_s_settings_are_fixed(tmp_path, monkeypatch):
    """Workers running members on 2 torchrun processes and on plain python serve one population (a member
    continues whatever count saved its checkpoint: the elastic re-split); another size is refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.json").write_text(json.dumps({"q-lr": {"low": 1e-4, "high": 1e-3}}))

    def population(*flags):
        argv = ["--script", "cleanrl/sac_continuous_action_multigpu.py", "--env-id", "Pendulum-v1", "--space",
                "space.json", "--study-name", "pop", *flags]  # fmt: skip
        return pbt.build(tyro.cli(pbt.Args, args=argv))

    wide, plain = population("--torchrun", "2"), population()
    pbt.seed_population(wide)
    pbt.seed_population(plain)  # the same population: its first segments are not enqueued twice
    assert len(load_pop(tmp_path).get_trials()) == 8
    study = load_pop(tmp_path)  # a population begun before --torchrun left its settings: still the same one
    study.set_user_attr("config", {**study.user_attrs["config"], "torchrun": 2})
    pbt.seed_population(plain)
    segment = {"member": 1, "params": {"q-lr": 5e-4}}
    assert pbt.segment_command(wide, segment)[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert pbt.segment_command(plain, segment)[1].endswith("sac_continuous_action_multigpu.py")
    with pytest.raises(pbt.PBTError, match="population pop was started with population=8: give another"):
        pbt.seed_population(population("--population", "4"))


@pytest.mark.quick
def test_a_retry_claimed_before_its_lost_segment_is_failed_trains(tmp_path, monkeypatch):
    """``lose`` enqueues a lost segment's retry, then fails the segment; a worker that claims the retry in
    between (the segment still running) trains it and fails the segment itself, instead of standing down
    and leaving the member with no segment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pbt, "CLAIM_SETTLE", 0.0)
    (tmp_path / "space.json").write_text(json.dumps({"learning-rate": {"low": 1e-4, "high": 1e-2, "log": True}}))
    population = pbt.build(tyro.cli(pbt.Args, args=["--script", "cleanrl/ppo.py", "--population", "2", "--total-"
                                                    "timesteps", "1000", "--ready", "100", "--space", "space.json",
                                                    "--study-name", "pop"]))  # fmt: skip
    pbt.seed_population(population)
    study = population.study()
    first, second = pbt.claim(study, population), pbt.claim(study, population)
    assert first is not None and second is not None and pbt.claim(study, population) is None
    enqueue, claimed = study.enqueue_trial, []

    def enqueue_then_another_worker_claims(*args, **kwargs):
        enqueue(*args, **kwargs)
        claimed.append(pbt.claim(study, population))

    study.enqueue_trial = enqueue_then_another_worker_claims
    pbt.lose(study, study.get_trials()[first.number], "its worker is gone", max_resumes=2)
    (retry,) = claimed
    assert retry is not None and retry.user_attrs["resume_of"] == first.number
    assert retry.user_attrs["member"] == first.user_attrs["member"]
    assert study.get_trials()[first.number].state == TrialState.FAIL


@pytest.mark.timeout(600)
def test_a_leader_saved_by_two_processes_is_continued_by_a_member_on_one(tmp_path, monkeypatch):
    """Exploit across process counts: member 1 trains its segment on 2 torchrun processes, member 0 on one;
    member 0 copies member 1 (the leader's weights at its own step) and continues on 1 process, re-split."""
    monkeypatch.chdir(tmp_path)
    for name, value in script_env().items():
        monkeypatch.setenv(name, value)
    (tmp_path / "space.json").write_text(json.dumps({"q-lr": {"low": 1e-4, "high": 1e-3}}))
    argv = ["--script", "cleanrl/sac_continuous_action_multigpu.py", "--env-id", "Pendulum-v1", "--space",
            "space.json", "--study-name", "pop", "--population", "2", "--total-timesteps", "256", "--ready", "128",
            "--extra=--num-envs 2 --learning-starts 64 --batch-size 16 --no-cuda"]  # fmt: skip
    wide, plain = (pbt.build(tyro.cli(pbt.Args, args=argv + more)) for more in (["--torchrun", "2"], []))
    for population, member in ((wide, 1), (plain, 0)):
        run = population.run_dir(member)
        code = pbt.train_to(pbt.command_for(population, run, member, {"q-lr": 5e-4}), tmp_path / f"m{member}.log",
                            128, population.args)  # fmt: skip
        assert code in pbt.STOPPED, (tmp_path / f"m{member}.log").read_text()[-3000:]
    leader = load_checkpoint(list_checkpoints(wide.run_dir(1) / "checkpoints")[-1])
    assert leader["world_size"] == 2 and len(leader["ranks"]) == 2
    assert pbt.copy_leader(plain, 0, 1, 128, 1) == leader["global_step"]
    copied = load_checkpoint(list_checkpoints(plain.run_dir(0) / "checkpoints")[-1])
    assert copied["run_name"] == "pop/m0" and copied["args"]["seed"] == 1 and copied["world_size"] == 2
    log = tmp_path / "m0-after.log"
    code = pbt.train_to(pbt.command_for(plain, plain.run_dir(0), 0, {"q-lr": 6e-4}), log, 256, plain.args)
    assert code == 0, log.read_text()[-3000:]
    assert "(2 processes -> 1)\n--q-lr 0.0006: changed on resume (trained so far with 0.0005)" in log.read_text()
    final = load_checkpoint(list_checkpoints(plain.run_dir(0) / "checkpoints")[-1])
    assert final["global_step"] >= 256 and final["world_size"] == 1 and final["args"]["q_lr"] == 6e-4


# --------------------------------------------------------------------------------------------
# A population of the real ppo.py
# --------------------------------------------------------------------------------------------
def run_pbt(cwd: Path, *flags: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*PBT, *flags], cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=timeout)


def load_pop(cwd: Path, name: str = "pop") -> optuna.Study:
    """The study as the population opens it (a new database's tables made once, whoever comes first)."""
    return optuna.load_study(study_name=name, storage=open_storage(f"sqlite:///{cwd / 'runs' / name / 'optuna.db'}"))


def segments_of(cwd: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    return [t for t in load_pop(cwd, name).get_trials() if "member" in t.user_attrs]


def logged_lr(run: Path) -> dict[int, float]:
    return dict(read_scalars(run)["charts/learning_rate"])


@pytest.mark.timeout(600)
def test_a_budget_the_script_rounds_down_to_whole_iterations_still_finishes(tmp_path):
    """--total-timesteps 320 with 128 steps per iteration: each run trains 256 (whole iterations) and exits 0;
    its last segment counts as finished (not as failed below 320), and the report finds every member."""
    flags = ["--population", "2", "--total-timesteps", "320", "--ready", "128", "--study-name", "pop", *SMALL]
    proc = run_pbt(tmp_path, *flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = [t for t in segments_of(tmp_path, "pop") if t.user_attrs["end"] == 320]
    assert sorted(t.user_attrs["member"] for t in last) == [0, 1]
    assert all(t.state == TrialState.COMPLETE and t.user_attrs["final"] and t.user_attrs["step"] == 256 for t in last)
    assert "best member " in proc.stdout and "did not finish" not in proc.stdout


@pytest.mark.timeout(900)
def test_population_exploits_explores_and_the_mutated_learning_rate_reaches_the_logs(tmp_path):
    (tmp_path / "space.json").write_text(json.dumps({"learning-rate": {"low": 1e-4, "high": 1e-2, "log": True},
                                                     "gamma": {"low": 0.9, "high": 0.999}}))  # fmt: skip
    total, ready, batch = 2048, 512, 128
    flags = ["--script", str(REPO / "cleanrl" / "ppo.py"), "--population", "4", "--total-timesteps", str(total),
             "--ready", str(ready), "--workers", "2", "--fraction", "0.5", "--window", "5",
             "--resample-probability", "0", "--space", str(tmp_path / "space.json"), "--study-name", "pop", *SMALL]  # fmt: skip
    proc = run_pbt(tmp_path, *flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = [t for t in segments_of(tmp_path, "pop") if t.state == TrialState.COMPLETE]
    assert sorted(t.user_attrs["member"] for t in done if t.user_attrs["step"] >= total) == [0, 1, 2, 3]
    copies = [t for t in done if t.user_attrs.get("parent") is not None]
    assert copies, "no member copied another in 4 x 3 decisions at fraction 0.5"
    num_iterations = total // batch
    for t in copies:
        a = t.user_attrs
        member, lr = a["member"], a["params"]["learning-rate"]
        leader_lr = next(s.user_attrs["params"]["learning-rate"] for s in done if s.user_attrs["member"] == a["parent"]
                         and s.user_attrs["start"] < a["parent_step"] <= s.user_attrs["step"])  # fmt: skip
        assert lr != leader_lr and min(abs(lr / leader_lr - f) for f in (0.8, 1.2)) < 1e-9 or lr in (1e-4, 1e-2)
        logged = logged_lr(tmp_path / "runs" / "pop" / f"m{member}")
        steps = [s for s in logged if a["start"] < s <= a["step"]]
        assert steps, (a, sorted(logged))
        for s in steps:  # annealed from the mutated base, at the member's own iteration
            frac = 1.0 - (s // batch - 1.0) / num_iterations
            assert logged[s] == pytest.approx(frac * lr, rel=1e-5), (member, s, logged[s], lr, leader_lr)
    for member in range(4):
        run = tmp_path / "runs" / "pop" / f"m{member}"
        steps = [s for s, _ in read_scalars(run)["charts/learning_rate"]]
        assert steps == sorted(steps) and steps[-1] == total  # its own step counter, never the leader's
        assert len(list_checkpoints(run / "checkpoints")) <= 2
        assert load_checkpoint(list_checkpoints(run / "checkpoints")[-1])["global_step"] == total
    lineage = (tmp_path / "runs" / "pop" / "lineage.md").read_text()
    assert f"m{copies[0].user_attrs['parent']} (step {copies[0].user_attrs['parent_step']:,})" in lineage
    best = json.loads((tmp_path / "runs" / "pop" / "best.json").read_text())
    assert best["best_score"] == max(t.user_attrs["score"] for t in done if t.user_attrs["step"] >= total)
    assert (tmp_path / "runs" / "pop" / "schedules.png").stat().st_size > 0
    assert "replay: " in proc.stdout


@pytest.mark.timeout(900)
def test_a_killed_worker_s_member_resumes_its_own_lineage_and_the_baseline_trains_the_first_flags(tmp_path):
    """SIGKILL the worker training member 0's second segment (its run dies with it): the segment is enqueued
    again with the same flags, and a new worker continues member 0 with --resume from its own checkpoint (not
    from scratch, not re-mutated). Then --baseline trains the members' first flags independently, and the
    population's report sets both side by side."""
    import signal
    import time

    (tmp_path / "space.json").write_text(json.dumps({"learning-rate": {"low": 1e-4, "high": 1e-2, "log": True}}))
    flags = ["--script", str(REPO / "cleanrl" / "ppo.py"), "--population", "2", "--total-timesteps", "1536",
             "--ready", "512", "--workers", "1", "--heartbeat", "1", "--poll", "0.1",
             "--space", str(tmp_path / "space.json"), "--study-name", "pop", *SMALL]  # fmt: skip
    proc = subprocess.Popen([*PBT, *flags], cwd=tmp_path, env=script_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
        if not (tmp_path / "runs" / "pop" / "optuna.db").exists():
            continue
        try:
            trials = segments_of(tmp_path, "pop")
        except KeyError:  # the study is not created yet
            continue
        for t in trials:
            a = t.user_attrs
            if t.state == TrialState.RUNNING and a["member"] == 0 and a["generation"] == 1 and "worker" in a:
                time.sleep(0.5)  # into its training
                os.kill(a["worker"]["pid"], signal.SIGKILL)
                killed = t
    out, _ = proc.communicate(timeout=600)
    assert killed is not None, out
    assert proc.returncode == 0, out
    assert (
        f"member 0's segment {killed.number} lost (its worker (pid {killed.user_attrs['worker']['pid']}) is gone)"
        in out
    )
    trials = segments_of(tmp_path, "pop")
    retry = next(t for t in trials if t.user_attrs.get("resume_of") == killed.number)
    assert retry.state == TrialState.COMPLETE and retry.user_attrs["params"] == killed.user_attrs["params"]
    assert (retry.user_attrs["start"], retry.user_attrs["end"]) == (
        killed.user_attrs["start"],
        killed.user_attrs["end"],
    )
    commands = [line for line in (tmp_path / "runs" / "pop" / "logs" / "m0.log").read_text().splitlines()
                if line.startswith("[pbt] ")]  # fmt: skip
    assert len(commands) == 4 and "--resume runs/pop/m0 --run-name" in commands[2], commands  # no flag changed
    steps = [s for s, _ in read_scalars(tmp_path / "runs" / "pop" / "m0")["charts/learning_rate"]]
    assert steps == sorted(steps) and steps[-1] == 1536  # continued, never restarted from step 0

    base = run_pbt(tmp_path, *flags, "--baseline")
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]
    independent = [t for t in segments_of(tmp_path, "pop-baseline") if t.state == TrialState.COMPLETE]
    assert not any(t.user_attrs.get("parent") is not None for t in independent)
    first = {t.user_attrs["member"]: t.user_attrs["params"] for t in trials if t.user_attrs["generation"] == 0}
    assert {t.user_attrs["member"]: t.user_attrs["params"] for t in independent} == first  # never explored
    report = run_pbt(tmp_path, *flags, "--report")
    finals = [t.user_attrs["score"] for t in independent if t.user_attrs["step"] >= 1536]
    line = (f"independent runs of the members' first flags and seeds): best {max(finals):.2f}, median "
            f"{np.median(finals):.2f}, std {np.std(finals):.2f}, ")  # fmt: skip
    assert line in report.stdout, report.stdout[-2000:]
    best = json.loads((tmp_path / "runs" / "pop" / "best.json").read_text())["baseline"]
    assert best["scores"] == sorted(finals) and 0 < best["wall_s"] < 600
    assert (tmp_path / "runs" / "pop" / "curves.png").stat().st_size > 10_000  # the population beside its baseline

    # --replay: one fresh run on the schedule of the member that copied (1 worker: the same every time), its
    # flags changing at the steps the schedule says
    population = pbt.build(tyro.cli(pbt.Args, args=flags))
    steps, m = max(((pbt.schedule(population, load_pop(tmp_path), m), m) for m in (0, 1)), key=lambda x: len(x[0]))
    assert len(steps) >= 2, steps
    again = run_pbt(tmp_path, *flags, "--replay", str(m))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert again.stdout.count("[pbt] replay from step") == len(steps)
    replayed = logged_lr(tmp_path / "runs" / "pop" / f"replay-m{m}")
    for i, (start, params) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else 1536
        for s, value in replayed.items():
            if start < s <= end:
                assert value == pytest.approx((1.0 - (s // 128 - 1.0) / 12) * params["learning-rate"], rel=1e-5)
    assert (
        load_checkpoint(list_checkpoints(tmp_path / "runs" / "pop" / f"replay-m{m}" / "checkpoints")[-1])["global_step"]
        == 1536
    )
