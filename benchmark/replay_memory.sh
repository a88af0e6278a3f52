#!/usr/bin/env bash
# Replay memory for 1M Atari transitions (naive layout vs ours, and per rank with 1/2/4/8 shards),
# and SPS of the single-process vs 2-process off-policy scripts (DQN Breakout, SAC HalfCheetah).
# Needs: pip install -e ".[atari,mujoco]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/replay_memory.py "$@"
