"""Scaling of ppo_atari_multigpu.py: 1 process vs 2 processes, measured in the same run.

    python benchmark/ppo_multigpu_scaling.py            # gloo on this machine's CPUs

Every process has the same settings (8 envs, 128 steps, 4 epochs x 4 minibatches, one torch
thread); 2 processes therefore run 16 envs in all. For each process count, gradient compression
none/bf16 and sync-every 1/4 (local SGD) are measured. Reported: training SPS (global), the
speed-up over 1 process with the same options, the all-reduce time per collective, the share
of the update phase spent communicating, and the time ranks wait for each other after their
rollouts (load imbalance, measured apart from the collectives by one barrier per iteration).

The same command lines on GPUs (NCCL is the default backend there):
    torchrun --standalone --nproc_per_node=1 cleanrl/ppo_atari_multigpu.py --num-envs 8
    torchrun --standalone --nproc_per_node=2 cleanrl/ppo_atari_multigpu.py --num-envs 16 --grad-compression bf16
    torchrun --standalone --nproc_per_node=8 cleanrl/ppo_atari_multigpu.py --num-envs 64 --sync-every 4
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def run(nproc: int, compression: str, sync_every: int, args: argparse.Namespace) -> dict[str, float]:
    envs = args.envs_per_process * nproc
    flags = ["--num-envs", str(envs), "--num-steps", str(args.num_steps), "--update-epochs", str(args.update_epochs)]
    flags += [
        "--num-minibatches",
        str(args.num_minibatches),
        "--total-timesteps",
        str(envs * args.num_steps * args.iterations),
    ]
    flags += ["--grad-compression", compression, "--sync-every", str(sync_every), "--threads", "1"]
    flags += ["--no-cuda", "--no-progress", "--checkpoint-interval", "0", "--run-name", "bench"]
    with tempfile.TemporaryDirectory() as cwd:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        cmd += [str(REPO / "cleanrl/ppo_atari_multigpu.py"), *flags]
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        s = read_scalars(Path(cwd) / "runs/bench")
    updates = args.update_epochs * args.num_minibatches
    collectives = updates if sync_every == 1 else -(-updates // sync_every)
    comm = float(np.mean(s["perf/comm_time"][1:]))
    learn = float(np.mean(s["perf/learn_time"][1:]))
    wait = float(np.mean(s["perf/rollout_wait_time"][1:]))
    return {
        "sps": s["charts/SPS"][-1],
        "comm_ms": 1000 * comm / collectives,
        "comm_share": comm / learn,
        "wait_ms": 1000 * wait,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs-per-process", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--update-epochs", type=int, default=4)
    parser.add_argument("--num-minibatches", type=int, default=4)
    parser.add_argument(
        "--iterations", type=int, default=4, help="iterations per run (the first is left out of the means)"
    )
    args = parser.parse_args()

    options = [(c, k) for c in ("none", "bf16") for k in (1, 4)]
    results = {(n, c, k): run(n, c, k, args) for n in (1, 2) for c, k in options}
    print(
        f"ppo_atari_multigpu.py, Breakout, per process: {args.envs_per_process} envs x {args.num_steps} steps, "
        f"{args.update_epochs} epochs x {args.num_minibatches} minibatches, 1 torch thread; gloo, {os.cpu_count()} CPUs"
    )
    print(
        "| procs | compression | sync-every |  SPS | vs 1 proc | all_reduce ms | comm % of update | rollout wait ms/it |"
    )
    print(
        "|-------|-------------|------------|------|-----------|---------------|------------------|--------------------|"
    )
    for (n, c, k), r in results.items():
        speedup = r["sps"] / results[(1, c, k)]["sps"]
        print(
            f"| {n:5d} | {c:11} | {k:10d} | {r['sps']:4.0f} | {speedup:8.2f}x | {r['comm_ms']:13.2f} "
            f"| {100 * r['comm_share']:15.1f}% | {r['wait_ms']:18.0f} |"
        )


if __name__ == "__main__":
    main()
