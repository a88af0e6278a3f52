"""Actor processes for the actor-learner scripts (appo*.py): start, supervise, stop.

The learner starts ``num_actors`` processes (spawned, not forked: the learner already runs torch's
thread pools, which a fork would copy half-alive). Each actor takes a free rollout slot, fills it
(the slots are shared-memory tensors the learner allocated) and hands back only the slot index and
a few statistics, as a :class:`Rollout`; the learner releases the slot once it has copied the batch.

Faults end the run with one line (:class:`ActorError`): an actor that raises (its error travels to
the learner), dies (its exit code), or stops delivering (``timeout`` seconds without any rollout).
An actor never outlives its learner: it checks for it while it waits for a slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import sys
import time
from collections.abc import Callable

import torch.multiprocessing as mp

from cleanrl_utils.run import RunError


class ActorError(RunError):
    """An actor process raised, died or stopped delivering rollouts."""

    on_every_rank = False  # one learner's actor: that rank reports it


@dataclasses.dataclass
class Rollout:
    """What an actor hands its learner for one filled slot."""

    actor: int
    slot: int
    version: int  # of the weights that acted
    episodes: list[tuple[float, int]]  # (return, length) of the episodes that ended in it
    wait: float  # seconds the actor waited for a free slot
    busy: float  # seconds it spent filling this one


class ActorChannel:
    """The queues between one learner and its actors, and the stop flag. Passed to every actor."""

    def __init__(self, ctx, num_slots: int):
        self.free, self.full, self.stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        self.learner_pid = os.getpid()
        for slot in range(num_slots):
            self.free.put(slot)
        self._waited = self._taken_at = 0.0

    # ---------------------------------------------------------------- actor side
    @contextlib.contextmanager
    def running(self, actor_id: int):
        """The body of an actor process: Ctrl-C is for the learner (which stops the actors), and an
        exception reaches the learner as one clear error."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        except Exception as e:
            self.full.put(("error", actor_id, f"{type(e).__name__}: {e}"))
            sys.exit(1)

    def take_slot(self) -> int | None:
        """A free slot to fill; None once the learner asks the actors to stop (or is gone)."""
        start = time.perf_counter()
        while not self.stop.is_set():
            try:
                slot = self.free.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != self.learner_pid:  # the learner is gone: do not outlive it (and skip
                    os._exit(0)  # flushing queues nobody reads, which would block forever)
                continue
            self._taken_at = time.perf_counter()
            self._waited = self._taken_at - start
            return slot
        return None

    def deliver(self, actor_id: int, slot: int, version: int, episodes: list[tuple[float, int]]) -> None:
        busy = time.perf_counter() - self._taken_at
        self.full.put(("rollout", Rollout(actor_id, slot, version, episodes, self._waited, busy)))


class ActorPool:
    """One process per entry of ``actor_args``, running ``target(actor_id, channel, *actor_args[actor_id])``."""

    def __init__(self, target: Callable, actor_args: list[tuple], num_slots: int, env_id: str, timeout: float):
        ctx = mp.get_context("spawn")
        self.channel = ActorChannel(ctx, num_slots)
        self.env_id, self.timeout = env_id, timeout
        self.processes = []
        for a, extra in enumerate(actor_args):
            proc = ctx.Process(target=target, args=(a, self.channel, *extra), daemon=True)
            proc.start()
            self.processes.append(proc)

    def _check_alive(self) -> None:
        dead = [a for a, p in enumerate(self.processes) if p.exitcode is not None]
        if dead:
            codes = ", ".join(str(self.processes[a].exitcode) for a in dead)
            raise ActorError(f"actor {', '.join(map(str, dead))} of {self.env_id} died (exit code {codes})")

    def next_rollout(self) -> Rollout:
        """The next filled slot; an actor that raised, died or hangs becomes an :class:`ActorError`."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = self.channel.full.get(timeout=0.5)
            except queue.Empty:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise ActorError(
                        f"no rollout from any actor of {self.env_id} within --actor-timeout {self.timeout:g}s"
                    ) from None
                continue
            if message[0] == "error":
                raise ActorError(f"actor {message[1]} of {self.env_id} raised {message[2]}")
            self._check_alive()  # the others may keep the queue busy after one of them died
            return message[1]

    def release(self, slot: int) -> None:
        """The learner is done with ``slot``: an actor may fill it again."""
        self.channel.free.put(slot)

    def queue_depth(self) -> int:
        """Filled slots waiting for the learner."""
        return self.channel.full.qsize()

    def close(self) -> None:
        """Stop every actor (killing those that do not stop within seconds) and release the queues."""
        self.channel.stop.set()
        for proc in self.processes:
            proc.join(timeout=3)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=3)
        for q in (self.channel.free, self.channel.full):
            q.cancel_join_thread()
            q.close()
