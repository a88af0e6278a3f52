"""plot.py on tiny runs of the stand-in script (known returns and SPS): the PNG's panels and lines,
and the numbers of every table."""

import csv
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from cleanrl_utils import plot
from cleanrl_utils.scores import iqm, normalize, reference_scores
from tests.conftest import REPO, script_env

FAKE = str(REPO / "tests" / "fake_train.py")
RUNS = [  # exp, env, quality, sps, world size
    ("a", "CartPole-v1", 1.0, 1000, 1),
    ("b", "CartPole-v1", 0.5, 1800, 2),
    ("a", "Acrobot-v1", 0.2, 1000, 1),
    ("b", "Acrobot-v1", 0.6, 1800, 2),
]


def returns(quality: float, seed: int) -> np.ndarray:
    return np.float32([500 * quality * s / 1000 + seed / 100 for s in range(100, 1001, 100)]).astype(np.float64)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("plot")
    procs = []
    for exp, env, quality, sps, world in RUNS:
        for seed in (1, 2, 3):
            cmd = [sys.executable, FAKE, "--exp-name", exp, "--env-id", env, "--seed", str(seed), "--step-time", "0"]
            cmd += ["--quality", str(quality), "--sps", str(sps), "--world-size", str(world)]
            procs.append(subprocess.Popen([*cmd, "--run-name", f"{env}__{exp}__{seed}"], cwd=cwd, env=script_env()))
    assert all(p.wait() == 0 for p in procs)
    return cwd


def test_tables_hold_the_right_numbers(runs_dir, tmp_path):
    assert plot.main([str(runs_dir / "runs"), "--out", str(tmp_path), "--last", "4", "--baseline", "a"]) == 0
    final = {(r["script"], r["env_id"]): r for r in read_csv(tmp_path / "final_returns.csv")}
    assert len(final) == 4
    for exp, env, quality, _, _ in RUNS:
        scores = [returns(quality, seed)[-4:].mean() for seed in (1, 2, 3)]
        row = final[(exp, env)]
        assert int(row["seeds"]) == 3 and int(row["steps"]) == 1000
        assert float(row["mean"]) == pytest.approx(np.mean(scores))
        assert float(row["std"]) == pytest.approx(np.std(scores))
        assert float(row["iqm"]) == pytest.approx(iqm(scores))
    speed = {(r["script"], r["env_id"]): r for r in read_csv(tmp_path / "throughput.csv")}
    for env in ("CartPole-v1", "Acrobot-v1"):
        a, b = speed[("a", env)], speed[("b", env)]
        assert float(a["sps"]) == pytest.approx(1002.0) and float(b["sps"]) == pytest.approx(1802.0)  # + seed, mean
        assert float(a["speedup"]) == 1.0 and float(b["speedup"]) == pytest.approx(1802.0 / 1002.0)
        assert float(b["efficiency"]) == pytest.approx(1802.0 / 1002.0 / 2)
        assert b["world_size"] == "2" and "GPU" in b["hardware"]
    aggregate = {r["script"]: r for r in read_csv(tmp_path / "aggregate.csv")}
    for exp in ("a", "b"):
        normalized = [
            normalize(returns(q, seed)[-4:].mean(), reference_scores(env))
            for e, env, q, _, _ in RUNS
            if e == exp
            for seed in (1, 2, 3)
        ]
        assert float(aggregate[exp]["iqm"]) == pytest.approx(iqm(normalized))
        assert float(aggregate[exp]["mean"]) == pytest.approx(np.mean(normalized))
        assert float(aggregate[exp]["iqm_low"]) <= float(aggregate[exp]["iqm"]) <= float(aggregate[exp]["iqm_high"])
    poi = {(r["script"], r["over"]): float(r["probability"]) for r in read_csv(tmp_path / "improvement.csv")}
    assert poi[("a", "b")] + poi[("b", "a")] == pytest.approx(1.0)
    # a is better on CartPole (3 of 3 seeds), worse on Acrobot: P(a > b) averages 1 and 0
    assert poi[("a", "b")] == pytest.approx(0.5)
    assert "| b | CartPole-v1 | 2 | 3 | 1,802 |" in (tmp_path / "throughput.md").read_text()


