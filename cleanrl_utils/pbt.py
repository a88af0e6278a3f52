"""Population-based training of any script, on the tuner's storage: exploit by checkpoint, explore by flags.

    python -m cleanrl_utils.pbt --script cleanrl/ppo_continuous_action.py --env-id HalfCheetah-v4 \\
        --population 8 --total-timesteps 1000000 --ready 100000 --workers 2
    python -m cleanrl_utils.pbt ... --baseline        # the same members' first values, trained independently
    python -m cleanrl_utils.pbt ... --report          # lineage, schedules, the best member, a replay command
    python -m cleanrl_utils.pbt ... --replay 3        # retrain one run on member 3's discovered schedule
    # more machines (or SLURM array tasks) serve the same population: the same command with a shared
    # --storage (postgresql://..., or SQLite / a journal file on a shared disk) and runs/ directory

Members are ordinary runs of the script (``runs/<population>/m<i>``), launched as a user would: the
first segment with the member's flags, every later one with ``--resume`` and the flags that changed
(only those in the script's ``Args.RESUMABLE``; the resume rule refuses any other change). A member
trains ``--ready`` env steps at a time (a segment) and stops itself after its first checkpoint at or past
the segment's end (``CLEANRL_STOP_AT_STEP``, exit code 0, under torchrun too), and scores the mean of its
last ``--window`` episodes up to that checkpoint. Then, unless it restarted from a copy in this segment (a
member is not judged right after it restarted), it is compared with the other members' scores at or
before its own step (a member ahead has trained longer: its later scores do not count; at least
``--quorum`` of the population must have one, so the first members to end a segment are not ranked as a
pair), and when it ranks in the bottom ``--fraction`` it copies the newest complete checkpoint of a member in the top
``--fraction`` into its own run directory, keeping its own step counter, its own W&B run and fresh generators, and
continues with that member's flags perturbed (explore): times 0.8 or 1.2 (discounts such as gamma:
their distance to 1), integers by one step, or, with probability ``--resample-probability``, drawn
anew; always within the space. The optimizer and schedule state come from the copy, the mutated
values from the command line (the scripts apply them after loading: an annealed learning rate anneals
from the new base). ``--torchrun`` belongs to the worker, not to the population: a leader saved by N
processes is continued by a member on a worker that runs M (the scripts' elastic re-split).

Why on the tuner's storage: every segment is an Optuna trial (its user attributes hold the member,
generation, parent, flags, step and score), so what the tuner already does for trials holds for
members: workers on any number of machines claim segments atomically from SQLite, a journal file or
PostgreSQL; a heartbeat tells a lost worker; a lost segment is enqueued again and resumes the
member's own lineage from its own newest checkpoint with its current flags (not from scratch, not
re-mutated), up to ``--max-resumes`` times. A run directory holds at most the scripts' two newest
checkpoints (a copy replaces the member's newest): the population's disk is bounded by 2 x members.
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import shlex
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import tyro
from optuna.trial import FrozenTrial, TrialState

from cleanrl_utils.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, write_state
from cleanrl_utils.launch import REPO, check_script_args, launch, load_script, locate_script, thread_env
from cleanrl_utils.run import STOP_AT_STEP
from cleanrl_utils.tb import ScalarReader
from cleanrl_utils.trials import _TOLD, Heartbeat, Watcher, open_storage, retry_s_trial_was_lost, worker_record
from cleanrl_utils.tuner_spaces import load_space

DISCOUNTS = {"gamma", "gae-lambda"}  # perturbed as 1 - x: 0.99 * 1.2 would leave [0, 1]
CLAIM_SETTLE = 1.0  # seconds between signing a claimed segment and reading the signature back
STOPPED = {0, 128 + signal.SIGTERM, -signal.SIGTERM}  # finished or at its segment's end; or SIGTERMed


class PBTError(Exception):
    """Bad input: one line, exit code 2."""


@dataclass
class Args:
    script: str = "cleanrl/ppo.py"
    """the script every member runs (any of cleanrl/*.py, python or torchrun)"""
    env_id: str = "CartPole-v1"
    """the env id of every member"""
    population: int = 8
    """members of the population"""
    total_timesteps: int = 100_000
    """env steps each member trains in all"""
    ready: int = 20_000
    """env steps between two exploit/explore decisions of a member (a segment)"""
    space: str | None = None
    """JSON or TOML file of the flags members start from and may mutate ({flag: {low, high[, log]} or a list});
    default: the script's RESUMABLE flags in the tuner's space"""
    extra: str = ""
    """flags every member gets (not mutated), one string: --extra="--num-envs 4 --no-anneal-lr" """
    torchrun: int = 0
    """processes per member under torchrun on this worker (0: python); workers with different counts may serve
    one population (a member continues a checkpoint saved on another count: the elastic re-split)"""
    study_name: str | None = None
    """the population's name: its runs are runs/<name>/m<i> (default <script>-<env>); --baseline adds -baseline"""
    storage: str | None = None
    """Optuna storage shared by the workers (default sqlite in runs/<name>/)"""
    workers: int = 1
    """segments trained at the same time by this process"""
    fraction: float = 0.25
    """truncation selection: the bottom fraction copies a member of the top fraction"""
    quorum: float = 0.5
    """a member is judged only when this share of the population (2 members at least) has a score at or before
    its step: the first members of an asynchronous population to end a segment are not ranked as a pair"""
    resample_probability: float = 0.25
    """explore: a mutated flag is drawn anew from the space with this probability, else perturbed"""
    window: int = 20
    """a member's score: the mean of its last this many episodic returns"""
    seed: int = 1
    """member i trains with seed + i; the population's draws are seeded with it too"""
    baseline: bool = False
    """train the members' first values independently (no exploit, no explore): the equal-compute baseline"""
    max_resumes: int = 3
    """times a segment whose worker was lost is started again"""
    heartbeat: float = 30.0
    """seconds between a worker's heartbeats (lost after three silent ones)"""
    threads_per_run: int = 1
    """OMP/MKL threads of each member process"""
    poll: float = 0.5
    """seconds between two looks at a running member"""
    report: bool = False
    """print the population's lineage and schedules, its best member and the replay command, and exit"""
    replay: int | None = None
    """retrain one run (runs/<name>/replay-m<i>) on member i's discovered schedule, and exit"""


# --------------------------------------------------------------------------------------------
# Explore: the maths, on plain values (unit-tested)
# --------------------------------------------------------------------------------------------
def draw(spec: Any, rng: np.random.Generator) -> Any:
    """A value of a space entry: a range {low, high[, log, int]}, a list of choices, or a fixed value."""
    if isinstance(spec, dict):
        low, high = spec["low"], spec["high"]
        if spec.get("log"):
            value = float(np.exp(rng.uniform(np.log(low), np.log(high))))
        else:
            value = float(rng.uniform(low, high))
        return int(round(value)) if spec.get("int", isinstance(low, int) and isinstance(high, int)) else value
    if isinstance(spec, list):
        return spec[int(rng.integers(len(spec)))]
    return spec


def perturb(key: str, value: Any, spec: Any, rng: np.random.Generator, resample_probability: float) -> Any:
    """Explore one flag: drawn anew with ``resample_probability``, else times 0.8 or 1.2 (a discount: its
    distance to 1), an integer by one step, a choice to a neighbour; clamped to the space."""
    if not isinstance(spec, dict | list) or rng.random() < resample_probability:
        return draw(spec, rng)
    factor = 0.8 if rng.random() < 0.5 else 1.2
    if isinstance(spec, list):
        i = spec.index(value) if value in spec else 0
        return spec[min(max(i + (1 if factor > 1 else -1), 0), len(spec) - 1)]
    low, high = spec["low"], spec["high"]
    if isinstance(value, int) and not isinstance(value, bool):
        return min(max(value + (1 if factor > 1 else -1), low), high)
    new = 1.0 - (1.0 - value) * factor if key in DISCOUNTS else value * factor
    return float(min(max(new, low), high))


def explore(params: dict[str, Any], space: dict[str, Any], rng: np.random.Generator, p: float) -> dict[str, Any]:
    return {k: perturb(k, v, space[k], rng, p) if k in space else v for k, v in params.items()}


# --------------------------------------------------------------------------------------------
# Exploit: who copies whom (unit-tested on frozen trials)
# --------------------------------------------------------------------------------------------
def standing(segments: list[FrozenTrial], step: int) -> dict[int, FrozenTrial]:
    """Each member's latest completed segment that ended at or before ``step`` (a member ahead has trained
    longer: its later scores are not compared with one at ``step``)."""
    latest: dict[int, FrozenTrial] = {}
    for t in segments:
        a = t.user_attrs
        if t.state != TrialState.COMPLETE or a.get("step") is None or a["step"] > step:
            continue
        m = a["member"]
        if m not in latest or a["step"] > latest[m].user_attrs["step"]:
            latest[m] = t
    return latest


def choose_leader(me: int, step: int, segments: list[FrozenTrial], fraction: float, rng: np.random.Generator,
                  has_checkpoint, quorum: int = 2) -> int | None:  # fmt: skip
    """The member ``me`` copies after its segment ending at ``step``: None unless at least ``quorum`` members
    (2 at least) are compared at ``step`` and it ranks in their bottom ``fraction``; then one of the top
    ``fraction`` that has a checkpoint."""
    latest = standing(segments, step)
    if me not in latest or latest[me].user_attrs.get("copied"):  # just restarted from a copy: not judged yet
        return None
    ranked = sorted(latest, key=lambda m: score_of(latest[m]), reverse=True)
    cut = max(1, int(len(ranked) * fraction))
    if len(ranked) < max(2, quorum) or me not in ranked[-cut:]:
        return None
    leaders = [m for m in ranked[:cut] if m != me and has_checkpoint(m)]
    return int(rng.choice(leaders)) if leaders else None


def score_of(trial: FrozenTrial) -> float:
    score = trial.user_attrs.get("score")
    return -math.inf if score is None else float(score)


# --------------------------------------------------------------------------------------------
# The population in the storage
# --------------------------------------------------------------------------------------------
@dataclass
class Population:
    """The population's settings and its storage (every process opens its own)."""

    args: Args
    script: Path
    name: str
    storage_url: str
    space: dict[str, Any]
    resumable: tuple[str, ...]

    @property
    def root(self) -> Path:
        return Path("runs") / self.name

    def run_dir(self, member: int) -> Path:
        return self.root / f"m{member}"

    def study(self) -> optuna.Study:
        return optuna.load_study(study_name=self.name, storage=open_storage(self.storage_url))

    def segments(self, study: optuna.Study) -> list[FrozenTrial]:
        return [t for t in study.get_trials(deepcopy=False) if "member" in t.user_attrs]

    def has_checkpoint(self, member: int) -> bool:
        return bool(list_checkpoints(self.run_dir(member) / "checkpoints"))


def build(args: Args) -> Population:
    script = Path(args.script)
    if not script.exists() and (REPO / script).exists():
        script = REPO / script
    if not script.exists():
        raise PBTError(f"--script {args.script}: no such file")
    for name in ("population", "total_timesteps", "ready", "workers", "window", "threads_per_run"):
        if getattr(args, name) < 1:
            raise PBTError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be a positive integer")
    if args.population < 2:
        raise PBTError(f"--population {args.population}: a population needs at least 2 members")
    if not 0 < args.fraction <= 0.5:
        raise PBTError(f"--fraction {args.fraction}: must be in (0, 0.5]")
    if not 0 < args.quorum <= 1:
        raise PBTError(f"--quorum {args.quorum}: must be in (0, 1]")
    resumable = tuple(getattr(load_script(script).Args, "RESUMABLE", ()))
    space = load_space(args.space) if args.space else default_space(script, resumable)
    bad = sorted(k for k, v in space.items() if isinstance(v, dict | list) and k.replace("-", "_") not in resumable)
    if bad:
        allowed = ", ".join(f"--{n.replace('_', '-')}" for n in resumable) or "none"
        raise PBTError(f"--space: {', '.join(bad)} may not change on resume (the script allows {allowed})")
    name = (args.study_name or f"{script.stem}-{args.env_id.replace('/', '-')}") + (
        "-baseline" if args.baseline else ""
    )
    population = Population(args, script, name, storage_url(args, name), space, resumable)
    for member in range(args.population):  # every member's first command line, as the script validates it
        _, error = check_script_args(script, first_flags(population, member, initial_params(population, member)),
                                     max(args.torchrun, 1))  # fmt: skip
        if error:
            raise PBTError(f"member {member}: {error}")
    return population


def storage_url(args: Args, name: str) -> str:
    return args.storage or f"sqlite:///{Path('runs') / name / 'optuna.db'}"


def default_space(script: Path, resumable: tuple[str, ...]) -> dict[str, Any]:
    from cleanrl_utils.tuner_spaces import SPACES

    shipped = SPACES.get(f"cleanrl/{script.name}", {})
    space = {k: v for k, v in shipped.items() if k.replace("-", "_") in resumable and isinstance(v, dict | list)}
    if not space:
        raise PBTError(f"--space: give one ({script.name} has no shipped space of flags it may change on resume)")
    return space


def initial_params(population: Population, member: int) -> dict[str, Any]:
    """Member ``member``'s first values: drawn from the space with the population's seed and its index."""
    rng = np.random.default_rng([population.args.seed, member])
    return {k: draw(v, rng) for k, v in population.space.items()}


def first_flags(population: Population, member: int, params: dict[str, Any]) -> list[str]:
    a = population.args
    flags = [
        *shlex.split(a.extra),
        "--env-id",
        a.env_id,
        "--seed",
        str(a.seed + member),
        "--total-timesteps",
        str(a.total_timesteps),
    ]
    flags += ["--checkpoint-interval", str(a.ready)]
    return flags + flag_list(params)


def flag_list(params: dict[str, Any]) -> list[str]:
    return [token for key, value in params.items() for token in (f"--{key}", str(value))]


def seed_population(population: Population) -> None:
    """Create the study (once, whoever comes first) and enqueue every member's first segment."""
    a = population.args  # the population's identity; not --torchrun, which is each worker's own
    config = {"script": population.script.name, "env_id": a.env_id, "population": a.population,
              "total_timesteps": a.total_timesteps, "ready": a.ready, "space": population.space,
              "extra": a.extra, "baseline": a.baseline, "seed": a.seed}  # fmt: skip
    try:
        study = optuna.create_study(study_name=population.name, storage=open_storage(population.storage_url),
                                    load_if_exists=True, direction="maximize")  # fmt: skip
    except Exception as error:  # a missing driver, a closed port, a file that is not a database
        raise PBTError(
            f"--storage {population.storage_url}: cannot be used ({type(error).__name__}: {error})"
        ) from None
    saved = study.user_attrs.get("config")
    if saved is not None:
        changed = [k for k in config if json.loads(json.dumps(config[k])) != saved.get(k)]  # older: more keys
        if changed:
            key = changed[0]
            raise PBTError(f"population {population.name} was started with {key}={saved.get(key)!r}: give another "
                           "--study-name")  # fmt: skip
        return
    study.set_user_attr("config", config)
    for member in range(a.population):
        end = min(a.ready, a.total_timesteps)
        segment = {
            "member": member,
            "generation": 0,
            "start": 0,
            "end": end,
            "params": initial_params(population, member),
        }
        study.enqueue_trial({}, user_attrs=segment)


# --------------------------------------------------------------------------------------------
# A worker: claim a segment, train it, score it, decide the member's next
# --------------------------------------------------------------------------------------------
def claim(study: optuna.Study, population: Population) -> optuna.Trial | None:
    """A waiting segment, or None. Two workers asking at once: the one that got no segment (Optuna made it a
    new, empty trial) or a twin of a segment already running stands down (a failed trial marked surplus).
    Two workers handed the same segment (SQLite lets two processes read it as waiting before either marks
    it running) both sign it and read it back a moment later: only the last signature's worker runs it."""
    if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return None
    trial = study.ask()
    attrs = trial.user_attrs
    twins = [t for t in population.segments(study) if t.number < trial.number and t.user_attrs.get("member") ==
             attrs.get("member") and t.user_attrs.get("start") == attrs.get("start") and
             t.state in (TrialState.RUNNING, TrialState.COMPLETE) and not t.user_attrs.get("surplus")]  # fmt: skip
    if "resume_of" in attrs:  # a retry: only the first of its lost segment, and only if that one was lost
        trials = study.get_trials(deepcopy=False)
        twins = [t for t in trials if t.user_attrs.get("resume_of") == attrs["resume_of"] and t.number < trial.number
                 and not t.user_attrs.get("surplus")]  # fmt: skip
    if "member" not in attrs or twins or ("resume_of" in attrs and not retry_s_trial_was_lost(study, trial)):
        trial.set_user_attr("surplus", True)
        study.tell(trial, state=TrialState.FAIL)
        return None
    signature = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    trial.set_user_attr("claimed_by", signature)
    time.sleep(CLAIM_SETTLE)
    now = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
    return trial if now.user_attrs.get("claimed_by") == signature and now.state == TrialState.RUNNING else None


def member_step(population: Population, member: int) -> int:
    """The global step of the member's newest checkpoint (0: none yet)."""
    found = list_checkpoints(population.run_dir(member) / "checkpoints")
    return int(found[-1].stem.split("_")[1]) if found else 0


def command_for(population: Population, run: Path, member: int, params: dict[str, Any]) -> list[str]:
    """A member's command line: the first with its flags, later ones ``--resume`` plus the flags that changed."""
    found = list_checkpoints(run / "checkpoints")
    if found:
        saved = load_checkpoint(found[-1])["args"]
        changed = {k: v for k, v in params.items() if saved.get(k.replace("-", "_")) != v}
        flags = ["--resume", str(run), *flag_list(changed)]
    else:
        flags = first_flags(population, member, params)
    a = population.args
    start = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={a.torchrun}"]
                                if a.torchrun else [])  # fmt: skip
    return locate_script([*start, str(population.script), *flags, "--run-name", run.relative_to("runs").as_posix(),
                          "--no-progress"])  # fmt: skip


def segment_command(population: Population, segment: dict[str, Any]) -> list[str]:
    member = segment["member"]
    return command_for(population, population.run_dir(member), member, segment["params"])


def score(population: Population, member: int, upto: int) -> float | None:
    series = ScalarReader(population.run_dir(member)).update().get("charts/episodic_return")
    values = [v for s, v in zip(series.steps, series.values) if s <= upto]
    return float(np.mean(values[-population.args.window :])) if values else None


def train_to(argv: list[str], log: Path, end: int, a: Args) -> int:
    """Run one segment of a member: it stops itself (as on SIGTERM) after its first checkpoint at or past
    ``end``, so every segment ends exactly on a checkpoint. Returns its exit code."""
    env = thread_env(a.threads_per_run)
    if end < a.total_timesteps:
        env[STOP_AT_STEP] = str(end)
    with open(log.parent.mkdir(parents=True, exist_ok=True) or log, "a") as f:
        f.write(f"\n[pbt] {STOP_AT_STEP}={env.get(STOP_AT_STEP, '')} {shlex.join(argv)}\n")
    proc = _worker_state["proc"] = launch(argv, log, env=env)
    if _worker_state["stopping"]:  # SIGTERM came while it started
        _stop_worker(signal.SIGTERM, None)
    return proc.wait()


def train_segment(population: Population, trial: optuna.Trial) -> tuple[int, int]:
    """Train the member's segment; returns (exit code, the step of its newest checkpoint)."""
    member = trial.user_attrs["member"]
    log = population.root / "logs" / f"m{member}.log"
    code = train_to(segment_command(population, trial.user_attrs), log, trial.user_attrs["end"], population.args)
    return code, member_step(population, member)


def copy_leader(population: Population, member: int, leader: int, step: int, generation: int) -> int:
    """Exploit: the leader's newest complete checkpoint becomes the member's, at the member's own step (its
    counters, W&B run and TensorBoard log continue), with generators of its own. Returns the leader's step."""
    for _ in range(5):  # the leader may be rotating its checkpoints as we read: take the newest again
        found = list_checkpoints(population.run_dir(leader) / "checkpoints")
        try:
            copy = load_checkpoint(found[-1])
            break
        except (CheckpointError, IndexError):
            time.sleep(0.2)
    else:
        raise CheckpointError(f"member {leader} has no checkpoint that loads")
    own_dir = population.run_dir(member) / "checkpoints"
    own = load_checkpoint(list_checkpoints(own_dir)[-1])
    leader_step = copy["global_step"]
    copy = reseeded(copy, [population.args.seed, member, generation])
    copy.update(global_step=own["global_step"], run_name=own["run_name"], wandb_id=own.get("wandb_id"))
    # its own settings (run name, seed, ...) with the leader's values of the flags a resume may change
    copy["args"] = {**own["args"], **{k: v for k, v in copy["args"].items() if k in population.resumable}}
    for key in ("iteration", "update", "updates"):  # the loop counters that go with the step
        if key in own:
            copy[key] = own[key]
    for key in ("format_version", "sha256", "path"):
        copy.pop(key, None)
    write_state(copy, own_dir / f"ckpt_{own['global_step']:08d}.pt")
    return leader_step


def reseeded(checkpoint: dict[str, Any], salt: list[int]) -> dict[str, Any]:
    """The checkpoint with every generator state replaced by one derived from it and ``salt``: a member
    restarted from a copy does not replay its leader's random draws."""
    from cleanrl_utils.reshard import _derived

    def fresh(state: Any, i: int) -> Any:
        return _derived(state, int(np.random.SeedSequence([*salt, i]).generate_state(1)[0]))

    out = dict(checkpoint)
    if "rng" in out:
        out["rng"] = fresh(out["rng"], 0)
    if "ranks" in out:
        out["ranks"] = [{**part, "rng": fresh(part["rng"], r + 1)} if "rng" in part else part
                        for r, part in enumerate(out["ranks"])]  # fmt: skip
    return out


def next_segment(population: Population, study: optuna.Study, done: FrozenTrial, step: int) -> dict | None:
    """The member's next segment after ``done`` ended at ``step`` (None: it has trained its budget)."""
    a, attrs = population.args, done.user_attrs
    if finished(done, a.total_timesteps):
        return None
    member, generation = attrs["member"], attrs["generation"] + 1
    rng = np.random.default_rng([a.seed, member, generation, 7])
    segment = {"member": member, "generation": generation, "start": step, "end": min(step + a.ready, a.total_timesteps),
               "params": dict(attrs["params"])}  # fmt: skip
    if a.baseline:
        return segment
    leader = choose_leader(member, step, population.segments(study), a.fraction, rng, population.has_checkpoint,
                           math.ceil(a.quorum * a.population))  # fmt: skip
    if leader is None:
        return segment
    leader_step = copy_leader(population, member, leader, step, generation)
    params = explore(dict(trained_with(population, study, leader, leader_step)), population.space, rng,
                     a.resample_probability)  # fmt: skip
    segment.update(params=params, copied=True, parent=leader, parent_step=leader_step)
    return segment


def trained_with(population: Population, study: optuna.Study, member: int, step: int) -> dict[str, Any]:
    """The flags the member trained its checkpoint at ``step`` with: those of its last segment that started
    before ``step`` (a checkpoint at a segment's end belongs to that segment, not to the next one, which
    starts there; a lost segment and its retry carry the same flags)."""
    before = [t for t in population.segments(study) if t.user_attrs["member"] == member
              and not t.user_attrs.get("surplus") and t.user_attrs["start"] < step]  # fmt: skip
    return max(before, key=lambda t: (t.user_attrs["start"], t.number)).user_attrs["params"]


def run_segment(population: Population, study: optuna.Study, trial: optuna.Trial) -> str:
    """Train, score and tell one segment; enqueue the member's next. Returns a progress line."""
    trial.set_user_attr("worker", worker_record())
    heartbeat = Heartbeat(trial, population.args.heartbeat)
    try:
        code, step = train_segment(population, trial)
    finally:
        heartbeat.stop()
    if _worker_state["stopping"]:  # not told: the segment is lost, and resumes from the run's checkpoint
        os._exit(128 + signal.SIGTERM)
    member = trial.user_attrs["member"]
    # the last segment is not stopped: exit code 0 says the run trained its budget, which the script may round
    # down to whole iterations (PPO at 1M steps and 2,048 per iteration: 999,424)
    final = trial.user_attrs["end"] >= population.args.total_timesteps and code == 0
    if code not in STOPPED or (step < trial.user_attrs["end"] and not final):
        log = population.root / "logs" / f"m{member}.log"
        trial.set_user_attr("error", f"exit code {code} at step {step}; log {log}")
        study.tell(trial, state=TrialState.FAIL)
        return f"[pbt] member {member} failed (exit code {code}, step {step}): see {log}"
    value = score(population, member, step)
    trial.set_user_attr("final", final)
    trial.set_user_attr("step", step)
    trial.set_user_attr("score", value)
    study.tell(trial, -math.inf if value is None else value)
    segment = next_segment(population, study, study.get_trials(deepcopy=False)[trial.number], step)
    if segment is not None:
        study.enqueue_trial({}, user_attrs=segment)
    copied = (
        f"; copies member {segment['parent']} and explores" if segment and segment.get("parent") is not None else ""
    )
    return f"[pbt] member {member} at step {step:,}: score {value if value is None else round(value, 2)}{copied}"


# A worker told to stop (SIGTERM: a SLURM requeue or preemption, the parent's Ctrl-C) passes it on to its
# member's run, which checkpoints and exits; the worker then exits too, leaving the segment running in the
# storage with a dead worker: a watcher (this host at once, others after the heartbeat's grace) enqueues
# it again, and it resumes from that checkpoint with the same flags.
_worker_state: dict[str, Any] = {"proc": None, "stopping": False}


def _stop_worker(signum: int, frame: Any) -> None:
    _worker_state["stopping"] = True
    proc = _worker_state["proc"]
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)


def worker(population: Population, index: int) -> None:
    """A worker process: claim and run segments until none is waiting or running."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers with SIGTERM
    signal.signal(signal.SIGTERM, _stop_worker)
    study = population.study()
    while not _worker_state["stopping"]:
        trial = claim(study, population)
        if trial is None:
            states = {t.state for t in population.segments(study) if not t.user_attrs.get("surplus")}
            if not states & {TrialState.WAITING, TrialState.RUNNING}:
                return
            time.sleep(population.args.poll)
            continue
        print(run_segment(population, study, trial), flush=True)


def lose(study: optuna.Study, trial: FrozenTrial, reason: str, max_resumes: int) -> str | None:
    """A segment whose worker is gone: train it again, from the member's own newest checkpoint with the same
    flags (its lineage continues), or fail the member past ``max_resumes``. Returns the line to print, or
    None when another watcher (another machine, another SLURM task) handled it first."""
    resumes = trial.user_attrs.get("resumes", 0)
    if resumes < max_resumes:  # the retry first: a retry whose lost segment was not failed after all stands down
        drop = ("worker", "beat", "surplus", "claimed_by")
        attrs = {k: v for k, v in trial.user_attrs.items() if k not in drop}
        study.enqueue_trial({}, user_attrs={**attrs, "resume_of": trial.number, "resumes": resumes + 1})
    try:
        study.tell(trial.number, state=TrialState.FAIL)
    except _TOLD:
        return None
    if resumes >= max_resumes:
        study.set_user_attr(f"error:{trial.number}", f"lost {resumes + 1} times ({reason})")
    what = "trains again" if resumes < max_resumes else f"fails (lost {resumes + 1} times)"
    return f"[pbt] member {trial.user_attrs['member']}'s segment {trial.number} lost ({reason}): it {what}"


def supervise(population: Population) -> None:
    """Start the workers; a worker that dies loses its segment to a retry; stop when the population is done."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker, args=(population, i)) for i in range(population.args.workers)]
    for proc in procs:
        proc.start()
    watcher, study = Watcher(grace=3 * population.args.heartbeat), population.study()
    try:
        while True:
            for trial, reason in watcher.lost(study):
                line = lose(study, trial, reason, population.args.max_resumes) if "member" in trial.user_attrs else None
                if line:
                    print(line, flush=True)
            for i, proc in enumerate(procs):
                if not proc.is_alive() and proc.exitcode not in (0, None):  # lost: another takes its place
                    procs[i] = ctx.Process(target=worker, args=(population, i))
                    procs[i].start()
            if not any(p.is_alive() for p in procs):  # every worker found nothing left to train
                break
            time.sleep(population.args.poll)
    except KeyboardInterrupt:
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        raise


# --------------------------------------------------------------------------------------------
# What a population found: lineage, schedules, the best member, a replay
# --------------------------------------------------------------------------------------------
def schedule(population: Population, study: optuna.Study, member: int) -> list[tuple[int, dict[str, Any]]]:
    """The flags member ``member``'s final weights were trained with, as (from step, flags) along its lineage:
    its own segments back to its last copy, then its parent's before the copied step, and so on."""
    done = sorted((t for t in population.segments(study) if t.state == TrialState.COMPLETE),
                  key=lambda t: (t.user_attrs["member"], t.user_attrs["start"]))  # fmt: skip
    out, m, before = [], member, math.inf
    while True:
        mine = [t for t in done if t.user_attrs["member"] == m and t.user_attrs["start"] < before]
        if not mine:
            break
        for t in reversed(mine):
            out.append((t.user_attrs["start"], t.user_attrs["params"]))
            if t.user_attrs.get("parent") is not None:
                m, before = t.user_attrs["parent"], t.user_attrs["parent_step"]
                break
        else:
            break
    steps = sorted({start: params for start, params in out}.items())
    return [(start, p) for i, (start, p) in enumerate(steps) if i == 0 or p != steps[i - 1][1]]  # changes only


def report(population: Population) -> dict[str, Any]:
    """Print and write the lineage table, the schedule plot and the best member; return the figures."""
    study = population.study()
    done = [t for t in population.segments(study) if t.state == TrialState.COMPLETE]
    final = {t.user_attrs["member"]: t for t in done if finished(t, population.args.total_timesteps)}
    rows = sorted(done, key=lambda t: (t.user_attrs["member"], t.user_attrs["start"]))
    lines = ["| member | generation | steps | score | parent | flags |", "| ---: | ---: | --- | ---: | --- | --- |"]
    for t in rows:
        a = t.user_attrs
        parent = f"m{a['parent']} (step {a['parent_step']:,})" if a.get("parent") is not None else ""
        flags = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in a["params"].items())
        score_text = "" if a.get("score") is None else f"{a['score']:.2f}"
        lines.append(f"| {a['member']} | {a['generation']} | {a['start']:,}-{a['step']:,} | {score_text} | {parent} | "
                     f"{flags} |")  # fmt: skip
    table = "\n".join(lines)
    (population.root / "lineage.md").write_text(table + "\n")
    scores = sorted((score_of(t), m) for m, t in final.items())
    lost = study.user_attrs
    failed = {t.user_attrs["member"]: t.user_attrs.get("error") or lost.get(f"error:{t.number}")
              for t in population.segments(study) if t.state == TrialState.FAIL}  # fmt: skip
    failed = {member: error for member, error in failed.items() if error}
    figures = {"finished": sorted(final), "failed": failed, "scores": [s for s, _ in scores], "wall_s": wall_s(done)}
    print(table)
    if scores:
        best_score, best = scores[-1]
        steps = schedule(population, study, best)
        values = [s for s, _ in scores]
        newest = list_checkpoints(population.run_dir(best) / "checkpoints")[-1]
        figures.update(best=best, best_score=best_score, median=float(np.median(values)), std=float(np.std(values)),
                       schedule=steps, checkpoint=str(newest))  # fmt: skip
        print(f"\nbest member {best}: score {best_score:.2f} (median {figures['median']:.2f} over "
              f"{len(scores)} members; {figures['wall_s'] / 3600:.2f} h from first start to last end); checkpoint "
              f"{figures['checkpoint']}")  # fmt: skip
        print("its schedule (from step: flags): " + "; ".join(f"{s:,}: {p}" for s, p in steps))
        replay = [sys.executable, "-m", "cleanrl_utils.pbt", "--script", str(population.script), "--env-id",
                  population.args.env_id, "--study-name", population.name, "--replay", str(best)]  # fmt: skip
        print(f"replay: {shlex.join(replay)}")
        if not population.args.baseline:
            figures["baseline"] = baseline_figures(population)
            if figures["baseline"]:
                b = figures["baseline"]
                print(f"baseline ({population.name}-baseline: {b['runs']} independent runs of the members' first flags "
                      f"and seeds): best {b['best']:.2f}, median {b['median']:.2f}, std {b['std']:.2f}, "
                      f"{b['wall_s'] / 3600:.2f} h; population: best {best_score:.2f}, median {figures['median']:.2f}, "
                      f"std {figures['std']:.2f}")  # fmt: skip
            else:
                print(f"baseline: none finished yet (the same command with --baseline trains it: {population.name}-"
                      "baseline)")  # fmt: skip
        plot_schedules(population, study, population.root / "schedules.png")
        plot_curves(population, population.root / "curves.png")
        (population.root / "best.json").write_text(
            json.dumps({k: v for k, v in figures.items() if k != "failed"}, indent=2, default=str)
        )
    return figures


def baseline_figures(population: Population) -> dict[str, Any] | None:
    """The equal-compute baseline's best and median final scores (None: it has no finished run)."""
    name = f"{population.name}-baseline"
    if not population.args.storage and not (Path("runs") / name / "optuna.db").exists():
        return None
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(storage_url(population.args, name)))
    except (KeyError, ValueError):  # no such study
        return None
    total = population.args.total_timesteps
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if "member" in t.user_attrs]
    final = [score_of(t) for t in done if finished(t, total)]
    if not final:
        return None
    return {"runs": len(final), "best": max(final), "median": float(np.median(final)), "std": float(np.std(final)),
            "scores": sorted(final), "wall_s": wall_s(done)}  # fmt: skip


def finished(segment: FrozenTrial, total: int) -> bool:
    """The member's last segment: it trained its budget (``final``), or reached ``total`` steps."""
    return bool(segment.user_attrs.get("final")) or segment.user_attrs["step"] >= total


def wall_s(segments: list[FrozenTrial]) -> float:
    """Seconds from the first segment's start to the last one's end (the wall time of the whole population)."""
    starts = [t.datetime_start for t in segments if t.datetime_start]
    ends = [t.datetime_complete for t in segments if t.datetime_complete]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0


def plot_curves(population: Population, path: Path) -> None:
    """Every member's training return (a 20-episode trailing mean) against its env steps, beside the
    baseline's independent runs when they exist; a copy shows as a jump in the member's curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cleanrl_utils.plot import smooth  # the trailing mean of the curves in docs/benchmarks.md

    fig, ax = plt.subplots(figsize=(7, 4))
    roots = [(population.root, "population", "tab:blue")]
    if not population.args.baseline:
        roots.append((Path("runs") / f"{population.name}-baseline", "baseline (independent)", "tab:gray"))
    for root, label, color in roots:
        for member in range(population.args.population):  # (one legend entry per group)
            series = ScalarReader(root / f"m{member}").update().get("charts/episodic_return")
            if series is None or not series.values:
                continue
            ax.plot(series.steps, smooth(np.asarray(series.values, dtype=float), 20), color=color, lw=1, alpha=0.8,
                    label=label)  # fmt: skip
            label = None
    ax.set_xlabel("env steps")
    ax.set_ylabel("episodic return (20-episode mean)")
    ax.set_title(f"{population.script.stem} on {population.args.env_id}: {population.args.population} members")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_schedules(population: Population, study: optuna.Study, path: Path) -> None:
    """One panel per mutated flag: every member's value against env steps (a copy shows as a jump)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, v in population.space.items() if isinstance(v, dict | list)]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.2), squeeze=False)
    done = [t for t in population.segments(study) if t.state == TrialState.COMPLETE]
    for ax, key in zip(axes[0], keys):
        for member in range(population.args.population):
            mine = sorted((t for t in done if t.user_attrs["member"] == member), key=lambda t: t.user_attrs["start"])
            xs = [x for t in mine for x in (t.user_attrs["start"], t.user_attrs["step"])]
            ys = [t.user_attrs["params"][key] for t in mine for _ in (0, 1)]
            ax.plot(xs, ys, label=f"m{member}")
        ax.set_title(key)
        ax.set_xlabel("env steps")
        ax.set_yscale(
            "log" if isinstance(population.space[key], dict) and population.space[key].get("log") else "linear"
        )
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def replay(population: Population, member: int) -> int:
    """Retrain one fresh run (runs/<name>/replay-m<member>) on member ``member``'s schedule, segment by segment."""
    steps = schedule(population, population.study(), member)
    if not steps:
        raise PBTError(f"--replay {member}: member {member} has no finished segment in {population.name}")
    run, log = population.root / f"replay-m{member}", population.root / "logs" / f"replay-m{member}.log"
    for i, (start, params) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else population.args.total_timesteps
        argv = command_for(population, run, member, params)
        print(f"[pbt] replay from step {start:,}: {shlex.join(argv)}", flush=True)
        if train_to(argv, log, end, population.args) not in STOPPED:
            print(f"[pbt] replay failed: see {log}", flush=True)
            return 1
    print(f"[pbt] replayed member {member}'s schedule: {run}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        population = build(args)
        if args.report:
            report(population)
            return 0
        if args.replay is not None:
            return replay(population, args.replay)
        seed_population(population)
        print(f"[pbt] population {population.name} ({population.storage_url}): {args.population} members of "
              f"{population.script.name} on {args.env_id}, {args.total_timesteps:,} steps each, deciding every "
              f"{args.ready:,}; workers here: {args.workers}", flush=True)  # fmt: skip
        supervise(population)
        figures = report(population)
    except PBTError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    unfinished = sorted(set(range(args.population)) - set(figures["finished"]))
    if unfinished:
        for member in unfinished:
            print(f"[pbt] member {member} did not finish: {figures['failed'].get(member) or 'no segment is left'}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
