"""Vector-environment plumbing shared by the scripts: exact env snapshots and supervised workers.

``EnvSnapshot`` (the outermost wrapper of every sub-environment) and :func:`get_vector_state` /
:func:`set_vector_state` let a checkpoint hold the full state of every environment (physics or
emulator state, RNGs, time limits, frame stacks, episode accumulators, normalisation statistics),
so ``--resume`` continues the very episodes the run was in and reproduces an uninterrupted run.
The state is captured as plain values (see ``cleanrl_utils.checkpoint.encode``), never pickled.

``async_vector_env`` builds an ``AsyncVectorEnv`` whose workers ignore Ctrl-C (the main process
checkpoints and then stops them) under a ``WorkerGuard``: a worker that raises, dies or stops
answering within ``timeout`` seconds ends the run with an :class:`EnvWorkerError` naming the env id,
the worker and the cause, after every worker process has been terminated.
"""

from __future__ import annotations

import importlib
import multiprocessing
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, VectorEnv, VectorWrapper
from gymnasium.vector.async_vector_env import AsyncState, _async_worker

from cleanrl_utils.arguments import fail
from cleanrl_utils.checkpoint import Unencodable, decode, encode
from cleanrl_utils.run import RunError

# Attributes that describe an environment rather than hold its state.
_STRUCTURAL = frozenset(
    {
        "env",
        "envs",
        "spec",
        "_cached_spec",
        "metadata",
        "_metadata",
        "action_space",
        "observation_space",
        "_action_space",
        "_observation_space",
        "single_action_space",
        "single_observation_space",
        "_single_action_space",
        "_single_observation_space",
        "_saved_kwargs",
        "_ezpickle_args",
        "_ezpickle_kwargs",
        "render_mode",
    }
)


def _is_stats_object(value: Any) -> bool:
    """Small state holders kept as attributes by gymnasium wrappers (e.g. RunningMeanStd)."""
    return type(value).__name__ == "RunningMeanStd"


def _capture_layer(layer: Any) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if type(layer).__name__ == "RecordVideo":
        return state  # recording is not part of the dynamics; a resumed run starts a new video
    for name, value in vars(layer).items():
        if name in _STRUCTURAL:
            continue
        if _is_stats_object(value):
            state[name] = {"__object__": _capture_layer(value)}
            continue
        try:
            state[name] = encode(value)
        except Unencodable:
            # Renderers, emulator/simulator handles and the like; the emulator and simulator
            # state is captured below through their own APIs.
            pass
    ale = getattr(layer, "ale", None)
    if ale is not None and type(ale).__name__ == "ALEInterface":
        state["__ale__"] = encode(ale.cloneState(include_rng=True).serialize())
    data, model = getattr(layer, "data", None), getattr(layer, "model", None)
    if type(data).__name__ == "MjData" and model is not None:
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        buffer = np.empty(mujoco.mj_stateSize(model, spec))
        mujoco.mj_getState(model, data, buffer, spec)
        state["__mujoco__"] = encode(buffer)
    return state


def _restore_layer(layer: Any, state: dict[str, Any]) -> None:
    for name, value in state.items():
        if name == "__ale__":
            import ale_py

            layer.ale.restoreState(ale_py.ALEState(decode(value)))
        elif name == "__mujoco__":
            import mujoco

            mujoco.mj_setState(layer.model, layer.data, decode(value), mujoco.mjtState.mjSTATE_INTEGRATION)
        elif isinstance(value, dict) and "__object__" in value:
            _restore_layer(getattr(layer, name), value["__object__"])
        else:
            setattr(layer, name, decode(value))


