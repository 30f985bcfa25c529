"""Compile throughput (candidates per second) of the build stage as Ray CPU tasks, 1 and 2 CPU workers.

For each CPU count n: a fresh local Ray instance (127.0.0.1, num_cpus = n) with one RayBuilder, then,
for comparison under the same conditions, the local Builder(workers=n) (spawned compile processes).
Each compiles the same batches of distinct RMSNorm genomes (bf16, sm_90a, never cached): a cold batch
(Ray workers and pool processes import cuda.core/NVRTC on their first task) and `--repeats` warm
batches, whose median is reported (the machine is shared, so one batch is noisy). Ray start-up is
timed separately. Rerun: python experiments/scripts/ray_compile_throughput.py
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

from evo import Builder, BuildInput, compiler_version, Genome, init_ray, load_templates, prepare, RayBuilder, sample


def distinct_inputs(n: int, seed: int) -> list[BuildInput]:
    """n distinct legal genomes, drawn like compile_throughput.py draws them."""
    tdefs = load_templates("rmsnorm")
    rng = random.Random(seed)
    dt = {"x": "bfloat16", "w": "bfloat16"}
    dims = {"M": 4096, "N": 4096}
    inputs, seen = [], set()
    while len(inputs) < n:
        t = tdefs[rng.choice(sorted(tdefs))]
        p = sample(t, rng, 90, [dt], [dims])
        g = Genome.make("rmsnorm", t.name, t.source_hash, p or {})
        if p and g.key() not in seen and t.is_valid(p, 90, dt, dims):
            seen.add(g.key())
            inputs.append(prepare(t, g, "sm_90a", dt, dims))
    return inputs


def timed_build(builder: RayBuilder | Builder, inputs: list[BuildInput]) -> dict:
    t0 = time.perf_counter()
    res = builder.build(inputs)
    wall = time.perf_counter() - t0
    return {"candidates": len(inputs), "ok": sum(r.status.ok for r in res), "wall_s": round(wall, 3),
            "candidates_per_s": round(len(inputs) / wall, 2),
            "compile_ms_median": round(sorted(r.compile_ms for r in res)[len(res) // 2], 1)}


def measure(builder: RayBuilder | Builder, batches: list[list[BuildInput]]) -> dict:
    """The first batch cold, the rest warm; the warm batch with the median rate stands for them."""
    cold = timed_build(builder, batches[0])
    warm = [timed_build(builder, b) for b in batches[1:]]
    median = sorted(warm, key=lambda r: r["candidates_per_s"])[len(warm) // 2]
    return {"cold": cold, "warm_median": median, "warm_candidates_per_s": [r["candidates_per_s"] for r in warm]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=48, help="candidates per batch")
    ap.add_argument("--repeats", type=int, default=3, help="warm batches per CPU count")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "ray_compile_throughput.json")
    args = ap.parse_args()
    import ray

    load0 = round(os.getloadavg()[0], 2)
    k = 1 + args.repeats
    pool = distinct_inputs(k * args.n, seed=0)
    batches = [pool[i::k] for i in range(k)]
    rows = []
    for cpus in (1, 2):
        t0 = time.perf_counter()
        init_ray("", num_cpus=cpus, num_gpus=0)
        start_s = time.perf_counter() - t0
        try:
            with RayBuilder() as b:
                ray_row = measure(b, batches)
        finally:
            ray.shutdown()
        with Builder(workers=cpus) as b:
            local_row = measure(b, batches)
        rows.append({"cpus": cpus, "ray": dict(ray_row, ray_start_s=round(start_s, 2)), "local_builder": local_row})
        print(json.dumps(rows[-1]), flush=True)
    doc = {
        "what": "NVRTC compiles of distinct RMSNorm genomes to sm_90a cubins as Ray CPU tasks "
                "(one task per candidate) on a local Ray instance, beside the local Builder on the same batches; "
                "nothing cached",
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "nvrtc": compiler_version(), "ray": ray.__version__,
                    "loadavg_1m_at_start": load0,
                    "loadavg_1m_at_end": round(os.getloadavg()[0], 2)},
        "results": rows,
        "warm_candidates_per_s": {f"{k}_{r['cpus']}cpu": r[k]["warm_median"]["candidates_per_s"]
                                  for r in rows for k in ("ray", "local_builder")},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
