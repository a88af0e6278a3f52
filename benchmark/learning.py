"""Learning results, one command per suite: the runs behind docs/benchmarks.md, beside CleanRL's numbers.

    python benchmark/learning.py classic                  # run the suite (resumable), then its tables and curves
    python benchmark/learning.py mujoco atari scaled      # several, in one pool of workers
    python benchmark/learning.py gpu --dry-run            # print the commands (the GPU suite is not run on CPUs)
    python benchmark/learning.py classic --report-only    # tables, curves and the page from the run records

Each suite lists its rows (script, command, env ids, steps, seeds) in ``SUITES`` below: the one place
that says what a figure is. Runs go through cleanrl_utils/benchmark.py's runner into
``runs/bench/<suite>/<env>__<exp>__<seed>`` (a torchrun row counts as many workers as its processes);
an interrupted suite continues where it stopped (finished runs are skipped, interrupted ones resume
from their checkpoints). Each finished run is kept as a run record (``plot.save_record``: its episodes,
clock, settings, hardware, the commits and package versions that made it, a few tens of kB) in
``docs/benchmarks/<suite>/records/``, which is committed: the page is made from the records, so runs
made on other machines or in other sessions add up, and a clone without ``runs/`` rebuilds the same
page. Then cleanrl_utils/plot.py writes
``docs/benchmarks/<suite>/`` (curves against steps and wall time, final returns, throughput) from the
records, and docs/benchmarks.md is rewritten from every suite's results. Rows published before records
were kept (``docs/benchmarks/<suite>/earlier/``: the tables and curves of that time) stay on the page,
marked, until the records of that script and env hold their seeds.

Final score, as CleanRL's tables compute it (openrlbenchmark's ``rlops``, whose
``--metric-last-n-average-window`` is 100): per run the mean of its last 100 training episodes'
``charts/episodic_return``; the table gives mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cleanrl_utils import benchmark as runner  # noqa: E402

LAST = 100  # episodes per run in its final score (CleanRL's tables: openrlbenchmark's default window)
TORCHRUN = "torchrun --standalone --nproc_per_node 2"
# CleanRL's dqn.py CartPole settings (its network is 120-84, ours 256-256; ours clips gradients at norm 10)
DQN_CLEANRL = ("--learning-rate 2.5e-4 --buffer-size 10000 --target-network-frequency 500 --batch-size 128 "
               "--end-e 0.05 --exploration-fraction 0.5 --learning-starts 10000 --train-frequency 10 "
               "--gradient-steps 1 --no-double-q --no-huber-loss --no-anneal-lr")  # fmt: skip
# dqn.py's defaults before they held at any budget (the short-run set), with a target copy every 500 env steps
DQN_SHORT_RUN_500 = "--target-network-frequency 500 --no-anneal-lr --exploration-fraction 0.16"
# Off-policy rows keep their replay in the checkpoint, so a run stopped between sittings (the runner's SIGTERM)
# resumes exactly as if it had never stopped; not dqn_atari's: 1M Atari frames make every checkpoint 7 GB.
REPLAY = "--checkpoint-buffer"


@dataclass(frozen=True)
class Row:
    exp: str  # the runs' exp name (the script's, unless the command gives --exp-name)
    command: str  # without --env-id/--seed/--run-name, which the runner adds
    env_ids: tuple[str, ...]
    steps: int
    seeds: int
    # CleanRL's published final score per env id (mean, std over seeds), at the same budget unless noted
    cleanrl: tuple[tuple[str, float, float, str], ...] = ()


def row(exp: str, command: str, env_ids, steps: int, seeds: int, cleanrl=()) -> Row:
    return Row(exp, f"{command} --total-timesteps {steps}", tuple(env_ids), steps, seeds, tuple(cleanrl))


SUITES: dict[str, list[Row]] = {
    "classic": [
        row("ppo", "python cleanrl/ppo.py", ["CartPole-v1", "Acrobot-v1"], 500_000, 3,
            [("CartPole-v1", 490.04, 6.12, ""), ("Acrobot-v1", -86.36, 1.32, "")]),
        row("dqn", f"python cleanrl/dqn.py {REPLAY}", ["CartPole-v1"], 500_000, 3, [("CartPole-v1", 488.69, 16.11, "")]),
        row("dqn_cleanrl_settings", f"python cleanrl/dqn.py --exp-name dqn_cleanrl_settings {DQN_CLEANRL} {REPLAY}",
            ["CartPole-v1"], 500_000, 3, [("CartPole-v1", 488.69, 16.11, "")]),
        row("dqn_target500", f"python cleanrl/dqn.py --exp-name dqn_target500 {DQN_SHORT_RUN_500} {REPLAY}",
            ["CartPole-v1"], 500_000, 3, [("CartPole-v1", 488.69, 16.11, "")]),
        row("appo", "python cleanrl/appo.py", ["CartPole-v1"], 500_000, 3),
    ],
    "mujoco": [
        row("ppo_continuous_action", "python cleanrl/ppo_continuous_action.py", ["HalfCheetah-v4", "Hopper-v4", "Walker2d-v4"],
            1_000_000, 3, [("HalfCheetah-v4", 1442.64, 46.03, ""), ("Hopper-v4", 2382.86, 271.74, ""),
                           ("Walker2d-v4", 2287.95, 571.78, "")]),
        row("sac_continuous_action", f"python cleanrl/sac_continuous_action.py {REPLAY}", ["HalfCheetah-v4", "Hopper-v4"], 300_000, 3,
            [("HalfCheetah-v4", 9634.89, 1423.73, "at 1M"), ("Hopper-v4", 2310.46, 342.82, "at 1M")]),
    ],
    "atari": [
        row("ppo_atari", "python cleanrl/ppo_atari.py", ["BreakoutNoFrameskip-v4"], 1_000_000, 2),
        row("ppo_atari_envpool", "python cleanrl/ppo_atari_envpool.py --vector-mode ale", ["BreakoutNoFrameskip-v4"],
            1_000_000, 2),
        row("ppo_atari_multigpu", f"{TORCHRUN} cleanrl/ppo_atari_multigpu.py --num-envs 8", ["BreakoutNoFrameskip-v4"],
            1_000_000, 2),
    ],
    "peer": [  # seed-major order starts one of each at a time, so each runs beside the other kind
        row("ppo_continuous_action", "python cleanrl/ppo_continuous_action.py", ["HalfCheetah-v4"], 1_000_000, 3,
            [("HalfCheetah-v4", 1442.64, 46.03, "")]),
        row("sb3_ppo", "python benchmark/sb3_ppo.py", ["HalfCheetah-v4"], 1_000_000, 3),
    ],
    "scaled": [  # beside the single-process runs of the mujoco and classic suites (same flags, same seeds)
        row("sac_continuous_action_multigpu", f"{TORCHRUN} cleanrl/sac_continuous_action_multigpu.py {REPLAY}",
            ["HalfCheetah-v4"], 300_000, 2),
    ],
    "gpu": [  # defined for a GPU machine (one command per row there); not run on the CPU machine
        row("ppo_atari_envpool", "python cleanrl/ppo_atari_envpool.py", ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"],
            10_000_000, 3, [("BreakoutNoFrameskip-v4", 211.24, 151.84, "Breakout-v5"),
                            ("PongNoFrameskip-v4", 20.45, 0.09, "Pong-v5")]),
        row("dqn_atari", "python cleanrl/dqn_atari.py", ["BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"], 10_000_000, 3,
            [("BreakoutNoFrameskip-v4", 366.93, 39.89, ""), ("PongNoFrameskip-v4", 20.25, 0.41, "")]),
        row("sac_continuous_action", f"python cleanrl/sac_continuous_action.py {REPLAY}", ["HalfCheetah-v4"], 1_000_000, 3,
            [("HalfCheetah-v4", 9634.89, 1423.73, "")]),
    ],
}  # fmt: skip
# what a suite's page compares its runs with: rows of other suites (suite, exp, env id), the same flags
ALSO_PLOT = {
    "scaled": [("mujoco", "sac_continuous_action", "HalfCheetah-v4"), ("classic", "ppo", "CartPole-v1"),
               ("classic", "appo", "CartPole-v1")],
}  # fmt: skip
DESCRIPTION = {
    "classic": "classic control, 500k steps, defaults of each script",
    "mujoco": "MuJoCo, CleanRL's budgets (SAC: 300k of CleanRL's 1M)",
    "atari": "Breakout, 1M steps (CleanRL publishes 10M), single-process, ALE vector env, 2 processes",
    "peer": "Stable-Baselines3's PPO with ppo_continuous_action.py's settings (benchmark/sb3_ppo.py) beside ours, "
    "1M steps, the same seeds",
    "scaled": "the variants that exist to go faster, beside their single-process base",
    "gpu": "10M-step Atari and 1M-step SAC: defined, to run on a GPU machine",
}


def suite_dir(suite: str) -> Path:
    return Path("runs") / "bench" / suite


def jobs_of(suite: str, seed_count: int | None = None, rows=(), seeds=()) -> list[runner.Job]:
    """The suite's runs; ``rows`` (exp names) and ``seeds`` pick some of them (a part that fits a session)."""
    jobs = []
    for r in SUITES[suite]:
        if rows and r.exp not in rows:
            continue
        seeds_of_row = [s for s in range(1, (seed_count or r.seeds) + 1) if not seeds or s in seeds]
        jobs += runner.plan_grid([r.command], list(r.env_ids), seeds_of_row, f"bench/{suite}/", Path("runs/logs"), 1)
    return jobs


