#!/usr/bin/env bash
# Issue 14's GPU work, rerunnable on an H200 from the project root with the wheels in .whl/
# (experiments/scripts/gpu_wheels.sh; the peers' wheels: experiments/peer_wheels.txt).
#   bash experiments/scripts/issue14_gpu.sh ga OUT     device references of every op, then the GAs:
#                                                      backward (rmsnorm_bwd_h200.toml), forward regimes
#   bash experiments/scripts/issue14_gpu.sh peers OUT  every dispatch entry of the two GAs (committed
#                                                      under experiments/results/) against every peer
set -uo pipefail
stage=${1:?ga or peers}; out=${2:?output folder}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv > "$out/nvidia_smi.csv"
log="$out/log.txt"
if [ "$stage" = ga ]; then
  timeout 120 python3 -m pytest -q -rs tests/gpu/test_op_device_reference.py >> "$log" 2>&1
  echo "device references rc=$?" >> "$log"
  timeout 250 python3 experiments/scripts/ga_h200.py --config experiments/rmsnorm_bwd_h200.toml \
    --store /tmp/kf_bwd/store.duckdb --out "$out/bwd" >> "$log" 2>&1
  echo "bwd GA rc=$?" >> "$log"
  timeout 190 python3 experiments/scripts/ga_h200.py --config experiments/rmsnorm_h200_regimes.toml \
    --store /tmp/kf_fwd/store.duckdb --out "$out/fwd" >> "$log" 2>&1
  echo "fwd GA rc=$?" >> "$log"
  cp /tmp/kf_bwd/store.duckdb "$out/bwd/store.duckdb" 2>/dev/null
elif [ "$stage" = peers ]; then
  export QUACK_COMPILE_WORKERS=14
  timeout 250 python3 -m evo.cli.main bench --op rmsnorm_bwd --dispatch experiments/results/rmsnorm_bwd_h200/dispatch.json \
    --peer "torch.autograd(rms_norm)" --peer liger --peer quack --peer quack.autotuned --timeout-s 240 \
    --out "$out/bwd_peers" >> "$log" 2>&1
  echo "bwd peers rc=$?" >> "$log"
  timeout 300 python3 -m evo.cli.main bench --op rmsnorm --dispatch experiments/results/rmsnorm_h200_regimes/dispatch.json \
    --timeout-s 240 --out "$out/fwd_peers" >> "$log" 2>&1
  echo "fwd peers rc=$?" >> "$log"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,driver_version --format=csv >> "$out/nvidia_smi.csv"
tail -5 "$log"
