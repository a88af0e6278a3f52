"""Submit runs to SLURM or AWS Batch: grids of runs as job arrays, multi-node torchrun jobs. Dry run by default.

    # a grid (env ids x seeds) as one SLURM job array; --submit acts, without it the job is printed
    python -m cleanrl_utils.submit_exp --backend slurm --command "python cleanrl/ppo_atari.py --track" \\
        --env-ids BreakoutNoFrameskip-v4 PongNoFrameskip-v4 --num-seeds 3 --gpus-per-node 1 --submit
    # 2 nodes x 8 GPUs of data-parallel PPO: torchrun on every node, c10d rendezvous on the first
    python -m cleanrl_utils.submit_exp --backend slurm --nodes 2 --gpus-per-node 8 \\
        --torchrun cleanrl/ppo_atari_multigpu.py --submit -- --env-id BreakoutNoFrameskip-v4 --num-envs 128
    # elastic: start on 2 to 4 nodes; when a node is lost torchrun goes on with the others (down to 2)
    python -m cleanrl_utils.submit_exp --backend slurm --nodes 2-4 --gpus-per-node 8 \\
        --torchrun cleanrl/ppo_atari_multigpu.py --submit -- --env-id BreakoutNoFrameskip-v4 --num-envs 192
    # continue that run later on another node count (the scripts re-split a run saved on N processes)
    python -m cleanrl_utils.submit_exp --backend slurm --nodes 3 --gpus-per-node 8 --resume-run runs/cleanrl/run \\
        --torchrun cleanrl/ppo_atari_multigpu.py --submit -- --env-id BreakoutNoFrameskip-v4 --num-envs 192
    # the same on AWS Batch (the image of ./Dockerfile; the W&B key by reference, never by value)
    python -m cleanrl_utils.submit_exp --backend aws-batch --job-queue gpu-queue --image <ecr-uri> \\
        --secret WANDB_API_KEY=arn:aws:secretsmanager:...:secret:wandb --command "python cleanrl/ppo_atari.py --track" \\
        --env-ids BreakoutNoFrameskip-v4 --num-seeds 3 --submit
    python -m cleanrl_utils.submit_exp status [JOB-NAME]       # what the last submission (of that name) is doing
    python -m cleanrl_utils.submit_exp cancel [JOB-NAME]

Every run has a fixed run directory, ``runs/<job-name>/<env>__<exp>__<seed>`` (multi-node:
``runs/<job-name>/run``), on the shared filesystem (SLURM: the submit directory; AWS Batch: the
volume of ``--efs-id`` mounted on ``runs/``). A task that is requeued, preempted or retried finds its
checkpoint there and continues with ``--resume``. SLURM jobs get ``--requeue`` and a SIGTERM
``--signal-before`` seconds before their time limit, so a run writes its checkpoint and the task
requeues itself. Each submission leaves a manifest (``runs/submissions/<job-name>-<time>.json``)
that ``status`` and ``cancel`` read. Bad input (a command that is not a script of this project,
flags that script does not accept, an impossible resource request) gets one line and exit code 2,
and nothing is submitted.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tyro

from cleanrl_utils.checkpoint import list_checkpoints
from cleanrl_utils.launch import REPO, check_script_args, exp_name, refusal

MANIFESTS = Path("runs") / "submissions"
MAX_GPUS_PER_NODE = 16
TUNER = "cleanrl_utils/tuner.py"
PBT = "cleanrl_utils/pbt.py"


class SubmitError(Exception):
    """Bad input: one line, exit code 2, nothing submitted."""


@dataclass
class Args:
    backend: str = "slurm"
    """slurm or aws-batch"""
    command: str | None = None
    """a grid's command, e.g. "python cleanrl/ppo.py --track"; each task adds --env-id, --seed and --run-name"""
    env_ids: list[str] = field(default_factory=list)
    """the grid's env ids"""
    num_seeds: int = 1
    """seeds per env id"""
    start_seed: int = 1
    """the first seed"""
    torchrun: str | None = None
    """a torchrun script for one multi-node data-parallel run (its flags after --)"""
    nodes: str = "1"
    """nodes of a --torchrun job: N, or MIN-MAX (SLURM: the job takes what it gets in the range, and when a
    node is lost torchrun continues the run on the nodes left, down to MIN)"""
    resume_run: str | None = None
    """a --torchrun job: continue this earlier job's run (e.g. runs/<job-name>/run) instead of starting
    runs/<job-name>/run; the node count may differ from the one it was saved with"""
    gpus_per_node: int = 0
    """GPUs per node (per grid task); 0: CPU-only"""
    cpus: int = 4
    """CPU cores per grid task or per node"""
    mem_gb: int = 16
    """memory per grid task or per node, GB"""
    time: str = "24:00:00"
    """time limit, HH:MM:SS (or D-HH:MM:SS)"""
    job_name: str = "cleanrl"
    """the job's name: its run directories are runs/<job-name>/..."""
    retries: int = 2
    """attempts after the first: SLURM requeues, AWS Batch retries of host and spot reclaims"""
    requeue: bool = True
    """SLURM: requeue on preemption or node failure, and before the time limit"""
    signal_before: int = 180
    """SLURM: seconds before the time limit at which the run is told to checkpoint and the task requeues"""
    array_parallelism: int | None = None
    """at most this many grid tasks run at once"""
    partition: str | None = None
    """SLURM partition (none: the cluster's default)"""
    account: str | None = None
    """SLURM account"""
    one_host: bool = False
    """SLURM: run a --torchrun job's N "nodes" as N tasks of one host (to try the template on one machine)"""
    job_queue: str | None = None
    """AWS Batch job queue"""
    image: str | None = None
    """AWS Batch: the container image (built from ./Dockerfile)"""
    secret: list[str] = field(default_factory=list)
    """AWS Batch: NAME=ARN of a Secrets Manager secret or SSM parameter, set as env var NAME in the container"""
    efs_id: str | None = None
    """AWS Batch: an EFS file system mounted on runs/ (checkpoints survive a retried attempt)"""
    region: str | None = None
    """AWS region (default: boto3's)"""
    endpoint_url: str | None = None
    """AWS Batch endpoint (e.g. a local test endpoint)"""
    tasks: int = 1
    """a tuner or population command (python cleanrl_utils/tuner.py ... or python cleanrl_utils/pbt.py ...): run it as
    this many identical array tasks (its workers)"""
    continue_runs: bool = False
    """SLURM: continue the runs an earlier submission of this --job-name left in runs/<job-name>/ (without it,
    a submission whose run directories hold checkpoints is refused: it would train into them)"""
    submit: bool = False
    """submit; without it, print what would be submitted"""