def seed_of(job: runner.Job) -> int:
    return int(job.argv[job.argv.index("--seed") + 1])


def commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "cleanrl", "cleanrl_utils"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return (out.stdout.strip() or "unknown") + ("+uncommitted" if dirty else "")


# what a run's numbers depend on besides the code and the CPU (another MuJoCo or torch build moves a seed)
PACKAGES = ("torch", "numpy", "gymnasium", "mujoco", "ale-py", "envpool", "stable-baselines3")


def package_versions() -> dict[str, str]:
    """This interpreter's Python and the installed ``PACKAGES``: the runs' (the runner starts them with it)."""
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def run_suites(suites: list[str], workers: int, dry_run: bool, seed_count: int | None, rows=(), seeds=()) -> int:
    # seed-major: every row's first seeds before any row's last, so a suite cut short still covers every row
    jobs = sorted((job for suite in suites for job in jobs_of(suite, seed_count, rows, seeds)), key=seed_of)
    if not jobs:
        print(f"error: --rows {' '.join(rows)} --seed {' '.join(map(str, seeds))}: no run of {' '.join(suites)}"
              " matches (rows are exp names, seeds the suite's)", file=sys.stderr)  # fmt: skip
        return 2
    for job in jobs:  # every command's flags, before anything starts (one line, exit 2)
        script = runner.script_of(job.argv)
        tail = job.argv[job.argv.index(str(script)) + 1 :]
        _, error = runner.check_script_args(script, tail, runner.world_size_of(job.argv))
        if error:
            print(f"error: {job.name}: {error}", file=sys.stderr)
            return 2
    todo = runner.resumable(jobs, skip_completed=True)
    if dry_run:
        for job in todo:
            print(shlex.join(job.argv))
        return 0
    for suite in suites:
        suite_dir(suite).mkdir(parents=True, exist_ok=True)
        with open(suite_dir(suite) / "commits.txt", "a") as f:  # the code each stretch of runs was made by
            f.write(f"{commit()}\n")
    versions = json.dumps(package_versions())
    for job in todo:  # and each run's (a run resumed later continues on the code and packages of that day)
        job.log.parent.mkdir(parents=True, exist_ok=True)
        with open(job.log.with_suffix(".commits"), "a") as f:
            f.write(f"{commit()}\n")
        with open(job.log.with_suffix(".versions"), "a") as f:
            f.write(versions + "\n")
    print(f"[learning] {len(todo)} of {len(jobs)} runs to do on {workers} workers", flush=True)
    done = runner.Pool(workers, [], threads=1).run(todo)
    failed = [(job, code) for job, code in done if code != 0]
    for job, code in failed:
        print(f"[learning] FAILED {job.name}: exit {code}; log {job.log}: {runner.last_line(job.log)}", flush=True)
    return 1 if failed else 0


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def finished(job: runner.Job) -> bool:
    """Whether the run's last attempt ended with exit code 0: a run still training (or stopped partway) is no
    seed of a final score, and is left off the page until it finishes."""
    return (runner.status_of(job) or {}).get("returncode") == 0


