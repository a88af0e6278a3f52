"""A stand-in training script for the tools' tests: this project's contract (tyro Args, validate,
runs/<run-name>/ event files with the hyperparameters table), no learning. The episodic return
follows a known schedule: ``500 * quality * step / total_timesteps + seed / 100`` at every
``--num-steps`` env steps, one point every ``--step-time`` seconds, so a test knows every value.
With ``--checkpoint-interval`` it writes a (content-free) checkpoint file every that many steps and
on SIGTERM, and ``--resume runs/<run>`` continues after the newest one, as the real scripts do.
"""

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cleanrl_utils.arguments import fail, parse_args  # noqa: E402
from cleanrl_utils.run import start_logging  # noqa: E402


@dataclass
class Args:
    exp_name: str = "fake_train"
    """name of this experiment"""
    env_id: str = "CartPole-v1"
    """the env id (only recorded)"""
    seed: int = 1
    """the seed (shifts the returns by seed / 100)"""
    total_timesteps: int = 1000
    """env steps of the run"""
    num_steps: int = 100
    """env steps between two logged episodes; must divide total_timesteps"""
    quality: float = 1.0
    """the final return is 500 * quality"""
    step_time: float = 0.02
    """seconds per logged episode"""
    crash_at: float | None = None
    """exit with code 3 at this fraction of the run"""
    nan_at: float | None = None
    """log a NaN return and stop as the scripts do at this fraction of the run"""
    run_name: str | None = None
    """the run directory under runs/"""
    track: bool = False
    """W&B (unused)"""
    wandb_project_name: str = "cleanRL"
    """W&B project (unused)"""
    threads: int = 1
    """threads (recorded)"""
    sps: float = 1000.0
    """the charts/SPS logged (plus the seed)"""
    world_size: int = 1
    """recorded as the distributed scripts record theirs"""
    progress: bool = True
    """console progress (unused)"""
    checkpoint_interval: int = 0
    """env steps between checkpoint files (0: none)"""
    resume: str | None = None
    """a run directory whose newest checkpoint this run continues after"""


def validate(args: Args, ranks=None) -> None:
    if args.total_timesteps % args.num_steps != 0:
        fail(f"--num-steps {args.num_steps}: must divide --total-timesteps {args.total_timesteps}")
    if args.quality < 0:
        fail(f"--quality {args.quality}: must be >= 0")


def main() -> None:
    args = parse_args(Args)
    validate(args)
    run_dir = Path("runs") / (args.run_name or f"{args.env_id}__{args.exp_name}__{args.seed}")
    first = args.num_steps
    if args.resume:
        done = int(sorted(Path(args.resume, "checkpoints").glob("ckpt_*.pt"))[-1].stem.split("_")[1])
        print(f"resuming after step {done}", flush=True)
        first = done + args.num_steps
    writer, _ = start_logging(args, run_dir, None, first - args.num_steps + 1 if args.resume else None)
    with open(run_dir / "pids", "a") as f:
        f.write(f"{os.getpid()}\n")
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))

    def checkpoint(step: int) -> None:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "checkpoints" / f"ckpt_{step:08d}.pt").write_text(f"{step}\n")

    for step in range(first, args.total_timesteps + 1, args.num_steps):
        fraction = step / args.total_timesteps
        if args.crash_at is not None and fraction >= args.crash_at:
            print("error: planned crash", flush=True)
            sys.exit(3)
        value = 500 * args.quality * fraction + args.seed / 100
        if args.nan_at is not None and fraction >= args.nan_at:
            writer.add_scalar("charts/episodic_return", float("nan"), step)
            writer.close()
            print(f"non-finite loss at step {step}", flush=True)
            sys.exit(1)
        writer.add_scalar("charts/episodic_return", value, step)
        writer.add_scalar("charts/SPS", args.sps + args.seed, step)
        writer.flush()
        if stop or (args.checkpoint_interval and step % args.checkpoint_interval == 0):
            checkpoint(step)
        if stop:
            writer.close()
            print(f"stopped by signal {stop[0]} at step {step}", flush=True)
            sys.exit(128 + stop[0])
        time.sleep(args.step_time)
    writer.close()
    print(f"done: {args.total_timesteps} steps", flush=True)


if __name__ == "__main__":
    main()