# --------------------------------------------------------------------------------------------
# Checks and the plan
# --------------------------------------------------------------------------------------------
@dataclass
class Task:
    env_id: str
    seed: int
    run_name: str


@dataclass
class Plan:
    kind: str  # "grid" or "multinode"
    argv: list[str]  # the command, without the per-task flags
    tasks: list[Task]
    nproc_per_node: int = 1
    nodes: tuple[int, int] = (1, 1)  # a --torchrun job's node range (MIN, MAX); MIN == MAX: a fixed count


def check(args: Args, extra: list[str]) -> Plan:
    if args.backend not in ("slurm", "aws-batch"):
        raise SubmitError(f"--backend {args.backend}: must be slurm or aws-batch")
    if (args.command is None) == (args.torchrun is None):
        raise SubmitError("give one of --command (a grid of runs) or --torchrun SCRIPT (one multi-node run)")
    nodes = node_range(args.nodes)
    if args.command is not None and nodes != (1, 1):
        raise SubmitError(f"--nodes {args.nodes}: a grid's tasks use one node each; --nodes is for --torchrun")
    if args.command is not None and args.resume_run:
        raise SubmitError(
            f"--resume-run {args.resume_run}: for a --torchrun job (a grid's tasks resume their own runs)"
        )
    if not 0 <= args.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise SubmitError(f"--gpus-per-node {args.gpus_per_node}: a node has 0 to {MAX_GPUS_PER_NODE} GPUs")
    for name in ("num_seeds", "cpus", "mem_gb"):
        if getattr(args, name) < 1:
            raise SubmitError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    if args.retries < 0:
        raise SubmitError(f"--retries {args.retries}: must be >= 0")
    if args.array_parallelism is not None and args.array_parallelism < 1:
        raise SubmitError(f"--array-parallelism {args.array_parallelism}: must be a positive integer")
    if not re.fullmatch(r"(\d+-)?\d{1,2}:\d{2}:\d{2}", args.time):
        raise SubmitError(f"--time {args.time}: must be HH:MM:SS or D-HH:MM:SS")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", args.job_name):
        raise SubmitError(f"--job-name {args.job_name}: letters, digits, - and _ only (at most 64)")
    if args.backend == "aws-batch":
        if not args.job_queue:
            raise SubmitError("--job-queue: required with --backend aws-batch")
        if not args.image:
            raise SubmitError("--image: required with --backend aws-batch (build ./Dockerfile and push it)")
        for item in args.secret:
            name, sep, arn = item.partition("=")
            if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) or not arn.startswith("arn:aws"):
                raise SubmitError(f"--secret {item}: must be NAME=arn:aws:secretsmanager:... or arn:aws:ssm:...")
    if args.tasks < 1:
        raise SubmitError(f"--tasks {args.tasks}: must be a positive integer")
    if args.command is not None and script_in(shlex.split(args.command))[0] in (REPO / TUNER, REPO / PBT):
        # tuner or population workers: the same command N times; they share the study through its --storage
        argv = shlex.split(args.command) + extra
        script, flags = script_in(argv)
        check_workers(script, flags)
        return Plan("workers", in_image(args, argv), [Task("", 0, "") for _ in range(args.tasks)])
    if args.command is not None:
        if not args.env_ids:
            raise SubmitError("--env-ids: a grid needs at least one env id")
        argv = shlex.split(args.command) + extra
        script, tail = script_in(argv)
        seeds = range(args.start_seed, args.start_seed + args.num_seeds)
        tasks = []
        for env_id in args.env_ids:
            for seed in seeds:
                flags = [*tail, "--env-id", env_id, "--seed", str(seed)]
                validate(script, flags, 1)
                run_name = f"{args.job_name}/{env_id.replace('/', '-')}__{exp_name(argv)}__{seed}"
                tasks.append(Task(env_id, seed, run_name))
        refuse_used_run_dirs(args, tasks)
        return Plan("grid", in_image(args, argv), tasks)
    low, high = nodes
    if low != high and (args.backend == "aws-batch" or args.one_host):
        where = "AWS Batch multi-node jobs have" if args.backend == "aws-batch" else "--one-host takes"
        raise SubmitError(f"--nodes {args.nodes}: {where} one node count; give --nodes N (--resume-run continues a "
                          "run on another count)")  # fmt: skip
    script = Path(args.torchrun)
    argv = [str(script), *extra]
    nproc = max(1, args.gpus_per_node)
    _, tail = script_in(argv)
    for n in range(low, high + 1):  # every world size the job may run at must split the run
        try:
            validate(script, tail, nproc * n)
        except SubmitError as error:
            if low == high:
                raise
            raise SubmitError(f"--nodes {args.nodes}: on {n} nodes ({n * nproc} processes) {error}") from None
    run_name = f"{args.job_name}/run" if args.resume_run is None else resumed_run(args)
    if args.resume_run is None:
        refuse_used_run_dirs(args, [Task("", 0, run_name)])
    return Plan("multinode", in_image(args, argv), [Task("", 0, run_name)], nproc, nodes)