def keep_records(suite: str, out_root: Path) -> list[Path]:
    """Bring the suite's run records up to date with the runs on this machine and return them: a finished run's
    record is written again, a run here that has not finished has none (it is being made again); the record
    of a run that is not here (made on another machine, or before this clone) stays as it is."""
    from cleanrl_utils import plot

    records = []
    for job in jobs_of(suite):
        record = out_root / suite / "records" / f"{job.run_dir.name}{plot.RECORD}"
        if job.run_dir.exists() and finished(job):
            (run,) = plot.find_runs([job.run_dir], "charts/episodic_return")
            commits = job.log.with_suffix(".commits")
            if not commits.exists():  # a run started before runs kept their own: the suite's
                commits = suite_dir(suite) / "commits.txt"
            made_by = list(dict.fromkeys(commits.read_text().split())) if commits.exists() else ["unknown"]
            versions = job.log.with_suffix(".versions")  # none for a run started before they were kept
            lines = versions.read_text().splitlines() if versions.exists() else []
            packages = {"versions": [json.loads(v) for v in dict.fromkeys(lines)]} if lines else {}
            plot.save_record(run, record, commits=made_by, **packages)
        elif job.run_dir.exists():
            record.unlink(missing_ok=True)
        if record.exists():
            records.append(record)
    return records


