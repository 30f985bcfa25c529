#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: the rmsnorm package exported from ../store.duckdb.gz (the runs named in
# experiments/packages/rmsnorm.env), installed, its own benchmark against every peer (the env file's BENCHES, one
# process a table, in order), then its own GPU tests. Each step is skipped when already done
# (experiments/scripts/package_proof.sh --help); results go to OUT/rmsnorm/ (OUT default: /tmp/kf_rmsnorm_results).
# On a machine without network, install the peers' wheels with: bash $P wheels DIR...
# The files here: rmsnorm_bench_serving_bf16 and _train_bf16 (the first two BENCHES) of this export;
# rmsnorm_bench_fwd_bf16 and _res_bf16 of the export before it, whose runs for those cells are this export's (the same
# kernels, rebuilt and byte-checked), timed before the serving launch went through libcuda's cuLaunchKernel;
# partial/ the backward bench stopped after 2 of its 6 cells (a diagnostic, not a table); previous_export/ the benches
# of an older export (other forward runs, another backward run). quack_autotune.tgz: the choices QuACK's autotuner
# made on this card (KF_QUACK_SEED=experiments/results/rmsnorm/h100/quack_autotune.tgz reuses them instead of
# autotuning again: 400 configs a backward cell, partial/rmsnorm_bench_bwd_bf16.log).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
P=experiments/scripts/package_proof.sh
OUT=${OUT:-/tmp/kf_rmsnorm_results}
export KF_QUACK_SEED=${KF_QUACK_SEED:-experiments/results/rmsnorm/h100/quack_autotune.tgz}
python3 -m pip install liger-kernel==0.8.5 quack-kernels==0.6.5 nvidia-cudnn-frontend==1.32.0 flashinfer-python
bash $P export rmsnorm
bash $P all "$OUT" 3600 rmsnorm
