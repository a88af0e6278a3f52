#!/usr/bin/env bash
# The learning suites behind docs/benchmarks.md: bash benchmark/learning.sh classic [mujoco atari scaled]
# (resumable: run it again after an interruption). Writes docs/benchmarks/<suite>/ and docs/benchmarks.md.
# Needs: pip install -e ".[all]"
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/learning.py "$@"