def compared_records(suite: str, out_root: Path, keep: bool = True) -> list[Path]:
    """The run records of the other suites' rows that ``suite``'s page shows beside its own (``ALSO_PLOT``);
    ``keep``: brought up to date first (``keep_records``), else as they lie in ``out_root``."""
    from cleanrl_utils import plot

    wanted = ALSO_PLOT.get(suite, [])
    records = []
    for other in dict.fromkeys(s for s, _, _ in wanted):
        kept = keep_records(other, out_root) if keep else sorted((out_root / other / "records").glob(f"*{plot.RECORD}"))
        for record in kept:
            env_id, exp, _seed = record.name.removesuffix(plot.RECORD).rsplit("__", 2)
            if (other, exp, env_id) in wanted:
                records.append(record)
    return records


def earlier_rows(out: Path) -> list[dict[str, str]]:
    """The rows published before run records were kept, from the tables of that time (``out/earlier/``: plot's
    final_returns.csv and throughput.csv, the curves, and commit.txt); a row of n seeds ran seeds 1 to n."""
    if not (out / "earlier" / "final_returns.csv").exists():
        return []
    speed = {(r["script"], r["env_id"]): r for r in read_csv(out / "earlier" / "throughput.csv")}
    made_by = (out / "earlier" / "commit.txt").read_text().strip()
    return [
        {**speed[(r["script"], r["env_id"])], **r, "commit": made_by, "seeds_run": set(range(1, int(r["seeds"]) + 1))}
        for r in read_csv(out / "earlier" / "final_returns.csv")
    ]


