#!/usr/bin/env bash
# Synchronous PPO vs the asynchronous actor-learner on this machine, same run, same total envs:
# CartPole (ppo.py vs appo.py) and Breakout (ppo_atari.py vs appo_atari.py with gymnasium and
# EnvPool actors), with learner/actor idle fractions and policy lag; --sample-efficiency adds
# steps-to-450 on CartPole for 3 seeds. Needs: pip install -e ".[atari,envpool]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/appo_throughput.py "$@"
