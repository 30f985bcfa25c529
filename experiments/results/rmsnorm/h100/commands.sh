#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: the rmsnorm package exported from ../store.duckdb.gz (the runs named in
# experiments/packages/rmsnorm.env), installed, its own GPU tests and its own benchmark against every peer. Each step
# is skipped when already done (experiments/scripts/package_proof.sh --help); results go to OUT (default: this
# folder). On a machine without network, install the peers' wheels with: bash $P wheels DIR...
set -euo pipefail
cd "$(dirname "$0")/../../../.."
P=experiments/scripts/package_proof.sh
OUT=${OUT:-experiments/results/rmsnorm/h100}
python3 -m pip install liger-kernel==0.8.5 quack-kernels==0.6.5 nvidia-cudnn-frontend==1.32.0 flashinfer-python
bash $P export rmsnorm
bash $P install rmsnorm
bash $P tests rmsnorm "$OUT"
bash $P bench rmsnorm "$OUT" fwd_bf16 --tables forward --cells "x=bf16" --samples 50
bash $P bench rmsnorm "$OUT" bwd_bf16 --tables backward --cells "x=bf16" --samples 50
