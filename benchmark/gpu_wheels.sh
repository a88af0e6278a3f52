#!/usr/bin/env bash
# What benchmark/gpu_check.sh needs on a GPU machine that cannot reach PyPI but has CUDA torch, numpy,
# tensorboard, opencv and psutil (Python 3.12, x86-64): the missing wheels, and EnvPool's Atari part,
# all into .whl/ here (about 9 MB, within what travels with the working tree); gpu_check.sh installs
# them from there.
#
# EnvPool's wheel and assets are over 250 MB; the Atari part is 4 MB compressed: its Python files,
# atari/atari_envpool.so, envpool.libs, the Atari ROMs of envpool-assets, and an entry point cut to the
# Atari registration (.whl/envpool-atari.tar.gz, unpacked beside the wheels).
#
#   bash benchmark/gpu_wheels.sh                 # for the GPU machine (cp312)
#   bash benchmark/gpu_wheels.sh --python 3.11   # for this machine's Python, to try the tree here
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=3.12
if [ "${1:-}" = "--python" ]; then python_version="$2"; fi
wheels=(gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 tyro==1.0.17 docstring-parser==0.18.0
    typeguard==4.6.1 dm-env==1.6 dm-tree==0.1.9 optree==0.20.0)
platforms=()
for n in 17 24 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
        "${platforms[@]}" --platform manylinux2014_x86_64 -d "$@"
}
mkdir -p .whl
rm -f .whl/*.whl .whl/envpool-atari.tar.gz
download .whl "${wheels[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download "$work" envpool==1.2.5 envpool-assets==0.3.0
python3 benchmark/gpu_wheels_envpool.py "$work" "$work/tree"
tar czf .whl/envpool-atari.tar.gz -C "$work/tree" envpool envpool.libs envpool_assets
du -sh .whl
