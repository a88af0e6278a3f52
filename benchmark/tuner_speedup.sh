#!/usr/bin/env bash
# Trials per hour of cleanrl_utils/tuner.py with 1 vs 2 workers on this machine (ppo.py, CartPole-v1),
# and how many trials median pruning stopped early. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/tuner_speedup.py --trials 8 --repeats 2 --total-timesteps 16384 "$@"