def refuse_used_run_dirs(args: Args, tasks: list[Task]) -> None:
    """SLURM names run directories by --job-name: a second submission of one name would continue the first's
    runs (or fail in every task on their settings). Refused, before anything is submitted, unless asked."""
    if args.backend != "slurm" or args.continue_runs:
        return  # (AWS Batch keys a job's runs by its job id: every submission gets directories of its own)
    used = [t.run_name for t in tasks if list_checkpoints(Path("runs") / t.run_name / "checkpoints")]
    if used:
        raise SubmitError(
            f"--job-name {args.job_name}: runs/{used[0]} (and {len(used) - 1} more) holds checkpoints of an earlier "
            "submission: give another --job-name, or --continue-runs to continue them"
        )


def node_range(spec: str) -> tuple[int, int]:
    """``--nodes``: "N" or "MIN-MAX" as (MIN, MAX)."""
    match = re.fullmatch(r"(\d+)(?:-(\d+))?", spec.strip())
    if match is None:
        raise SubmitError(f"--nodes {spec}: must be N or MIN-MAX (e.g. 2-4)")
    low, high = int(match[1]), int(match[2] or match[1])
    if low < 1:
        raise SubmitError(f"--nodes {spec}: must be at least 1")
    if high < low:
        raise SubmitError(f"--nodes {spec}: MIN must not exceed MAX")
    return low, high


