"""Learning curves, aggregate metrics and tables from the runs' TensorBoard event files, read in full.

    python -m cleanrl_utils.plot runs/ --out plots/
    python -m cleanrl_utils.plot runs/bench1 runs/bench2 --out plots/ --baseline ppo_atari --last 20

Every directory holding event files under the given paths is one run (and so is every run record,
``*.run.json.gz``, below them or given by name: ``save_record`` keeps what this tool reads of a run, its
episodes, clock and settings, in a small file that outlives the event files), grouped by script (its
``exp_name``), env id and settings, read from the hyperparameters the run recorded (or parsed from a
``<env>__<exp>__<seed>`` run name). Runs are one experiment only when their settings agree (all but the
seed and the flags about the machine and the output): where a script ran an env with other settings
too, each group is named by the settings that tell them apart (``ppo [learning_rate=0.001]``), and a
group counts its distinct seeds (two runs of seed 1 are one seed, run twice). Writes into ``--out``:

- ``curves.png``: one panel per env, the episodic return against env steps (top row): per script the
  mean over seeds on a common grid and a band, the 95% bootstrap interval of the mean with 5 seeds or more,
  the seeds' range (lowest to highest) with fewer (a bootstrap over 2-3 seeds is only their envelope), the
  legend says which; ``--reference`` draws a published score at its budget (mean and std as an error
  bar). Against wall-clock time (bottom row) every run is drawn to its own end;
- ``final_returns.{md,csv}``: per script and env, the final return (mean of each run's last ``--last``
  episodes) as mean +- std and IQM over seeds;
- ``throughput.{md,csv}``: per script, env and world size, SPS (the run's own ``charts/SPS``, which
  leaves out start-up), wall time, speed-up and scaling efficiency (speed-up / world-size ratio)
  against the same script's smallest world size, or with ``--baseline`` against that script's
  (blank where nothing comparable ran), and the hardware the run recorded;
- ``aggregate.{md,csv}``: with rliable, IQM, mean, median and optimality gap of the normalised final
  scores over envs (``cleanrl_utils/scores.py``'s reference scores), with 95% stratified bootstrap
  intervals, and the probability of improvement of each script over each other.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tyro

from cleanrl_utils.arguments import LAUNCH_FLAGS, OUTPUT_FLAGS
from cleanrl_utils.scores import iqm, normalize, reference_scores
from cleanrl_utils.tb import ScalarReader, parse_table

# What does not make two runs different experiments: the seed, and the flags about the machine, the launch and
# what a run writes (cleanrl_utils.arguments' LAUNCH_FLAGS and OUTPUT_FLAGS), and what derives from them.
NOT_SETTINGS = {"seed", "run_name", "resume", "exp_name", "env_id", "world_size", "local_num_envs"}


@dataclass
class RunData:
    path: Path
    exp: str
    env_id: str
    seed: int
    world_size: int
    steps: np.ndarray
    returns: np.ndarray
    times: np.ndarray  # training seconds since the run's first event (the pauses of a resumed run left out)
    sps: float
    wall: float
    total_steps: int
    hardware: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)


def training_time(wall_times: list[float], start: float, pauses: list[tuple[float, float]]) -> np.ndarray:
    """Seconds from ``start`` to each wall time, less the pauses (``ScalarReader.pauses``) before it."""
    t = np.asarray(wall_times, dtype=np.float64)
    return t - start - sum((np.where(t >= resumed, gap, 0.0) for resumed, gap in pauses), np.zeros_like(t))


RECORD = ".run.json.gz"  # a run record's file name ends so


def save_record(run: RunData, path: Path, metric: str = "charts/episodic_return", **extra) -> Path:
    """Write ``run`` (as ``find_runs`` read it for ``metric``) to ``path``, a gzipped JSON run record, with
    ``extra`` keys (the commits that made it) beside it. Clocks at 0.1 s, steps as integers: a few tens of kB."""
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(RunData)}
    fields.update(
        path=run.path.name,
        steps=[int(x) for x in run.steps],
        returns=[float(x) for x in run.returns],
        times=[round(float(x), 1) for x in run.times],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps({"run": fields, "metric": metric, **extra}, separators=(",", ":")).encode()
    path.write_bytes(gzip.compress(data, mtime=0))  # no time stamp: the same run is the same bytes (git sees no change)
    return path


def load_record(path: Path) -> tuple[RunData, dict]:
    """A run record: the run, and the extra keys saved with it."""
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    fields = data.pop("run")
    fields.update(
        path=Path(fields["path"]), **{k: np.asarray(fields[k], np.float64) for k in ("steps", "returns", "times")}
    )
    return RunData(**fields), data


def find_runs(paths: list[Path], metric: str) -> list[RunData]:
    files = [Path(p) for p in paths if Path(p).is_file()]
    records = sorted({*files, *(r for root in paths if Path(root).is_dir() for r in Path(root).rglob(f"*{RECORD}"))})
    runs = [run for run, extra in map(load_record, records) if extra["metric"] == metric]
    dirs = sorted(
        {p.parent for root in paths if Path(root).is_dir() for p in Path(root).rglob("events.out.tfevents.*")}
    )
    for run_dir in dirs:
        reader = ScalarReader(run_dir).update()
        series = reader.get(metric)
        if not series.steps:
            continue
        hp = reader.hyperparameters()
        parts = run_dir.name.split("__")
        exp = hp.get("exp_name") or (parts[1] if len(parts) >= 3 else run_dir.name)
        env_id = hp.get("env_id") or parts[0]
        seed = int(hp.get("seed") or (parts[2] if len(parts) >= 3 and parts[2].isdigit() else 0))
        start = min(s.wall_times[0] for s in reader.series.values() if s.wall_times)
        pauses = reader.pauses()  # a resumed run's clock counts its training time, not the time it lay stopped
        last = max(s.wall_times[-1] for s in reader.series.values() if s.wall_times)
        end = float(training_time([last], start, pauses)[0])
        sps_values = reader.get("charts/SPS").values
        total = reader.last_step()
        runs.append(
            RunData(
                path=run_dir,
                exp=exp,
                env_id=env_id,
                seed=seed,
                world_size=int(hp.get("world_size", 1)),
                steps=np.asarray(series.steps, dtype=np.float64),
                returns=np.asarray(series.values, dtype=np.float64),
                times=training_time(series.wall_times, start, pauses),
                sps=float(sps_values[-1]) if sps_values else total / max(end, 1e-9),
                wall=end,
                total_steps=total,
                hardware=parse_table(reader.texts.get("hardware", "")),
                settings={k: v for k, v in hp.items() if k not in NOT_SETTINGS | LAUNCH_FLAGS | OUTPUT_FLAGS},
            )
        )
    # one order whatever the runs were read from (the bootstrap intervals depend on it)
    return name_by_settings(sorted(runs, key=lambda r: (r.exp, r.env_id, r.seed, r.path.name)))


def name_by_settings(runs: list[RunData]) -> list[RunData]:
    """Where one script ran one env with several settings, name each group by the settings that differ."""
    by_script_env: dict[tuple[str, str], list[RunData]] = defaultdict(list)
    for run in runs:
        by_script_env[(run.exp, run.env_id)].append(run)
    for group in by_script_env.values():
        kinds = {tuple(sorted(r.settings.items())) for r in group}
        if len(kinds) < 2:
            continue
        keys = sorted({k for kind in kinds for k, _ in kind} - set.intersection(*(set(kind) for kind in kinds)))
        keys = [k for k in keys if len({r.settings.get(k) for r in group}) > 1]
        for run in group:
            run.exp = f"{run.exp} [{', '.join(f'{k}={run.settings.get(k)}' for k in keys)}]"
    return runs


def seeds_of(group: list[RunData]) -> str:
    """How many seeds a group holds, and runs when a seed ran more than once."""
    seeds = len({r.seed for r in group})
    noun = "seed" if seeds == 1 else "seeds"
    return f"{seeds} {noun}" if seeds == len(group) else f"{len(group)} runs of {seeds} {noun}"


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` episodes (the first points average what there is)."""
    if window <= 1:
        return values
    cumsum = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (cumsum[1:] - cumsum[np.arange(1, len(values) + 1) - counts]) / counts


