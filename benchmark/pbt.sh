#!/usr/bin/env bash
# Population-based training against its equal-compute baseline: ppo_continuous_action.py on HalfCheetah-v4,
# 8 members x 1M env steps, deciding every 100k; then 8 independent runs of the members' first flags and
# seeds; then the report (lineage.md, schedules.png, best.json; best and median of both).
# About 8M + 8M env steps: some five hours on 2 cores. Interrupted, the same command continues (the
# population and the baseline live in runs/<name>/optuna.db; members resume from their checkpoints).
#   benchmark/pbt.sh                      # HalfCheetah, as above
#   benchmark/pbt.sh --population 4 ...   # any pbt flag overrides
set -euo pipefail
cd "$(dirname "$0")/.."
common=(--script cleanrl/ppo_continuous_action.py --env-id HalfCheetah-v4 --population 8
        --total-timesteps 1000000 --ready 100000 --workers "$(getconf _NPROCESSORS_ONLN)" --study-name pbt-halfcheetah "$@")
python -m cleanrl_utils.pbt "${common[@]}"
python -m cleanrl_utils.pbt "${common[@]}" --baseline
python -m cleanrl_utils.pbt "${common[@]}" --report
