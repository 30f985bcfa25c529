#!/usr/bin/env bash
# Download the wheels listed in experiments/gpu_wheels.txt into .whl/ for the GPU machine (CPython
# 3.12, x86-64 manylinux), then print the two lines that install them there.
# Usage, from the project root: bash experiments/scripts/gpu_wheels.sh [LIST [DIR]]
# (default: experiments/gpu_wheels.txt into .whl/)
set -euo pipefail
cd "$(dirname "$0")/../.."
list=${1:-experiments/gpu_wheels.txt}
dir=${2:-.whl}
mkdir -p "$dir"
mapfile -t pkgs < <(grep -v '^\s*#' "$list" | grep -v '^\s*$')
plat=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64; do plat+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dir" "${pkgs[@]}"
ls "$dir"
echo "on the GPU machine:"
echo "  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl"
echo "  export PYTHONPATH=/tmp/site:\$PWD"
