#!/usr/bin/env bash
# One prepared check for a machine with an NVIDIA GPU: every script for a few iterations on CUDA
# (the torchrun ones with NCCL at world size 1), the host syncs per iteration of each hot loop, and
# throughput (ppo_atari_envpool.py at 8/32/64 envs with and without --compile, ppo_atari.py vs
# ppo_atari_multigpu.py) with the env / inference / learn shares. Under 8 minutes on one H200 with
# 16 cores (--budget); prints tables.
# Needs: a CUDA build of torch and pip install -e ".[atari,envpool]". On a machine that cannot reach
# PyPI, run benchmark/gpu_wheels.sh where it can first: the wheels and EnvPool's Atari part it puts in
# .whl/ are installed into /tmp/site here.
# Without a GPU: bash benchmark/gpu_check.sh --cpu --quick checks the harness itself.
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null || [ -f .whl/envpool-atari.tar.gz ]; then
    mkdir -p /tmp/site
    if compgen -G ".whl/*.whl" >/dev/null; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    fi
    if [ -f .whl/envpool-atari.tar.gz ]; then tar xzf .whl/envpool-atari.tar.gz -C /tmp/site; fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 benchmark/gpu_check.py "$@"