def test_png_has_one_panel_per_env_with_the_mean_curves(runs_dir, tmp_path):
    runs = plot.find_runs([runs_dir / "runs"], "charts/episodic_return")
    cleanrl = plot.Reference.parse("CleanRL a,CartPole-v1,450.5,20,1000")
    fig = plot.plot_curves(runs, tmp_path / "curves.png", window=3, references=(cleanrl,))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["Acrobot-v1", "CartPole-v1", "Acrobot-v1", "CartPole-v1"]
    assert [ax.get_xlabel() for ax in fig.axes] == ["env steps", "env steps", "wall time (s)", "wall time (s)"]
    step_panel = fig.axes[1]  # CartPole against env steps
    lines = {line.get_label(): line for line in step_panel.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"a (3 seeds, band: range)", "b (3 seeds, band: range)"}
    (published,) = step_panel.containers  # the published score at its budget, in a's colour, +- its std
    marker, _, (bar,) = published
    assert published.get_label() == "CleanRL a: 450 ± 20" and marker.get_color() == "C0"
    assert list(marker.get_xdata()) == [1000] and list(marker.get_ydata()) == [450.5]
    np.testing.assert_allclose(bar.get_segments()[0], [[1000, 430.5], [1000, 470.5]])
    assert not fig.axes[0].containers  # none on Acrobot
    for exp, quality in (("a", 1.0), ("b", 0.5)):
        grid = lines[f"{exp} (3 seeds, band: range)"].get_xdata()
        assert grid[-1] == 1000
        steps = np.arange(100, 1001, 100)
        curves = [np.interp(grid, steps, plot.smooth(returns(quality, seed), 3)) for seed in (1, 2, 3)]
        np.testing.assert_allclose(
            lines[f"{exp} (3 seeds, band: range)"].get_ydata(), np.mean(curves, axis=0), rtol=1e-6
        )
    # the wall-time panel: every seed its own line, to its own end (one legend entry per script)
    wall = [line for line in fig.axes[3].get_lines()]
    assert len(wall) == 6 and {line.get_label() for line in wall if not line.get_label().startswith("_")} == {
        "a (3 seeds, each to its end)", "b (3 seeds, each to its end)"}  # fmt: skip
    ends = sorted(line.get_xdata()[-1] for line in wall)
    assert ends == sorted(r.times[-1] for r in runs if r.env_id == "CartPole-v1")


def test_the_band_is_the_seeds_range_below_five_seeds_and_a_bootstrap_interval_from_five():
    rng = np.random.default_rng(0)
    three, five = rng.normal(size=(3, 40)), rng.normal(size=(5, 40))
    low, high, what = plot.band(three)
    assert what == "range"
    np.testing.assert_array_equal(low, three.min(axis=0))
    np.testing.assert_array_equal(high, three.max(axis=0))
    low, high, what = plot.band(five)
    assert what == "95% CI"
    mean = five.mean(axis=0)  # inside the seeds' range, around the mean, narrower than the range
    assert np.all(low <= mean) and np.all(mean <= high)
    assert np.all(low >= five.min(axis=0)) and np.all(high <= five.max(axis=0))
    assert np.mean(high - low) < 0.8 * np.mean(five.max(axis=0) - five.min(axis=0))


