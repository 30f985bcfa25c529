#!/usr/bin/env bash
# The GPU test files on a Hopper GPU machine, each in a process of its own (a kernel that faults ends only its file's
# CUDA context), logs in OUT/verify/. kda_device_x.log and kda_overlap_varlen_x.log came from
#   pytest -v -x tests/gpu/test_kda_device.py   (stopped by its 290 s limit at 92%)
#   pytest -v -x tests/gpu/test_kda_device.py -k "beside_the_prep or varlen"   (the overlapped plan's fault)
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
bash experiments/scripts/lab_gpu.sh verify "${OUT:-experiments/results/gate/h100/gpu_tests}"
