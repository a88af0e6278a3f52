#!/usr/bin/env bash
# Throughput of sac_continuous_action.py and dqn.py (eager and --compile) beside Stable-Baselines3's SAC
# and DQN with the same sizes, one torch thread each, over the learning phase. Prints tables.
# Needs: pip install -e ".[mujoco,bench]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/offpolicy_throughput.py "$@"
