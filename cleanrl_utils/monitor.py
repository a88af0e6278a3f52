"""Console progress and resource figures for the training scripts.

``Progress`` shows steps done of total, steps per second, the latest mean episodic return and the
ETA: a live bar when the console is a terminal, one plain line every ``interval`` seconds
otherwise (log files, SLURM output). ``ResourceMonitor`` reads the CPU utilisation of the run's
own processes (env workers included) and, when a GPU is used, its utilisation and memory.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import TextIO

import psutil
import torch


def _fmt_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "--:--"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


class Progress:
    """Live progress of a run on the console (stderr by default)."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        description: str = "",
        interval: float = 10.0,
        enabled: bool = True,
        stream: TextIO | None = None,
    ):
        self.total = total_steps
        self.start_step = start_step
        self.interval = interval
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.description = description
        self._t0 = time.perf_counter()
        self._last_print = -math.inf
        self._live = None
        if enabled and self.stream.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
            from rich.progress import Progress as RichProgress

            self._live = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._task = self._live.add_task(description, total=total_steps, completed=start_step, status="")
            self._live.start()

    def update(self, global_step: int, sps: float, mean_return: float | None) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self._t0
        rate = (global_step - self.start_step) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - global_step) / rate if rate > 0 else math.inf
        ret = "n/a" if mean_return is None else f"{mean_return:.2f}"
        status = f"SPS {sps:,.0f}  return {ret}  ETA {_fmt_duration(eta)}"
        if self._live is not None:
            self._live.update(self._task, completed=global_step, status=status)
        elif time.perf_counter() - self._last_print >= self.interval or global_step >= self.total:
            self._last_print = time.perf_counter()
            pct = 100.0 * global_step / self.total
            print(
                f"{self.description} step {global_step:,}/{self.total:,} ({pct:.1f}%)  {status}",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


class ResourceMonitor:
    """CPU utilisation of this process and its children, plus GPU figures for a CUDA device."""

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._root = psutil.Process(os.getpid())
        self._procs: dict[int, psutil.Process] = {}
        self.sample()  # prime psutil's per-process counters

    def sample(self) -> dict[str, float]:
        """Figures since the previous call: ``cpu_util`` in percent of one core, summed over processes."""
        try:
            current = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            current = [self._root]
        total = 0.0
        alive = {}
        for proc in current:
            known = self._procs.get(proc.pid, proc)
            try:
                total += known.cpu_percent(interval=None)
                alive[proc.pid] = known
            except psutil.Error:
                continue
        self._procs = alive
        figures = {"cpu_util": total, "num_processes": float(len(alive))}
        if self.device is not None and self.device.type == "cuda":
            figures["gpu_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            figures["gpu_memory_reserved_gb"] = torch.cuda.memory_reserved(self.device) / 2**30
            try:
                figures["gpu_util"] = float(torch.cuda.utilization(self.device))
            except Exception:
                pass  # needs NVML (pynvml); memory figures are still reported
        return figures


class DeviceClock:
    """Seconds spent in timed regions (``with clock: ...``), summed until :meth:`read`.

    On a GPU the host clock around asynchronous work measures the launch, not the work (and an
    NCCL all_reduce returns at once). There each region is bracketed by two CUDA events recorded on
    the current stream, which costs no host wait; :meth:`read`, called where the figure is logged,
    waits for the last event and sums the elapsed times. On the CPU the host clock is true: the
    work is done when the call returns (gloo included).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.seconds = 0.0
        self._start: float | torch.cuda.Event = 0.0

    def __enter__(self) -> DeviceClock:
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.events.append((self._start, end))
        else:
            self.seconds += time.perf_counter() - self._start

    def read(self) -> float:
        """Seconds in the regions timed since the last read (on a GPU: once they have run)."""
        if self.events:
            self.events[-1][1].synchronize()
        total = self.seconds + sum(start.elapsed_time(end) for start, end in self.events) / 1000.0
        self.events, self.seconds = [], 0.0
        return total
