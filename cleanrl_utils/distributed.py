"""Ranks and collectives: this process's place among the processes of one run, its device and process
group, the run plan (which run, which checkpoint, each rank's part of it), collective checkpoint
writes, the agreed stop and a rank that stops answering. None of it is an algorithm.

One code path for 1..N processes. ``Ranks.from_env()`` reads what torchrun sets (``RANK`` is the
global rank, ``LOCAL_RANK`` picks the device, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``); a plain
``python`` launch, and every single-process script, is rank 0 of 1 and never starts a process group.
``cleanrl_utils.run.setup`` then picks the device, joins the process group (nccl with CUDA, gloo
otherwise) and opens a gloo *side group* for everything that is not a tensor of the model: Python
objects (checkpoint parts, the run plan, per-rank statistics) and the host-level agreements (the
barrier after the rollouts, the largest NaN record, the stop signal). On a gloo group the host call
completes the transfer, and a peer that is gone raises in Python (after ``--dist-timeout`` at most) so
the run can say which rank it lost. On the NCCL group the same calls would be queued on the GPU, the
host would wait for them in a CUDA sync, and NCCL's watchdog would abort the process there without a
word. The process group is left (``destroy_process_group``) on every exit path: error, signal, NaN or
the end.

Checkpoints are read and written by rank 0 alone (no shared filesystem needed): at a checkpoint
every rank hands rank 0 its own part (env state, RNG states, replay shard, parameter digest), rank 0
writes one file, and every rank waits for the outcome before it may go on or exit. At a resume rank
0 reads the file and hands each rank its own part back (re-split by ``cleanrl_utils.reshard`` when
the number of processes changed).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn as nn

from cleanrl_utils.arguments import default_run_name, fail, find_checkpoint, note, read_checkpoint
from cleanrl_utils.checkpoint import CheckpointError
from cleanrl_utils.reshard import reshard

PEER_WATCH_GRACE = 30.0  # seconds NCCL's own timeout adds to --dist-timeout (see Ranks.watch_peers)


def check_devices(args: Any, local_world_size: int) -> None:
    """Validation lines (exit 2) for the device flags (``--cuda``, ``--backend``, ``--device-ids``), before any
    process group starts."""
    cuda, backend, device_ids = args.cuda and torch.cuda.is_available(), args.backend, args.device_ids
    if backend == "nccl" and not cuda:
        fail("--backend nccl: needs CUDA (use gloo on CPUs)")
    if not cuda:
        return
    count = torch.cuda.device_count()
    if device_ids is not None:
        if len(device_ids) != local_world_size:
            fail(f"--device-ids {device_ids}: needs one GPU per local process (LOCAL_WORLD_SIZE={local_world_size})")
        bad = [i for i in device_ids if not 0 <= i < count]
        if bad:
            fail(f"--device-ids {device_ids}: GPU {bad[0]} does not exist (this node has {count})")
        if (backend or "nccl") == "nccl" and len(set(device_ids)) != len(device_ids):
            fail(f"--device-ids {device_ids}: NCCL needs a different GPU for every process (or use --backend gloo)")
    elif count < local_world_size:
        fail(f"{local_world_size} processes on this node but only {count} GPUs (use --device-ids or --no-cuda)")


def select_device(cuda: bool, local_rank: int, device_ids: list[int] | None) -> torch.device:
    """``cuda:<device_ids[local_rank]>`` (``cuda:<local_rank>`` without ids) when CUDA is used, else the CPU."""
    if not cuda:
        return torch.device("cpu")
    return torch.device("cuda", device_ids[local_rank] if device_ids else local_rank)


@dataclasses.dataclass
class Ranks:
    """This process's place among the processes of one run."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    distributed: bool = False  # launched by torchrun (even with one process): a process group exists
    device: torch.device = torch.device("cpu")
    timeout: float = 600.0
    store: Any = None  # this attempt's keys (prefixed) of torchrun's store
    run_store: Any = None  # torchrun's store, unprefixed: it outlives a restart of the workers
    objects: Any = None  # the gloo side group for Python objects and host-level agreements
    _agents: list[str] | None = None  # this attempt's torchrun agents, until the first checkpoint records them
    step: int = 0  # the env step the run has reached, and its last good checkpoint (for the lost-rank line)
    last_checkpoint: Path | None = None
    lost: bool = False  # a rank stopped answering: the process group is not destroyed at exit

    @classmethod
    def from_env(cls) -> Ranks:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", 0)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            distributed="RANK" in env,
        )

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, records video and reads and writes checkpoints."""
        return self.rank == 0

    # ----------------------------------------------------------------------------------------
    def join_process_group(
        self, cuda: bool, backend: str | None, device_ids: list[int] | None, timeout: float
    ) -> torch.device:
        """Pick this rank's device and join the process group (under torchrun); returns the device."""
        cuda = cuda and torch.cuda.is_available()
        self.device = select_device(cuda, self.local_rank, device_ids)
        self.timeout = timeout
        if cuda:
            torch.cuda.set_device(self.device)
        if self.distributed:
            self._init_process_group(backend or ("nccl" if cuda else "gloo"))
        return self.device

    def _init_process_group(self, backend: str) -> None:
        """Join the group torchrun describes in MASTER_ADDR / MASTER_PORT, with a store prefixed per attempt.

        After a failed worker torchrun restarts every worker but keeps its store; without the prefix
        the new ranks would read the dead ranks' addresses and gloo's connectFullMesh is refused
        (pytorch/pytorch#135712).
        """
        timeout = datetime.timedelta(seconds=self.timeout)
        agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # torchrun's agent hosts it
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            self.world_size,
            is_master=not agent_store and self.rank == 0,
            timeout=timeout,
            multi_tenant=not agent_store,
        )
        self.run_store = store if agent_store else None
        self.store = dist.PrefixStore(f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        dist.init_process_group(
            backend,
            store=self.store,
            rank=self.rank,
            world_size=self.world_size,
            # NCCL's watchdog gives a lost peer PEER_WATCH_GRACE more than the peer watch, which names it first
            timeout=timeout + datetime.timedelta(seconds=PEER_WATCH_GRACE if backend == "nccl" else 0),
            device_id=self.device if backend == "nccl" else None,
        )
        self.objects = dist.new_group(backend="gloo", timeout=timeout)
        atexit.register(self.close)  # also on the paths that leave before the run's ``finally`` (exit 2 in set-up)
        if backend == "nccl":
            threading.Thread(target=self.watch_peers, name="peer-watch", daemon=True).start()

    def watch_peers(self, period: float = 1.0) -> None:
        """Name a rank that stops answering while this one waits inside an NCCL collective (a thread of its own).

        A collective whose peer is gone blocks the host inside a CUDA wait, where Python never runs, until
        NCCL's watchdog aborts the process without a word. So every rank beats on the store every ``period``
        seconds from this daemon thread (torch releases the GIL in its kernels and file writes: a busy rank
        still beats) and watches the others' beats. When one has not beaten for --dist-timeout, the lowest
        rank still beating says so in one line, as ``exit_on_lost_rank`` does, and every live rank exits 1.
        """
        peers = [r for r in range(self.world_size) if r != self.rank]
        last_change = {r: (None, time.monotonic()) for r in peers}
        beat = 0
        while True:
            beat += 1
            try:
                self.store.set(f"beat/{self.rank}", str(beat))
                beats = {r: self.store.get(f"beat/{r}") if self.store.check([f"beat/{r}"]) else None for r in peers}
            except Exception:  # the store itself is gone: it lived with a rank (or agent) that stopped
                beats = None
            now = time.monotonic()
            if beats is None:
                silent = None
            else:
                for r, value in beats.items():
                    if value != last_change[r][0]:
                        last_change[r] = (value, now)
                silent = [r for r, (_, since) in last_change.items() if now - since > self.timeout]
                if not silent:
                    time.sleep(period)
                    continue
            self.lost = True
            who = (
                f"rank {', '.join(map(str, silent))} stopped answering"
                if silent
                else "the rendezvous store stopped answering"
            )
            live = [r for r in range(self.world_size) if r not in (silent or [])]
            if not live or self.rank == min(live):
                print(f"error: {who}: no reply within --dist-timeout {self.timeout:g}s at step {self.step}; "
                      f"last good checkpoint: {self.last_checkpoint or 'none'}", file=sys.stderr, flush=True)  # fmt: skip
            else:
                time.sleep(1.0)  # let the lowest live rank speak first
            os._exit(1)  # the main thread is stuck in a CUDA wait: no finally block would ever run

    def close(self) -> None:
        """Leave the process group (every rank, on every exit path, so none warns or hangs at exit). Not after a
        lost rank: destroying an NCCL group waits for the collectives queued on it, which the lost rank never joins."""
        if self.distributed and dist.is_initialized() and not self.lost:
            dist.destroy_process_group()

    # ---------------------------------------------------------------------------------------- objects
    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere), over the side group."""
        if not self.distributed:
            return [obj]
        out = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, out, dst=0, group=self.objects)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank, over the side group."""
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.objects)
        return box[0]

    def scatter(self, objs: list[Any] | None) -> Any:
        """Rank r receives ``objs[r]`` from rank 0, over the side group."""
        if not self.distributed:
            return objs[0]
        box = [None]
        dist.scatter_object_list(box, objs if self.is_main else None, src=0, group=self.objects)
        return box[0]

    # ---------------------------------------------------------------------------------------- the run plan
    def plan(self, args: Any, script_file: str) -> tuple[Path, dict[str, Any] | None]:
        """Which run this launch is, and what each rank restores; returns (run_dir, this rank's checkpoint).

        Rank 0 names the run (stable across torchrun restarts: it carries torchrun's run id), finds
        the checkpoint (``--resume``, or the newest one of the run after a torchrun restart), reads
        it and hands every rank the shared part plus its own (a single-process script's checkpoint is
        all shared). Refusals are one line and exit 2 on every rank. The resume rule
        (``cleanrl_utils.arguments.resumed_args``) then applies to the checkpoint's settings.

        Rank 0 alone writes checkpoints, on its own node. A restart that puts rank 0 on a node that
        does not hold the newest one (torchrun's store remembers its step and host) is refused rather
        than starting the run again from an older file or from step 0.
        """
        script = Path(script_file).name
        plan: dict[str, Any] = {"error": None, "run_name": None, "path": None}
        parts = None
        agents = self.gather(agent_identity()) if self.distributed else None
        if self.is_main:
            run_id = os.environ.get("TORCHELASTIC_RUN_ID")
            restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) > 0
            restarted = restarted or same_launch(Path("runs") / default_run_name(args, run_id), agents)
            try:
                plan["run_name"], path = find_checkpoint(args, run_id, restarted)
                saved = read_checkpoint(path, script) if path is not None else None
                if restarted:  # (with --resume the run's name is the checkpoint's)
                    name = saved["run_name"] if saved is not None else plan["run_name"]
                    self._refuse_a_lost_checkpoint(name, saved and saved["global_step"])
                if saved is not None:
                    own_parts = saved.get("ranks", [{}])
                    if saved.get("world_size", 1) != self.world_size:  # elastic: re-split by global env index
                        own_parts = reshard(own_parts, self.world_size, str(path))
                        plan["resharded"] = f" ({saved['world_size']} processes -> {self.world_size})"
                    plan["run_name"], plan["path"] = saved["run_name"], str(path)
                    shared = {k: v for k, v in saved.items() if k not in ("ranks", "world_size")}
                    parts = [{**shared, **own} for own in own_parts]
            except CheckpointError as e:
                plan["error"] = str(e)
        plan = self.broadcast(plan)
        if plan["error"] is not None:
            fail(plan["error"])
        self._agents = agents
        checkpoint = None
        if plan["path"] is not None:
            checkpoint = self.scatter(parts)
            note(f"resuming from {plan['path']}{plan.get('resharded', '')}")
        return Path("runs") / plan["run_name"], checkpoint

    def _refuse_a_lost_checkpoint(self, run_name: str, found_step: int | None) -> None:
        """After a torchrun restart: raise CheckpointError if the run wrote a newer checkpoint than rank 0 finds."""
        key = f"cleanrl/checkpoint/{run_name}"
        if self.run_store is None or not self.run_store.check([key]):
            return
        step, host = self.run_store.get(key).decode().split(" ", 1)
        if found_step is None or found_step < int(step):
            has = "no checkpoint of it" if found_step is None else f"only the checkpoint of step {found_step}"
            raise CheckpointError(
                f"torchrun restarted runs/{run_name} with rank 0 on {socket.gethostname()}, which has {has}; the "
                f"newest (step {step}) is on {host}: give the nodes one shared runs/ directory, or keep rank 0's node"
            )

    def _record_checkpoint(self, run_name: str, global_step: int) -> None:
        """Remember in torchrun's store which host holds the run's newest checkpoint (best effort)."""
        if self.run_store is not None:
            with contextlib.suppress(RuntimeError):  # a store that is gone: torchrun itself is going down
                self.run_store.set(f"cleanrl/checkpoint/{run_name}", f"{global_step} {socket.gethostname()}")

    # ---------------------------------------------------------------------------------------- checkpoints
    def save_collectively(self, write: Callable[[list[dict[str, Any]]], Path], own: dict[str, Any], global_step: int,
                          run_name: str) -> Path:  # fmt: skip
        """Collective: every rank's ``own`` part (CPU data only) goes to rank 0, which calls ``write(parts)`` (it
        writes the one file and returns its path); every rank returns that path once it is on disk.

        ``own["parameters_sha256"]`` must be equal on every rank (one model), or nothing is written. Every
        rank waits for rank 0's outcome, so none leaves before its part is on disk, and a failed write
        raises the same :class:`CheckpointError` on every rank.
        """
        parts = self.gather(own)
        outcome: dict[str, Any] = {"path": None, "error": None}
        if self.is_main:
            try:
                if len({repr(p.get("parameters_sha256")) for p in parts}) != 1:
                    raise CheckpointError(f"ranks hold different parameters at step {global_step}; not checkpointing")
                outcome["path"] = str(write(parts))
                self._record_checkpoint(run_name, global_step)
                if self._agents is not None:  # once per attempt: the agents a membership change restarts
                    record_launch(Path(outcome["path"]).parent, self._agents)
                    self._agents = None
            except CheckpointError as e:
                outcome["error"] = str(e)
        outcome = self.broadcast(outcome)
        if outcome["error"] is not None:
            raise CheckpointError(outcome["error"])
        return Path(outcome["path"])

    # ---------------------------------------------------------------------------------------- agreement
    def wait_for_all(self) -> float:
        """Wait until every rank gets here (on the side group); returns the seconds waited. Ranks finish their
        rollouts at different times (games differ in speed): waiting once, here, keeps that imbalance out
        of the timings of the collectives that follow."""
        start = time.perf_counter()
        if self.distributed:
            dist.barrier(group=self.objects)
        return time.perf_counter() - start

    def agree_on_signal(self, signum: int | None) -> int:
        """The largest signal number any rank received (0: none), so every rank stops at the same point."""
        return int(self.max(torch.tensor(signum or 0)))

    def max(self, value: torch.Tensor) -> torch.Tensor:
        """The largest ``value`` over all ranks (on the CPU, over the side group), so every rank decides the same.

        A value on the GPU is read first (the one host wait of the agreement)."""
        value = value.detach().to("cpu", copy=True)
        if self.distributed:
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=self.objects)
        return value

    def exit_on_lost_rank(self, error: BaseException, global_step: int, last: Path | None) -> NoReturn:
        """A collective failed (timed out, or a peer vanished): name the rank(s) that stopped answering.

        Re-raises ``error`` when it is not a collective failure. The ranks still alive check in on
        the store, wait a moment for each other, and the lowest of them says which ranks did not,
        in one line; every live rank exits with code 1.
        """
        text = str(error)
        collective = isinstance(error, dist.DistError) or any(
            s in text for s in ("Timed out", "timed out", "Connection closed by peer", "Connection reset by peer")
        )
        if not (self.distributed and collective):
            raise error
        silent: list[int] | None = None
        try:
            self.store.set(f"alive/{self.rank}", "1")
            deadline = time.monotonic() + min(5.0, self.timeout / 2)
            while time.monotonic() < deadline:
                silent = [r for r in range(self.world_size) if not self.store.check([f"alive/{r}"])]
                if not silent:
                    break
                time.sleep(0.2)
        except Exception:
            silent = None  # the store itself is gone (it lived with a rank that stopped)
        who = f"rank {', '.join(map(str, silent))} stopped answering" if silent else "a rank stopped answering or left"
        timed_out = "imed out" in text
        why = f"no reply within --dist-timeout {self.timeout:g}s" if timed_out else "its connection closed"
        message = f"error: {who}: {why} at step {global_step}; last good checkpoint: {last or 'none'}"
        self.lost = True
        live = [r for r in range(self.world_size) if r not in (silent or [])]
        if not live or self.rank == min(live):
            print(message, file=sys.stderr, flush=True)
        else:
            time.sleep(1.0)  # let the lowest live rank speak before torchrun stops the others
        raise SystemExit(1)


