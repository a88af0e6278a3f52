"""Hyperparameter search with Optuna over this project's scripts: parallel trials, many machines, live pruning.

    python cleanrl_utils/tuner.py --algorithm ppo --env-ids BreakoutNoFrameskip-v4 PongNoFrameskip-v4 --num-trials 100
    python cleanrl_utils/tuner.py --algorithm ppo --env-ids CartPole-v1 Acrobot-v1 --num-seeds 2 --workers 4
    python cleanrl_utils/tuner.py --script cleanrl/dqn.py --env-ids CartPole-v1 --space my_space.json
    # more machines join the same study (run the same command on each):
    python cleanrl_utils/tuner.py ... --storage postgresql://user:password@db-host/optuna

A trial samples the script's flags from a search space (shipped per algorithm and env family, or
``--space FILE``: ``{"learning-rate": {"low": 1e-4, "high": 1e-2, "log": true}, "num-steps": [16, 32],
"total-timesteps": 100000}``), checks them with the script's own validation (an impossible batch split
fails that trial, not the tuner), then trains every (env id, seed) as its own process. While they run,
the tuner reads their TensorBoard event files and reports the normalised score at every
``--report-every`` of the budget, so the pruner stops a poor trial's processes early. The objective
of a run is the mean of its last ``--metric-last-n-average-window`` episodic returns (or, with
``--objective auc``, the area under its learning curve divided by the steps), normalised per env by
reference scores (``cleanrl_utils/scores.py``: Atari human-normalised, classic control 0-1, or
``--reference-scores FILE``), then aggregated over envs (mean, median or IQM) and seeds.

``--workers N`` runs N trials at once on this machine (with ``--gpus`` each worker gets its own GPU
slot, ``--trials-per-gpu`` share one). ``--num-trials`` is the study-wide number of finished
(complete or pruned) trials, whatever the number of workers or machines. The study lives in an
Optuna storage: SQLite by default (``runs/<study>/optuna.db``), an Optuna journal file (a path
ending in ``.log``), or PostgreSQL to share it between machines; running the same command again
resumes it. A trial whose worker is lost (SIGKILL, a preemption or requeue, a node gone; noticed on
its machine at once, elsewhere after three silent ``--heartbeat`` intervals) is resumed, not
replaced: its parameters run again and its runs continue with ``--resume`` from their own last
checkpoints, up to ``--max-resumes`` times. A run that crashes or goes NaN fails its trial, with
the path of its log; that trial is not retried. The end prints the best trials, writes
``runs/<study>/best_params.json`` and the command lines that reproduce the best trial.

The parts: this file holds the study, the supervisor of its worker processes and the final report;
``tuner_worker.py`` a worker's trials (runs, live reports, pruning, stops); ``trials.py`` a trial's
life in the storage (claim, heartbeat, lost and resumed); ``tuner_spaces.py`` the search spaces and
the objective's maths.

Python API (CleanRL's ``Tuner`` arguments are accepted, so its tuning examples keep working)::

    Tuner(script="cleanrl/ppo.py", metric="charts/episodic_return",
          target_scores={"CartPole-v1": [0, 500], "Acrobot-v1": [-500, 0]},
          params_fn=lambda trial: {"learning-rate": trial.suggest_float("learning-rate", 3e-4, 3e-3, log=True),
                                   "total-timesteps": 100000},
          pruner=optuna.pruners.MedianPruner(n_startup_trials=5)).tune(num_trials=100, num_seeds=3)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing
import os
import re
import shlex
import signal
import socket
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import optuna
import tyro
from optuna.trial import TrialState

from cleanrl_utils.launch import REPO, device_slots, locate_script
from cleanrl_utils.scores import AGGREGATIONS, load_reference_file, reference_scores
from cleanrl_utils.trials import Watcher, census, claim_trial, error_of, lineage, lose_trial, open_storage  # noqa: F401 (claim_trial)
from cleanrl_utils.tuner_spaces import (  # noqa: F401 (re-exported: tuner.SPACES, tuner.run_score...)
    FAMILIES,
    MUJOCO,
    SPACES,
    TunerError,
    env_family,
    flag_args,
    load_space,
    run_score,
    script_for,
    space_params_fn,
    trial_value,
)
from cleanrl_utils.tuner_worker import WorkerSettings, dispose, repo_relative, run_worker, stop_recorded_groups


# --------------------------------------------------------------------------------------------
# The tuner: the study, its workers' supervisor, the final report (a worker's trials: tuner_worker.py)
# --------------------------------------------------------------------------------------------
class Tuner:
    """An Optuna study over one training script; ``tune(num_trials, num_seeds)`` runs it to the end."""

    def __init__(
        self,
        script: str,
        metric: str = "charts/episodic_return",
        target_scores: dict[str, list[float] | None] | None = None,
        params_fn: Callable[[optuna.Trial], dict[str, Any]] | None = None,
        direction: str = "maximize",
        aggregation_type: str = "average",
        metric_last_n_average_window: int = 50,
        sampler: optuna.samplers.BaseSampler | None = None,
        pruner: optuna.pruners.BasePruner | None = None,
        storage: str | None = None,
        study_name: str = "",
        wandb_kwargs: dict[str, Any] | None = None,
        *,
        env_ids: list[str] | None = None,
        space: dict[str, Any] | None = None,
        objective: str = "last",
        workers: int = 1,
        gpus: list[int] | None = None,
        trials_per_gpu: int = 1,
        threads_per_run: int = 1,
        report_every: float = 0.1,
        heartbeat: int = 60,
        max_failures: int | None = None,
        max_resumes: int = 3,
        sampler_seed: int | None = None,
        start_seed: int = 1,
        progress_interval: float = 30.0,
        poll: float = 1.0,
        extra_args: list[str] | None = None,
    ):
        self.script = Path(script)
        if not self.script.exists() and (REPO / script).exists():
            self.script = REPO / script
        if not self.script.exists():
            raise TunerError(f"--script {script}: no such file")
        # CleanRL's target_scores names the envs and their (low, high) normalisation; env_ids alone uses our tables.
        target_scores = dict(target_scores or {})
        self.env_ids = list(env_ids or target_scores)
        if not self.env_ids:
            raise TunerError("--env-ids: give at least one env id")
        self.references = {}
        for env_id in self.env_ids:
            given = target_scores.get(env_id)
            self.references[env_id] = tuple(map(float, given)) if given is not None else reference_scores(env_id)
        missing = [env_id for env_id, ref in self.references.items() if ref is None]
        if len(self.env_ids) > 1 and missing:
            raise TunerError(
                f"--env-ids {' '.join(missing)}: no reference scores to normalise with, needed to aggregate several "
                "envs (give --reference-scores FILE)"
            )
        if params_fn is None:
            params_fn = space_params_fn(space if space is not None else SPACES.get(repo_relative(self.script), {}))
        self.params_fn = params_fn
        self.space = space
        self.metric, self.direction = metric, direction
        self.aggregation = {"average": "mean"}.get(aggregation_type, aggregation_type)
        if self.aggregation not in AGGREGATIONS:
            raise TunerError(f"--aggregation {aggregation_type}: must be one of {', '.join(AGGREGATIONS)}")
        if objective not in ("last", "auc"):
            raise TunerError(f"--objective {objective}: must be last or auc")
        self.window, self.objective = metric_last_n_average_window, objective
        self.sampler, self.pruner = sampler, pruner
        self.study_name = _safe(study_name) or _safe(f"{self.script.stem}-{'-'.join(self.env_ids)}")
        self.out_dir = Path("runs") / self.study_name
        self.storage_url = storage or f"sqlite:///{self.out_dir / 'optuna.db'}"
        self.wandb_kwargs = wandb_kwargs or {}
        self.gpus, self.trials_per_gpu = list(gpus or []), trials_per_gpu
        self.workers = workers if not self.gpus else min(workers, len(self.gpus) * trials_per_gpu)
        self.threads_per_run, self.report_every, self.heartbeat = threads_per_run, report_every, heartbeat
        self.max_failures, self.start_seed, self.sampler_seed = max_failures, start_seed, sampler_seed
        self.max_resumes = max_resumes
        self.progress_interval, self.poll = progress_interval, poll
        self.extra_args = list(extra_args or [])
        for name, value in (
            ("workers", workers),
            ("trials-per-gpu", trials_per_gpu),
            ("threads-per-run", threads_per_run),
        ):
            if value < 1:
                raise TunerError(f"--{name} {value}: must be a positive integer")
        if max_resumes < 0:
            raise TunerError(f"--max-resumes {max_resumes}: must be >= 0")
        if heartbeat <= 0:
            raise TunerError(f"--heartbeat {heartbeat}: must be a positive number of seconds")
        if not 0.0 < report_every <= 1.0:
            raise TunerError(f"--report-every {report_every}: must be in (0, 1]")
        if metric_last_n_average_window < 1:
            raise TunerError(f"--metric-last-n-average-window {metric_last_n_average_window}: must be >= 1")

    # ----------------------------------------------------------------------------------------
    def storage(self):
        """A fresh storage object (one per process: database connections do not survive a fork)."""
        return open_storage(self.storage_url)

    def worker_settings(self) -> WorkerSettings:
        """What the worker processes need of these settings (a worker does not hold the tuner)."""
        return WorkerSettings(**{f.name: getattr(self, f.name) for f in dataclasses.fields(WorkerSettings)})

    def config(self, num_seeds: int) -> dict[str, Any]:
        """What makes two runs of the tuner the same study; a re-run that differs is refused."""
        return {
            "script": repo_relative(self.script),
            "env_ids": self.env_ids,
            "num_seeds": num_seeds,
            "start_seed": self.start_seed,
            "metric": self.metric,
            "objective": self.objective,
            "window": self.window,
            "aggregation": self.aggregation,
            "references": {k: list(v) if v else None for k, v in self.references.items()},
            "space": self.space,
            "extra_args": self.extra_args,
        }

    def tune(self, num_trials: int, num_seeds: int = 1) -> optuna.trial.FrozenTrial | None:
        if num_trials < 1 or num_seeds < 1:
            raise TunerError(f"--num-trials {num_trials} / --num-seeds {num_seeds}: must be positive integers")
        self.num_trials, self.num_seeds = num_trials, num_seeds
        self.max_failures = self.max_failures or num_trials
        self.seeds = list(range(self.start_seed, self.start_seed + num_seeds))
        self.check_space()
        try:  # a storage that cannot be used is one line, and leaves no directory behind
            storage = self.storage()
            study = optuna.create_study(
                study_name=self.study_name, storage=storage, direction=self.direction, load_if_exists=True
            )
        except Exception as error:  # a missing driver, a closed port, a file that is not a database
            raise TunerError(f"--storage {self.storage_url}: {storage_problem(error)}") from None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        config, saved = self.config(num_seeds), study.user_attrs.get("config")
        if saved is None:
            study.set_user_attr("config", config)
        elif saved != config:
            key = next(k for k in config if config[k] != saved.get(k))
            raise TunerError(
                f"study {self.study_name} in {self.storage_url} was started with {key}={saved.get(key)!r}, "
                f"now {config[key]!r}: give another --study-name"
            )
        dispose(storage)
        print(
            f"[tuner] study {self.study_name} ({self.storage_url}): {num_trials} trials of {repo_relative(self.script)} "
            f"on {', '.join(self.env_ids)} x {num_seeds} seeds, {self.workers} workers; join from another machine "
            f"with the same command and --storage <shared url> --study-name {self.study_name}",
            flush=True,
        )
        self.supervise()
        return self.report()

    def check_space(self) -> None:
        """Sample once (in memory) and check every key is a flag of the script: a typo fails here, not in a trial."""
        from cleanrl_utils.launch import load_script

        module = load_script(self.script)
        if not hasattr(module, "Args"):
            return
        flags = {f.replace("_", "-") for f in module.Args.__dataclass_fields__}
        params = self.params_fn(optuna.create_study(direction=self.direction).ask())
        unknown = [key for key in params if key.replace("_", "-").lstrip("-") not in flags]
        if unknown:
            raise TunerError(f"search space: {', '.join(unknown)} not flags of {self.script.name}")

    # ----------------------------------------------------------------------------------------
    def supervise(self) -> None:
        """Start the workers, show progress, resume the trials of a worker that dies and start another in
        its place, until all have stopped. SIGTERM (a preemption, a requeue) and Ctrl-C stop the workers,
        whose runs write a checkpoint; their trials resume when the command runs again."""
        ctx = multiprocessing.get_context("fork")
        slots = device_slots(self.gpus, self.trials_per_gpu, 1) or [{} for _ in range(self.workers)]
        procs, settings = {}, self.worker_settings()

        def start(index: int) -> None:
            proc = ctx.Process(target=run_worker, args=(settings, index, slots[index]), daemon=False)
            proc.start()
            procs[index] = proc

        for index in range(self.workers):
            start(index)
        stopping = []
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
        storage = self.storage()
        study = optuna.load_study(study_name=self.study_name, storage=storage)
        watcher = Watcher(grace=3 * self.heartbeat)
        started, last_line_printed, last_print = time.monotonic(), [], 0.0
        try:
            while procs:
                if stopping:
                    raise KeyboardInterrupt
                for index, proc in list(procs.items()):
                    if proc.is_alive():
                        continue
                    proc.join()
                    del procs[index]
                    if proc.exitcode != 0:
                        self.clean_up_worker(study, proc.pid, proc.exitcode)
                        if proc.exitcode < 0 and not self.study_done(study):  # killed: another takes its place
                            start(index)
                watcher.resume_lost(study, self.max_resumes)
                line = self.progress_line(study, started)
                now = time.monotonic()
                counts = line.split(";")[:2]  # the counts and the best value, not the clock
                if counts != last_line_printed or now - last_print > self.progress_interval:
                    print(line, flush=True)
                    last_line_printed, last_print = counts, now
                if procs:
                    time.sleep(self.poll)
        except KeyboardInterrupt:
            why = "SIGTERM" if stopping else "interrupted"
            print(f"[tuner] {why}: stopping the workers (their runs checkpoint; the same command resumes their trials)",
                  flush=True)  # fmt: skip
            for proc in procs.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
            for proc in procs.values():
                proc.join()
            raise SystemExit(143 if stopping else 130) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
            dispose(storage)

    def study_done(self, study: optuna.Study) -> bool:
        count = census(study)
        return count.finished >= self.num_trials or count.failed >= self.max_failures

    def clean_up_worker(self, study: optuna.Study, pid: int, exitcode: int) -> None:
        """A worker died (killed, crashed): stop its runs and resume its trial, so the study goes on."""
        state_file = self.out_dir / "workers" / f"{socket.gethostname()}-{pid}.json"
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
            stop_recorded_groups(state.get("groups", []))
            running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            trial = next((t for t in running if t.number == state.get("trial")), None)
            if trial is not None:
                how = f"signal {-exitcode}" if exitcode < 0 else f"exit code {exitcode}"
                line = lose_trial(study, trial, f"its worker (pid {pid}) died ({how})", self.max_resumes)
                if line:
                    print(line, flush=True)
        with contextlib.suppress(OSError):
            state_file.unlink()

    def progress_line(self, study: optuna.Study, started: float) -> str:
        count = census(study)
        best = _best(study)
        best_text = f"best {best.value:.4g} (trial {best.number})" if best else "no complete trial yet"
        durations = [
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in count.counted
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.datetime_complete and t.datetime_start
        ]
        remaining = max(self.num_trials - count.finished, 0)
        eta = (
            f"ETA {np.mean(durations) * remaining / self.workers / 60:.1f} min" if durations and remaining else "ETA -"
        )
        resumed = f", {count.resumed} resumed" if count.resumed else ""
        return (
            f"[tuner] {count.finished}/{self.num_trials} finished ({count.complete} complete, {count.pruned} pruned), "
            f"{count.running} running, {count.failed} failed, {count.invalid} invalid{resumed}; {best_text}; "
            f"{(time.monotonic() - started) / 60:.1f} min, {eta}"
        )

    # ----------------------------------------------------------------------------------------
    def report(self) -> optuna.trial.FrozenTrial | None:
        """The table of the best trials, ``best_params.json`` and the command lines of the best trial."""
        storage = self.storage()
        study = optuna.load_study(study_name=self.study_name, storage=storage)
        count = census(study)
        complete = sorted(
            (t for t in count.counted if t.state == TrialState.COMPLETE),
            key=lambda t: t.value,
            reverse=self.direction == "maximize",
        )
        failed = [t for t in count.counted if t.state == TrialState.FAIL]
        for t in failed[-5:]:
            print(f"[tuner] failed trial {t.number}: {error_of(study, t)}", flush=True)
        if count.resumed:
            resumed = [t for t in count.counted if "resume_of" in t.user_attrs]
            print(f"[tuner] {len(resumed)} trials resumed after a lost worker ({count.resumed} resumes): "
                  + ", ".join(f"trial {t.number} (lineage {lineage(t)}, {t.user_attrs['resumes']}x)" for t in resumed),
                  flush=True)  # fmt: skip
        if not complete:
            print("[tuner] no trial completed", flush=True)
            dispose(storage)
            return None
        print(f"\n| trial | value | {' | '.join(self.env_ids)} | params |")
        print(f"|---|---|{'---|' * len(self.env_ids)}---|")
        for t in complete[:5]:
            per_env = []
            for env_id in self.env_ids:
                scores = [r["score"] for r in t.user_attrs.get("runs", []) if r["env_id"] == env_id]
                per_env.append(f"{np.mean(scores):.4g}" if scores else "-")
            params = " ".join(f"{k}={_short(v)}" for k, v in t.params.items())
            print(f"| {t.number} | {t.value:.4g} | {' | '.join(per_env)} | {params} |")
        best = complete[0]
        runs = best.user_attrs.get("runs", [])
        out = {
            "study": self.study_name,
            "storage": self.storage_url,
            "trial": best.number,
            "value": best.value,
            "params": best.user_attrs.get("params", best.params),
            "script": repo_relative(self.script),
            "runs": runs,
        }
        path = self.out_dir / "best_params.json"
        path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\n[tuner] best trial {best.number}: value {best.value:.4g}; {path}; reproduce with:")
        for r in runs:  # recorded with the project's path of the script; printed as it runs from here
            command = locate_script(shlex.split(r["command"]))
            print("  " + shlex.join(command).replace(f" --run-name {r['run_dir'][len('runs/') :]}", ""))
        dispose(storage)
        return best


def _best(study: optuna.Study):
    try:
        return study.best_trial
    except ValueError:
        return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", name).strip("-")


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
@dataclass
class Args:
    env_ids: list[str]
    """the env ids every trial trains on (the objective aggregates over them)"""
    algorithm: Literal["ppo", "dqn", "sac", "appo"] | None = None
    """a script family: picks the script (and its search space) for the env ids: ppo -> ppo.py or ppo_atari.py..."""
    script: str | None = None
    """any training script instead of --algorithm (its search space from --space)"""
    num_trials: int = 100
    """finished (complete or pruned) trials of the whole study, over all workers and machines"""
    num_seeds: int = 1
    """seeds per env in each trial"""
    start_seed: int = 1
    """the first seed"""
    workers: int = 1
    """trials at the same time on this machine"""
    gpus: list[int] = field(default_factory=list)
    """GPU indices; each worker gets one as its device slot (none: runs see every device)"""
    trials_per_gpu: int = 1
    """trials sharing one GPU at the same time"""
    threads_per_run: int = 1
    """OMP/torch threads of each training process"""
    storage: str | None = None
    """Optuna storage: a sqlite:// or postgresql:// URL, or a journal file path; default sqlite in runs/<study>/"""
    study_name: str | None = None
    """the study (default <script>-<env ids>); the same name and storage resume or join it"""
    space: str | None = None
    """a JSON or TOML search space replacing the shipped one: {"flag": {"low", "high", "log"} | [choices] | value}"""
    fixed: list[str] = field(default_factory=list)
    """flags fixed for every run, as KEY=VALUE (override the search space), e.g. num-envs=4"""
    total_timesteps: int | None = None
    """env steps of every run (overrides the search space's budget)"""
    metric: str = "charts/episodic_return"
    """the TensorBoard scalar the objective is computed from"""
    objective: Literal["last", "auc"] = "last"
    """last: mean of the last N values of the metric; auc: area under its curve per env step"""
    metric_last_n_average_window: int = 50
    """N of --objective last"""
    aggregation: Literal["mean", "median", "iqm", "max", "min"] = "mean"
    """how normalised scores are combined over envs (iqm: over all runs)"""
    reference_scores: str | None = None
    """a JSON file {"env-id": [low, high]} of normalisation bounds (default: built-in Atari and classic tables)"""
    direction: Literal["maximize", "minimize"] = "maximize"
    """the direction of the objective"""
    sampler: Literal["tpe", "random"] = "tpe"
    """Optuna's sampler"""
    sampler_seed: int | None = None
    """the sampler's seed (worker i uses seed + i); None: random"""
    pruner: Literal["median", "percentile", "hyperband", "none"] = "median"
    """how trials are stopped early from their live scores"""
    pruner_startup_trials: int = 5
    """trials that finish before pruning begins (median, percentile)"""
    pruner_warmup: float = 0.2
    """fraction of a run's budget before it can be pruned (median, percentile)"""
    percentile: float = 25.0
    """prune below this percentile (--pruner percentile)"""
    report_every: float = 0.1
    """report the live score to the pruner at every this fraction of the budget"""
    heartbeat: int = 60
    """seconds between a trial's heartbeats; a trial silent for 3 of them is resumed by another worker"""
    max_failures: int | None = None
    """stop when the study has this many failed trials (default: --num-trials)"""
    max_resumes: int = 3
    """times a trial whose worker is lost (killed, preempted, requeued) is resumed from its checkpoints before it fails"""
    progress_interval: float = 30.0
    """seconds between progress lines when nothing changes"""
    track: bool = False
    """pass --track to every run (W&B; key from WANDB_API_KEY)"""