def resumed_run(args: Args) -> str:
    """``--resume-run``: the run's name under runs/ (SLURM: it must hold a checkpoint here, the shared runs/)."""
    name = Path(args.resume_run.rstrip("/"))
    name = Path(*name.parts[1:]) if name.parts and name.parts[0] == "runs" else name
    if name.is_absolute() or ".." in name.parts or not name.parts:
        raise SubmitError(f"--resume-run {args.resume_run}: must name a run directory under runs/")
    if args.backend == "slurm" and not list_checkpoints(Path("runs") / name / "checkpoints"):
        raise SubmitError(f"--resume-run {args.resume_run}: runs/{name.as_posix()} holds no checkpoint")
    return name.as_posix()


def in_image(args: Args, argv: list[str]) -> list[str]:
    """AWS Batch runs the command in the image's /workspace: the script by its path inside the project."""
    if args.backend != "aws-batch":
        return argv
    index = next(i for i, token in enumerate(argv) if token.endswith(".py"))
    return [*argv[:index], script_in(argv)[0].relative_to(REPO).as_posix(), *argv[index + 1 :]]


def script_in(argv: list[str]) -> tuple[Path, list[str]]:
    """The project script a command runs and the flags after it; anything else is refused."""
    index = next((i for i, token in enumerate(argv) if token.endswith(".py")), None)
    if index is None:
        raise SubmitError(f"--command {shlex.join(argv)}: runs no .py script")
    script = Path(argv[index])
    resolved = (Path.cwd() / script).resolve() if not script.is_absolute() else script
    if not resolved.exists() or (resolved.parent != REPO / "cleanrl" and resolved not in (REPO / TUNER, REPO / PBT)):
        raise SubmitError(f"{script}: not a script of this project (cleanrl/*.py, {TUNER} or {PBT})")
    return resolved, argv[index + 1 :]


def check_workers(script: Path, flags: list[str]) -> None:
    """A tuner's or a population's own command-line parsing and checks, without starting it; its workers on
    several nodes share one study, so --storage is required."""
    import contextlib
    import io

    from cleanrl_utils import pbt, tuner

    tool, error_class, what = (tuner, tuner.TunerError, "study") if script == REPO / TUNER else (pbt, pbt.PBTError,
                                                                                                  "population")  # fmt: skip
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            tool.build(tyro.cli(tool.Args, args=flags))
    except SystemExit:
        raise SubmitError(f"{script.name}: {refusal(stderr.getvalue()) or 'its command line is refused'}") from None
    except error_class as error:
        raise SubmitError(f"{script.name}: {error}") from None
    if not any(f.startswith("--storage") for f in flags):
        raise SubmitError(f"{script.name}: give --storage (e.g. postgresql://...): workers on several nodes share one "
                          f"{what}")  # fmt: skip