@dataclass(frozen=True)
class Reference:
    """A published final score drawn on the step panels: its mean and std at its budget (env steps)."""

    label: str
    env_id: str
    mean: float
    std: float
    steps: int

    @classmethod
    def parse(cls, text: str) -> Reference:
        """``LABEL,ENV_ID,MEAN,STD,STEPS`` (``--reference``), or ValueError naming the rule."""
        parts = text.split(",")
        if len(parts) != 5:
            raise ValueError("must be LABEL,ENV_ID,MEAN,STD,STEPS")
        label, env_id, mean, std, steps = parts
        try:
            values = float(mean), float(std), int(steps)
        except ValueError:
            raise ValueError("MEAN and STD must be numbers, STEPS an integer") from None
        if not all(np.isfinite(values)) or values[1] < 0 or values[2] < 1:
            raise ValueError("MEAN must be finite, STD >= 0, STEPS >= 1")
        return cls(label, env_id, *values)


CI_SEEDS = 5  # fewer seeds: the band is their range, not a bootstrap interval


def band(curves: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """The shaded band over seeds (rows) and what it is: the 95% bootstrap interval of their mean with
    ``CI_SEEDS`` seeds or more; with fewer, the seeds' range (a bootstrap over 2-3 seeds would be just that)."""
    if len(curves) >= CI_SEEDS:
        return *bootstrap_band(curves), "95% CI"
    return curves.min(axis=0), curves.max(axis=0), "range"


def bootstrap_band(curves: np.ndarray, reps: int = 1000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """95% bootstrap interval of the mean over seeds (rows) at each grid point (columns)."""
    if len(curves) == 1:
        return curves[0], curves[0]
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(curves), size=(reps, len(curves)))
    means = curves[picks].mean(axis=1)
    return np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0)


