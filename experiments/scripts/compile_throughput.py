"""Compile throughput (candidates per second) of the NVRTC build stage with 1 and 2 CPU workers.

Each round compiles the same fresh set of distinct genomes (warp_row and cta_row, bf16, sm_90a) with
an empty cache (1 worker compiles in-process; 2 workers use a spawn pool, its start-up included). Rerun: python experiments/scripts/compile_throughput.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from evo.build.nvrtc import Builder, compiler_version, prepare
from evo.core.genome import Genome
from evo.search.space import sample
from evo.templates.template import load_templates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "compile_throughput.json")
    args = ap.parse_args()
    tdefs = load_templates("rmsnorm")
    rng = random.Random(0)
    dt = {"x": "bfloat16", "w": "bfloat16"}
    dims = {"M": 4096, "N": 4096}
    inputs, seen = [], set()
    while len(inputs) < args.n:
        t = tdefs[rng.choice(sorted(tdefs))]
        p = sample(t, rng, 90, [dt], [dims])
        g = Genome.make("rmsnorm", t.name, t.source_hash, p)
        if p and g.key() not in seen and t.is_valid(p, 90, dt, dims):
            seen.add(g.key())
            inputs.append(prepare(t, g, "sm_90a", dt, dims))
    rows = []
    for workers in (1, 2):
        with Builder(workers=workers) as b:
            t0 = time.perf_counter()
            res = b.build(inputs)
            wall = time.perf_counter() - t0
        ok = sum(r.status.ok for r in res)
        rows.append({"workers": workers, "candidates": len(inputs), "ok": ok, "wall_s": round(wall, 3),
                     "candidates_per_s": round(len(inputs) / wall, 2)})
        print(rows[-1], flush=True)
    doc = {"what": "NVRTC compiles of distinct RMSNorm genomes to sm_90a cubins, process pool, cold cache",
           "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                       "python": platform.python_version(), "nvrtc": compiler_version()},
           "results": rows, "speedup_2_vs_1": round(rows[1]["candidates_per_s"] / rows[0]["candidates_per_s"], 2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