def validate(script: Path, flags: list[str], world_size: int) -> None:
    _, error = check_script_args(script, flags, world_size)
    if error:
        raise SubmitError(f"{script.name}: {error}")


# --------------------------------------------------------------------------------------------
# SLURM
# --------------------------------------------------------------------------------------------
RESUME_IF_CHECKPOINT = """resume=()
if compgen -G "runs/$RUN/checkpoints/ckpt_*.pt" >/dev/null; then resume=(--resume "runs/$RUN"); fi"""

# The batch shell runs the training in the background and waits. SLURM's early warning (B:USR1,
# --signal-before seconds before the time limit) reaches only the shell: it passes SIGTERM on (the run
# writes its checkpoint and exits) and requeues the task. A preemption, `scontrol requeue` or scancel
# sends SIGTERM to every process of the job: the run checkpoints, and SLURM decides what comes next.
SUPERVISE = """trap 'kill -TERM "$child" 2>/dev/null; requeue=1' USR1
trap 'kill -TERM "$child" 2>/dev/null' TERM
requeue=0
"${cmd[@]}" &
child=$!
set +e
wait "$child"; status=$?
while kill -0 "$child" 2>/dev/null; do wait "$child"; status=$?; done
if [ "$requeue" = 1 ] && [ "${SLURM_RESTART_COUNT:-0}" -lt "$retries" ]; then
    if [ -n "${RUN:-}" ] && ! compgen -G "runs/$RUN/checkpoints/ckpt_*.pt" >/dev/null; then
        echo "time limit near: stopped before its first checkpoint (exit $status), requeueing to start again"
    else
        echo "time limit near: checkpoint written (exit $status), requeueing"
    fi
    scontrol requeue "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}"
fi
exit "$status"
"""


