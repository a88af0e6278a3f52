"""The grid runner: every run of the grid, one log and status per run, failures reported and
counted in the exit code, --skip-completed skipping finished runs and resuming interrupted ones."""

import json
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cleanrl_utils.launch import device_slots, world_size_of
from cleanrl_utils.tb import ScalarReader
from tests.conftest import REPO, run_script, script_env

FAKE = str(REPO / "tests" / "fake_train.py")


def bench(cwd, *args):
    return subprocess.run(
        [sys.executable, "-m", "cleanrl_utils.benchmark", *args], cwd=cwd, env=script_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip


def test_grid_failures_and_skip_completed(tmp_path):
    cmd = f"python {FAKE} --step-time 0 --total-timesteps 300"
    crash = f"python {FAKE} --step-time 0 --exp-name crash --crash-at 0.5"
    proc = bench(tmp_path, "--env-ids", "CartPole-v1", "Acrobot-v1", "--command", cmd, crash, "--num-seeds", "2",
                 "--workers", "2")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "4 of 8 runs succeeded" in proc.stdout
    failures = [line for line in proc.stdout.splitlines() if line.startswith("[benchmark] FAILED")]
    assert len(failures) == 4 and all("exit 3" in f and "planned crash" in f for f in failures)
    for env in ("CartPole-v1", "Acrobot-v1"):
        for seed in (1, 2):
            name = f"{env}__fake_train__{seed}"
            assert json.loads((tmp_path / f"runs/logs/{name}.json").read_text())["returncode"] == 0
            hp = ScalarReader(tmp_path / "runs" / name).update().hyperparameters()
            assert (hp["env_id"], hp["seed"], hp["total_timesteps"]) == (env, str(seed), "300")
            assert json.loads((tmp_path / f"runs/logs/{env}__fake_train__{seed}.json").read_text())["returncode"] == 0
    again = bench(tmp_path, "--env-ids", "CartPole-v1", "Acrobot-v1", "--command", cmd, crash, "--num-seeds", "2",
                  "--skip-completed", "--dry-run")  # fmt: skip
    lines = [line for line in again.stdout.splitlines() if not line.startswith("[")]
    assert "skipping 4 completed runs" in again.stdout and len(lines) == 4 and all("crash" in line for line in lines)


def test_interrupted_run_resumes_and_existing_checkpoints_refused(tmp_path):
    """A run killed after its checkpoint at 768 steps continues there, in its own (nested) run directory."""
    run = "b/CartPole-v1__ppo__1"
    run_script("ppo.py", "--total-timesteps", "1024", "--checkpoint-interval", "256", "--run-name", run, cwd=tmp_path)
    (tmp_path / "runs" / run / "checkpoints/ckpt_00001024.pt").unlink()  # as if killed after 768 steps
    # the project's path of the script, as in CleanRL's docs, from another directory: it runs, and the
    # printed command names the script as it runs from here
    cmd = "python cleanrl/ppo.py --total-timesteps 1024 --checkpoint-interval 256 --no-progress"
    args = ("--env-ids", "CartPole-v1", "--command", cmd, "--num-seeds", "1", "--run-prefix", "b/")
    refused = bench(tmp_path, *args)
    assert refused.returncode == 2 and "holds checkpoints: pass --skip-completed" in refused.stderr
    resumed = bench(tmp_path, *args, "--skip-completed")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"--resume runs/{run}" in resumed.stdout
    started = next(line for line in resumed.stdout.splitlines() if line.startswith("[benchmark] start"))
    assert (tmp_path / started.split(": ", 1)[1].split()[1]).is_file(), started
    log = (tmp_path / "runs/logs/b/CartPole-v1__ppo__1.log").read_text()
    assert "done: 1,024 steps (256 in" in log  # continued from step 768, not restarted
    assert (tmp_path / "runs" / run / "checkpoints/ckpt_00001024.pt").exists()  # in the same directory
    assert not (tmp_path / "runs/CartPole-v1__ppo__1").exists()


def test_a_terminated_runner_stops_its_runs_with_their_checkpoints(tmp_path):
    """SIGTERM to the runner (a scheduler's, or kill): its runs get SIGTERM and write their checkpoint
    before it exits 143, rather than dying unsaved with it; --skip-completed then continues them."""
    cmd = "python cleanrl/ppo.py --total-timesteps 10000000 --checkpoint-interval 0 --no-progress"  # no periodic one
    args = ["--env-ids", "CartPole-v1", "--command", cmd, "--num-seeds", "2", "--workers", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "cleanrl_utils.benchmark", *args], cwd=tmp_path, env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    runs = [tmp_path / f"runs/CartPole-v1__ppo__{seed}" for seed in (1, 2)]
    deadline = time.monotonic() + 120
    while not all(run.is_dir() and ScalarReader(run).update().get("charts/SPS").steps for run in runs):  # training
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # the runner alone, not its runs' process groups
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "[benchmark] interrupted (signal 15): stopping 2 runs" in out, out
    for run in runs:
        saved = sorted((run / "checkpoints").glob("ckpt_*.pt"))
        assert saved and int(saved[-1].stem.split("_")[1]) > 0, run
    dry = bench(tmp_path, *args, "--skip-completed", "--dry-run")
    assert dry.stdout.count("--resume runs/CartPole-v1__ppo__") == 2, dry.stdout


@pytest.mark.quick
def test_bad_input_exits_2_before_any_run(tmp_path):
    bad = bench(tmp_path, "--env-ids", "CartPole-v1", "--command", f"python {FAKE} --num-steps 7", "--num-seeds", "1")
    assert bad.returncode == 2 and "--num-steps 7: must divide --total-timesteps 1000" in bad.stderr
    assert not (tmp_path / "runs").exists()
    bad = bench(tmp_path, "--env-ids", "CartPole-v1", "--command", "python nothing.py")
    assert bad.returncode == 2 and "names no existing .py script" in bad.stderr


@pytest.mark.quick
def test_device_slots_and_world_size():
    assert device_slots([0, 1], 2, 1) == [{"CUDA_VISIBLE_DEVICES": "0"}] * 2 + [{"CUDA_VISIBLE_DEVICES": "1"}] * 2
    assert device_slots([0, 1, 2, 3], 1, 2) == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert device_slots([], 1, 1) == []
    assert world_size_of(["torchrun", "--nnodes=2", "--nproc_per_node", "4", "x.py"]) == 8
    assert world_size_of(["python", "x.py"]) == 1


def _learning():
    sys.path.insert(0, str(REPO / "benchmark"))
    import learning

    return learning


@pytest.mark.quick
def test_every_command_of_the_gpu_suite_is_accepted_by_its_script():
    """The GPU suite is run on a GPU machine only: its commands must be right the day one is there."""
    from cleanrl_utils.launch import check_script_args, script_of

    learning = _learning()
    jobs = learning.jobs_of("gpu")
    assert {(job.argv[job.argv.index("--env-id") + 1], learning.seed_of(job)) for job in jobs} >= {
        ("BreakoutNoFrameskip-v4", 3),
        ("PongNoFrameskip-v4", 3),
        ("HalfCheetah-v4", 3),
    }
    for suite in learning.SUITES:
        for job in learning.jobs_of(suite):
            script = script_of(job.argv)
            tail = job.argv[job.argv.index(str(script)) + 1 :]
            _, error = check_script_args(script, tail, world_size_of(job.argv))
            assert error is None, f"{suite}: {job.argv}: {error}"
            if script.name == "sb3_ppo.py":  # not one of ours: its own parser (exits 2 on a flag it lacks)
                assert _sb3_ppo().parse(tail).total_timesteps == 1_000_000


@pytest.mark.quick
def test_every_off_policy_row_keeps_its_replay_in_the_checkpoint():
    """A suite run stopped between sittings resumes exactly only if its replay was in the checkpoint (without
    it the resumed run starts from an empty buffer); dqn_atari's 1M frames (7 GB a checkpoint) are left out."""
    from cleanrl_utils.launch import script_of

    learning = _learning()
    checked = []
    for suite, rows in learning.SUITES.items():
        for r in rows:
            script = script_of(r.command.split())
            if "checkpoint_buffer: bool" not in (REPO / script).read_text() or script.name == "dqn_atari.py":
                continue
            assert "--checkpoint-buffer" in r.command.split(), f"{suite}: {r.command}"
            checked.append((suite, r.exp))
    assert {("classic", "dqn"), ("mujoco", "sac_continuous_action"), ("scaled", "sac_continuous_action_multigpu"),
            ("gpu", "sac_continuous_action")} <= set(checked)  # fmt: skip


@pytest.mark.quick
def test_the_scaled_page_shows_its_runs_beside_their_single_process_rows_only(tmp_path, monkeypatch):
    """The scaled suite is read beside the runs of the same flags in other suites (SAC HalfCheetah, PPO and APPO
    CartPole), not beside every record those suites hold (Hopper, Walker2d, Acrobot, DQN)."""
    learning = _learning()
    monkeypatch.chdir(tmp_path)  # no runs/ here: the records are what there is
    for suite in ("mujoco", "classic"):
        (tmp_path / suite / "records").mkdir(parents=True)
        for job in learning.jobs_of(suite):
            (tmp_path / suite / "records" / f"{job.run_dir.name}.run.json.gz").touch()
    shown = sorted(p.name.removesuffix(".run.json.gz") for p in learning.compared_records("scaled", tmp_path))
    assert shown == [f"CartPole-v1__{exp}__{seed}" for exp in ("appo", "ppo") for seed in (1, 2, 3)] + [
        f"HalfCheetah-v4__sac_continuous_action__{seed}" for seed in (1, 2, 3)
    ]
    assert learning.compared_records("mujoco", tmp_path) == []


@pytest.mark.quick
def test_the_page_groups_its_runs_commits_by_training_code(tmp_path, monkeypatch):
    """Rows made over several sessions name their commits; the page says which of them ran the same training
    code: a commit that changed only the results reader joins its predecessor, one that changed a script not."""
    learning = _learning()
    repo = tmp_path / "repo"
    (repo / "cleanrl").mkdir(parents=True)
    (repo / "cleanrl_utils").mkdir()

    def commit(path, text):
        (repo / path).write_text(text)
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", path], check=True)
        return subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()

    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = commit("cleanrl/ppo.py", "lr = 1\n")
    reader = commit("cleanrl_utils/plot.py", "print()\n")
    script = commit("cleanrl/ppo.py", "lr = 2\n")
    monkeypatch.setattr(learning, "REPO", repo)
    assert learning.same_training_code(first, reader) and not learning.same_training_code(reader, script)
    assert not learning.same_training_code(first, "unknown")
    out = tmp_path / "benchmarks"

    def publish_earlier(suite, made_by, seeds=1):  # a row published before run records were kept
        (out / suite / "earlier").mkdir(parents=True)
        (out / suite / "earlier" / "commit.txt").write_text(f"{made_by}\n")
        (out / suite / "earlier" / "final_returns.csv").write_text(
            f"script,env_id,seeds,runs,mean,std,iqm,steps\nppo,CartPole-v1,{seeds},{seeds},500.0,0.0,500.0,499968\n"
        )
        (out / suite / "earlier" / "throughput.csv").write_text(
            "script,env_id,world_size,runs,sps,wall_s\nppo,CartPole-v1,1,1,3387.0,156.0\n"
        )

    publish_earlier("classic", first)
    publish_earlier("atari", reader)
    assert f"by 1 version of the training code: {first} = {reader} (" in learning.code_versions(out)
    publish_earlier("mujoco", script, seeds=2)
    assert f"by 2 versions of the training code: {first} = {reader}; {script} (" in learning.code_versions(out)
    # once run records hold an earlier row's seeds (1 to n) the row leaves the page, and its commit the line
    from cleanrl_utils import plot

    empty = np.zeros(0)
    run = plot.RunData(Path("CartPole-v1__ppo__1"), "ppo", "CartPole-v1", 1, 1, empty, empty, empty, 1.0, 1.0, 1)
    for seed in (1, 2):
        plot.save_record(run, out / "mujoco" / "records" / f"CartPole-v1__ppo__{seed}{plot.RECORD}", commits=[first])
        versions = learning.code_versions(out)
        assert (f"; {script} (" in versions) == (seed == 1), versions
    assert f"by 1 version of the training code: {first} = {reader} (" in versions


def test_a_suite_runs_resumes_and_writes_its_table_curves_and_page(tmp_path, monkeypatch):
    """The suite plumbing on a tiny budget: two seeds of 2,048 steps through the grid runner, then the
    final-return table beside CleanRL's number, the curves, and the page; a second call runs nothing."""
    learning = _learning()
    monkeypatch.setitem(learning.SUITES, "tiny", [learning.row("ppo", "python cleanrl/ppo.py --num-envs 4",
                        ["CartPole-v1"], 2048, 2, [("CartPole-v1", 490.04, 6.12, "")])])  # fmt: skip
    monkeypatch.setitem(learning.DESCRIPTION, "tiny", "two short seeds")
    monkeypatch.setattr(learning, "SUITES", {"tiny": learning.SUITES["tiny"]})
    monkeypatch.chdir(tmp_path)
    for name, value in script_env().items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "docs" / "benchmarks"
    out.mkdir(parents=True)
    (out / "notes.md").write_text("by hand\n\n## tiny\n\nA finding.\n\n## population-based training\n\nA table.\n")
    assert learning.main(["tiny", "--workers", "2", "--out", str(out)]) == 0
    runs = sorted(p.name for p in (tmp_path / "runs/bench/tiny").iterdir())
    assert runs == ["CartPole-v1__ppo__1", "CartPole-v1__ppo__2", "commits.txt"]
    finals = learning.read_csv(out / "tiny" / "final_returns.csv")
    assert [(r["script"], r["env_id"], r["seeds"], r["steps"]) for r in finals] == [("ppo", "CartPole-v1", "2", "2048")]
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    mean, std = float(finals[0]["mean"]), float(finals[0]["std"])
    made_by = (tmp_path / "runs/logs/bench/tiny/CartPole-v1__ppo__1.commits").read_text().split()[0]
    assert f"| ppo | CartPole-v1 | 2,048 | 2 | {mean:,.2f} ± {std:,.2f} | 490.04 ± 6.12 |" in page
    assert page.split("| ppo | CartPole-v1 |")[1].split("\n")[0].endswith(f"| {made_by} |")
    # and the packages they ran with (another MuJoCo or torch build moves a seed's trajectory)
    versions = learning.package_versions()
    assert versions["python"] == platform.python_version() and versions["torch"] == torch.__version__
    listed = ", ".join(f"{k} {v}" for k, v in versions.items())
    assert f"**Packages**: 2 runs: {listed}.\n" in page, page[:3000]
    assert (
        out / "tiny" / "curves.png"
    ).stat().st_size > 10_000 and "![tiny curves](benchmarks/tiny/curves.png)" in page
    # hand notes: a suite's under its table, any other heading as a section of its own after the suites
    assert (
        page.index("### tiny: two short seeds")
        < page.index("A finding.")
        < page.index("### population-based training\n\nA table.")
    )
    logs = sorted((tmp_path / "runs/logs/bench/tiny").glob("*.json"))
    assert [json.loads(p.read_text())["returncode"] for p in logs] == [0, 0]
    before = [p.stat().st_mtime for p in logs]
    assert learning.main(["tiny", "--out", str(out)]) == 0  # finished runs are not run again
    assert [p.stat().st_mtime for p in logs] == before
    # a run that has not finished (here: its last attempt failed; or still training) is no seed on the page
    logs[1].write_text(json.dumps({**json.loads(logs[1].read_text()), "returncode": 1}))
    assert learning.main(["tiny", "--report-only", "--out", str(out)]) == 0
    finals = learning.read_csv(out / "tiny" / "final_returns.csv")
    assert [(r["seeds"], r["steps"]) for r in finals] == [("1", "2048")]
    assert [p.name for p in (out / "tiny" / "records").iterdir()] == ["CartPole-v1__ppo__1.run.json.gz"]
    record = f"docs/benchmarks/mujoco/records/{next((out / 'tiny' / 'records').iterdir()).name}"
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", record], capture_output=True)
    assert ignored.returncode == 1, f"{record} is git-ignored: the page's records would never be committed"
    # a clone without runs/ (another machine, a later session): the committed run records make the same page
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    shutil.rmtree(tmp_path / "runs")
    assert learning.main(["tiny", "--report-only", "--out", str(out)]) == 0
    assert learning.read_csv(out / "tiny" / "final_returns.csv") == finals
    assert (tmp_path / "docs" / "benchmarks.md").read_text() == page
    # a row published before records were kept stays, marked, until the records hold its seeds (1 to n)
    (out / "tiny" / "earlier").mkdir()
    (out / "tiny" / "earlier" / "commit.txt").write_text("e4cd7a9\n")
    (out / "tiny" / "earlier" / "throughput.csv").write_text("script,env_id,world_size,runs,sps,wall_s\n"
                                                             "ppo,CartPole-v1,1,2,3387.0,156.0\n")  # fmt: skip
    for seeds, kept in ((2, True), (1, False)):
        (out / "tiny" / "earlier" / "final_returns.csv").write_text("script,env_id,seeds,runs,mean,std,iqm,steps\n"
                                                                    f"ppo,CartPole-v1,{seeds},{seeds},500.0,0.0,500.0,499968\n")  # fmt: skip
        assert learning.main(["tiny", "--report-only", "--out", str(out)]) == 0
        page = (tmp_path / "docs" / "benchmarks.md").read_text()
        row = f"| ppo † | CartPole-v1 | 499,968 | {seeds} | 500.00 ± 0.00 | 490.04 ± 6.12 | 2.6 min | 3,387 | e4cd7a9 |"
        assert (row in page, "benchmarks/tiny/earlier/curves.png" in page) == (kept, kept), page
        assert f"| ppo | CartPole-v1 | 2,048 | 1 | {float(finals[0]['mean']):,.2f} ± 0.00 |" in page


@pytest.mark.quick
def test_the_pool_counts_a_torchrun_run_as_its_processes(tmp_path):
    """Two workers: a 2-process run never shares them with another run; 1-process runs go two at a time."""
    from cleanrl_utils.benchmark import Job, Pool

    def job(name, processes, seconds):
        argv = [sys.executable, "-c", f"import time; print(time.time()); time.sleep({seconds}); print(time.time())"]
        return Job(name, argv, tmp_path / f"{name}.log", tmp_path / name, processes=processes)

    jobs = [job("a", 1, 1.0), job("wide", 2, 1.0), job("b", 1, 1.0), job("c", 1, 1.0)]
    assert all(code == 0 for _, code in Pool(2, [], threads=1, quiet=True).run(jobs))
    spans = {j.name: [float(x) for x in (tmp_path / f"{j.name}.log").read_text().split()] for j in jobs}
    overlaps = lambda x, y: spans[x][0] < spans[y][1] and spans[y][0] < spans[x][1]  # noqa: E731
    assert not any(overlaps("wide", other) for other in "abc")
    assert overlaps("b", "c")


def test_dqn_divergence_sets_sb3_beside_the_q_values_and_returns_the_run_logged(tmp_path):
    """benchmark/dqn_divergence.py: SB3's DQN gets dqn.py's defaults, and each row carries the run's own
    losses/q_values at the nearest logged step and the mean of its last 100 returns up to that step."""
    pytest.importorskip("stable_baselines3")
    from torch.utils.tensorboard import SummaryWriter

    from cleanrl.dqn import Args

    writer = SummaryWriter(str(tmp_path / "run"))
    for step, q in [(900, 5.0), (1050, 7.0), (1950, 9.0), (2300, 11.0)]:
        writer.add_scalar("losses/q_values", q, step)
    returns = {step: float(step % 37) for step in range(10, 2400, 10)}  # 239 episodes
    for step, r in returns.items():
        writer.add_scalar("charts/episodic_return", r, step)
    writer.close()
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "dqn_divergence.py"), "--steps", "2000", "--every", "1000",
         "--ours", str(tmp_path / "run")], env=script_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = Args()
    assert (f"learning_rate={d.learning_rate}, gradient_steps={d.gradient_steps}, "
            f"target_network_frequency={d.target_network_frequency}") in proc.stdout  # fmt: skip
    rows = [line.strip("| ").split(" | ") for line in proc.stdout.splitlines() if line.startswith("| 1,000 |")
            or line.startswith("| 2,000 |")]  # fmt: skip
    assert [r[0] for r in rows] == ["1,000", "2,000"], proc.stdout
    for row, step, q in zip(rows, (1000, 2000), (7.0, 9.0)):
        last = [r for s, r in returns.items() if s <= step][-100:]
        assert row[3] == f"{q:,.1f}" and row[4] == f"{sum(last) / len(last):.1f}", row
        assert abs(float(row[1].replace(",", ""))) < 100.0  # SB3's Q this early: finite, below the bound