def make_pruner(args: Args) -> optuna.pruners.BasePruner:
    warmup = round(args.pruner_warmup * 100)
    if args.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=args.pruner_startup_trials, n_warmup_steps=warmup)
    if args.pruner == "percentile":
        return optuna.pruners.PercentilePruner(
            args.percentile, n_startup_trials=args.pruner_startup_trials, n_warmup_steps=warmup
        )
    if args.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, round(args.report_every * 100)), max_resource=100)
    return optuna.pruners.NopPruner()


def build(args: Args) -> Tuner:
    if (args.algorithm is None) == (args.script is None):
        raise TunerError("give one of --algorithm (ppo, dqn, sac, appo) or --script PATH")
    script = args.script or script_for(args.algorithm, args.env_ids)
    if args.space:
        space = load_space(args.space)
    else:
        space = dict(SPACES.get(repo_relative(REPO / script if not Path(script).exists() else Path(script)), {}))
    for item in args.fixed:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TunerError(f"--fixed {item}: must be KEY=VALUE")
        space[key.lstrip("-")] = value
    if args.total_timesteps is not None:
        if args.total_timesteps < 1:
            raise TunerError(f"--total-timesteps {args.total_timesteps}: must be a positive integer")
        space["total-timesteps"] = args.total_timesteps
    table = None
    if args.reference_scores:
        try:
            table = load_reference_file(args.reference_scores)
        except (OSError, ValueError) as error:
            raise TunerError(f"--reference-scores {error}") from None
    targets = {env_id: reference_scores(env_id, table) for env_id in args.env_ids}
    sampler = (
        optuna.samplers.RandomSampler(seed=args.sampler_seed)
        if args.sampler == "random"
        else optuna.samplers.TPESampler(seed=args.sampler_seed)
    )
    return Tuner(
        script=script,
        metric=args.metric,
        target_scores=targets,
        direction=args.direction,
        aggregation_type=args.aggregation,
        metric_last_n_average_window=args.metric_last_n_average_window,
        sampler=sampler,
        pruner=make_pruner(args),
        storage=args.storage,
        study_name=args.study_name or "",
        env_ids=args.env_ids,
        space=space,
        objective=args.objective,
        workers=args.workers,
        gpus=args.gpus,
        trials_per_gpu=args.trials_per_gpu,
        threads_per_run=args.threads_per_run,
        report_every=args.report_every,
        heartbeat=args.heartbeat,
        max_failures=args.max_failures,
        max_resumes=args.max_resumes,
        sampler_seed=args.sampler_seed,
        start_seed=args.start_seed,
        progress_interval=args.progress_interval,
        extra_args=["--track"] if args.track else [],
    )


def storage_problem(error: BaseException) -> str:
    """One line for what went wrong opening a study's storage."""
    if isinstance(error, ImportError):
        return f"its database driver is not installed ({error}): pip install -e '.[optuna]'"
    text = " ".join(str(getattr(error, "orig", None) or error).split())
    return f"cannot be used as an Optuna storage ({type(error).__name__}: {text[:200]})"


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        tuner = build(args)
        best = tuner.tune(args.num_trials, args.num_seeds)
    except TunerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if best is not None else 1


if __name__ == "__main__":
    sys.exit(main())
