#!/usr/bin/env bash
# What a checkpoint costs each script and how much a preemption can lose at the default
# --checkpoint-interval (the interval tuner trials run with). Prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/checkpoint_overhead.py --repeats 2 "$@"
