"""Cluster submission: dry runs, bad input, a real single-host SLURM cluster (Debian's slurm-wlm and
munge, started and stopped here), AWS Batch against a local moto server, and the image's entrypoint."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from cleanrl_utils import submit_exp
from tests.conftest import REPO, script_env

PPO = str(REPO / "cleanrl" / "ppo.py")
FAKE = str(REPO / "tests" / "fake_train.py")
MULTI = str(REPO / "cleanrl" / "ppo_atari_multigpu.py")
TINY_MULTI = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "256", "--num-minibatches", "2"]
TINY_MULTI += ["--update-epochs", "1", "--checkpoint-interval", "128"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_digests_agree(checkpoint_path: Path) -> None:
    """Every rank's parameters at the final checkpoint hash the same, and equal the saved model."""
    from cleanrl_utils.distributed import parameters_digest
    from cleanrl_utils.launch import load_script

    checkpoint = torch.load(checkpoint_path, weights_only=True)
    digests = {part["parameters_sha256"] for part in checkpoint["ranks"]}
    assert len(checkpoint["ranks"]) == 2 and len(digests) == 1, digests
    agent = load_script(Path(MULTI)).Agent(4)  # Breakout's 4 actions
    agent.load_state_dict(checkpoint["model"])
    assert digests == {parameters_digest(agent)}


