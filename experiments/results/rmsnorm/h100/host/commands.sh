#!/usr/bin/env bash
# Diagnostics of the RMSNorm package's host path on a Hopper GPU machine (not published tables): where a forward
# call's host time goes, layer by layer (host_layers.json and .log: the package exported from ../../store.duckdb.gz's
# runs in experiments/packages/rmsnorm.env, each layer also under the package bench's own timer;
# host_layers_before.json: the same script, without its api.routed side and the bench timer, on the package before its
# direct launches), the package's own tests, and the serving matrix's
# bf16 cells with torch eager as the only peer (serving_bf16_eager.json: its cells are not searched yet).
set -euo pipefail
cd "$(dirname "$0")/../../../../.."
P=experiments/scripts/package_proof.sh
OUT=${OUT:-experiments/results/rmsnorm/h100/host}
bash $P export rmsnorm
bash $P install rmsnorm
(cd build/packages/rmsnorm && python3 -m pytest -q -rs tests) > "$OUT/package_tests.log" 2>&1 || true
python3 experiments/scripts/rmsnorm_host_layers.py "$OUT/host_layers.json" --calls 2000 --bench-samples 150 \
  > "$OUT/host_layers.log"
(cd /tmp && python3 -m kf_rmsnorm.bench --tables serving --cells x=bf16 --peers torch.eager --samples 50 \
  --out "$OLDPWD/$OUT/serving_bf16_eager.json")
