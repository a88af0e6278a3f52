#!/usr/bin/env bash
# Steps until ppo.py's default settings solve CartPole-v1 (mean of the last 20 episodes >= 475 and
# = 500), for five seeds, 100k steps each. Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/ppo_sample_efficiency.py --seeds 1 2 3 4 5 "$@"