def curve(group: list[RunData], x: str, window: int, points: int = 100):
    """(grid, mean, low, high, what the band is) over the group's seeds; the grid ends where the shortest run
    ends."""
    xs = [getattr(r, x) for r in group]
    end = min(v[-1] for v in xs)
    grid = np.linspace(0.0, end, points)
    curves = np.stack([np.interp(grid, v, smooth(r.returns, window)) for v, r in zip(xs, group)])
    return grid, curves.mean(axis=0), *band(curves)


def groups_of(runs: list[RunData]) -> dict[tuple[str, str], list[RunData]]:
    groups: dict[tuple[str, str], list[RunData]] = defaultdict(list)
    for run in runs:
        groups[(run.exp, run.env_id)].append(run)
    return dict(sorted(groups.items()))


def plot_curves(runs: list[RunData], path: Path, window: int, references: tuple[Reference, ...] = ()):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter

    groups = groups_of(runs)
    envs = sorted({env for _, env in groups})
    exps = sorted({exp for exp, _ in groups})
    fig, axes = plt.subplots(2, len(envs), figsize=(5 * len(envs), 7), squeeze=False)
    colors = {exp: f"C{i}" for i, exp in enumerate(exps)}
    for col, env in enumerate(envs):
        for row, (x, label) in enumerate((("steps", "env steps"), ("times", "wall time (s)"))):
            ax = axes[row][col]
            for exp in exps:
                group = groups.get((exp, env))
                if not group:
                    continue
                if x == "times":  # each run to its own end: runs of one budget take different times
                    for i, r in enumerate(sorted(group, key=lambda r: r.seed)):
                        name = f"{exp} ({seeds_of(group)}, each to its end)" if i == 0 else "_nolegend_"
                        ax.plot(r.times, smooth(r.returns, window), color=colors[exp], alpha=0.7, lw=1, label=name)
                    continue
                grid, mean, low, high, what = curve(group, x, window)
                ax.plot(grid, mean, color=colors[exp], label=f"{exp} ({seeds_of(group)}, band: {what})")
                ax.fill_between(grid, low, high, color=colors[exp], alpha=0.2)
            for ref in (ref for ref in references if ref.env_id == env and x == "steps"):
                # in the colour of the script whose name ends its label ("CleanRL ppo"), else black
                color = next((colors[e] for e in exps if ref.label.split()[-1:] == [e]), "black")
                ax.errorbar([ref.steps], [ref.mean], yerr=[ref.std], fmt="D", color=color, mec="black", ms=6,
                            capsize=4, label=f"{ref.label}: {ref.mean:,.0f} ± {ref.std:,.0f}")  # fmt: skip
            ax.set_title(env)
            ax.set_xlabel(label)
            if x == "steps":  # 200k, 1M: a narrow panel's step labels would run into each other
                ax.xaxis.set_major_formatter(EngFormatter(sep=""))
            ax.set_ylabel("episodic return")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return fig


def final_score(run: RunData, last: int) -> float:
    return float(run.returns[-last:].mean())


def final_table(runs: list[RunData], last: int) -> list[dict]:
    rows = []
    for (exp, env), group in groups_of(runs).items():
        scores = np.array([final_score(r, last) for r in group])
        rows.append(
            {
                "script": exp,
                "env_id": env,
                "seeds": len({r.seed for r in group}),
                "runs": len(group),
                "mean": scores.mean(),
                "std": scores.std(),
                "iqm": iqm(scores),
                "steps": int(np.mean([r.total_steps for r in group])),
            }
        )
    return rows