# --------------------------------------------------------------------------------------------
# Dry runs and bad input
# --------------------------------------------------------------------------------------------
@pytest.mark.quick
def test_slurm_dry_run_is_complete_and_stable(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--command", f"python {PPO} --total-timesteps 2048", "--env-ids", "CartPole-v1", "Acrobot-v1"]
    argv += ["--num-seeds", "2", "--array-parallelism", "2", "--cpus", "1", "--job-name", "g", "--time", "1:00:00"]
    assert submit_exp.main(argv) == 0
    first = capsys.readouterr().out
    assert submit_exp.main(argv) == 0
    assert capsys.readouterr().out == first  # no timestamps, no randomness
    for line in [
        "#SBATCH --array=0-3%2",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR1@180",
        "#SBATCH --cpus-per-task=1",
        "#SBATCH --time=1:00:00",
        "#SBATCH --output=runs/g/slurm/%x_%A_%a.out",
        "env_ids=(CartPole-v1 CartPole-v1 Acrobot-v1 Acrobot-v1)",
        "seeds=(1 2 1 2)",
        "runs=(g/CartPole-v1__ppo__1 g/CartPole-v1__ppo__2 g/Acrobot-v1__ppo__1 g/Acrobot-v1__ppo__2)",
    ]:
        assert line in first.splitlines(), line
    assert "--partition" not in first and "#SBATCH --gpus" not in first  # no site-specific partition, CPU-only
    assert "retries=2" in first.splitlines()  # the self-requeue before the time limit is bounded by --retries
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing

    multi = ["--torchrun", MULTI, "--nodes", "2", "--gpus-per-node", "8", "--job-name", "m", "--", "--num-envs", "128"]
    assert submit_exp.main(multi) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --gpus-per-node=8" in text
    assert re.search(r"srun .*torch.distributed.run --nnodes=\"\$SLURM_NTASKS\" --nproc-per-node=8 "
                     r"--rdzv-backend=c10d --rdzv-endpoint=\"\$head:\$port\"", text)  # fmt: skip
    assert f'{MULTI} --num-envs 128 --run-name "$RUN"' in text
    assert "--no-kill" not in text and "srun --kill-on-bad-exit=1" in text  # a fixed count: a lost node ends it


def test_slurm_node_range_continues_on_the_nodes_it_gets(tmp_path, monkeypatch, capsys):
    """--nodes 2-4: SLURM may start the job on 2 to 4 nodes and keeps it when one is lost (--no-kill, the
    other tasks go on), torchrun accepts 2 up to the nodes allocated; every world size in the range is
    checked against the run's sizes."""
    monkeypatch.chdir(tmp_path)
    multi = ["--torchrun", MULTI, "--nodes", "2-4", "--gpus-per-node", "2", "--job-name", "m", "--", "--num-envs", "48"]
    assert submit_exp.main(multi) == 0
    lines = capsys.readouterr().out.splitlines()
    for line in ["#SBATCH --nodes=2-4", "#SBATCH --ntasks-per-node=1", "#SBATCH --no-kill", "#SBATCH --requeue"]:
        assert line in lines, line
    assert not any(line.startswith("#SBATCH --ntasks=") for line in lines)  # one task per node it gets
    cmd = next(line for line in lines if line.startswith("cmd=("))
    assert cmd.startswith("cmd=(srun --no-kill --kill-on-bad-exit=0 --label python -m torch.distributed.run ")
    assert '--nnodes=2:"$SLURM_JOB_NUM_NODES" --nproc-per-node=2' in cmd and "--max-restarts=2" in cmd
    assert submit_exp.main([*multi[:-1], "32"]) == 2  # 32 envs do not split among 3 nodes x 2 processes
    err = capsys.readouterr().err
    assert err.startswith("error: --nodes 2-4: on 3 nodes (6 processes) ppo_atari_multigpu.py: --num-envs 32") and (
        err.count("\n") == 1
    ), err


def test_tuner_workers_are_an_array_of_the_same_command(tmp_path, monkeypatch, capsys):
    tuner = f"python {REPO}/cleanrl_utils/tuner.py --algorithm ppo --env-ids CartPole-v1 --storage postgresql://db/s"
    assert submit_exp.main(["--command", tuner, "--tasks", "8", "--array-parallelism", "4", "--job-name", "t"]) == 0
    text = capsys.readouterr().out
    assert "#SBATCH --array=0-7%4" in text and f"cmd=({tuner})" in text and "--run-name" not in text.split("cmd=")[1]


@pytest.mark.quick
def test_aws_dry_run_definition(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "sk-not-to-be-seen")
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:wandb"
    argv = ["--backend", "aws-batch", "--job-queue", "q", "--image", "img:1", "--secret", f"WANDB_API_KEY={arn}"]
    argv += ["--torchrun", MULTI, "--nodes", "2", "--gpus-per-node", "4", "--cpus", "16", "--mem-gb", "64"]
    assert submit_exp.main([*argv, "--job-name", "m", "--", "--num-envs", "32"]) == 0
    out = capsys.readouterr().out
    assert submit_exp.main([*argv, "--job-name", "m", "--", "--num-envs", "32"]) == 0
    assert capsys.readouterr().out == out  # stable
    definition = json.loads(out.split("# and the job")[0].split("\n", 1)[1])
    node = definition["nodeProperties"]
    assert definition["type"] == "multinode" and node["numNodes"] == 2 and node["mainNode"] == 0
    container = node["nodeRangeProperties"][0]["container"]
    assert container["command"] == ["cleanrl/ppo_atari_multigpu.py", "--num-envs", "32"]  # as in the image
    assert {r["type"]: r["value"] for r in container["resourceRequirements"]} == {
        "VCPU": "16",
        "MEMORY": str(64 * 1024),
        "GPU": "4",
    }
    assert container["secrets"] == [{"name": "WANDB_API_KEY", "valueFrom": arn}]
    assert {"name": "CLEANRL_NPROC_PER_NODE", "value": "4"} in container["environment"]
    assert definition["retryStrategy"]["evaluateOnExit"][0] == {"onStatusReason": "Host EC2*", "action": "RETRY"}
    assert "sk-not-to-be-seen" not in out
    assert "nodePropertyOverrides" not in out  # a new run: runs/<job-name>-<job id>/run

    # continuing that run on another node count: one job request, the entrypoint told which run
    assert submit_exp.main([*argv, "--nodes", "3", "--resume-run", "runs/m-abc/run/", "--", "--num-envs", "48"]) == 0
    request = json.loads(capsys.readouterr().out.split("# and the job; --submit to submit")[1])
    assert request["nodeOverrides"] == {
        "numNodes": 3,
        "nodePropertyOverrides": [
            {
                "targetNodes": "0:",
                "containerOverrides": {"environment": [{"name": "CLEANRL_RUN", "value": "m-abc/run"}]},
            }
        ],
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "pbs", "--command", f"python {PPO}", "--env-ids", "CartPole-v1"], "--backend pbs: must be"),
        (["--backend", "aws-batch", "--image", "i", "--command", f"python {PPO}", "--env-ids", "CartPole-v1"],
         "--job-queue: required"),
        (["--torchrun", MULTI, "--nodes", "0"], "--nodes 0: must be at least 1"),
        (["--torchrun", MULTI, "--nodes", "4-2"], "--nodes 4-2: MIN must not exceed MAX"),
        (["--torchrun", MULTI, "--nodes", "2:4"], "--nodes 2:4: must be N or MIN-MAX"),
        (["--backend", "aws-batch", "--job-queue", "q", "--image", "i", "--torchrun", MULTI, "--nodes", "2-3"],
         "--nodes 2-3: AWS Batch multi-node jobs have one node count"),
        (["--torchrun", MULTI, "--resume-run", "runs/gone/run"], "--resume-run runs/gone/run: runs/gone/run holds no"),
        (["--torchrun", MULTI, "--resume-run", "../elsewhere"], "--resume-run ../elsewhere: must name a run directory"),
        (["--torchrun", MULTI, "--gpus-per-node", "17"], "--gpus-per-node 17: a node has 0 to 16 GPUs"),
        (["--command", "python train.py", "--env-ids", "CartPole-v1"], "train.py: not a script of this project"),
        (["--command", f"python {PPO} --learning-rat 1", "--env-ids", "CartPole-v1"],
         "ppo.py: Unrecognized options: --learning-rat"),
        (["--command", f"python {PPO} --num-minibatches 3", "--env-ids", "CartPole-v1"],
         "ppo.py: --num-minibatches 3: must divide"),
        (["--torchrun", MULTI, "--nodes", "2", "--", "--num-envs", "3"], "--num-envs 3: must be a multiple"),
        (["--command", f"python {PPO}"], "--env-ids: a grid needs at least one env id"),
        (["--command", f"python {REPO}/cleanrl_utils/tuner.py --algorithm ppo --env-ids CartPole-v1", "--tasks", "4"],
         "tuner.py: give --storage"),
        (["--command", f"python {REPO}/cleanrl_utils/tuner.py --algorithm ppx --env-ids CartPole-v1 --storage x"],
         "tuner.py: invalid choice 'ppx' for argument '--algorithm'"),
        (["--command", f"python {PPO}", "--env-ids", "CartPole-v1", "--time", "90"], "--time 90: must be HH:MM:SS"),
        (["--backend", "aws-batch", "--job-queue", "q", "--image", "i", "--secret", "WANDB_API_KEY=abc",
          "--command", f"python {PPO}", "--env-ids", "CartPole-v1"], "--secret WANDB_API_KEY=abc: must be NAME=arn"),
    ],
)  # fmt: skip
@pytest.mark.quick
def test_bad_input_exits_2_and_submits_nothing(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: had anything been submitted, this would fail differently
    assert submit_exp.main(["--submit", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.quick
def test_a_second_slurm_submission_of_one_job_name_is_refused_before_sbatch(tmp_path, monkeypatch, capsys):
    """runs/<job-name>/... holds the first submission's checkpoints: a second one (here with a changed flag)
    would fail in every task on them, or "finish" in 0 s; it is refused before anything is submitted."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch: had anything been submitted, this would fail differently
    ckpt = tmp_path / "runs/cleanrl/CartPole-v1__ppo__2/checkpoints/ckpt_00001024.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"a checkpoint of the first submission")
    grid = ["--command", f"python {PPO} --learning-rate 0.0003", "--env-ids", "CartPole-v1", "--num-seeds", "2"]
    assert submit_exp.main(["--submit", *grid]) == 2
    err = capsys.readouterr().err
    assert err == ("error: --job-name cleanrl: runs/cleanrl/CartPole-v1__ppo__2 (and 0 more) holds checkpoints of an "
                   "earlier submission: give another --job-name, or --continue-runs to continue them\n")  # fmt: skip
    assert submit_exp.main([*grid, "--job-name", "second"]) == 0  # a fresh name: its own directories
    assert submit_exp.main([*grid, "--continue-runs"]) == 0  # or on purpose: the tasks resume them
    assert "runs=(cleanrl/CartPole-v1__ppo__1 cleanrl/CartPole-v1__ppo__2)" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# A real single-host SLURM cluster
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slurm():
    """slurmctld + slurmd on this host (root), with munge; stopped after the tests of this module."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    tools = {
        b: shutil.which(b, path=path)
        for b in ("slurmctld", "slurmd", "sbatch", "munged", "munge", "mungekey", "runuser")
    }
    if not all(tools[b] for b in ("slurmctld", "slurmd", "sbatch", "munged", "munge")) or os.geteuid() != 0:
        pytest.skip("needs Debian's slurm-wlm and munge, as root (.ci/run installs them)")
    root = Path(tempfile.mkdtemp(prefix="cleanrl-slurm-"))
    for d in ("state", "spool", "log"):
        (root / d).mkdir()
    host = socket.gethostname()
    ctld, slurmd_port = free_port(), free_port()
    conf = root / "slurm.conf"
    import psutil

    memory_mb = min(8000, int(psutil.virtual_memory().total / 2**20 * 0.8))  # never more than the host has
    conf.write_text(
        f"""ClusterName=cleanrltest
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmctldPort={ctld}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
KillWait=5
MinJobAge=600
NodeName={host} CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    started_munge = None

    def munge_answers() -> bool:  # a socket file alone may be stale (a daemon that died with the machine)
        return subprocess.run([tools["munge"], "-n"], capture_output=True).returncode == 0

    if not munge_answers():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run([tools["runuser"], "-u", "munge", "--", tools["mungekey"], "--create"], check=True)
        # --force: take over a stale socket left by a daemon that did not stop cleanly
        subprocess.run([tools["runuser"], "-u", "munge", "--", tools["munged"], "--force"], check=True)
        started_munge = True
        wait_for(munge_answers, 20, "munged to answer")
    subprocess.run([tools["slurmctld"], "-f", str(conf)], env=env, check=True)
    subprocess.run([tools["slurmd"], "-f", str(conf)], env=env, check=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if info.stdout.strip() == "idle":
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"the test cluster did not come up: {info.stdout} {info.stderr}")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], env=env)
        deadline = time.monotonic() + 30  # let the cancelled jobs' steps end before the daemons go
        while time.monotonic() < deadline and subprocess.run(["squeue", "-h"], env=env, capture_output=True).stdout:
            time.sleep(0.5)
        for pid_file in ("slurmd.pid", "slurmctld.pid"):
            try:
                os.kill(int((root / pid_file).read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        if started_munge:
            try:
                os.kill(int(Path("/run/munge/munged.pid").read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        os.environ.pop("SLURM_CONF", None)
        time.sleep(1)
        shutil.rmtree(root, ignore_errors=True)


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    # what the cluster says (a job's pending reason, a drained node), so a timeout under load names its cause
    state = []
    for cmd in (["squeue", "-h", "-o", "%i %T %r"], ["sinfo", "-h", "-N", "-o", "%N %T %E"]):
        try:
            state.append(subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip() or "-")
        except (OSError, subprocess.TimeoutExpired):
            state.append("-")
    raise AssertionError(f"timed out waiting for {what}; squeue: {state[0]}; sinfo: {state[1]}")


def queue_empty(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout
    return not out.strip()


def start_requeued(job: str, log: Path, attempts: int, timeout: float = 150) -> None:
    """Wait until attempt number ``attempts`` has resumed. A requeued job waits for its old credential
    to expire (``cred_expire``, 10 s on the test cluster); forcing an earlier start (``scontrol update
    StartTime=now``) races with it: slurmd kills the new attempt at launch ("Job credential revoked")."""

    def resumed() -> bool:
        return log.exists() and log.read_text().count("resuming from") >= attempts - 1

    try:
        wait_for(resumed, timeout, f"attempt {attempts} to resume")
    except AssertionError as e:  # say what SLURM and the run were doing
        job_info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        daemons = Path(os.environ.get("SLURM_CONF", "/nonexistent")).parent / "log"
        tails = "".join(
            f"\n{f.name}:\n" + "\n".join(f.read_text().splitlines()[-25:]) for f in sorted(daemons.glob("*.log"))
        )
        raise AssertionError(
            f"{e}\n{job_info}\n{log.read_text()[-3000:] if log.exists() else 'no log'}{tails}"
        ) from None


def submit(cwd: Path, *argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "cleanrl_utils.submit_exp", "--submit", *argv], cwd=cwd,
                          env=script_env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return re.search(r"job (\d+)", proc.stdout).group(1)


def final_checkpoint(run_dir: Path) -> Path:
    found = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert found, f"no checkpoint in {run_dir}"
    return found[-1]


def test_slurm_array_of_two_seeds(slurm, tmp_path):
    job = submit(tmp_path, "--command", f"python {PPO} --total-timesteps 1024 --checkpoint-interval 512",
                 "--env-ids", "CartPole-v1", "--num-seeds", "2", "--cpus", "1", "--mem-gb", "1", "--job-name", "arr")  # fmt: skip
    wait_for(lambda: queue_empty(job), 180, "the array to finish")
    for seed in (1, 2):
        run_dir = tmp_path / f"runs/arr/CartPole-v1__ppo__{seed}"
        checkpoint = torch.load(final_checkpoint(run_dir), weights_only=True)
        assert checkpoint["global_step"] == 1024 and checkpoint["args"]["seed"] == seed
        log = (tmp_path / f"runs/arr/slurm/arr_{job}_{seed - 1}.out").read_text()
        assert "done: 1,024 steps" in log
    manifest = json.loads(next((tmp_path / "runs/submissions").glob("arr-*.json")).read_text())
    assert manifest["job_ids"] == [job] and [t["seed"] for t in manifest["tasks"]] == [1, 2]
    status = subprocess.run([sys.executable, "-m", "cleanrl_utils.submit_exp", "status", "arr"], cwd=tmp_path,
                            env=script_env(), capture_output=True, text=True)  # fmt: skip
    assert status.stdout.count(": finished") == 2, status.stdout


def test_slurm_requeued_task_resumes_from_its_checkpoint(slurm, tmp_path):
    total = 40960
    job = submit(tmp_path, "--command", f"python {PPO} --total-timesteps {total} --checkpoint-interval 2048",
                 "--env-ids", "CartPole-v1", "--cpus", "1", "--mem-gb", "1", "--job-name", "rq")  # fmt: skip
    run_dir = tmp_path / "runs/rq/CartPole-v1__ppo__1"
    wait_for(lambda: list((run_dir / "checkpoints").glob("ckpt_*.pt")), 120, "the first checkpoint")
    subprocess.run(["scontrol", "requeue", f"{job}_0"], check=True)
    start_requeued(job, tmp_path / f"runs/rq/slurm/rq_{job}_0.out", attempts=2)
    wait_for(lambda: queue_empty(job), 240, "the requeued task to finish")
    log = (tmp_path / f"runs/rq/slurm/rq_{job}_0.out").read_text()
    stopped = re.search(r"stopped by signal 15 at step (\d+)", log)
    assert (
        stopped and f"resuming from runs/rq/CartPole-v1__ppo__1/checkpoints/ckpt_{int(stopped.group(1)):08d}.pt" in log
    )
    assert f"done: {total:,} steps" in log
    assert torch.load(final_checkpoint(run_dir), weights_only=True)["global_step"] == total


def test_slurm_tuner_array_requeued_task_resumes_its_trial(slurm, tmp_path):
    """Tuner workers as a SLURM array on one study; `scontrol requeue` one task mid-trial: its runs
    checkpoint on SIGTERM, its trial is resumed (by whichever task is free first) from that checkpoint,
    and the study ends with every trial counted once."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    space = {
        "quality": {"low": 0.1, "high": 1.0},
        "total-timesteps": 2000,
        "step-time": 0.2,
        "checkpoint-interval": 500,
    }
    (tmp_path / "space.json").write_text(json.dumps(space))
    tuner = (f"python {REPO}/cleanrl_utils/tuner.py --script {FAKE} --env-ids CartPole-v1 --space space.json "
             "--storage study.log --study-name sw --num-trials 3 --pruner none --progress-interval 1")  # fmt: skip
    job = submit(tmp_path, "--command", tuner, "--tasks", "2", "--cpus", "1", "--mem-gb", "1", "--job-name", "sw")

    def study():
        return optuna.load_study(
            study_name="sw", storage=JournalStorage(JournalFileBackend(str(tmp_path / "study.log")))
        )

    def a_trial_of_task_1():  # its worker's pid is in task 1's log; the trial has a checkpoint
        log = tmp_path / f"runs/sw/slurm/sw_{job}_1.out"
        if not (tmp_path / "study.log").exists() or not log.exists():
            return None
        try:
            running = study().get_trials(states=(optuna.trial.TrialState.RUNNING,))
        except KeyError:  # the journal file is there, the study's record not yet
            return None
        for t in running:
            ckpt = list((tmp_path / f"runs/sw/t{t.number:04d}").glob("*/checkpoints/ckpt_*.pt"))
            if ckpt and _task_of(t.user_attrs.get("worker", {}).get("pid")) == f"{job}_1":
                return t
        return None

    victim = wait_for(a_trial_of_task_1, 120, "task 1 to be mid-trial")
    subprocess.run(["scontrol", "requeue", f"{job}_1"], check=True)

    def done():
        trials = study().get_trials()
        return sum(t.state.name == "COMPLETE" for t in trials) == 3 and not any(
            t.state.name == "RUNNING" for t in trials
        )

    try:
        wait_for(done, 180, "the study to finish")
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    trials = study().get_trials()
    retry = next(t for t in trials if t.user_attrs.get("resume_of") == victim.number)
    assert retry.state.name == "COMPLETE" and retry.user_attrs["lineage"] == victim.number
    ((name, step),) = retry.user_attrs["resumed_from"].items()
    assert step >= 500 and name == f"sw/t{victim.number:04d}/CartPole-v1__1"
    log = next((tmp_path / "runs/sw/logs").glob(f"t{victim.number:04d}__*.log")).read_text()
    assert f"stopped by signal 15 at step {step}" in log and f"resuming after step {step}" in log, log
    complete = [t.user_attrs.get("lineage", t.number) for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == len(set(complete)) == 3 and victim.number in complete  # each trial counted once
    # only the lost attempt failed (a retry enqueued twice, by its worker and by a watcher, stands down: surplus)
    assert [t.number for t in trials if t.state.name == "FAIL" and not t.user_attrs.get("surplus")] == [victim.number]


def _task_of(pid: int | None) -> str | None:
    """The SLURM job (``<array job>_<task>``) a process of this host belongs to, from its environment."""
    import psutil

    try:
        env = psutil.Process(pid).environ() if pid else {}
    except psutil.Error:
        return None
    if "SLURM_ARRAY_JOB_ID" not in env:
        return None
    return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"


def test_slurm_time_limit_checkpoints_and_requeues_within_retries(slurm, tmp_path):
    """45 s before the limit the run checkpoints and the task requeues itself; the requeued attempt
    resumes from that checkpoint; with --retries 1 the second warning does not requeue again. The limit
    is 90 s: SLURM checks its time limits every 30 s or so and may warn at once when the warning is due,
    so a shorter limit could stop the run while it is still importing torch, before it could checkpoint."""
    job = submit(tmp_path, "--command", f"python {PPO} --total-timesteps 10000000 --checkpoint-interval 100000",
                 "--env-ids", "CartPole-v1", "--cpus", "1", "--mem-gb", "1", "--job-name", "tl", "--time", "0:01:30",
                 "--signal-before", "45", "--retries", "1")  # fmt: skip
    log = tmp_path / f"runs/tl/slurm/tl_{job}_0.out"
    wait_for(lambda: log.exists() and "requeueing" in log.read_text(), 150, "the time-limit warning")
    start_requeued(job, log, attempts=2)
    wait_for(lambda: log.read_text().count("stopped by signal 15") == 2 and queue_empty(job), 150, "the second attempt")
    text = log.read_text()
    first = re.search(r"stopped by signal 15 at step (\d+); checkpoint (\S+)", text)
    assert f"resuming from {first.group(2)}" in text
    assert text.count("requeueing") == 1  # SLURM_RESTART_COUNT reached --retries


def test_slurm_cancel_stops_what_was_submitted(slurm, tmp_path):
    job = submit(tmp_path, "--command", f"python {PPO} --total-timesteps 10000000", "--env-ids", "CartPole-v1",
                 "--num-seeds", "2", "--cpus", "1", "--mem-gb", "1", "--job-name", "cx")  # fmt: skip
    wait_for(lambda: not queue_empty(job), 30, "the job to be queued")
    out = subprocess.run([sys.executable, "-m", "cleanrl_utils.submit_exp", "cancel", "cx"], cwd=tmp_path,
                         env=script_env(), capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0 and f"cancelled cx: {job}" in out.stdout
    wait_for(lambda: queue_empty(job), 60, "the cancelled job to leave the queue")


def test_slurm_multinode_template_on_one_host(slurm, tmp_path):
    job = submit(tmp_path, "--torchrun", MULTI, "--nodes", "2", "--one-host", "--cpus", "1", "--mem-gb", "2",
                 "--job-name", "mn", "--", *TINY_MULTI)  # fmt: skip
    wait_for(lambda: queue_empty(job), 240, "the 2-node job to finish")
    log = (tmp_path / f"runs/mn/slurm/mn_{job}.out").read_text()
    assert "0: done: 256 steps" in log, log[-2000:]
    rank_digests_agree(final_checkpoint(tmp_path / "runs/mn/run"))

    # that run continued by a node-range job, which gets the cluster's one node: 2 processes -> 1
    more = [*TINY_MULTI[:5], "384", *TINY_MULTI[6:]]  # (--total-timesteps 384)
    job = submit(tmp_path, "--torchrun", MULTI, "--nodes", "1-2", "--resume-run", "runs/mn/run", "--cpus", "1",
                 "--mem-gb", "2", "--job-name", "mr", "--", *more)  # fmt: skip
    wait_for(lambda: queue_empty(job), 240, "the node-range job to finish")
    log = (tmp_path / f"runs/mr/slurm/mr_{job}.out").read_text()
    assert "(2 processes -> 1)" in log and "0: done: 384 steps" in log, log[-2000:]
    final = final_checkpoint(tmp_path / "runs/mn/run")
    assert torch.load(final, weights_only=True)["world_size"] == 1 and final.name == "ckpt_00000384.pt"


# --------------------------------------------------------------------------------------------
# AWS Batch against a local moto server
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moto_endpoint():
    if shutil.which("moto_server") is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]')")
    port = free_port()
    proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update({"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"})
    import boto3

    batch = boto3.client("batch", endpoint_url=url)
    deadline = time.monotonic() + 30
    while True:
        try:
            iam = boto3.client("iam", endpoint_url=url)
            role = iam.create_role(RoleName="batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    env = batch.create_compute_environment(computeEnvironmentName="cenv", type="UNMANAGED", serviceRole=role)
    batch.create_job_queue(jobQueueName="gpu-queue", state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": env["computeEnvironmentArn"]}])  # fmt: skip
    try:
        yield url, batch
    finally:
        proc.terminate()
        proc.wait()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_aws_batch_definitions_and_jobs(moto_endpoint, tmp_path, monkeypatch, capsys):
    url, batch = moto_endpoint
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_API_KEY", "sk-not-to-be-seen")
    sent: list[bytes] = []
    make = submit_exp.batch_client

    def recording_client(args):  # every request body that leaves for the service
        client = make(args)
        client.meta.events.register("before-send.batch.*", lambda request, **_: sent.append(request.body or b""))
        return client

    monkeypatch.setattr(submit_exp, "batch_client", recording_client)
    arn = "arn:aws:ssm:us-east-1:123456789012:parameter/wandb-key"
    common = ["--backend", "aws-batch", "--endpoint-url", url, "--job-queue", "gpu-queue", "--image", "img:abc"]
    common += ["--secret", f"WANDB_API_KEY={arn}", "--submit"]
    grid = [*common, "--command", f"python {PPO} --track", "--env-ids", "CartPole-v1", "Acrobot-v1"]
    grid += ["--num-seeds", "3", "--job-name", "grid", "--gpus-per-node", "1", "--retries", "2"]
    assert submit_exp.main(grid) == 0
    assert submit_exp.main(grid) == 0  # the same definition again: reused, not registered twice
    multi = [*common, "--torchrun", MULTI, "--nodes", "2", "--gpus-per-node", "8", "--job-name", "multi"]
    assert submit_exp.main([*multi, "--", "--num-envs", "64"]) == 0
    out = capsys.readouterr()

    definitions = batch.describe_job_definitions(jobDefinitionName="grid", status="ACTIVE")["jobDefinitions"]
    assert len(definitions) == 1
    container = definitions[0]["containerProperties"]
    assert container["image"] == "img:abc" and container["command"] == ["python", "cleanrl/ppo.py", "--track"]
    assert {r["type"]: r["value"] for r in container["resourceRequirements"]} == {
        "VCPU": "4",
        "MEMORY": "16384",
        "GPU": "1",
    }
    assert container["secrets"] == [{"name": "WANDB_API_KEY", "valueFrom": arn}]
    retry = definitions[0]["retryStrategy"]
    assert retry["attempts"] == 3 and [e["action"].upper() for e in retry["evaluateOnExit"]] == ["RETRY", "EXIT"]
    manifests = sorted((tmp_path / "runs/submissions").glob("grid-*.json"))
    job_id = json.loads(manifests[-1].read_text())["job_ids"][0]
    job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
    assert job["arrayProperties"]["size"] == 6
    grid_env = {e["name"]: e["value"] for e in job["container"]["environment"]}["CLEANRL_GRID"].split()
    assert grid_env[0] == "CartPole-v1|1|grid/CartPole-v1__ppo__1" and grid_env[5].startswith("Acrobot-v1|3|")

    # moto keeps no nodeProperties: read the multi-node definition and job from the requests themselves
    bodies = [json.loads(body) for body in sent if body.startswith(b"{")]
    mdef = next(b for b in bodies if b.get("jobDefinitionName") == "multi" and "type" in b)
    node_props = mdef["nodeProperties"]
    assert mdef["type"] == "multinode" and node_props["numNodes"] == 2 and node_props["mainNode"] == 0
    assert node_props["nodeRangeProperties"][0]["container"]["command"] == [
        "cleanrl/ppo_atari_multigpu.py",
        "--num-envs",
        "64",
    ]
    assert node_props["nodeRangeProperties"][0]["container"]["secrets"] == [{"name": "WANDB_API_KEY", "valueFrom": arn}]
    mjob = next(b for b in bodies if b.get("jobName") == "multi")
    assert mjob["nodeOverrides"] == {"numNodes": 2} and mjob["jobQueue"] == "gpu-queue"
    registered = [b for b in bodies if "jobDefinitionName" in b and "type" in b]
    assert [b["jobDefinitionName"] for b in registered] == ["grid", "multi"]  # the second grid reused its definition
    multi_manifest = json.loads(next((tmp_path / "runs/submissions").glob("multi-*.json")).read_text())
    assert batch.describe_jobs(jobs=multi_manifest["job_ids"])["jobs"][0]["jobName"] == "multi"

    assert submit_exp.main(["status", "grid"]) == 0
    assert f"grid {job_id}: " in capsys.readouterr().out
    assert sent and all(b"sk-not-to-be-seen" not in body for body in sent)
    assert "sk-not-to-be-seen" not in out.out + out.err
    for path in (tmp_path / "runs").rglob("*.json"):
        assert "sk-not-to-be-seen" not in path.read_text()


# --------------------------------------------------------------------------------------------
# The image's entrypoint, on the host
# --------------------------------------------------------------------------------------------
ENTRYPOINT = REPO / "docker" / "entrypoint.sh"


def test_entrypoint_starts_two_nodes_that_train_together(tmp_path):
    port = free_port()
    procs = []
    for node in (0, 1):
        env = script_env({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": str(node),
                          "AWS_BATCH_JOB_MAIN_NODE_INDEX": "0", "AWS_BATCH_JOB_ID": f"job123#{node}",
                          "CLEANRL_WORKDIR": str(tmp_path), "CLEANRL_JOB_NAME": "e", "CLEANRL_RDZV_PORT": str(port)})  # fmt: skip
        if node == 1:  # only child nodes get the main node's address
            env["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] = "127.0.0.2"  # not what the main node calls itself
        procs.append(subprocess.Popen(["bash", str(ENTRYPOINT), MULTI, *TINY_MULTI], env=env, cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)[-3000:]
    assert "node 0 of 2" in outs[0] and "node 1 of 2, rendezvous 127.0.0.2" in outs[1]
    rank_digests_agree(final_checkpoint(tmp_path / "runs/e-job123/run"))

    # a later one-node job continues that run (submit_exp.py --resume-run): 2 processes -> 1
    env = script_env({"AWS_BATCH_JOB_NUM_NODES": "1", "AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_ID": "job456#0",
                      "CLEANRL_WORKDIR": str(tmp_path), "CLEANRL_JOB_NAME": "e", "CLEANRL_RDZV_PORT": str(free_port()),
                      "CLEANRL_RUN": "e-job123/run"})  # fmt: skip
    more = [*TINY_MULTI[:5], "384", *TINY_MULTI[6:]]  # (--total-timesteps 384)
    proc = subprocess.run(["bash", str(ENTRYPOINT), MULTI, *more], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "node 0 of 1" in out and "(2 processes -> 1)" in out, out[-3000:]
    final = torch.load(final_checkpoint(tmp_path / "runs/e-job123/run"), weights_only=True)
    assert final["world_size"] == 1 and final["global_step"] == 384 and not (tmp_path / "runs/e-job456").exists()


def test_entrypoint_runs_its_grid_task(tmp_path):
    env = script_env({"CLEANRL_GRID": "CartPole-v1|1|g/CartPole-v1__fake_train__1 Acrobot-v1|2|g/Acrobot-v1__fake_train__2",
                      "AWS_BATCH_JOB_ARRAY_INDEX": "1", "AWS_BATCH_JOB_ID": "abc:1", "CLEANRL_WORKDIR": str(tmp_path),
                      "CLEANRL_JOB_NAME": "g"})  # fmt: skip
    fake = str(REPO / "tests" / "fake_train.py")
    proc = subprocess.run(["bash", str(ENTRYPOINT), sys.executable, fake, "--step-time", "0"], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from cleanrl_utils.tb import ScalarReader

    hp = ScalarReader(tmp_path / "runs/g-abc/Acrobot-v1__fake_train__2").update().hyperparameters()
    assert (hp["env_id"], hp["seed"]) == ("Acrobot-v1", "2")


def test_dockerfile_inputs_exist_and_its_entrypoint_is_the_tested_one():
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^FROM pytorch/pytorch:(\d+)\.(\d+)\.\d+-cuda\S+-runtime", text, re.M)
    assert base, "the image is not built on a PyTorch CUDA runtime image"
    floor = re.search(r'"torch>=(\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text())
    assert tuple(map(int, base.groups())) >= tuple(map(int, floor.groups())), "the image's torch is below the floor"
    assert "org.opencontainers.image.revision" in text and "ARG GIT_REVISION" in text
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), source
    assert re.search(r'^ENTRYPOINT \["/workspace/docker/entrypoint.sh"\]', text, re.M)
    assert "COPY docker/entrypoint.sh docker/entrypoint.sh" in text and "WORKDIR /workspace" in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not {"cleanrl", "cleanrl_utils", "docker", "pyproject.toml"} & set(ignored)


def test_slurm_pbt_array_requeued_task_s_member_resumes_its_lineage(slurm, tmp_path):
    """A population served by two SLURM array tasks on one journal storage; `scontrol requeue` the task
    training a member's later segment: the member's run checkpoints on SIGTERM, the segment is trained
    again (same flags) from that checkpoint by whichever task is free, and every member's segments
    still chain from step 0 to the end."""
    import optuna

    from cleanrl_utils.trials import open_storage

    total, ready = 12288, 4096
    (tmp_path / "space.json").write_text(json.dumps({"learning-rate": {"low": 1e-4, "high": 1e-2, "log": True}}))
    pbt = (f"python {REPO}/cleanrl_utils/pbt.py --script {PPO} --population 2 --total-timesteps {total} "
           f"--ready {ready} --space space.json --storage pop.log --study-name pop --heartbeat 1 --poll 0.2 "
           "'--extra=--num-envs 1 --num-steps 16 --num-minibatches 1 --update-epochs 1'")  # fmt: skip
    job = submit(tmp_path, "--command", pbt, "--tasks", "2", "--cpus", "1", "--mem-gb", "1", "--job-name", "pb")

    def segments():
        if not (tmp_path / "pop.log").exists():
            return []
        try:
            study = optuna.load_study(study_name="pop", storage=open_storage(str(tmp_path / "pop.log")))
        except KeyError:  # the journal file is there, the study's record not yet
            return []
        return [t for t in study.get_trials() if "member" in t.user_attrs]

    def a_later_segment_of_task_1():
        for t in segments():
            a = t.user_attrs
            # training: this start's event file exists (the run's SIGTERM handler comes right after it)
            starts = len(list((tmp_path / "runs" / "pop" / f"m{a['member']}").glob("events.out.tfevents.*")))
            task = _task_of(a.get("worker", {}).get("pid"))
            if t.state.name == "RUNNING" and a["generation"] >= 1 and task == f"{job}_1" and starts > a["generation"]:
                return t
        return None

    victim = wait_for(a_later_segment_of_task_1, 150, "task 1 to be training a later segment")
    subprocess.run(["scontrol", "requeue", f"{job}_1"], check=True)
    try:
        wait_for(lambda: queue_empty(job), 240, "the population to finish")
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    trials = segments()
    retry = next(t for t in trials if t.user_attrs.get("resume_of") == victim.number)
    assert retry.state.name == "COMPLETE" and retry.user_attrs["params"] == victim.user_attrs["params"]
    member = victim.user_attrs["member"]
    log = (tmp_path / "runs" / "pop" / "logs" / f"m{member}.log").read_text()
    stopped = re.search(r"stopped by signal 15 at step (\d+)", log)
    assert stopped and f"resuming from runs/pop/m{member}/checkpoints/ckpt_{int(stopped.group(1)):08d}.pt" in log, log
    for m in (0, 1):  # each member's finished segments chain from 0 to the end: nothing lost, nothing trained twice
        done = sorted((t.user_attrs["start"], t.user_attrs["step"]) for t in trials
                      if t.state.name == "COMPLETE" and t.user_attrs["member"] == m)  # fmt: skip
        assert done[0][0] == 0 and done[-1][1] == total and all(a[1] == b[0] for a, b in zip(done, done[1:])), done
        assert (
            torch.load(final_checkpoint(tmp_path / "runs" / "pop" / f"m{m}"), weights_only=True)["global_step"] == total
        )
