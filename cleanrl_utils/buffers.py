"""A replay buffer that stores each observation once, for next-step-autoreset vector envs.

Why each observation is stored once: under gymnasium's next-step autoreset (and EnvPool's), the
observation returned by the step that ends an episode is the episode's real final observation,
and the step after it only resets the env (its action is ignored, its reward is 0). So every
env's stream of observations is o_0, o_1, ..., o_T (final), o'_0 (reset), ..., and the next
observation of the transition stored at step t is *always* the observation stored at step t + 1,
including at terminations and truncations (a truncated transition bootstraps from the real final
observation). Reset steps are stored (they keep the stream aligned) but never sampled.

Frame stacks (Atari): with ``frame_stack=k`` the observations are k stacked frames, and only the
newest frame of each step is stored. A stack is rebuilt from the frames of the same episode; at
the start of an episode the missing frames are copies of the first one, which is what gymnasium's
``FrameStackObservation`` (padding "reset") and EnvPool produce. One 84x84 frame per step instead of
two 4x84x84 stacks is 1/8 of the naive ``obs`` + ``next_obs`` layout.

Storage is one ring per env, allocated once at construction; memory stays flat afterwards.
"""

from typing import Any

import numpy as np
import torch


class ReplayBuffer:
    """Transitions of ``num_envs`` envs, ``capacity`` steps in all (``capacity // num_envs`` per env)."""

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        obs_dtype: Any = np.float32,
        action_dtype: Any = np.float32,
        frame_stack: int = 1,
        seed: int | None = None,
    ):
        if capacity < num_envs * (frame_stack + 2):
            raise ValueError(
                f"capacity {capacity} is too small for {num_envs} envs with a frame stack of {frame_stack}"
            )
        self.size = capacity // num_envs  # steps kept per env
        self.num_envs = num_envs
        self.frame_stack = frame_stack
        self.obs_shape = tuple(obs_shape)
        frame_shape = self.obs_shape[1:] if frame_stack > 1 else self.obs_shape
        if frame_stack > 1 and self.obs_shape[0] != frame_stack:
            raise ValueError(f"observations of shape {self.obs_shape} are not stacks of {frame_stack} frames")
        self.frames = np.zeros((self.size, num_envs, *frame_shape), dtype=obs_dtype)
        self.actions = np.zeros((self.size, num_envs, *action_shape), dtype=action_dtype)
        self.rewards = np.zeros((self.size, num_envs), dtype=np.float32)
        self.terminations = np.zeros((self.size, num_envs), dtype=np.bool_)
        self.valid = np.zeros((self.size, num_envs), dtype=np.bool_)  # False for reset steps
        # steps since the episode's first observation, capped at frame_stack - 1 (enough to rebuild stacks)
        self.age = np.zeros((self.size, num_envs), dtype=np.uint8)
        self.steps = 0  # observations written per env, ever
        self.rng = np.random.default_rng(seed)

    @property
    def nbytes(self) -> int:
        """Bytes held by the buffer's arrays."""
        return sum(a.nbytes for a in (self.frames, self.actions, self.rewards, self.terminations, self.valid, self.age))

    def __len__(self) -> int:
        """Transitions that can be sampled, summed over envs (an upper bound: reset steps included)."""
        return self.num_envs * max(0, min(self.steps, self.size) - self.frame_stack)

    def add(
        self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray, valid: np.ndarray
    ) -> None:
        """Record one vector step: ``obs`` is the observation ``action`` was taken in, ``reward`` and
        ``terminated`` what the step returned, ``valid`` False where the step only reset the env.

        The step's next observation arrives with the next call. An observation that follows a
        reset step is the first of an episode (frame stacks do not reach back past it).
        """
        i = self.steps % self.size
        self.frames[i] = obs[:, -1] if self.frame_stack > 1 else obs
        self.actions[i] = action
        self.rewards[i] = reward
        self.terminations[i] = terminated
        self.valid[i] = valid
        if self.steps == 0:
            self.age[i] = 0
        else:
            previous = (self.steps - 1) % self.size
            older = np.minimum(self.age[previous].astype(np.int64) + 1, self.frame_stack - 1)
            self.age[i] = np.where(self.valid[previous], older, 0)
        self.steps += 1

    def _stack(self, t: np.ndarray, env: np.ndarray) -> np.ndarray:
        """Observations (frame stacks) at ring positions ``t`` of envs ``env``."""
        if self.frame_stack == 1:
            return self.frames[t, env]
        age = self.age[t, env].astype(np.int64)
        k = np.arange(self.frame_stack)  # frame k of a stack is (frame_stack - 1 - k) steps back
        back = np.minimum(self.frame_stack - 1 - k[None, :], age[:, None])
        idx = (t[:, None] - back) % self.size
        return self.frames[idx, env[:, None]]

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        """A uniform batch of stored transitions (reset steps excluded): obs, actions, rewards,
        terminations, next_obs."""
        newest = self.steps - 1  # its outcome is not known yet: it cannot be sampled
        oldest = max(0, self.steps - self.size) + self.frame_stack - 1  # older stacks lost frames
        if newest - oldest <= 0:
            raise ValueError("not enough steps stored to sample")
        t_abs = np.empty(batch_size, dtype=np.int64)
        env = np.empty(batch_size, dtype=np.int64)
        filled = 0
        while filled < batch_size:  # rejection sampling: reset steps are rare
            n = batch_size - filled
            cand_t = self.rng.integers(oldest, newest, size=2 * n)
            cand_e = self.rng.integers(0, self.num_envs, size=2 * n)
            keep = self.valid[cand_t % self.size, cand_e]
            cand_t, cand_e = cand_t[keep][:n], cand_e[keep][:n]
            t_abs[filled : filled + len(cand_t)], env[filled : filled + len(cand_e)] = cand_t, cand_e
            filled += len(cand_t)
        t = t_abs % self.size
        return {
            "obs": self._stack(t, env),
            "actions": self.actions[t, env],
            "rewards": self.rewards[t, env],
            "terminations": self.terminations[t, env],
            "next_obs": self._stack((t + 1) % self.size, env),
        }

    def sample_to(self, batch_size: int, device: torch.device) -> dict[str, torch.Tensor]:
        """:meth:`sample` as tensors on ``device`` (see :func:`to_device`)."""
        return {k: to_device(v, device) for k, v in self.sample(batch_size).items()}

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint (tensors share the arrays' memory: no copy)."""
        arrays = {
            k: torch.from_numpy(getattr(self, k))
            for k in ("frames", "actions", "rewards", "terminations", "valid", "age")
        }
        return {**arrays, "steps": self.steps, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in ("frames", "actions", "rewards", "terminations", "valid", "age"):
            target = getattr(self, k)
            if tuple(state[k].shape) != target.shape:
                raise ValueError(f"saved replay {k} has shape {tuple(state[k].shape)}, this buffer {target.shape}")
            target[...] = state[k].numpy()
        self.steps = int(state["steps"])
        self.rng.bit_generator.state = state["rng"]


def to_device(array: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``array`` (an array or a CPU tensor) as a tensor on ``device``.

    To a GPU it goes through pinned memory and ``non_blocking``: a copy from ordinary (pageable) memory
    would first wait for all the work queued on the GPU. The pinned block comes from torch's caching
    host allocator, which reuses it only once the copy has finished, so the caller may drop it at once.
    """
    if device.type != "cuda":  # (the CPU: the array's memory itself, no copy)
        return torch.as_tensor(array) if device.type == "cpu" else torch.as_tensor(array, device=device)
    return torch.as_tensor(array).contiguous().pin_memory().to(device, non_blocking=True)