def _layers(env: Any) -> list[Any]:
    """The wrapper chain from ``env`` down to (and including) its innermost environment."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper | VectorWrapper):
        layers.append(layers[-1].env)
    return layers


def register_env_family(env_id: str) -> None:
    """Register the optional family an env id names: ``dm_control/<domain>-<task>-v0`` through shimmy (the
    ``dm_control`` extra), as CleanRL names them. Call it where envs are made (also in worker processes)."""
    if env_id.startswith("dm_control/") and env_id not in gym.registry:
        import shimmy  # registers dm_control/* with gymnasium on import

        gym.register_envs(shimmy)


def finished_episodes(infos: dict[str, Any]) -> list[tuple[float, int]]:
    """(return, length) of every episode that ended on this step, from gymnasium's vector ``RecordEpisodeStatistics``."""
    if "_episode" not in infos:
        return []
    episode = infos["episode"]
    return [(float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(infos["_episode"])]


def check_env_id(env_id: str, atari: bool = False) -> None:
    """``--env-id`` must name a registered gymnasium env (``module:Env-v0`` imports the module that
    registers it, as ``gym.make`` does); with ``atari``, an ALE one. One line and exit 2 otherwise."""
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        try:
            register_env_family(name)
        except ImportError:
            fail(f"--env-id {env_id}: dm_control envs need the dm_control extra (pip install -e '.[dm_control]')")
        spec = gym.spec(name)
    except (ImportError, gym.error.Error) as e:
        fail(f"--env-id {env_id}: not a registered gymnasium environment ({e})")
    if atari and not str(spec.entry_point).startswith("ale_py"):
        fail(f"--env-id {env_id}: not an Atari (ALE) environment")


def envpool_atari_task(env_id: str) -> str:
    """The EnvPool Atari task ``--env-id`` names: an EnvPool id (``Breakout-v5``), or an ALE id of the
    same game (``BreakoutNoFrameskip-v4``, ``ALE/Breakout-v5``), as CleanRL's command lines use. EnvPool's
    v5 tasks have no sticky actions, like NoFrameskip-v4. One line and exit 2 for anything else."""
    import envpool

    name = env_id.removeprefix("ALE/").replace("NoFrameskip-v4", "-v5").replace("-v4", "-v5")
    if name not in envpool.list_all_envs():
        fail(f"--env-id {env_id}: not an EnvPool task (see envpool.list_all_envs())")
    if type(envpool.make_spec(name)).__name__ != "AtariEnvSpec":
        fail(f"--env-id {env_id}: not an Atari task of EnvPool")
    return name


def ale_rom(env_id: str, vector: bool = False) -> str:
    """The ALE ROM of the game ``--env-id`` names (``BreakoutNoFrameskip-v4``, ``ALE/Breakout-v5`` and
    EnvPool's ``Breakout-v5`` are ``breakout``); ``vector``: ALE's vector env must exist too. One line
    and exit 2 for a game ale-py does not ship."""
    import re

    import ale_py
    from ale_py import roms

    try:
        from ale_py.vector_env import AtariVectorEnv  # noqa: F401
    except ImportError:
        if vector:
            fail("ALE's vector env needs ale-py >= 0.11, which ships AtariVectorEnv (pip install -U ale-py)")
    gym.register_envs(ale_py)
    if env_id in gym.registry and "game" in gym.registry[env_id].kwargs:  # gymnasium's own ALE ids
        return gym.registry[env_id].kwargs["game"]
    game = env_id.removeprefix("ALE/").split("-")[0].removesuffix("NoFrameskip")
    rom = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", game).lower()
    if rom not in roms.get_all_rom_ids():
        fail(f"--env-id {env_id}: not an Atari game of ale-py (ROM {rom!r} not in ale_py.roms.get_all_rom_ids())")
    return rom


def atari_actions(env_id: str) -> int:
    """Actions of the game's minimal action set: what gymnasium's ALE envs, EnvPool and ALE's vector env use."""
    import ale_py
    from ale_py import roms

    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(roms.get_rom_path(ale_rom(env_id)))
    return len(ale.getMinimalActionSet())


class ALEVectorEnv:
    """ALE's own threaded vector env (``ale_py.vector_env.AtariVectorEnv``) with EnvPool's Atari interface.

    ALE does the standard preprocessing in C++: frame skip 4 with max-pooling, 84x84 grayscale, a
    4-frame stack, no-op starts, FIRE on reset, 108,000 frames at most per game, no sticky actions;
    its frames equal gymnasium's ``AtariPreprocessing`` pixel for pixel (tests/test_ale.py). Like
    EnvPool it autoresets on the next step after a game over or a truncation. Its own episodic-life
    mode resets the whole game on every lost life, so it is off here: a lost life terminates the
    training episode as ``atari_wrappers.EpisodicLifeEnv`` decides it (fewer lives, some left) and the
    game goes on. Rewards come out clipped to their sign, and as EnvPool does, ``info["reward"]``
    holds the raw score and ``info["terminated"]`` the game over, so ``EnvPoolGames`` counts whole games.
    Where it differs from ``ppo_atari.py``'s wrappers: the stack starts with zero frames (ours repeats
    the first), the no-op starts and FIRE on reset are ALE's own (other first frames after a reset), and
    a lost life is followed by a real transition (as in EnvPool), not by a reset step that presses FIRE.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int, num_threads: int = 0, noop_max: int = 30,
                 fire_reset: bool = True):  # fmt: skip
        from ale_py.vector_env import AtariVectorEnv

        self.env = AtariVectorEnv(
            ale_rom(env_id), num_envs, num_threads=num_threads, noop_max=noop_max, use_fire_reset=fire_reset,
            reward_clipping=False, episodic_life=False, repeat_action_probability=0.0,
        )  # fmt: skip
        self.metadata = self.env.metadata
        self.num_envs, self.seed = num_envs, seed
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.lives = np.zeros(num_envs, dtype=np.int64)

    @staticmethod
    def check(env_id: str) -> None:
        """Before any work: one line and exit 2 unless ``env_id`` names a game and ale-py has its vector env."""
        ale_rom(env_id, vector=True)

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Env i starts with seed ``seed + i``."""
        obs, info = self.env.reset(seed=self.seed)
        self.lives = info["lives"].astype(np.int64)
        return obs, info

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = info["lives"].astype(np.int64)
        life_lost = (lives > 0) & (lives < self.lives)  # after a reset step the count goes up again
        self.lives = lives
        info = {**info, "reward": reward, "terminated": terminated}
        return obs, np.sign(reward).astype(np.float32), terminated | life_lost, truncated, info

    def close(self) -> None:
        self.env.close()


class EnvSnapshot(gym.Wrapper):
    """Outermost wrapper of a sub-environment: exposes its whole state as the ``snapshot`` attribute.

    Reading ``snapshot`` captures every wrapper layer and the base environment; assigning to it
    restores them. It also remembers whether the last step ended the episode, because under
    next-step autoreset the reset is still pending at that point: a restored environment performs
    that pending reset on its next ``step``, exactly as the vector environment would have.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._episode_over = False
        self._pending_reset = False

    def reset(self, **kwargs):
        self._episode_over = self._pending_reset = False
        return self.env.reset(**kwargs)

    def step(self, action):
        if self._pending_reset:
            obs, info = self.reset()
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._episode_over = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info

    @property
    def snapshot(self) -> dict[str, Any]:
        layers = _layers(self.env)
        return {"episode_over": self._episode_over, "layers": [_capture_layer(layer) for layer in layers]}

    @snapshot.setter
    def snapshot(self, state: dict[str, Any]) -> None:
        layers = _layers(self.env)
        if len(layers) != len(state["layers"]):
            raise ValueError(f"saved environment has {len(state['layers'])} wrapper layers, this one has {len(layers)}")
        for layer, layer_state in zip(layers, state["layers"]):
            _restore_layer(layer, layer_state)
        self._episode_over = self._pending_reset = state["episode_over"]


def _base(envs: VectorEnv) -> VectorEnv:
    return _layers(envs)[-1]


def _vector_wrappers(envs: VectorEnv) -> list[Any]:
    """The vector wrappers that hold state (a ``WorkerGuard`` holds none: sync and async runs resume alike)."""
    return [w for w in _layers(envs)[:-1] if not isinstance(w, WorkerGuard)]


def get_vector_state(envs: VectorEnv) -> dict[str, Any]:
    """State of every sub-environment (through ``EnvSnapshot``) and of every vector wrapper.

    Must be called between steps of a next-step-autoreset vector env whose sub-environments
    are wrapped (outermost) in :class:`EnvSnapshot`.
    """
    wrappers = _vector_wrappers(envs)
    return {
        "envs": list(_base(envs).get_attr("snapshot")),
        "wrappers": [_capture_layer(w) for w in wrappers],
    }


def set_vector_state(envs: VectorEnv, state: dict[str, Any]) -> None:
    """Restore what :func:`get_vector_state` captured into freshly made and reset ``envs``."""
    base = _base(envs)
    if len(state["envs"]) != base.num_envs:
        raise ValueError(f"saved state has {len(state['envs'])} environments, this vector env has {base.num_envs}")
    wrappers = _vector_wrappers(envs)
    if len(wrappers) != len(state["wrappers"]):
        raise ValueError("saved vector env has a different stack of vector wrappers")
    base.set_attr("snapshot", list(state["envs"]))
    for wrapper, wrapper_state in zip(wrappers, state["wrappers"]):
        _restore_layer(wrapper, wrapper_state)


class EnvWorkerError(RunError):
    """An environment worker process raised, died or stopped answering."""

    on_every_rank = False  # one rank's worker: that rank reports it


def _worker_ignoring_ctrl_c(*args, **kwargs) -> None:
    # Ctrl-C reaches every process of the terminal's group; the main process checkpoints, then stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _async_worker(*args, **kwargs)


def async_vector_env(env_fns, env_id: str, timeout: float) -> WorkerGuard:
    """One worker process per env (observations in shared memory), next-step autoreset, supervised.

    The workers are forked, except once a process group exists (under torchrun): then NCCL's and
    gloo's threads run, and a fork copies the locks they hold without the threads that would release
    them. There the workers come from a fork server, a fresh process started before them.
    """
    import torch.distributed as dist

    context = "forkserver" if dist.is_available() and dist.is_initialized() else None
    envs = AsyncVectorEnv(
        env_fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP, worker=_worker_ignoring_ctrl_c, context=context
    )
    return WorkerGuard(envs, env_id, timeout)


class WorkerGuard(VectorWrapper):
    """Supervises the worker processes of an ``AsyncVectorEnv``.

    Each ``reset``/``step`` waits at most ``timeout`` seconds. A worker that raised, exited or did
    not answer in time turns into one :class:`EnvWorkerError` naming the env id, the worker index and
    the cause; all worker processes are terminated before it is raised, so nothing is left behind.
    """

    def __init__(self, env: AsyncVectorEnv, env_id: str, timeout: float):
        super().__init__(env)
        if not isinstance(env, AsyncVectorEnv):
            raise TypeError("WorkerGuard supervises an AsyncVectorEnv")
        self.env_id = env_id
        self.timeout = timeout

    def reset(self, *, seed=None, options=None):
        def call():
            self.env.reset_async(seed=seed, options=options)
            return self.env.reset_wait(timeout=self.timeout)

        return self._guarded("reset", call)

    def step(self, actions):
        def call():
            self.env.step_async(actions)
            return self.env.step_wait(timeout=self.timeout)

        return self._guarded("step", call)

    def _guarded(self, what: str, call):
        try:
            return call()
        except multiprocessing.TimeoutError:
            # Workers that have not answered yet are the ones that hang.
            pipes = self.env.parent_pipes
            slow = [i for i, p in enumerate(pipes) if p is not None and not p.closed and not p.poll(0)]
            cause = f"did not answer {what} within --env-timeout {self.timeout:g}s"
            self._fail(slow or list(range(len(pipes))), cause)
        except (EOFError, BrokenPipeError, ConnectionResetError) as e:
            deadline, dead = time.monotonic() + 2.0, []
            while not dead and time.monotonic() < deadline:  # a killed worker may not be reaped yet
                dead = [i for i, proc in enumerate(self.env.processes) if proc.exitcode is not None]
                time.sleep(0 if dead else 0.02)
            codes = {i: self.env.processes[i].exitcode for i in dead}
            cause = (
                "died (exit code " + ", ".join(f"{codes[i]}" for i in dead) + ")"
                if dead
                else f"lost its pipe ({type(e).__name__})"
            )
            self._fail(dead or list(range(len(self.env.processes))), cause)
        except Exception as e:
            failed = [i for i, p in enumerate(self.env.parent_pipes) if p is None]
            if not failed:
                raise
            self._fail(failed, f"raised {type(e).__name__}: {e}")

    def _fail(self, workers: list[int], cause: str):
        self.shutdown()
        names = ", ".join(str(i) for i in workers)
        noun = "worker" if len(workers) == 1 else "workers"
        raise EnvWorkerError(f"env {noun} {names} of {self.env_id} {cause}") from None

    def shutdown(self) -> None:
        """Terminate every worker now, whatever state the pipes are in, then release the env."""
        for proc in self.env.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self.env.processes:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        # The pending step/reset can never complete now; skip waiting for it in close().
        self.env._state = AsyncState.DEFAULT
        try:
            self.env.close(terminate=True)
        except Exception:
            pass


class EnvPoolGames:
    """Whole-game statistics of EnvPool's Atari envs, and which env's next step only resets it.

    EnvPool autoresets on the next step after a game ends (game over or truncation): that step
    ignores the action and returns reward 0, so it belongs to no game. A lost life sets
    ``terminated`` but the game goes on, so games end on ``info["terminated"]`` (game over) or
    truncation, and scores are sums of ``info["reward"]``, the unclipped reward.
    """

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.reset_next = np.zeros(num_envs, dtype=bool)  # the next step of this env only resets it

    def update(self, infos: dict[str, Any], truncated: np.ndarray) -> list[tuple[int, float, int]]:
        """Account one vector step; returns (env index, score, length) of every game it ended."""
        self.returns[self.reset_next], self.lengths[self.reset_next] = 0.0, 0
        self.returns += infos["reward"]
        self.lengths += ~self.reset_next
        self.reset_next = infos["terminated"].astype(bool) | truncated
        return [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(self.reset_next)]


class EpisodeVideo:
    """Video of one env for vector envs without ``RecordVideo`` (EnvPool): feed it rendered frames.

    Frames are kept only for the episodes that gymnasium's capped cubic schedule picks
    (0, 1, 8, 27, ..., then every 1000th), and each picked episode is written as an mp4.
    """

    def __init__(self, folder: str, fps: int = 30):
        self.folder, self.fps = folder, fps
        self.episode = 0
        self.frames: list[np.ndarray] = []

    @property
    def recording(self) -> bool:
        from gymnasium.utils.save_video import capped_cubic_video_schedule

        return capped_cubic_video_schedule(self.episode)

    def add(self, frame: np.ndarray) -> None:
        self.frames.append(frame)

    def record(self, envs, episode_over: bool) -> None:
        """One step of env 0 of an EnvPool vector env: keep its frame if this episode is filmed."""
        if self.recording:
            self.add(envs.render(env_ids=[0])[0])
        if episode_over:
            self.end_episode()

    def end_episode(self) -> None:
        if self.frames:
            from gymnasium.utils.save_video import save_video

            save_video(self.frames, self.folder, episode_index=self.episode, fps=self.fps)
        self.frames = []
        self.episode += 1
