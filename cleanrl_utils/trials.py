"""A tuner trial's life in an Optuna storage, with Optuna's public API only: claiming a trial without
overshooting the budget, the trial's heartbeat, and what happens when its worker is lost.

A lost trial (its worker SIGKILLed, preempted, requeued, its node gone) is resumed, not replaced:
``lose_trial`` enqueues its parameters again as a retry trial carrying the user attributes
``lineage`` (the number of the trial that first drew them, which names the run directories
``runs/<study>/t<lineage>/...``), ``resume_of`` (the lost trial) and ``resumes`` (how many times the
lineage was resumed), then fails the lost trial. Whichever worker claims the retry, on any host that
shares the storage and ``runs/``, continues the lineage's runs with ``--resume`` from their own last
checkpoints and first reports again the intermediate values already reported, so the pruner sees
the lineage as if it had never stopped. A lineage counts once: by its last trial. A trial that fails
for its own reasons (a run that crashes, a NaN, no episode) is never retried; a lineage lost more
than ``max_resumes`` times is failed with a line saying so.

The heartbeat is a counter the trial's worker writes to a user attribute (every storage has them:
SQLite, PostgreSQL, the journal file); a watcher that sees it unchanged for the grace period, by its
own clock, declares the trial lost, so hosts need not agree on the time. On the worker's own host
the watcher does not wait: a worker whose process is gone is lost at once.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState

# Why telling a trial can fail: it finished meanwhile (its worker completed it, or another watcher
# failed it first); Optuna raises ValueError (RDB) or UpdateFinishedTrialError (a RuntimeError).
_TOLD = (ValueError, RuntimeError)


def open_storage(url: str):
    """A fresh storage object for ``url`` (one per process: database connections do not survive a fork):
    a file path is Optuna's journal file (no server, safe for processes on one machine), else an RDB URL."""
    if "://" not in url:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        Path(url).parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(url))
    if url.startswith("sqlite:///"):
        Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    for attempt in range(9):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as error:
            # Processes started together (a SLURM array's tasks) race to create the tables of a new
            # database: the loser's CREATE TABLE or version row is refused; by then the winner made them.
            if not _schema_race(error):
                raise
            time.sleep(0.05 * (attempt + 1))
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)  # the last try raises what it meets