def _sb3_ppo():
    sys.path.insert(0, str(REPO / "benchmark"))
    import sb3_ppo

    return sb3_ppo


def test_sb3_ppo_trains_with_our_settings_and_logs_the_env_s_own_returns(tmp_path, monkeypatch):
    """benchmark/sb3_ppo.py, the peer row: SB3's PPO holds ppo_continuous_action.py's settings (here not its
    defaults, so a setting dropped on the way shows), and its run reads as one of ours: the env's own
    returns (Pendulum: 200 steps, about -1,000 a game at first; normalised rewards would sum near -10), the
    budget rounded down to whole rollouts."""
    pytest.importorskip("stable_baselines3")
    import torch

    from cleanrl_utils.plot import find_runs

    sb3_ppo = _sb3_ppo()
    flags = ["--env-id", "Pendulum-v1", "--num-envs", "2", "--num-steps", "128", "--num-minibatches", "8",
             "--update-epochs", "3", "--learning-rate", "0.001", "--gamma", "0.95", "--gae-lambda", "0.9",
             "--clip-coef", "0.3", "--ent-coef", "0.01", "--vf-coef", "0.7", "--max-grad-norm", "0.4",
             "--clip-obs", "5", "--clip-reward", "4", "--no-norm-adv"]  # fmt: skip
    model = sb3_ppo.make_model(sb3_ppo.parse(flags))
    assert (model.n_envs, model.n_steps, model.batch_size, model.n_epochs) == (2, 128, 32, 3)
    assert model.lr_schedule(1.0) == pytest.approx(0.001) and model.lr_schedule(0.25) == pytest.approx(0.00025)
    assert (model.gamma, model.gae_lambda, model.clip_range(0.5), model.clip_range_vf(0.5)) == (0.95, 0.9, 0.3, 0.3)
    assert (model.ent_coef, model.vf_coef, model.max_grad_norm, model.normalize_advantage) == (0.01, 0.7, 0.4, False)
    assert (model.env.clip_obs, model.env.clip_reward, model.env.gamma) == (5.0, 4.0, 0.95)
    assert model.policy.optimizer.defaults["eps"] == 1e-5
    assert float(model.policy.log_std.detach().abs().max()) == 0.0
    linear = [m for m in model.policy.mlp_extractor.policy_net if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linear] == [64, 64]
    assert isinstance(model.policy.mlp_extractor.policy_net[1], torch.nn.Tanh)

    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmark" / "sb3_ppo.py"), *flags, "--total-timesteps", "1000", "--seed", "3",
         "--run-name", "p"], cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run,) = find_runs([tmp_path / "runs"], "charts/episodic_return")
    assert (run.exp, run.env_id, run.seed, run.total_steps) == ("sb3_ppo", "Pendulum-v1", 3, 768)  # 3 rollouts of 256
    assert len(run.returns) == 2 and run.returns.max() < -300, run.returns
    assert run.settings["num_minibatches"] == "8" and run.settings["vf_coef"] == "0.7"

    bad = subprocess.run([sys.executable, str(REPO / "benchmark" / "sb3_ppo.py"), "--num-minibatches", "3"],
                         cwd=tmp_path, env=script_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --num-minibatches 3: must divide num_envs * num_steps (2048)"
    ], bad.stderr