def shown_earlier(out: Path, records: list[Path]) -> list[dict[str, str]]:
    """The earlier rows (``earlier_rows``) still on the page: those whose seeds the run records do not all hold."""
    from cleanrl_utils import plot

    seeds = {}
    for record in records:
        env_id, exp, seed = record.name.removesuffix(plot.RECORD).rsplit("__", 2)
        seeds.setdefault((exp, env_id), set()).add(int(seed))
    return [e for e in earlier_rows(out) if not seeds.get((e["script"], e["env_id"]), set()) >= e["seeds_run"]]


def references(suite: str, records: list[Path]) -> list[str]:
    """CleanRL's published score of each plotted script and env, for ``plot --reference``, at CleanRL's budget
    (a note "at 1M" moves it there; the row's own budget otherwise); one per env and score."""
    from cleanrl_utils import plot

    shown = {tuple(record.name.removesuffix(plot.RECORD).rsplit("__", 2)[:2]) for record in records}
    refs = {}
    for s in dict.fromkeys([suite, *(s for s, _, _ in ALSO_PLOT.get(suite, []))]):
        for r in SUITES[s]:
            for env, mean, std, note in r.cleanrl:
                steps = 1_000_000 if note == "at 1M" else r.steps
                if (env, r.exp) in shown:
                    refs.setdefault((env, mean, std, steps), f"CleanRL {r.exp},{env},{mean},{std},{steps}")
    return list(refs.values())