def _schema_race(error: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError, IntegrityError

    return isinstance(error, IntegrityError) or (isinstance(error, DBAPIError) and "already exists" in str(error))


def lineage(trial: FrozenTrial | optuna.Trial) -> int:
    """The number of the trial that first drew these parameters (its run directories are named by it)."""
    return trial.user_attrs.get("lineage", trial.number)


@dataclass
class Census:
    """What the study holds, counting each lineage once (surplus and resumed trials are not counted)."""

    finished: int = 0
    complete: int = 0
    pruned: int = 0
    running: int = 0
    failed: int = 0
    invalid: int = 0
    resumed: int = 0
    waiting: int = 0
    counted: list[FrozenTrial] = field(default_factory=list)


def resumed_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Failed trials that a retry took over (they are counted by the retry)."""
    failed = {t.number for t in trials if t.state == TrialState.FAIL}
    return {t.user_attrs["resume_of"] for t in trials if "resume_of" in t.user_attrs} & failed


def census(study: optuna.Study) -> Census:
    trials = study.get_trials(deepcopy=False)
    resumed = resumed_numbers(trials)
    out = Census(resumed=len(resumed))
    for t in trials:
        if t.user_attrs.get("surplus") or t.number in resumed:
            continue
        if t.state == TrialState.WAITING:
            out.waiting += 1
            continue
        out.counted.append(t)
        out.complete += t.state == TrialState.COMPLETE
        out.pruned += t.state == TrialState.PRUNED
        out.running += t.state == TrialState.RUNNING
        if t.state == TrialState.FAIL:
            if "invalid" in t.user_attrs:
                out.invalid += 1
            else:
                out.failed += 1
    out.finished = out.complete + out.pruned
    return out


def _stand_down(study: optuna.Study, trial: optuna.Trial) -> None:
    trial.set_user_attr("surplus", True)
    study.tell(trial, state=TrialState.FAIL)


def claim_trial(study: optuna.Study, num_trials: int) -> optuna.Trial | None:
    """The next trial to run: a waiting retry, or a new trial unless the lineages numbered before it
    (finished, running or waiting to resume) already fill the budget.

    Workers on several machines may ask at the same moment; the storage numbers their trials in
    order, so the later one sees the earlier and stands down: its trial is closed as a ``surplus``
    failure that nothing counts, and ``--num-trials`` is never overshot. A retry stands down too when
    its lost trial was not failed after all (its worker finished it) or another retry of it came first.
    """
    trial = study.ask()
    trials = study.get_trials(deepcopy=False)
    if "resume_of" in trial.user_attrs:
        lost = trial.user_attrs["resume_of"]
        twin = any(
            t.user_attrs.get("resume_of") == lost and t.number < trial.number and not t.user_attrs.get("surplus")
            for t in trials
        )
        if twin or not retry_s_trial_was_lost(study, trial):
            _stand_down(study, trial)
            return None
        return trial
    resumed = resumed_numbers(trials)
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
    ahead = [
        t
        for t in trials
        if t.number < trial.number and t.state in states and not t.user_attrs.get("surplus") and t.number not in resumed
    ]
    if len(ahead) >= num_trials:
        _stand_down(study, trial)
        return None
    return trial


def retry_s_trial_was_lost(study: optuna.Study, retry: optuna.Trial) -> bool:
    """Whether the trial that ``retry`` resumes was lost (failed), so that the retry runs; False when it
    finished after all (its worker completed it). ``lose_trial`` enqueues the retry before it fails the lost
    trial (so that no new trial takes the lineage's place in the budget), so a worker may claim the retry in
    between and find the lost trial still running: it fails it itself, as the loser is about to."""
    number = retry.user_attrs["resume_of"]

    def state() -> TrialState:
        return next(t.state for t in study.get_trials(deepcopy=False) if t.number == number)

    if state() == TrialState.RUNNING:
        try:
            study.tell(number, state=TrialState.FAIL)
        except _TOLD:  # told meanwhile: failed by its loser, or finished by its worker
            return state() == TrialState.FAIL
        study.set_user_attr(f"error:{number}", f"{retry.user_attrs.get('lost', 'lost')}; resumed by a retry")
        return True
    return state() == TrialState.FAIL


def lose_trial(study: optuna.Study, trial: FrozenTrial, reason: str, max_resumes: int) -> str | None:
    """``trial``'s worker is gone: enqueue its retry (or, past ``max_resumes``, fail the lineage) and
    fail it. Returns the line to print, or None when the trial had finished or was handled elsewhere."""
    resumes = trial.user_attrs.get("resumes", 0)
    if resumes >= max_resumes:
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except _TOLD:
            return None
        error = f"{reason}; already resumed {resumes} times (--max-resumes {max_resumes}): failed"
        study.set_user_attr(f"error:{trial.number}", error)
        return f"[tuner] trial {trial.number} (lineage {lineage(trial)}) lost: {error}"
    # the retry is enqueued first, so that no new trial can take the lineage's place in the budget
    study.enqueue_trial(
        trial.params,
        user_attrs={
            "lineage": lineage(trial),
            "resume_of": trial.number,
            "resumes": resumes + 1,
            "lost": reason,
            "params": trial.user_attrs.get("params"),
        },
    )
    try:
        study.tell(trial.number, state=TrialState.FAIL)
    except _TOLD:  # finished meanwhile (its retry stands down when claimed), or failed by its retry's claimer
        return None
    study.set_user_attr(f"error:{trial.number}", f"{reason}; resumed by a retry")
    return f"[tuner] trial {trial.number} lost ({reason}): its lineage {lineage(trial)} resumes (resume {resumes + 1} of at most {max_resumes})"


def error_of(study: optuna.Study, trial: FrozenTrial) -> str:
    return trial.user_attrs.get("error") or study.user_attrs.get(f"error:{trial.number}") or "no reason recorded"


class Heartbeat:
    """Bumps the running trial's ``beat`` user attribute every ``interval`` seconds, in a thread."""

    def __init__(self, trial: optuna.Trial, interval: float):
        self.done = threading.Event()
        self.trial = trial

        def beat():
            count = 0
            while True:
                count += 1
                with contextlib.suppress(Exception):  # a storage hiccup: the next beat may get through
                    trial.set_user_attr("beat", count)
                if self.done.wait(interval):
                    return

        self.thread = threading.Thread(target=beat, daemon=True, name="trial-heartbeat")
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def worker_record() -> dict:
    """Who runs a trial: host, pid and the process's start time (a pid can be reused)."""
    return {"host": socket.gethostname(), "pid": psutil.Process().pid, "started": psutil.Process().create_time()}


def _alive(worker: dict) -> bool:
    try:
        return abs(psutil.Process(worker["pid"]).create_time() - worker["started"]) < 1.0
    except psutil.NoSuchProcess:
        return False


class Watcher:
    """Finds the running trials whose worker is lost: on this host, a worker process that no longer
    exists; elsewhere, a heartbeat seen unchanged for ``grace`` seconds (by this process's clock)."""

    def __init__(self, grace: float):
        self.grace = grace
        self.seen: dict[int, tuple[object, float]] = {}  # trial number -> (its beat, when it last changed)

    def lost(self, study: optuna.Study) -> list[tuple[FrozenTrial, str]]:
        host, now, out = socket.gethostname(), time.monotonic(), []
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for trial in running:
            worker = trial.user_attrs.get("worker")
            if worker and worker["host"] == host:
                if not _alive(worker):
                    out.append((trial, f"its worker (pid {worker['pid']}) is gone"))
                continue
            beat = trial.user_attrs.get("beat")
            previous = self.seen.get(trial.number)
            if previous is None or previous[0] != beat:
                self.seen[trial.number] = (beat, now)
            elif now - previous[1] > self.grace:
                where = f"on {worker['host']}" if worker else "before it started"
                out.append((trial, f"no heartbeat from its worker {where} for {self.grace:.0f} s"))
        numbers = {t.number for t in running}
        self.seen = {n: v for n, v in self.seen.items() if n in numbers}
        return out

    def resume_lost(self, study: optuna.Study, max_resumes: int) -> None:
        for trial, reason in self.lost(study):
            line = lose_trial(study, trial, reason, max_resumes)
            if line:
                print(line, flush=True)
