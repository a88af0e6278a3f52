#!/usr/bin/env bash
# Throughput of the PPO scripts on this machine: Atari (Breakout, 8 envs: env-only stepping,
# learner-only updates, full training of ppo_atari.py sync/async and ppo_atari_envpool.py with EnvPool and ALE) and
# CartPole (ppo.py against Stable-Baselines3 with the same settings). Prints tables.
# Needs: pip install -e ".[atari,envpool,bench]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/ppo_throughput.py --section all "$@"
