"""Reading the scalars a run logs, from its TensorBoard event files, in full and as they grow.

TensorBoard's own ``EventAccumulator`` keeps a reservoir sample of each tag (10,000 points by
default) and re-reads from the start; the tuner needs every point of a live run, incrementally.
A resumed run writes a new event file that begins with a restart marker at the checkpoint's
step: the points the previous attempt logged from that step on are dropped, as TensorBoard does.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
from tensorboard.compat.proto.event_pb2 import SessionLog


@dataclass
class Series:
    """One tag's points in step order: env step, value, wall-clock time (seconds since the epoch)."""

    steps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    wall_times: list[float] = field(default_factory=list)

    def truncate(self, step: int) -> None:
        """Drop the points at ``step`` and after (a resumed run logs them again)."""
        keep = next((i for i, s in enumerate(self.steps) if s >= step), len(self.steps))
        del self.steps[keep:], self.values[keep:], self.wall_times[keep:]


class ScalarReader:
    """All scalars of one run directory; ``update()`` reads what was appended since the last call."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.series: dict[str, Series] = {}
        self.texts: dict[str, str] = {}
        self.restarts: list[tuple[int, float]] = []  # (step, wall time) of each resumed launch's restart marker
        self._loaders: dict[Path, LegacyEventFileLoader] = {}

    def update(self) -> "ScalarReader":
        if self.run_dir.is_dir():
            for path in sorted(self.run_dir.glob("events.out.tfevents.*"), key=_file_order):
                if path not in self._loaders:
                    self._loaders[path] = LegacyEventFileLoader(str(path))
                for event in self._loaders[path].Load():
                    self._add(event)
        return self

    def _add(self, event) -> None:
        if event.HasField("session_log") and event.session_log.status == SessionLog.START:
            for series in self.series.values():
                series.truncate(event.step)
            self.restarts.append((event.step, event.wall_time))
            return
        if not event.HasField("summary"):
            return
        for value in event.summary.value:
            if value.HasField("simple_value"):
                series = self.series.setdefault(value.tag, Series())
                series.steps.append(event.step)
                series.values.append(value.simple_value)
                series.wall_times.append(event.wall_time)
            elif value.HasField("tensor") and value.tensor.string_val:
                self.texts[value.tag.split("/")[0]] = value.tensor.string_val[0].decode()

    def get(self, tag: str) -> Series:
        return self.series.get(tag, Series())

    def pauses(self) -> list[tuple[float, float]]:
        """(wall time a launch resumed at, seconds the run was not training before it): from the last point
        the run kept from before its restart step to the restart marker. Work done past the checkpoint and
        then lost counts as paused too (it is logged again), so a resumed run's clock is its training time."""
        kept = [(s, w) for series in self.series.values() for s, w in zip(series.steps, series.wall_times)]
        pauses = []
        for step, resumed in sorted(self.restarts, key=lambda r: r[1]):
            before = [w for s, w in kept if s < step and w < resumed]
            if before:
                pauses.append((resumed, resumed - max(before)))
        return pauses

    def last_step(self) -> int:
        """The largest env step any scalar was logged at (how far the run has come)."""
        return max((s.steps[-1] for s in self.series.values() if s.steps), default=0)

    def hyperparameters(self) -> dict[str, str]:
        """The ``hyperparameters`` table every script logs at its start, as strings."""
        return parse_table(self.texts.get("hyperparameters", ""))


def format_table(rows: dict) -> str:
    """``rows`` as the ``|param|value|`` markdown table runs log as text (``hyperparameters``, ``hardware``)."""
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in rows.items())


def parse_table(text: str) -> dict[str, str]:
    """``|param|value|`` markdown rows into a dict (the header and rule rows are skipped)."""
    rows = {}
    for line in text.splitlines():
        cells = line.strip().strip("|").split("|", 1)
        if len(cells) == 2 and cells[0] not in ("param", "-") and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells[1]
    return rows


def _file_order(path: Path) -> tuple[int, str]:
    """Event files in the order they were started: their names hold the creation time."""
    match = re.search(r"tfevents\.(\d+)", path.name)
    return (int(match.group(1)) if match else 0, path.name)
