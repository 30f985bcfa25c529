"""Sweep the replay space of every RMSNorm template over the full matrix on the GPU -> Parquet.

Every legal point of the space in experiments/rmsnorm_replay.toml is verified (3 fresh input sets,
poisoned outputs, canaries, float64 device reference) and timed (median of 100 launches, L2 flushed
or graph replay), on every cell where it is legal. torch's time is measured once per cell. Rows are
flushed to disk as they come, and the sweep stops cleanly at --deadline-s, so a partial sweep is
still usable (missing points are UNKNOWN in replay, never invented).

Rerun: python experiments/scripts/sweep.py --out experiments/data/rmsnorm_h200_sweep.parquet
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import pandas as pd

from evo import (
    Builder, enumerate_space, EvalItem, gbps, Genome, get_op, GpuEvaluator, GpuRunner, load_config, load_templates, prepare, Timing,
)



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "experiments" / "rmsnorm_replay.toml")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet")
    ap.add_argument("--deadline-s", type=float, default=540.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="keep the rows in --out and sweep only the rest")
    args = ap.parse_args()
    t0 = time.time()
    cfg = load_config(args.config)
    op = get_op(cfg.run.op)
    arch = cfg.run.arch
    arch_n = int("".join(c for c in arch if c.isdigit()))
    tdefs = {k: t.restrict(cfg.search.space.get(k, {})) for k, t in load_templates(op.name).items()}
    cells = op.matrix()
    points = []
    for name, tdef in tdefs.items():
        for p in enumerate_space(tdef, arch_n, [c.dtypes_dict() for c in cells]):
            points.append(Genome.make(op.name, name, tdef.source_hash, p))
    for name, tdef in tdefs.items():  # points legal only for some dtypes (vec=8 is 16-bit only)
        for dt in {tuple(sorted(c.dtypes_dict().items())) for c in cells}:
            for p in enumerate_space(tdef, arch_n, [dict(dt)]):
                g = Genome.make(op.name, name, tdef.source_hash, p)
                if g not in points:
                    points.append(g)
    random.Random(args.seed).shuffle(points)
    print(f"{len(points)} genomes x {len(cells)} cells (legal pairs only)", flush=True)
    rows: list[dict] = []
    if args.resume and args.out.exists():
        rows = pd.read_parquet(args.out).drop(columns=["ceiling_gbps"]).to_dict("records")
        seen = {r["genome_key"] for r in rows}
        points = [g for g in points if g.key() not in seen]
        print(f"resuming: {len(seen)} genomes already swept, {len(points)} to go", flush=True)
    timing = Timing(min_samples=100, max_samples=100)
    with GpuRunner(timeout_s=60) as runner, Builder(workers=8) as builder:
        evaluator = GpuEvaluator(op, arch_n, runner, timing, seed=1000 + args.seed)
        fp = evaluator.fingerprint
        fp_json = json.dumps(fp, sort_keys=True)
        for gi, g in enumerate(points):
            if time.time() - t0 > args.deadline_s:
                print(f"deadline reached after {gi} of {len(points)} genomes", flush=True)
                break
            tdef = tdefs[g.template]
            legal = [c for c in cells if tdef.is_valid(g.params_dict(), arch_n, c.dtypes_dict(), c.dims_dict())]
            builds = builder.build([prepare(tdef, g, arch, c.dtypes_dict(), c.dims_dict()) for c in legal])
            evals = evaluator.evaluate([EvalItem(g, tdef, c, b) for c, b in zip(legal, builds)])
            for c, b, ev in zip(legal, builds, evals):
                ok = ev.status.ok
                rows.append(dict(op=op.name, template=g.template, genome_key=g.key(), params_json=g.params_json(),
                                 cell=c.label(), dtype=c.dtype("x").value, M=c.dim("M"), N=c.dim("N"),
                                 build_key=b.build_key, regs=b.regs, status=ev.status.value,
                                 median_us=ev.median_us if ok else None, p10_us=ev.p10_us if ok else None,
                                 p90_us=ev.p90_us if ok else None, samples=ev.samples,
                                 gbps=gbps(op.bytes_moved(c), ev.median_us * 1e-6) if ok else None,
                                 baseline_us=ev.baseline_us if ok else None, error=ev.error or None,
                                 fingerprint_json=fp_json))
            if gi % 20 == 0:
                _flush(rows, args.out, fp, runner.ceiling_gbps)
                print(f"[{time.time() - t0:6.0f}s] {gi + 1}/{len(points)} genomes, {len(rows)} rows", flush=True)
    _flush(rows, args.out, fp, runner.ceiling_gbps)
    df = pd.DataFrame(rows)
    print(df.groupby(["template", "status"]).size().to_string())
    print(f"wrote {len(df)} rows to {args.out} in {time.time() - t0:.0f} s")
    return 0


def _flush(rows: list[dict], out: Path, fp: dict, ceiling: float) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df["ceiling_gbps"] = ceiling
    df.to_parquet(out, index=False, compression="zstd")
    out.with_suffix(".json").write_text(json.dumps({"fingerprint": fp, "copy_ceiling_gbps": ceiling,
                                                    "rows": len(df)}, indent=2, sort_keys=True))


if __name__ == "__main__":
    sys.exit(main())
