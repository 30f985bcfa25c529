#!/usr/bin/env bash
# Rebuilds this folder on a Hopper GPU machine: every gallery (RMSNorm forward, backward and KDA cheats) through the
# gate (gallery.json: each cheat rejected, the honest controls OK), then what gate 9's rounds cost an evaluation
# (gate_cost.json); gallery_gate_cost.log is both scripts' output. The GPU tests of the worker's device code
# (tests/gpu/test_worker.py and the others `lab_gpu.sh verify` names) run beside them.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-experiments/results/gate/h100}
python3 experiments/scripts/gallery.py --no-controls --out "$OUT/gallery.json" | tee "$OUT/gallery_gate_cost.log"
python3 experiments/scripts/gate_cost.py --out "$OUT/gate_cost.json" | tee -a "$OUT/gallery_gate_cost.log"
