#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: the rmsnorm package exported from ../store.duckdb.gz (the runs named in
# experiments/packages/rmsnorm.env), installed, its own benchmark against every peer (the env file's BENCHES, one
# process a table, in order), then its own GPU tests. Each step is skipped when already done
# (experiments/scripts/package_proof.sh --help); results go to OUT/rmsnorm/ (OUT default: /tmp/kf_rmsnorm_results).
# On a machine without network, install the peers' wheels with: bash $P wheels DIR...
# The files here: rmsnorm_bench_serving_bf16, _fwd_bf16 and _res_bf16 (the first three BENCHES); previous_export/
# holds the benches of the package's previous export (other forward runs, the same backward run).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
P=experiments/scripts/package_proof.sh
OUT=${OUT:-/tmp/kf_rmsnorm_results}
python3 -m pip install liger-kernel==0.8.5 quack-kernels==0.6.5 nvidia-cudnn-frontend==1.32.0 flashinfer-python
bash $P export rmsnorm
bash $P all "$OUT" 3600 rmsnorm