def slurm_script(args: Args, plan: Plan, workdir: Path) -> str:
    logs = f"runs/{args.job_name}/slurm"
    lines = ["#!/bin/bash", f"#SBATCH --job-name={args.job_name}", f"#SBATCH --time={args.time}"]
    lines += [f"#SBATCH --chdir={workdir}", f"#SBATCH --mem={args.mem_gb}G", "#SBATCH --open-mode=append"]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    if args.requeue:
        lines += ["#SBATCH --requeue", f"#SBATCH --signal=B:USR1@{args.signal_before}"]
    if plan.kind in ("grid", "workers"):  # a job array: one task per run (grid) or per worker
        throttle = f"%{args.array_parallelism}" if args.array_parallelism else ""
        lines += [f"#SBATCH --array=0-{len(plan.tasks) - 1}{throttle}", f"#SBATCH --cpus-per-task={args.cpus}"]
        lines.append(f"#SBATCH --output={logs}/%x_%A_%a.out")
        if args.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-task={args.gpus_per_node}")
        lines += ["set -euo pipefail", ""]
    if plan.kind == "workers":
        lines.append(f"cmd=({shlex.join(plan.argv)})")
    elif plan.kind == "grid":
        lines.append("env_ids=(" + " ".join(shlex.quote(t.env_id) for t in plan.tasks) + ")")
        lines.append("seeds=(" + " ".join(str(t.seed) for t in plan.tasks) + ")")
        lines.append("runs=(" + " ".join(shlex.quote(t.run_name) for t in plan.tasks) + ")")
        lines += ["i=$SLURM_ARRAY_TASK_ID", 'RUN="${runs[$i]}"', RESUME_IF_CHECKPOINT]
        lines.append(
            f'cmd=({shlex.join(plan.argv)} --env-id "${{env_ids[$i]}}" --seed "${{seeds[$i]}}" '
            '--run-name "$RUN" --no-progress "${resume[@]}")'
        )
    else:
        low, high = plan.nodes
        if args.one_host:
            lines += [f"#SBATCH --ntasks={low}", "#SBATCH --nodes=1"]
        elif low == high:
            lines += [f"#SBATCH --ntasks={low}", f"#SBATCH --nodes={low}", "#SBATCH --ntasks-per-node=1"]
        else:  # a node range: one task per node it gets, and a lost node does not end the job
            lines += [f"#SBATCH --nodes={low}-{high}", "#SBATCH --ntasks-per-node=1", "#SBATCH --no-kill"]
        lines += [f"#SBATCH --cpus-per-task={args.cpus}", f"#SBATCH --output={logs}/%x_%j.out"]
        if args.gpus_per_node:
            lines.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
        lines += ["set -euo pipefail", ""]
        lines.append('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
        lines.append("port=$((29400 + SLURM_JOB_ID % 1000))")
        lines += [f"RUN={shlex.quote(plan.tasks[0].run_name)}", RESUME_IF_CHECKPOINT]
        # one torchrun per node (task); they meet at the first host; torchrun restarts a failed worker group,
        # and in a node range it goes on with the nodes left (down to MIN) from the run's newest checkpoint
        srun, nnodes = "srun --kill-on-bad-exit=1", '"$SLURM_NTASKS"'
        if low != high:
            srun, nnodes = "srun --no-kill --kill-on-bad-exit=0", f'{low}:"$SLURM_JOB_NUM_NODES"'
        lines.append(
            f"cmd=({srun} --label python -m torch.distributed.run "
            f"--nnodes={nnodes} --nproc-per-node={plan.nproc_per_node} --rdzv-backend=c10d "
            f'--rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID" --max-restarts={args.retries} '
            f'{shlex.join(plan.argv)} --run-name "$RUN" --no-progress "${{resume[@]}}")'
        )
    lines += ["", f"retries={args.retries}", SUPERVISE, ""]
    return "\n".join(lines)


def submit_slurm(args: Args, plan: Plan, text: str) -> list[str]:
    out = Path("runs") / args.job_name / "slurm"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.job_name}-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    path.write_text(text)
    try:
        result = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SubmitError("sbatch: not found (is this a SLURM login node?)") from None
    if result.returncode != 0:
        raise SubmitError(f"sbatch refused {path}: {result.stderr.strip()}")
    return [result.stdout.strip().split(";")[0]]


# --------------------------------------------------------------------------------------------
# AWS Batch
# --------------------------------------------------------------------------------------------
def batch_client(args: Args):
    import boto3

    return boto3.client("batch", region_name=args.region, endpoint_url=args.endpoint_url)


def container_properties(args: Args, plan: Plan) -> dict[str, Any]:
    resources = [
        {"type": "VCPU", "value": str(args.cpus)},
        {"type": "MEMORY", "value": str(args.mem_gb * 1024)},
    ]
    if args.gpus_per_node:
        resources.append({"type": "GPU", "value": str(args.gpus_per_node)})
    props: dict[str, Any] = {
        "image": args.image,
        "command": list(plan.argv),
        "resourceRequirements": resources,
        "secrets": [{"name": n, "valueFrom": arn} for n, _, arn in (s.partition("=") for s in args.secret)],
        "environment": [{"name": "CLEANRL_JOB_NAME", "value": args.job_name}],
    }
    if args.efs_id:
        props["volumes"] = [{"name": "runs", "efsVolumeConfiguration": {"fileSystemId": args.efs_id}}]
        props["mountPoints"] = [{"sourceVolume": "runs", "containerPath": "/workspace/runs"}]
    return props