@pytest.mark.parametrize("text", ["CleanRL,CartPole-v1,1,2", "x,CartPole-v1,abc,1,10", "x,CartPole-v1,1,-1,10"])
def test_a_bad_reference_exits_2_with_one_line(runs_dir, tmp_path, capsys, text):
    assert plot.main([str(runs_dir / "runs"), "--out", str(tmp_path), "--reference", text]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"--reference {text}: " in err
    assert not (tmp_path / "curves.png").exists()


def test_png_shows_both_curves_in_every_panel(runs_dir, tmp_path):
    runs = plot.find_runs([runs_dir / "runs"], "charts/episodic_return")
    fig = plot.plot_curves(runs, tmp_path / "curves.png", window=3)
    for ax in fig.axes:  # (a legend over a curve blends its colour)
        ax.get_legend().remove()
    fig.savefig(tmp_path / "curves.png", dpi=100)
    image = mpimg.imread(tmp_path / "curves.png")
    assert image.shape[:2] == (700, 1000)  # figsize (5 per env x 7) at dpi 100
    for ax in fig.axes:  # every panel holds both curves' colours (the wall-time lines at alpha 0.7 on white)
        x0, y0, x1, y1 = (ax.get_window_extent().extents).astype(int)
        panel = image[700 - y1 : 700 - y0, x0:x1, :3]
        alpha = 0.7 if ax.get_xlabel().startswith("wall") else 1.0
        for color in ((0.12, 0.47, 0.71), (1.0, 0.5, 0.05)):  # C0 blue, C1 orange
            seen = alpha * np.array(color) + (1 - alpha)
            assert (np.abs(panel - seen).sum(axis=2) < 0.1).sum() > 50, (ax.get_title(), color)


@pytest.mark.quick
def test_run_records_stand_in_for_the_event_files(runs_dir, tmp_path):
    """Each run saved as a record (what the benchmark page keeps in git) reads back as the run itself, and the
    tables made from the records alone equal those made from the event files; a record of another metric is
    not read as this one."""
    from_events = plot.find_runs([runs_dir / "runs"], "charts/episodic_return")
    for run in from_events:
        plot.save_record(run, tmp_path / "records" / f"{run.path.name}{plot.RECORD}", commits=["abc1234"])
    plot.save_record(from_events[0], tmp_path / "records" / f"sps{plot.RECORD}", metric="charts/SPS")
    # a report written again re-saves every record: the same run must be the same bytes, or git sees a change
    again = plot.save_record(from_events[0], tmp_path / f"again{plot.RECORD}", metric="charts/SPS")
    time.sleep(1.1)  # gzip's header would otherwise hold the second it was written in
    assert again.read_bytes() == plot.save_record(from_events[0], again, metric="charts/SPS").read_bytes()
    from_records = plot.find_runs([tmp_path / "records"], "charts/episodic_return")
    assert len(from_records) == len(from_events) == 12
    for a, b in zip(sorted(from_events, key=lambda r: r.path.name), sorted(from_records, key=lambda r: r.path.name)):
        assert (a.exp, a.env_id, a.seed, a.world_size, a.total_steps) == (
            b.exp,
            b.env_id,
            b.seed,
            b.world_size,
            b.total_steps,
        )
        assert np.array_equal(a.steps, b.steps) and np.array_equal(a.returns, b.returns)
        assert np.allclose(a.times, b.times, atol=0.051) and (a.sps, a.wall, a.settings) == (b.sps, b.wall, b.settings)
    assert plot.load_record(tmp_path / "records" / f"{from_events[0].path.name}{plot.RECORD}")[1]["commits"] == [
        "abc1234"
    ]
    one_file = tmp_path / "records" / f"{from_events[0].path.name}{plot.RECORD}"
    assert plot.main([str(runs_dir / "runs"), "--out", str(tmp_path / "events"), "--last", "4"]) == 0
    assert plot.main([str(tmp_path / "records"), "--out", str(tmp_path / "kept"), "--last", "4"]) == 0
    for table in ("final_returns.csv", "throughput.csv"):
        assert read_csv(tmp_path / "events" / table) == read_csv(tmp_path / "kept" / table), table
    for a, b in zip(read_csv(tmp_path / "events" / "aggregate.csv"), read_csv(tmp_path / "kept" / "aggregate.csv")):
        assert a.keys() == b.keys() and a["script"] == b["script"]  # (rliable's bootstrap varies in the 8th digit)
        assert all(float(a[k]) == pytest.approx(float(b[k]), rel=1e-6) for k in a if k != "script"), (a, b)
    assert plot.main([str(one_file), "--out", str(tmp_path / "one")]) == 0  # a record given by name
    assert [r["seeds"] for r in read_csv(tmp_path / "one" / "final_returns.csv")] == ["1"]


def test_bad_input(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing")]) == 2
    assert plot.main([str(tmp_path)]) == 2
    assert "no run under" in capsys.readouterr().err


def speed_run(exp: str, env: str, world: int, sps: float) -> plot.RunData:
    empty = np.zeros(0)
    return plot.RunData(Path(exp), exp, env, 1, world, empty, empty, empty, sps, 10.0, 1000)


@pytest.mark.quick
def test_speedup_only_between_runs_that_compare():
    """Without --baseline: one script against its own smallest world size, never ppo against dqn;
    with it: every script of the env against the baseline's smallest world size."""
    runs = [speed_run("ppo", "Pong", 1, 1000), speed_run("ppo", "Pong", 4, 3000), speed_run("dqn", "Pong", 1, 5760)]
    rows = {(r["script"], r["world_size"]): r for r in plot.throughput_table(runs, None)}
    assert rows[("ppo", 1)]["speedup"] == 1.0 and rows[("ppo", 4)]["speedup"] == 3.0
    assert rows[("ppo", 4)]["efficiency"] == 0.75
    assert rows[("dqn", 1)]["speedup"] is None and rows[("dqn", 1)]["efficiency"] is None
    assert plot.cell("{speedup:.2f}x", rows[("dqn", 1)]) == "-"
    rows = {(r["script"], r["world_size"]): r for r in plot.throughput_table(runs, "dqn")}
    assert rows[("ppo", 4)]["speedup"] == pytest.approx(3000 / 5760)
    assert rows[("ppo", 4)]["efficiency"] == pytest.approx(3000 / 5760 / 4)
    assert rows[("dqn", 1)]["speedup"] == 1.0
    rows = plot.throughput_table(runs, "sac")  # a baseline that did not run there: nothing to compare
    assert all(row["speedup"] is None for row in rows)


def test_runs_with_other_settings_are_not_pooled_and_a_seed_run_twice_is_one_seed(tmp_path):
    """A 1,000-step run and three 300-step tuner trials with other values, all seed 1, and one seed run
    twice: each setting is its own group, named by what differs, counted by its distinct seeds."""
    runs = [(1.0, 1000, 1, "long"), (0.3, 300, 1, "t0"), (0.5, 300, 1, "t1"), (0.7, 300, 1, "t2"), (0.7, 300, 1, "t2b")]
    procs = []
    for quality, total, seed, name in runs:
        cmd = [sys.executable, FAKE, "--exp-name", "ppo", "--env-id", "CartPole-v1", "--seed", str(seed)]
        cmd += ["--quality", str(quality), "--total-timesteps", str(total), "--step-time", "0", "--run-name", name]
        procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=script_env()))
    assert all(p.wait() == 0 for p in procs)
    assert plot.main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--last", "2"]) == 0
    final = {r["script"]: r for r in read_csv(tmp_path / "out" / "final_returns.csv")}
    assert sorted(final) == [
        "ppo [quality=0.3, total_timesteps=300]",
        "ppo [quality=0.5, total_timesteps=300]",
        "ppo [quality=0.7, total_timesteps=300]",
        "ppo [quality=1.0, total_timesteps=1000]",
    ]
    assert [(r["seeds"], r["runs"]) for _, r in sorted(final.items())] == [
        ("1", "1"),
        ("1", "1"),
        ("1", "2"),
        ("1", "1"),
    ]
    assert int(final["ppo [quality=1.0, total_timesteps=1000]"]["steps"]) == 1000  # not cut at the trials' 300


