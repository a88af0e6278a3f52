#!/usr/bin/env bash
# Wheels for benchmark/gpu_check.sh on a GPU machine that cannot reach PyPI but has CUDA torch,
# numpy, tensorboard, opencv and psutil (Python 3.12, x86-64): downloads the rest into .whl/ here;
# gpu_check.sh installs them from there. envpool (over 250 MB with its assets) is left out unless
# --envpool is given; without it gpu_check.sh skips ppo_atari_envpool.py.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=(gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 tyro==1.0.17 docstring-parser==0.18.0
    typeguard==4.6.1)
if [ "${1:-}" = "--envpool" ]; then
    wheels+=(envpool==1.2.5 envpool-assets==0.3.0 dm-env==1.6 dm-tree optree==0.20.0 types-protobuf glfw)
fi
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
du -sh .whl