LAUNCH_FILE = "torchrun_agents.json"


def agent_identity() -> str:
    """This worker's torchrun agent as ``host:pid:start time``: the same for every attempt of one launch.

    torchrun restarts its workers after a failure (TORCHELASTIC_RESTART_COUNT counts those) and also
    when a node joins or leaves (that count stays 0): the agents of such a restart are the same
    processes, while a new launch of the same command (a requeued job) has new ones.
    """
    ppid = os.getppid()
    try:  # field 22 of /proc/<pid>/stat, the start time, tells a reused pid from the same process
        started = Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "?"
    return f"{socket.gethostname()}:{ppid}:{started}"


def same_launch(run_dir: Path, agents: list[str] | None) -> bool:
    """Does ``run_dir`` belong to this very torchrun launch (one of its agents wrote its checkpoints)?"""
    if agents is None:
        return False
    try:
        recorded = json.loads((run_dir / "checkpoints" / LAUNCH_FILE).read_text())["agents"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return bool(set(recorded) & set(agents))


def record_launch(directory: Path, agents: list[str]) -> None:
    """Write the agents of this attempt beside its checkpoints (atomically; best effort)."""
    tmp = directory / f".{LAUNCH_FILE}.tmp{os.getpid()}"
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps({"agents": sorted(set(agents))}))
        os.replace(tmp, directory / LAUNCH_FILE)


def parameters_digest(*modules: nn.Module) -> str:
    """SHA-256 of the parameters' bytes: equal on all ranks exactly when the models are identical."""
    digest = hashlib.sha256()
    for module in modules:
        for p in module.parameters():
            digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it moved to the CPU (what one rank sends another must not name its GPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value


def log_rank_stats(run: Any, gathered: list[dict[str, Any]], global_step: int) -> None:
    """Rank 0 logs every rank's episodes (``episodes``: (step, return, length)) and SPS (``sps``), and
    the slowest rank's value of every other entry (timings) as ``perf/<key>``."""
    for r, stats in enumerate(gathered):
        run.writer.add_scalar(f"perf/SPS_rank{r}", stats["sps"], global_step)
        for step_at, episodic_return, episodic_length in stats["episodes"]:
            run.log_episode(step_at, episodic_return, episodic_length)
    for key in sorted(gathered[0].keys() - {"sps", "episodes"}):
        run.writer.add_scalar(f"perf/{key}", max(stats[key] for stats in gathered), global_step)
