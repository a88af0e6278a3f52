#!/usr/bin/env bash
# Stable-Baselines3's DQN with dqn.py's default settings on CartPole-v1: its mean Q(s, a) beside the one a
# dqn.py run logged (--ours RUN_DIR), to tell a divergence of the settings from one of our code. Prints a table.
# Needs: pip install -e ".[bench]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/dqn_divergence.py "$@"
