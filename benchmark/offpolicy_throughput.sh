#!/usr/bin/env bash
# CPU cost of sac_continuous_action.py, dqn.py and dqn_atari.py beside Stable-Baselines3's SAC and DQN with
# the same settings, one torch thread each, alternated: whole-process CPU seconds and the learning phase.
# Prints tables. Needs: pip install -e ".[mujoco,atari,bench]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/offpolicy_throughput.py "$@"
