"""Where one learning step of SAC and of DQN spends its time, against the floor the network maths sets on this CPU.

    python benchmark/offpolicy_profile.py                 # SAC (HalfCheetah sizes) and DQN (CartPole sizes)
    python benchmark/offpolicy_profile.py --section sac --steps 300

For each algorithm it builds the script's own networks, losses and optimizers (imported from cleanrl/, the
update written as the script's UPDATE section is), fills a replay with random transitions of the env's
sizes, and measures, one torch thread, alternating with Stable-Baselines3's ``train(gradient_steps=1)``
of the same sizes (SAC: 256-256, batch 256; DQN: 256-256, batch 128, no Double DQN, as in
benchmark/offpolicy_throughput.py):

* FLOPs per learning step (``torch.utils.flop_counter``: matrix products, forward and backward);
* the GEMM rate this core reaches at the step's own matrix shapes (each product timed alone), and so the
  floor: the step's FLOPs at that rate;
* CPU ms per learning step, ours and SB3's, alternated in rounds (the machine's speed drifts);
* ours split into its matrix products (timed alone) and everything else (elementwise kernels, the
  optimizer, replay sampling, Python and dispatch, cache misses), with its top kernels from ``torch.profiler``.

A SAC learning step is one critic update and, on average, one actor update (two every second step); a DQN
learning step is one gradient step (dqn.py makes 8 every 16 env steps).
"""

import argparse
import collections
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cleanrl_utils.buffers import ReplayBuffer  # noqa: E402
from cleanrl_utils.nan_guard import NaNGuard  # noqa: E402

GEMMS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "cleanrl" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def filled_buffer(obs_dim: int, action_shape: tuple, action_dtype, sample_action, size: int = 20_000) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    rb = ReplayBuffer(size + 10, 1, (obs_dim,), action_shape, np.float32, action_dtype, seed=1)
    for _ in range(size):
        rb.add(rng.standard_normal((1, obs_dim), dtype=np.float32), sample_action(rng), rng.standard_normal(1),
               rng.random(1) < 0.01, np.ones(1, bool))  # fmt: skip
    return rb


def sac_step(batch_size: int = 256):
    """One learning step of sac_continuous_action.py on HalfCheetah's sizes (17 observations, 6 actions)."""
    sac, cpu = script("sac_continuous_action"), torch.device("cpu")
    obs_dim, action_dim = 17, 6
    actor = sac.Actor(obs_dim, -np.ones(action_dim, np.float32), np.ones(action_dim, np.float32))
    qf, qf_target = sac.SoftQNetworks(obs_dim, action_dim), sac.SoftQNetworks(obs_dim, action_dim)
    qf_target.requires_grad_(False)
    q_params = list(qf.parameters())
    q_optimizer = torch.optim.Adam(q_params, lr=1e-3, fused=True)
    log_alpha = torch.tensor([math.log(0.2)], requires_grad=True)
    actor_params = [*actor.parameters(), log_alpha]
    actor_optimizer = torch.optim.Adam(actor_params, lr=3e-4, fused=True)
    nan_guard = NaNGuard(cpu)
    rb = filled_buffer(obs_dim, (action_dim,), np.float32, lambda rng: rng.uniform(-1, 1, (1, action_dim)))
    state = {"alpha": log_alpha.detach().exp(), "updates": 0}

    def step():
        data = rb.sample_to(batch_size, cpu)
        qf_loss, _ = sac.critic_loss(actor, qf, qf_target, data, state["alpha"], 0.99)
        q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        nan_guard.step(q_optimizer, nn.utils.get_total_norm([p.grad for p in q_params]), 0)
        state["updates"] += 1
        if state["updates"] % 2 == 0:
            qf.requires_grad_(False)
            for _ in range(2):
                loss, _ = sac.policy_loss(actor, qf, data["obs"], state["alpha"], log_alpha, -6.0, True)
                actor_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nan_guard.step(actor_optimizer, nn.utils.get_total_norm([p.grad for p in actor_params]), 0)
                state["alpha"] = log_alpha.detach().exp()
            qf.requires_grad_(True)
        sac.polyak_update_(qf_target, qf, 0.005)

    return step