def test_a_resumed_run_s_clock_leaves_out_the_time_it_lay_stopped(tmp_path):
    """Launch 1 logs steps 0-100 at 1 s a step and is killed after its checkpoint at 60; launch 2 starts
    1,000 s later and logs 61-200. Curves against wall time and the wall time per run count training: the
    last point is at 100 + 140 = 240 s less the 40 s of work lost past the checkpoint (logged again)."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run = tmp_path / "runs" / "CartPole-v1__ppo__1"

    def launch(name: str, events: list[Event]) -> None:  # one event file, named as if started at that time
        scratch = tmp_path / "scratch" / name.split(".")[3]
        writer = EventFileWriter(str(scratch))
        for event in events:
            writer.add_event(event)
        writer.close()
        run.mkdir(parents=True, exist_ok=True)
        (file,) = scratch.iterdir()
        file.rename(run / name)

    def point(step: int, wall: float) -> Event:
        values = [Summary.Value(tag="charts/episodic_return", simple_value=float(step))]
        return Event(wall_time=wall, step=step, summary=Summary(value=values))

    t0 = 1_000_000.0
    launch("events.out.tfevents.1000000.a", [point(s, t0 + s) for s in range(0, 101)])
    restart = Event(wall_time=t0 + 1100, step=61, session_log=SessionLog(status=SessionLog.START))
    launch("events.out.tfevents.1001100.a", [restart, *(point(s, t0 + 1100 + (s - 60)) for s in range(61, 201))])
    (found,) = plot.find_runs([tmp_path / "runs"], "charts/episodic_return")
    assert list(found.steps) == list(range(201))  # the lost steps 61-100 of launch 1 are dropped
    assert found.times[60] == 60.0 and found.times[61] == 61.0 and found.times[-1] == 200.0
    assert found.wall == 200.0