def throughput_table(runs: list[RunData], baseline: str | None) -> list[dict]:
    grouped: dict[tuple, list[RunData]] = defaultdict(list)
    for run in runs:
        grouped[(run.exp, run.env_id, run.world_size)].append(run)
    rows = []
    for (exp, env, world), group in sorted(grouped.items()):
        hw = group[0].hardware
        rows.append(
            {
                "script": exp,
                "env_id": env,
                "world_size": world,
                "runs": len(group),
                "sps": float(np.mean([r.sps for r in group])),
                "wall_s": float(np.mean([r.wall for r in group])),
                "hardware": f"{hw.get('cpu', '?')} x{hw.get('cpu_count', '?')}; GPU {hw.get('gpu', '?')}",
            }
        )
    # Speed-up and scaling efficiency compare like with like: one script's runs of one env at its
    # smallest world size and above, or with --baseline every script's runs of an env against the
    # baseline script's smallest world size there. Anything else (ppo beside dqn) is left blank.
    for row in rows:
        row["speedup"] = row["efficiency"] = None
    for env in {row["env_id"] for row in rows}:
        same_env = [row for row in rows if row["env_id"] == env]
        if baseline is not None:
            comparisons = [(same_env, [row for row in same_env if row["script"] == baseline])]
        else:
            by_script = defaultdict(list)
            for row in same_env:
                by_script[row["script"]].append(row)
            comparisons = [(group, group) for group in by_script.values() if len(group) > 1]
        for group, candidates in comparisons:
            if not candidates:
                continue
            base = min(candidates, key=lambda row: row["world_size"])
            for row in group:
                row["speedup"] = row["sps"] / base["sps"]
                row["efficiency"] = row["speedup"] / (row["world_size"] / base["world_size"])
    return rows


def aggregate_tables(runs: list[RunData], last: int, reps: int = 2000):
    """rliable's interval estimates over envs; None when rliable is missing or no env has reference scores."""
    try:
        from rliable import library as rly
        from rliable import metrics
    except ImportError:
        print("[plot] no aggregate table: rliable is not installed (pip install -e '.[plot]')")
        return None
    groups = groups_of(runs)
    exps = sorted({exp for exp, _ in groups})
    envs = sorted(env for env in {env for _, env in groups} if reference_scores(env) is not None)
    if not envs:
        print("[plot] no aggregate table: no env here has reference scores to normalise by (cleanrl_utils/scores.py)")
        return None
    envs = [env for env in envs if all((exp, env) in groups for exp in exps)]
    if not envs:
        print("[plot] no aggregate table: no env with reference scores was run by every script (rliable compares "
              "scripts over the same envs)")  # fmt: skip
        return None
    num_runs = min(len(groups[(exp, env)]) for exp in exps for env in envs)
    scores = {
        exp: np.array(
            [
                [normalize(final_score(r, last), reference_scores(env)) for r in groups[(exp, env)][:num_runs]]
                for env in envs
            ]
        ).T  # (runs, envs)
        for exp in exps
    }
    aggregate = lambda x: np.array(  # noqa: E731
        [
            metrics.aggregate_iqm(x),
            metrics.aggregate_mean(x),
            metrics.aggregate_median(x),
            metrics.aggregate_optimality_gap(x),
        ]
    )
    points, intervals = rly.get_interval_estimates(scores, aggregate, reps=reps)
    rows = []
    for exp in exps:
        row = {"script": exp, "envs": len(envs), "runs_per_env": num_runs}
        for i, name in enumerate(("iqm", "mean", "median", "optimality_gap")):
            row[name] = float(points[exp][i])
            row[f"{name}_low"], row[f"{name}_high"] = float(intervals[exp][0][i]), float(intervals[exp][1][i])
        rows.append(row)
    improvement = []
    pairs = {f"{a}\t{b}": (scores[a], scores[b]) for a in exps for b in exps if a != b}  # (names hold commas)
    if pairs:
        poi, poi_ci = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=reps)
        for key in pairs:
            a, b = key.split("\t")
            low, high = np.ravel(poi_ci[key])
            improvement.append(
                {"script": a, "over": b, "probability": float(np.ravel(poi[key])[0]), "low": low, "high": high}
            )
    return rows, improvement