def report(suite: str, out_root: Path) -> str | None:
    """Curves and tables of ``suite`` into ``out_root/<suite>/`` from its run records (and the rows published
    before records were kept); returns its section of the page (None: nothing to show)."""
    from cleanrl_utils import plot

    out = out_root / suite
    own = keep_records(suite, out_root)
    finals, speed, commits = {}, {}, {}
    records = own + compared_records(suite, out_root) if own else []
    if own:
        refs = references(suite, records)
        flags = ["--reference", *refs] if refs else []
        code = plot.main([*map(str, records), "--out", str(out), "--last", str(LAST), "--smooth", "20", *flags])
        if code != 0:
            return None
        finals = {(r["script"], r["env_id"]): r for r in read_csv(out / "final_returns.csv")}
        speed = {(r["script"], r["env_id"]): r for r in read_csv(out / "throughput.csv")}
        for record in records:
            run, extra = plot.load_record(record)
            commits.setdefault((run.exp, run.env_id), {}).update(dict.fromkeys(extra.get("commits", ["unknown"])))
    earlier = shown_earlier(out, records)
    if not finals and not earlier:
        return None
    lines = [f"### {suite}: {DESCRIPTION[suite]}", "", f"Command: `python benchmark/learning.py {suite}`.", ""]
    lines += [
        "| script | env | steps | seeds | final return (mean ± std) | CleanRL | wall time / run | SPS | commit |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rows = [r for s in dict.fromkeys([suite, *(s for s, _, _ in ALSO_PLOT.get(suite, []))]) for r in SUITES[s]]
    for r in rows:
        reference = {env: (mean, std, note) for env, mean, std, note in r.cleanrl}
        for env in r.env_ids:
            theirs = ""
            if env in reference:
                mean, std, note = reference[env]
                theirs = f"{mean:,.2f} ± {std:,.2f}" + (f" ({note})" if note else "")
            for e in (e for e in earlier if (e["script"], e["env_id"]) == (r.exp, env)):
                lines.append(f"| {r.exp} † | {env} | {int(e['steps']):,} | {e['seeds']} | {float(e['mean']):,.2f} ± "
                             f"{float(e['std']):,.2f} | {theirs} | {float(e['wall_s']) / 60:,.1f} min | "
                             f"{float(e['sps']):,.0f} | {e['commit']} |")  # fmt: skip
            final, throughput = finals.get((r.exp, env)), speed.get((r.exp, env))
            if final is None:
                continue
            ours = f"{float(final['mean']):,.2f} ± {float(final['std']):,.2f}"
            wall = f"{float(throughput['wall_s']) / 60:,.1f} min" if throughput else ""
            sps = f"{float(throughput['sps']):,.0f}" if throughput else ""
            made_by = ", ".join(commits.get((r.exp, env), {})) or "unknown"
            lines.append(f"| {r.exp} | {env} | {int(final['steps']):,} | {final['seeds']} | {ours} | {theirs} | {wall} "
                         f"| {sps} | {made_by} |")  # fmt: skip
    lines.append("")
    if finals:  # (the image paths are relative to the page, which lies beside out_root)
        lines += [f"![{suite} curves]({out_root.name}/{suite}/curves.png)", ""]
    if earlier:
        lines += [
            "† Runs made before run records were kept: the figures as published then (seeds 1 to n); a row stays "
            "until the records of its script and env hold those seeds. Their curves:",
            "",
            f"![{suite} curves, earlier runs]({out_root.name}/{suite}/earlier/curves.png)",
            "",
        ]
    return "\n".join(lines)


PAGE_HEAD = """# Learning results

Every row is made by one command, `python benchmark/learning.py SUITE` (the suites and their rows are
defined in [benchmark/learning.py](../benchmark/learning.py)), on this project's CPU machine: 2 cores,
one torch thread per run, two runs at a time (a 2-process torchrun run takes both cores). Wall time and
SPS are this machine's, with the other core busy with another run; a run that was stopped and resumed
from its checkpoint counts its training time (the time it lay stopped is left out; SPS is its last launch's).
Every finished run is kept in the repository as a run record (`benchmarks/<suite>/records/`: its episodes,
clock, settings, hardware, and the commit and package versions that made it); the tables and curves are
made from the records, so
`python -m cleanrl_utils.plot docs/benchmarks/mujoco/records` redraws them without the event files.

**Final return**, as CleanRL's tables compute it (openrlbenchmark's `rlops`, whose
`--metric-last-n-average-window` is 100): per run the mean of its last 100 training episodes'
`charts/episodic_return` (whole games for Atari), then mean ± std (numpy's, over seeds) across seeds.
CleanRL's numbers are from its documentation's benchmark tables, at the same budget unless the cell
says otherwise. Curves: against env steps (top), the mean over seeds of each run's 20-episode trailing mean,
with a band that is the seeds' range (lowest to highest) below 5 seeds and the 95% bootstrap interval of
the mean from 5 (the legend says which), and CleanRL's score as a diamond with its std at its budget;
against wall time (bottom), each run's own curve to its own end.
"""


# what reads results rather than trains: a commit that changed only these ran the same training code
READERS = ("cleanrl_utils/plot.py",)


def same_training_code(a: str, b: str) -> bool:
    """Whether commits ``a`` and ``b`` hold the same ``cleanrl/`` and ``cleanrl_utils/``, the readers of
    results aside (False where either is not a commit of this clone: "unknown", "+uncommitted")."""
    excluded = [f":(exclude){path}" for path in READERS]
    diff = ["git", "-C", str(REPO), "diff", "--quiet", a, b, "--", "cleanrl", "cleanrl_utils", *excluded]
    return subprocess.run(diff, capture_output=True).returncode == 0


def code_versions(out_root: Path) -> str:
    """One line for the page: the commits its runs were made by, grouped by training code."""
    from cleanrl_utils import plot

    commits = {}  # in the order the suites name them
    for suite in SUITES:
        own = sorted((out_root / suite / "records").glob(f"*{plot.RECORD}"))
        for record in own:
            commits.update(dict.fromkeys(plot.load_record(record)[1].get("commits", ["unknown"])))
        drawn = compared_records(suite, out_root, keep=False)
        if shown_earlier(out_root / suite, own + drawn):  # an earlier commit counts while a row of it is shown
            commits.update(dict.fromkeys((out_root / suite / "earlier" / "commit.txt").read_text().split()))
    groups: list[list[str]] = []
    for c in commits:
        group = next((g for g in groups if same_training_code(g[0], c)), None)
        if group:
            group.append(c)
        else:
            groups.append([c])
    if not groups:
        return ""
    named = "; ".join(" = ".join(g) for g in groups)
    return (f"**Code**: the runs on this page were made by {len(groups)} version{'s' * (len(groups) > 1)} of the "
            f"training code: {named} (commits joined by = hold the same `cleanrl/` and `cleanrl_utils/`, "
            f"{', '.join(READERS)} aside, which reads results).\n")  # fmt: skip


def package_sets(out_root: Path) -> str:
    """One line for the page: the package versions its recorded runs were made with, each set with its count."""
    from cleanrl_utils import plot

    counts: dict[str, int] = {}
    unknown = 0
    for suite in SUITES:
        for record in sorted((out_root / suite / "records").glob(f"*{plot.RECORD}")):
            versions = plot.load_record(record)[1].get("versions") or []
            if not versions:
                unknown += 1
            for v in versions:  # a run resumed on other packages names each set
                name = ", ".join(f"{k} {v[k]}" for k in v)
                counts[name] = counts.get(name, 0) + 1
    if not counts and not unknown:
        return ""
    sets = [f"{n} run{'s' * (n > 1)}: {name}" for name, n in counts.items()]
    if unknown:
        sets.append(f"{unknown} run{'s' * (unknown > 1)} recorded before the versions were kept")
    return f"**Packages**: {'; '.join(sets)}.\n"


def write_page(out_root: Path, notes: dict[str, str]) -> Path:
    sections = []
    for suite in SUITES:
        section = report(suite, out_root)
        if section is None:
            commands = "\n".join(shlex.join(job.argv) for job in jobs_of(suite))
            section = (f"### {suite}: {DESCRIPTION[suite]}\n\nNot run yet on this machine. The commands "
                       f"(`python benchmark/learning.py {suite} --dry-run`):\n\n```\n{commands}\n```\n")  # fmt: skip
        if suite in notes:
            section += "\n" + notes[suite] + "\n"
        sections.append(section)
    for name, text in notes.items():  # a heading that is no suite (population-based training): its own section
        if name not in SUITES:
            sections.append(f"### {name}\n\n{text}\n")
    page = out_root.parent / "benchmarks.md"
    head = PAGE_HEAD + "\n" + code_versions(out_root) + "\n" + package_sets(out_root)
    page.write_text(head + "\n" + "\n".join(sections))
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suites", nargs="+", choices=list(SUITES))
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="processes at a time (default: cores)")
    parser.add_argument("--seeds", type=int, help="seeds per row instead of the suite's (a quick look)")
    parser.add_argument("--rows", nargs="+", default=[], help="only these rows (exp names, e.g. sac_continuous_action)")
    parser.add_argument("--seed", type=int, nargs="+", default=[], help="only these seeds (e.g. 2 3)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands still to run, and exit")
    parser.add_argument("--report-only", action="store_true", help="only the tables, curves and the page")
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks"), help="where the tables and curves go")
    args = parser.parse_args(argv)
    if args.workers < 1:
        print(f"error: --workers {args.workers}: must be a positive integer", file=sys.stderr)
        return 2
    code = 0
    if not args.report_only:
        code = run_suites(args.suites, args.workers, args.dry_run, args.seeds, args.rows, args.seed)
        if args.dry_run or code == 2:
            return code
    notes_file = Path(args.out) / "notes.md"
    notes = {}
    if notes_file.exists():  # hand-written findings per suite, under "## <suite>" headings
        for block in notes_file.read_text().split("\n## ")[1:]:
            name, _, text = block.partition("\n")
            notes[name.strip()] = text.strip()
    print(f"[learning] page: {write_page(Path(args.out), notes)}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
