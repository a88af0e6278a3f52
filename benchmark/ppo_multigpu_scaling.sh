#!/usr/bin/env bash
# Data-parallel PPO scaling on this machine: 1 vs 2 processes (gloo), each with gradient compression
# none/bf16 and sync-every 1/4; SPS, speed-up, all_reduce time per collective, share of the update.
# The GPU command lines are in benchmark/ppo_multigpu_scaling.py's docstring.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/ppo_multigpu_scaling.py "$@"
