#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: every gallery (RMSNorm forward, backward and KDA cheats) through the
# gate (gallery.json, gallery.log: each cheat must be rejected and the honest controls pass), then what the
# rounds since gate 8 cost an evaluation (gate_cost.json, gate_cost.log).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-experiments/results/gate/h100}
python3 experiments/scripts/gallery.py --no-controls --out "$OUT/gallery.json" | tee "$OUT/gallery.log"
python3 experiments/scripts/gate_cost.py --out "$OUT/gate_cost.json" | tee "$OUT/gate_cost.log"
