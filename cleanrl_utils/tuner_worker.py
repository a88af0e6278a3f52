"""One worker process of the tuner (``cleanrl_utils/tuner.py``): it claims trials from the study and
runs each to its end.

A trial's life in a worker: sample (or, for a retry, take back) its parameters; check every (env, seed)
run with the script's own validation; start the runs as processes of their own; read their event
files while they train and report the normalised score to the pruner at every ``report_every`` of
the budget (pruned: the runs are killed); at the end, tell the study the value or why the trial
failed. A worker stopped from outside (SIGTERM: a preemption, a requeue, Ctrl-C) stops its runs with
SIGTERM, so that they write their checkpoints, and leaves the trial to be resumed
(``cleanrl_utils/trials.py``); a retry continues the runs with ``--resume`` and reports again what its
lineage reported, so pruning and the final value are those of the uninterrupted trial.

The tuner's parent process only supervises: it starts ``TrialWorker(settings, i, slot).main()`` in a
forked process per worker (with ``Tuner.worker_settings()``) and cleans up after one that dies.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import psutil
from optuna.trial import TrialState

from cleanrl_utils.checkpoint import list_checkpoints
from cleanrl_utils.launch import REPO, _die_with_parent, check_script_args, last_line, launch, stop_group, thread_env
from cleanrl_utils.scores import normalize
from cleanrl_utils.tb import ScalarReader
from cleanrl_utils.trials import (
    Heartbeat,
    Watcher,
    census,
    claim_trial,
    lineage,
    lose_trial,
    open_storage,
    worker_record,
)
from cleanrl_utils.tuner_spaces import flag_args, run_score, trial_value

# exit codes of a run stopped by SIGTERM or SIGINT (it wrote a checkpoint): stopped from outside, not failed
STOPPED = {128 + signal.SIGTERM, -signal.SIGTERM, 128 + signal.SIGINT, -signal.SIGINT}


@dataclass
class WorkerSettings:
    """What a worker reads of the tuner's settings (``Tuner.worker_settings()``; the names are the Tuner's)."""

    script: Path
    env_ids: list[str]
    seeds: list[int]
    extra_args: list[str]
    metric: str
    objective: str
    window: int
    aggregation: str
    references: dict[str, Any]
    params_fn: Callable[[optuna.Trial], dict[str, Any]]
    sampler: Any
    sampler_seed: int | None
    pruner: Any
    study_name: str
    storage_url: str
    out_dir: Path
    num_trials: int
    max_failures: int
    max_resumes: int
    threads_per_run: int
    report_every: float
    heartbeat: float
    poll: float
    wandb_kwargs: dict[str, Any]


@dataclass
class RunSpec:
    env_id: str
    seed: int
    name: str
    argv: list[str]
    log: Path
    run_dir: Path
    total: int
    resume_step: int | None = None  # the checkpoint this run continues from (a resumed trial)


class TrialWorker:
    """Worker ``index`` with the tuner's ``settings`` and its device ``slot`` (environment variables)."""

    def __init__(self, tuner: WorkerSettings, index: int, slot: dict[str, str]):
        self.tuner, self.index, self.slot = tuner, index, slot
        self.interrupted = False
        self.state_file = tuner.out_dir / "workers" / f"{socket.gethostname()}-{os.getpid()}.json"

    def main(self) -> None:
        """Claim and run trials until the study has its trials, too many failures, or SIGTERM; then exit 0."""
        t = self.tuner
        _die_with_parent()  # a killed tuner takes its workers (and through them their runs) along
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent forwards Ctrl-C as SIGTERM
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        storage = open_storage(t.storage_url)
        study = optuna.load_study(study_name=t.study_name, storage=storage, sampler=self.sampler(), pruner=t.pruner)
        watcher = Watcher(grace=3 * t.heartbeat)
        try:
            while not self.interrupted:
                watcher.resume_lost(study, t.max_resumes)
                count = census(study)
                if count.finished >= t.num_trials:
                    break
                if count.failed >= t.max_failures:
                    print(
                        f"[tuner] {count.failed} trials failed (--max-failures {t.max_failures}): stopping", flush=True
                    )
                    break
                if count.invalid >= 100 + 10 * t.num_trials:
                    print(f"[tuner] {count.invalid} sampled settings failed the script's validation: fix the space",
                          flush=True)  # fmt: skip
                    break
                if count.finished + count.running >= t.num_trials and not count.waiting:
                    time.sleep(t.poll)  # the last trials run elsewhere; one may yet fail or be lost
                    continue
                trial = claim_trial(study, t.num_trials)
                if trial is None:
                    continue
                self.run_trial(study, trial)
        finally:
            dispose(storage)
            with contextlib.suppress(OSError):
                self.state_file.unlink()
        sys.exit(0)

    def sampler(self, trial_number: int = 0) -> optuna.samplers.BaseSampler:
        """The sampler that draws trial ``trial_number``'s parameters: with ``--sampler-seed``, seeded from the seed
        and the trial's number (so a replacement worker, or the same command run again, draws new values for
        each new trial, never trial 0's again); else reseeded at random (forked copies of one sampler would
        otherwise propose the same values)."""
        given, seed = self.tuner.sampler, self.tuner.sampler_seed
        kind = type(given) if given is not None else optuna.samplers.TPESampler
        if seed is not None and kind in (optuna.samplers.TPESampler, optuna.samplers.RandomSampler):
            return kind(seed=int(np.random.SeedSequence([seed, trial_number]).generate_state(1)[0]))
        sampler = copy.deepcopy(given) if given is not None else kind()
        with contextlib.suppress(AttributeError):
            sampler.reseed_rng()
        return sampler

    def _on_sigterm(self, signum, frame) -> None:
        self.interrupted = True

    def write_state(self, trial_number: int | None, procs: list) -> None:
        """Which trial this worker runs and its runs' process groups (each leader's pid and start time), for
        the parent to clean up if it dies."""
        groups = [[p.pid, started(p.pid)] for p in procs]
        self.state_file.write_text(json.dumps({"trial": trial_number, "groups": groups}))

    # ----------------------------------------------------------------------------------------
    def plan_runs(
        self, number: int, params: dict[str, Any], resume: bool = False
    ) -> tuple[list[RunSpec] | None, str | None]:
        """The runs of lineage ``number``, checked with the script's own validation; (None, error) if one
        is invalid. With ``resume``, a run that holds checkpoints continues from its last one (``--resume``);
        one that holds none starts again in an emptied directory (the points it logged would repeat)."""
        t = self.tuner
        runs = []
        for env_id in t.env_ids:
            for seed in t.seeds:
                name = f"{t.study_name}/t{number:04d}/{env_id.replace('/', '-')}__{seed}"
                flags = [*flag_args(params), *t.extra_args, "--env-id", env_id, "--seed", str(seed)]
                args, error = check_script_args(t.script, flags)
                if error:
                    return None, error
                if args is not None and hasattr(args, "progress"):
                    flags.append("--no-progress")
                if args is not None and hasattr(args, "threads") and "threads" not in _keys(params, t.extra_args):
                    flags += ["--threads", str(t.threads_per_run)]
                total = getattr(args, "total_timesteps", None) or params.get("total-timesteps") or 0
                run_dir, step = Path("runs") / name, None
                if resume:
                    found = list_checkpoints(run_dir / "checkpoints") if hasattr(args, "resume") else []
                    if found:
                        flags += ["--resume", str(run_dir)]
                        step = int(found[-1].stem.split("_")[1])
                    elif run_dir.exists():
                        shutil.rmtree(run_dir)
                argv = [sys.executable, str(t.script), *flags, "--run-name", name]
                log = t.out_dir / "logs" / f"{name.split('/', 1)[1].replace('/', '__')}.log"
                runs.append(RunSpec(env_id, seed, name, argv, log, run_dir, int(total), step))
        return runs, None

    def resume_lineage(self, study: optuna.Study, trial: optuna.Trial, runs: list[RunSpec]) -> int:
        """A retry: report again what its lineage reported (the pruner sees it as never stopped), record
        where each run resumes. Returns the last step already reported (0 for a new trial)."""
        if "resume_of" not in trial.user_attrs:
            return 0
        lost = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.user_attrs["resume_of"])
        for step, value in sorted(lost.intermediate_values.items()):
            trial.report(value, step)
        trial.set_user_attr("resumed_from", {run.name: run.resume_step or 0 for run in runs})
        where = ", ".join(f"{run.env_id} seed {run.seed} from step {run.resume_step or 0}" for run in runs)
        print(f"[tuner] trial {trial.number} resumes trial {lost.number} (lineage {lineage(trial)}, resume "
              f"{trial.user_attrs['resumes']} of at most {self.tuner.max_resumes}): {where}", flush=True)  # fmt: skip
        return max(lost.intermediate_values, default=0)

    def run_trial(self, study: optuna.Study, trial: optuna.Trial) -> None:
        """Run one trial's runs to the end (complete, pruned, failed) or until stopped from outside (lost)."""
        t = self.tuner
        trial.set_user_attr("worker", worker_record())
        heartbeat = Heartbeat(trial, t.heartbeat)
        if t.sampler_seed is not None:
            study.sampler = self.sampler(trial.number)
        params = t.params_fn(trial)
        if trial.user_attrs.get("params") is not None:  # a retry: exactly the values its lineage ran with
            params = trial.user_attrs["params"]
        trial.set_user_attr("params", params)  # every value passed to the runs, fixed ones included
        retry = "resume_of" in trial.user_attrs
        runs, error = self.plan_runs(lineage(trial), params, resume=retry)
        if error:
            heartbeat.stop()
            trial.set_user_attr("invalid", True)  # not run: counts neither as a trial nor as a failure
            trial.set_user_attr("error", f"invalid: {error}")
            study.tell(trial, state=TrialState.FAIL)
            print(f"[tuner] trial {trial.number} not run, its values fail the script's validation: {error}", flush=True)
            return
        reported = self.resume_lineage(study, trial, runs)
        procs = [launch(run.argv, run.log, {**thread_env(t.threads_per_run), **self.slot}) for run in runs]
        self.write_state(trial.number, procs)
        readers = [ScalarReader(run.run_dir) for run in runs]
        steps = [round(t.report_every * k * 100) for k in range(1, int(1 / t.report_every + 1e-9) + 1)]
        steps = [s for s in steps if reported < s < 100]
        try:
            # LIVE REPORTS: the score so far at every report step, and pruning
            while any(p.poll() is None for p in procs):
                if self.interrupted:
                    self.lose(study, trial, procs, heartbeat)
                    return
                time.sleep(t.poll)
                for reader in readers:
                    reader.update()
                progress = min(reader.last_step() / max(run.total, 1) for reader, run in zip(readers, runs))
                while steps and progress * 100 >= steps[0]:
                    step = steps.pop(0)
                    value = self.value(runs, readers, upto=step / 100)
                    if value is None:
                        continue
                    trial.report(value, step)
                    if trial.should_prune():
                        for proc in procs:
                            stop_group(proc, signal.SIGKILL)
                        heartbeat.stop()
                        trial.set_user_attr("pruned_at", step)
                        study.tell(trial, state=TrialState.PRUNED)
                        print(f"[tuner] trial {trial.number} pruned at {step}% of its budget ({value:.4g})", flush=True)
                        return
            # THE END: stopped from outside, failed, or a value
            if self.interrupted or any(p.returncode in STOPPED for p in procs):  # signalled from outside too
                self.lose(study, trial, procs, heartbeat)
                return
            for reader in readers:
                reader.update()
            results = self.results(runs, readers, procs)
            heartbeat.stop()
            trial.set_user_attr("runs", results)
            failed = next((r for r in results if r["returncode"] != 0), None)
            if failed:
                reason = (
                    f"run {failed['run_dir']} exited {failed['returncode']}: {failed['last_line']}; log {failed['log']}"
                )
                self.fail(study, trial, reason)
                return
            value = self.value(runs, readers)
            if value is None or not math.isfinite(value):
                why = "a run ended no episode (raise --total-timesteps)" if value is None else f"its score is {value}"
                self.fail(study, trial, f"{why}; logs in {runs[0].log.parent}")
                return
            study.tell(trial, value)
            self.log_wandb(trial, params, results, value)
        finally:
            heartbeat.stop()
            for proc in procs:
                if proc.poll() is None:
                    stop_group(proc, signal.SIGKILL)
            self.write_state(None, [])

    def fail(self, study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
        """The trial failed for its own reasons (a run crashed, a NaN, no episode): failed, never retried."""
        trial.set_user_attr("error", reason)
        study.tell(trial, state=TrialState.FAIL)
        print(f"[tuner] trial {trial.number} failed: {reason}", flush=True)

    def lose(self, study: optuna.Study, trial: optuna.Trial, procs: list, heartbeat: Heartbeat) -> None:
        """Stopped from outside (SIGTERM to the worker or its runs: a preemption, a requeue, Ctrl-C): the runs
        write their checkpoints and the trial waits to be resumed, here or by another worker."""
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            stop_group(proc, signal.SIGTERM, grace=20.0)
        heartbeat.stop()
        frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        line = lose_trial(study, frozen, "its worker or runs were stopped (SIGTERM)", self.tuner.max_resumes)
        if line:
            print(line, flush=True)

    # ----------------------------------------------------------------------------------------
    def value(self, runs: list[RunSpec], readers: list[ScalarReader], upto: float | None = None) -> float | None:
        """The trial's aggregated normalised score from its runs' points up to ``upto`` of the budget."""
        t = self.tuner
        scores: dict[str, list[float]] = {}
        for run, reader in zip(runs, readers):
            series = reader.get(t.metric)
            limit = math.inf if upto is None else upto * run.total
            score = run_score(series.steps, series.values, t.objective, t.window, limit)
            if score is None:
                return None
            scores.setdefault(run.env_id, []).append(normalize(score, t.references[run.env_id]))
        return trial_value(scores, t.aggregation)

    def results(self, runs: list[RunSpec], readers: list[ScalarReader], procs: list) -> list[dict[str, Any]]:
        """What the study keeps of each run: score, SPS, steps, exit code, paths and the command that reproduces it."""
        t = self.tuner
        out = []
        for run, reader, proc in zip(runs, readers, procs):
            series = reader.get(t.metric)
            score = run_score(series.steps, series.values, t.objective, t.window)
            sps = reader.get("charts/SPS").values
            out.append(
                {
                    "env_id": run.env_id,
                    "seed": run.seed,
                    "score": score,
                    "normalized": None if score is None else normalize(score, t.references[run.env_id]),
                    "sps": sps[-1] if sps else None,
                    "steps": reader.last_step(),
                    "returncode": proc.returncode,
                    "run_dir": str(run.run_dir),
                    "log": str(run.log),
                    "last_line": last_line(run.log) if proc.returncode else "",
                    "command": shlex.join(["python", repo_relative(t.script), *_without_resume(run.argv[2:])]),
                }
            )
        return out

    def log_wandb(self, trial: optuna.Trial, params: dict[str, Any], results: list[dict], value: float) -> None:
        """With ``wandb_kwargs`` (CleanRL's API), one W&B run per trial with its scores."""
        t = self.tuner
        if not t.wandb_kwargs:
            return
        import wandb

        run = wandb.init(
            **t.wandb_kwargs, config=params, name=f"{t.study_name}_{trial.number}", group=t.study_name,
            reinit="create_new",
        )  # fmt: skip
        run.log({f"{r['env_id']}_seed{r['seed']}_return": r["score"] for r in results} | {"value": value})
        run.finish()


def dispose(storage) -> None:
    """Close an RDB storage's connections (a journal file has none)."""
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


def repo_relative(path: Path) -> str:
    """``path`` relative to the project when it lies inside it (how the study records its script)."""
    path = Path(path).resolve()
    with contextlib.suppress(ValueError):
        return str(path.relative_to(REPO))
    return str(path)


def _without_resume(flags: list[str]) -> list[str]:
    """A run's flags without ``--resume DIR`` (a resumed run's command, as one uninterrupted run)."""
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--resume":
            skip = True
        else:
            out.append(flag)
    return out


def _keys(params: dict[str, Any], extra_args: list[str]) -> set[str]:
    keys = {k.replace("-", "_") for k in params}
    return keys | {a[2:].replace("-", "_") for a in extra_args if a.startswith("--")}


def started(pid: int) -> float | None:
    """The start time of process ``pid`` (None: gone): with the pid, it names one process, never a later one."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def stop_recorded_groups(groups: list[list]) -> None:
    """SIGKILL the process groups a worker recorded, each only while its leader is still the process recorded
    (the same pid and start time): a pid that an unrelated process has taken since is left alone."""
    for pgid, when in groups:
        if when is not None and started(pgid) == when:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


def run_worker(settings: WorkerSettings, index: int, slot: dict[str, str]) -> None:
    """The target of a forked worker process (its state file is named by the child's own pid)."""
    TrialWorker(settings, index, slot).main()