def dqn_step(batch_size: int = 128):
    """One gradient step of dqn.py on CartPole's sizes (4 observations, 2 actions), without Double DQN."""
    dqn, cpu = script("dqn"), torch.device("cpu")
    q_network, target_network = dqn.QNetwork(4, 2), dqn.QNetwork(4, 2)
    target_network.load_state_dict(q_network.state_dict())
    optimizer = torch.optim.Adam(q_network.parameters(), lr=5e-4, fused=True)
    nan_guard = NaNGuard(cpu)
    rb = filled_buffer(4, (), np.int64, lambda rng: rng.integers(2, size=1))
    burst_size = 8  # dqn.py's default: one draw and one target pass per burst of 8 gradient steps
    burst, i = None, burst_size

    def step():
        nonlocal burst, i
        if i == burst_size:
            burst = rb.sample_to(batch_size * burst_size, cpu)
            with torch.no_grad():
                burst["next_q_target"] = target_network(burst["next_obs"])
            i = 0
        data = {k: v[i * batch_size : (i + 1) * batch_size] for k, v in burst.items()}
        i += 1
        loss, _ = dqn.td_loss(q_network, data, 0.99, False, True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(q_network.parameters(), 10.0)
        nan_guard.step(optimizer, grad_norm, 0)

    return step


SB3 = {
    "sac": lambda: __import__("stable_baselines3").SAC(
        "MlpPolicy", "HalfCheetah-v4", learning_starts=0, batch_size=256, buffer_size=30_000,
        policy_kwargs={"net_arch": [256, 256]}, seed=1, device="cpu"),
    "dqn": lambda: __import__("stable_baselines3").DQN(
        "MlpPolicy", "CartPole-v1", learning_rate=5e-4, buffer_size=30_000, learning_starts=0, batch_size=128,
        max_grad_norm=10, policy_kwargs={"net_arch": [256, 256]}, seed=1, device="cpu"),
}  # fmt: skip


def sb3_step(kind: str):
    """Stable-Baselines3's gradient step with the same sizes, on a replay of random transitions."""
    from stable_baselines3.common.logger import configure

    model = SB3[kind]()
    model.set_logger(configure(None, [""]))
    env = model.get_env()
    obs = env.reset()
    for _ in range(20_000):
        action = np.array([model.action_space.sample()])
        next_obs, reward, done, info = env.step(action)
        model.replay_buffer.add(obs, next_obs, action, reward, done, info)
        obs = next_obs
    return lambda: model.train(gradient_steps=1, batch_size=model.batch_size)


def flops(step, period: int) -> float:
    """Matrix-product FLOPs per step, over ``period`` steps (SAC's actor updates every second step, DQN's target
    network values a burst of 8 gradient steps at once)."""
    with FlopCounterMode(display=False) as counter:
        for _ in range(period):
            step()
    return counter.get_total_flops() / period


def gemm_rate(step, period: int) -> tuple[float, float]:
    """(GFLOP/s, ms per step) of every matrix product of ``period`` steps, each with its own shapes, timed alone."""
    from torch.profiler import profile

    shapes = collections.Counter()
    with profile(record_shapes=True) as prof:
        for _ in range(period):
            step()
    for event in prof.events():
        if event.name in GEMMS:
            shapes[(event.name, tuple(tuple(s) for s in event.input_shapes))] += 1
    total_flops, total_seconds = 0.0, 0.0
    for (name, shapes_in), count in shapes.items():
        tensors = [torch.randn(s) for s in shapes_in[: 2 if name in ("aten::mm", "aten::bmm") else 3]]
        run = {"aten::mm": torch.mm, "aten::bmm": torch.bmm, "aten::addmm": torch.addmm, "aten::baddbmm": torch.baddbmm}
        fn = run[name]
        a_shape, b_shape = (t.shape for t in tensors[-2:])
        product = 2 * (a_shape[0] if len(a_shape) == 3 else 1) * a_shape[-2] * a_shape[-1] * b_shape[-1]
        for _ in range(20):
            fn(*tensors)
        reps = max(20, int(1e9 / max(product, 1)))
        start = time.process_time()
        for _ in range(reps):
            fn(*tensors)
        total_flops += product * count
        total_seconds += (time.process_time() - start) / reps * count
    return total_flops / total_seconds / 1e9, total_seconds * 1e3 / period


def top_ops(step, steps: int, rows: int = 8) -> list[tuple[str, float]]:
    """The kernels that take the most of ours (torch.profiler, self CPU time), as shares of the profiled time."""
    from torch.profiler import profile

    with profile() as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    events.sort(key=lambda e: -e.self_cpu_time_total)
    return [(e.key, e.self_cpu_time_total / total) for e in events[:rows]]


def profile_one(kind: str, rounds: int, steps: int) -> None:
    ours, theirs = (sac_step if kind == "sac" else dqn_step)(), sb3_step(kind)
    period = 2 if kind == "sac" else 8
    for fn in (ours, theirs):
        for _ in range(16):
            fn()
    ours_flops, sb3_flops = flops(ours, period), flops(theirs, period)
    rate, gemm_ms = gemm_rate(ours, period)
    times = {"ours": [], "sb3": []}
    for r in range(rounds):  # alternated, in short rounds
        for name in ("ours", "sb3") if r % 2 == 0 else ("sb3", "ours"):
            fn = ours if name == "ours" else theirs
            start = time.process_time()
            for _ in range(steps):
                fn()
            times[name].append((time.process_time() - start) / steps * 1e3)
    ours_ms, sb3_ms = statistics.median(times["ours"]), statistics.median(times["sb3"])
    title = "SAC, HalfCheetah sizes, batch 256" if kind == "sac" else "DQN, CartPole sizes, batch 128"
    print(f"\n{title}; one learning step; {rounds} alternated rounds of {steps} steps; 1 torch thread")
    print("| | ours | stable-baselines3 |")
    print("| --- | ---: | ---: |")
    print(
        f"| MFLOP per step (matrix products, forward and backward) | {ours_flops / 1e6:.0f} | {sb3_flops / 1e6:.0f} |"
    )
    print(f"| CPU ms per step (median) | {ours_ms:.2f} | {sb3_ms:.2f} |")
    print(f"| GFLOP/s reached | {ours_flops / ours_ms / 1e6:.1f} | {sb3_flops / sb3_ms / 1e6:.1f} |")
    print(f"| floor: the matrix products alone, at the {rate:.0f} GFLOP/s this core reaches with their shapes (ms) "
          f"| {ours_flops / rate / 1e6:.2f} | {sb3_flops / rate / 1e6:.2f} |")  # fmt: skip
    print(f"| SB3 / ours | {sb3_ms / ours_ms:.2f} | |")
    print(
        f"\nours: {gemm_ms:.2f} ms of matrix products (timed alone) and {ours_ms - gemm_ms:.2f} ms of everything else "
        "(elementwise kernels, the optimizer, replay sampling, Python and dispatch, cache misses); its top kernels:"
    )
    print("| kernel | share of the step |")
    print("| --- | ---: |")
    for name, share in top_ops(ours, steps):
        print(f"| {name} | {share:.0%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", nargs="+", choices=["sac", "dqn"], default=["sac", "dqn"])
    parser.add_argument("--rounds", type=int, default=20, help="alternated rounds of ours and SB3")
    parser.add_argument("--steps", type=int, default=20, help="learning steps per round")
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps: must be at least 1")
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}")
    for kind in args.section:
        profile_one(kind, args.rounds, args.steps)


if __name__ == "__main__":
    main()