def job_definition(args: Args, plan: Plan) -> dict[str, Any]:
    """The job definition to register: resources, secrets by reference, retries of reclaimed hosts only."""
    definition: dict[str, Any] = {
        "jobDefinitionName": args.job_name,
        # retry what the host did to the job (spot reclaim, instance failure), not what the run did
        "retryStrategy": {
            "attempts": args.retries + 1,
            "evaluateOnExit": [
                {"onStatusReason": "Host EC2*", "action": "RETRY"},
                {"onReason": "*", "action": "EXIT"},
            ],
        },
        "timeout": {"attemptDurationSeconds": seconds(args.time)},
    }
    container = container_properties(args, plan)
    if plan.kind in ("grid", "workers"):
        definition["type"] = "container"
        definition["containerProperties"] = container
    else:
        container["environment"].append({"name": "CLEANRL_NPROC_PER_NODE", "value": str(plan.nproc_per_node)})
        definition["type"] = "multinode"
        definition["nodeProperties"] = {
            "numNodes": plan.nodes[0],
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": "0:", "container": container}],
        }
    return definition


def seconds(limit: str) -> int:
    days, _, clock = limit.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def same_definition(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """An ACTIVE revision that already says everything we would register (fields AWS adds are ignored)."""

    def subset(want, have) -> bool:
        if isinstance(want, str) and isinstance(have, str):
            return want.lower() == have.lower()  # the service may echo enums in another case
        if isinstance(want, dict):
            return isinstance(have, dict) and all(subset(v, have.get(k)) for k, v in want.items())
        if isinstance(want, list):
            return isinstance(have, list) and len(want) == len(have) and all(map(subset, want, have))
        return want == have

    return subset({k: v for k, v in wanted.items() if k != "jobDefinitionName"}, existing)


def submit_aws(args: Args, plan: Plan, client) -> tuple[list[str], str]:
    wanted = job_definition(args, plan)
    found = client.describe_job_definitions(jobDefinitionName=args.job_name, status="ACTIVE")["jobDefinitions"]
    reuse = [d for d in found if same_definition(d, wanted)]
    if reuse:
        arn = max(reuse, key=lambda d: d["revision"])["jobDefinitionArn"]
    else:
        arn = client.register_job_definition(**wanted)["jobDefinitionArn"]
    request = job_request(args, plan, arn)
    job = client.submit_job(**request)
    return [job["jobId"]], arn


def job_request(args: Args, plan: Plan, definition: str) -> dict[str, Any]:
    """The submit_job request: an array of the grid's runs or of tuner workers, or a multi-node job."""
    request: dict[str, Any] = {"jobName": args.job_name, "jobQueue": args.job_queue, "jobDefinition": definition}
    if plan.kind in ("grid", "workers") and len(plan.tasks) > 1:
        request["arrayProperties"] = {"size": len(plan.tasks)}
    if plan.kind == "grid":
        grid = " ".join(f"{t.env_id}|{t.seed}|{t.run_name}" for t in plan.tasks)
        request["containerOverrides"] = {"environment": [{"name": "CLEANRL_GRID", "value": grid}]}
    elif plan.kind == "multinode":
        request["nodeOverrides"] = {"numNodes": plan.nodes[0]}
        if args.resume_run:  # the entrypoint continues this run instead of runs/<job-name>-<job id>/run
            env = [{"name": "CLEANRL_RUN", "value": plan.tasks[0].run_name}]
            request["nodeOverrides"]["nodePropertyOverrides"] = [
                {"targetNodes": "0:", "containerOverrides": {"environment": env}}
            ]
    return request


# --------------------------------------------------------------------------------------------
# Manifests, status, cancel
# --------------------------------------------------------------------------------------------
def write_manifest(args: Args, plan: Plan, job_ids: list[str], extra: dict[str, Any]) -> Path:
    MANIFESTS.mkdir(parents=True, exist_ok=True)
    path = MANIFESTS / f"{args.job_name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    manifest = {
        "backend": args.backend,
        "job_name": args.job_name,
        "job_ids": job_ids,
        "kind": plan.kind,
        "command": plan.argv,
        "tasks": [asdict(t) for t in plan.tasks],
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "args": {k: v for k, v in asdict(args).items() if k != "secret"},
        "secrets": [s.partition("=")[0] for s in args.secret],  # names only
        **extra,
    }
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def latest_manifest(job_name: str | None) -> dict[str, Any]:
    found = sorted(MANIFESTS.glob(f"{job_name or '*'}-*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SubmitError(f"no submission{' named ' + job_name if job_name else ''} in {MANIFESTS}")
    return json.loads(found[-1].read_text())


def status(job_name: str | None) -> int:
    manifest = latest_manifest(job_name)
    print(f"{manifest['job_name']} ({manifest['backend']}, submitted {manifest['submitted']}): {manifest['job_ids']}")
    if manifest["backend"] == "slurm":
        job = manifest["job_ids"][0]
        queue = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T %R"], capture_output=True, text=True)
        states = dict(line.split(" ", 1) for line in queue.stdout.splitlines() if line.strip())
        for i, task in enumerate(manifest["tasks"]):
            key = f"{job}_{i}" if manifest["kind"] == "grid" else job
            state = states.get(key) or ("finished" if run_done(task["run_name"]) else "not queued (ended)")
            print(f"  {task['run_name']}: {state}")
    else:
        args = Args(**{**manifest["args"], "secret": []})
        client = batch_client(args)
        for job in client.describe_jobs(jobs=manifest["job_ids"])["jobs"]:
            summary = job.get("arrayProperties", {}).get("statusSummary")
            print(f"  {job['jobName']} {job['jobId']}: {job['status']}" + (f" {summary}" if summary else ""))
    return 0


def cancel(job_name: str | None) -> int:
    manifest = latest_manifest(job_name)
    if manifest["backend"] == "slurm":
        subprocess.run(["scancel", *manifest["job_ids"]], check=True)
    else:
        client = batch_client(Args(**{**manifest["args"], "secret": []}))
        for job in manifest["job_ids"]:
            client.terminate_job(jobId=job, reason="cancelled with submit_exp.py")
    print(f"cancelled {manifest['job_name']}: {' '.join(manifest['job_ids'])}")
    return 0


def run_done(run_name: str) -> bool:
    """A run is finished when its newest checkpoint is at its total step count."""
    from cleanrl_utils.checkpoint import list_checkpoints, load_checkpoint

    found = list_checkpoints(Path("runs") / run_name / "checkpoints")
    if not found:
        return False
    checkpoint = load_checkpoint(found[-1])
    return checkpoint.get("global_step", 0) >= checkpoint["args"].get("total_timesteps", float("inf"))


# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in ("status", "cancel"):
            name = argv[1] if len(argv) > 1 else None
            return status(name) if argv[0] == "status" else cancel(name)
        extra = argv[argv.index("--") + 1 :] if "--" in argv else []
        argv = argv[: argv.index("--")] if "--" in argv else argv
        args = tyro.cli(Args, args=argv)
        plan = check(args, extra)
        if args.backend == "slurm":
            text = slurm_script(args, plan, Path.cwd())
            if not args.submit:
                print(f"# dry run: sbatch would get this script ({len(plan.tasks)} runs); --submit to submit\n{text}")
                return 0
            job_ids = submit_slurm(args, plan, text)
            path = write_manifest(args, plan, job_ids, {})
        else:
            definition = job_definition(args, plan)
            if not args.submit:
                print("# dry run: the job definition (registered unless an identical ACTIVE one exists)")
                print(json.dumps(definition, indent=2))
                print("# and the job; --submit to submit")
                print(json.dumps(job_request(args, plan, args.job_name), indent=2))
                return 0
            job_ids, arn = submit_aws(args, plan, batch_client(args))
            for task in plan.tasks if not args.resume_run else []:  # the entrypoint keys runs by the job
                task.run_name = f"{args.job_name}-{job_ids[0]}/{task.run_name.split('/', 1)[1]}"
            path = write_manifest(args, plan, job_ids, {"job_definition": arn})
        print(f"submitted {args.job_name}: job {' '.join(job_ids)} ({len(plan.tasks)} runs); manifest {path}")
        return 0
    except SubmitError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