def cell(fmt: str, row: dict) -> str:
    """One markdown cell; a value left out (None) is a dash."""
    try:
        return fmt.format(**row)
    except TypeError:  # None under a numeric format
        return "-"


def write_table(rows: list[dict], path: Path, columns: list[tuple[str, str]]) -> str:
    """``rows`` as CSV (all fields, full precision) and as a markdown table of ``columns`` (title, format)."""
    if not rows:
        return ""
    with open(path.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(cell(fmt, row) for _, fmt in columns) + " |")
    text = "\n".join(lines) + "\n"
    path.with_suffix(".md").write_text(text)
    return text


@dataclass
class Args:
    paths: tyro.conf.Positional[list[str]]
    """runs directories (every directory with event files below them is one run) or run records"""
    out: str = "plots"
    """where the PNG and the tables go"""
    metric: str = "charts/episodic_return"
    """the scalar plotted and tabled"""
    last: int = 100
    """a run's final return is the mean of its last this many episodes (100: CleanRL's tables)"""
    smooth: int = 20
    """curves: trailing mean over this many episodes before averaging over seeds"""
    reference: list[str] = field(default_factory=list)
    """published scores to draw on the step panels, each LABEL,ENV_ID,MEAN,STD,STEPS (e.g. CleanRL's)"""
    baseline: str | None = None
    """the script (exp name) whose smallest world size is speed-up 1 for every script of its env (default:
    each script against its own smallest world size; no speed-up between different scripts)"""


def main(argv: list[str] | None = None) -> int:
    args = tyro.cli(Args, args=argv)
    for path in args.paths:
        if not Path(path).is_dir() and not (Path(path).is_file() and path.endswith(RECORD)):
            print(f"error: {path}: not a directory or a run record (*{RECORD})", file=sys.stderr)
            return 2
    if args.last < 1 or args.smooth < 1:
        print(f"error: --last {args.last} / --smooth {args.smooth}: must be positive integers", file=sys.stderr)
        return 2
    references = []
    for text in args.reference:
        try:
            references.append(Reference.parse(text))
        except ValueError as e:
            print(f"error: --reference {text}: {e}", file=sys.stderr)
            return 2
    runs = find_runs([Path(p) for p in args.paths], args.metric)
    if not runs:
        print(f"error: no run under {' '.join(args.paths)} logged {args.metric}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(runs, out / "curves.png", args.smooth, tuple(references))
    print(f"[plot] {len(runs)} runs; curves in {out / 'curves.png'}\n")
    print(
        write_table(
            final_table(runs, args.last),
            out / "final_returns",
            [
                ("script", "{script}"),
                ("env", "{env_id}"),
                ("seeds", "{seeds}"),
                ("runs", "{runs}"),
                ("steps", "{steps:,}"),
                (f"return (last {args.last}), mean ± std", "{mean:.2f} ± {std:.2f}"),
                ("IQM", "{iqm:.2f}"),
            ],
        )  # fmt: skip
    )
    print(
        write_table(
            throughput_table(runs, args.baseline),
            out / "throughput",
            [
                ("script", "{script}"),
                ("env", "{env_id}"),
                ("world size", "{world_size}"),
                ("runs", "{runs}"),
                ("SPS", "{sps:,.0f}"),
                ("wall time (s)", "{wall_s:.1f}"),
                ("speed-up", "{speedup:.2f}x"),
                ("scaling efficiency", "{efficiency:.0%}"),
                ("hardware", "{hardware}"),
            ],
        )  # fmt: skip
    )
    tables = aggregate_tables(runs, args.last)
    if tables:
        rows, improvement = tables
        print(
            write_table(
                rows,
                out / "aggregate",
                [
                    ("script", "{script}"),
                    ("envs", "{envs}"),
                    ("IQM", "{iqm:.3f} [{iqm_low:.3f}, {iqm_high:.3f}]"),
                    ("mean", "{mean:.3f} [{mean_low:.3f}, {mean_high:.3f}]"),
                    ("median", "{median:.3f} [{median_low:.3f}, {median_high:.3f}]"),
                    ("optimality gap", "{optimality_gap:.3f} [{optimality_gap_low:.3f}, {optimality_gap_high:.3f}]"),
                ],
            )  # fmt: skip
        )
        print(
            write_table(
                improvement,
                out / "improvement",
                [
                    ("P(script > other)", "{script} > {over}"),
                    ("probability", "{probability:.3f} [{low:.3f}, {high:.3f}]"),
                ],
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
