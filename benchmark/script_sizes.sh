#!/usr/bin/env bash
# Lines per script against the style guide's budget, and the changed lines of each data-parallel
# variant against its single-process script (diff -w). Prints tables; exits 1 if a budget is exceeded.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmark/script_sizes.py "$@"
