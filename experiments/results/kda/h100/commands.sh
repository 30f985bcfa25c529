#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: the kda package exported from ../store.duckdb.gz (the runs named in
# experiments/packages/kda.env), installed, its own GPU tests and its own benchmark against every peer. Each step
# is skipped when already done (experiments/scripts/package_proof.sh --help); results go to OUT (default: this
# folder). On a machine without network, install the peers' wheels with: bash $P wheels DIR...
set -euo pipefail
cd "$(dirname "$0")/../../../.."
P=experiments/scripts/package_proof.sh
OUT=${OUT:-experiments/results/kda/h100}
python3 -m pip install fla-core==0.6.0 nvidia-cudnn-frontend==1.32.0
bash $P export kda
bash $P install kda
bash $P tests kda "$OUT"
bash $P bench kda "$OUT" all --samples 100
