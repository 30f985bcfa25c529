"""GA against random search in replay: evaluations needed to come within 1% of the sweep's best.

For each strategy and seed, the strategy proposes genomes (the real GeneticSearch / RandomSearch over
the replay config's space); each genome is answered on every cell where it is legal from the
committed H200 sweep (a pair the sweep lacks is UNKNOWN and counts as a spent evaluation). The
count is of (genome, cell) evaluations until every cell's best is within 1% of the sweep's best for
that cell (and, as a second number, until 90% of the cells are). Builds are skipped here: a
strategy benchmark needs only the recorded answers. Deterministic for fixed seeds.

Rerun: python experiments/scripts/replay_bench.py --out build/replay_ga_vs_random.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import pandas as pd

from evo import cells_for, dtype_sets, GeneticSearch, get_op, load_config, load_templates, Observation, RandomSearch


def evals_to_target(strategy, cells, tdefs, arch, table, best, batch, cap):
    """(evals until all cells within 1%, evals until 90% of cells within 1%) or None if never."""
    have: dict[str, float] = {}
    n = 0
    t_all = t_90 = None
    while n < cap:
        genomes = strategy.propose(batch)
        if not genomes:
            break
        obs = []
        for g in genomes:
            tdef = tdefs[g.template]
            times = {}
            for c in cells:
                label = c.label()
                times[label] = math.inf
                if not tdef.is_valid(g.params_dict(), arch, c.dtypes_dict(), c.dims_dict()):
                    continue
                n += 1
                t = table.get((g.key(), label), math.inf)
                times[label] = t
                if t < have.get(label, math.inf):
                    have[label] = t
                within = sum(have.get(k, math.inf) <= 1.01 * v for k, v in best.items())
                if t_90 is None and within >= 0.9 * len(best):
                    t_90 = n
                if t_all is None and within == len(best):
                    t_all = n
            obs.append(Observation(g, times))
        strategy.observe(obs)
        if t_all is not None:
            break
    return t_all, t_90


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=ROOT / "experiments" / "rmsnorm_replay.toml")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--cap", type=int, default=20000, help="give up after this many evaluations")
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "replay_ga_vs_random.json")
    args = ap.parse_args()
    cfg = load_config(args.config)
    op = get_op(cfg.run.op)
    arch = int("".join(ch for ch in cfg.run.arch if ch.isdigit()))
    tdefs = {k: t.restrict(cfg.search.space.get(k, {})) for k, t in load_templates(op.name).items()}
    cells = cells_for(cfg, op)
    df = pd.read_parquet(ROOT / cfg.run.replay_data)
    ok = df[df.status == "OK"]
    table = {(r.genome_key, r.cell): float(r.median_us) for r in ok.itertuples(index=False)}
    best = ok.groupby("cell").median_us.min().to_dict()
    ds = dtype_sets(cells)
    s = cfg.search
    results: dict[str, list] = {"ga": [], "random": []}
    for seed in range(args.seeds):
        ga = GeneticSearch(tdefs, random.Random(seed), arch, ds, cells, population=s.population, elite=s.elite,
                           tournament=s.tournament, p_crossover=s.p_crossover, p_switch=s.p_switch,
                           max_template_share=s.max_template_share)
        rs = RandomSearch(tdefs, random.Random(seed), arch, ds, cells)
        for name, strat in (("ga", ga), ("random", rs)):
            t_all, t_90 = evals_to_target(strat, cells, tdefs, arch, table, best, s.population, args.cap)
            results[name].append({"seed": seed, "evals_all_cells_within_1pct": t_all, "evals_90pct_cells_within_1pct": t_90})
            print(f"seed {seed} {name:>6}: all cells within 1% after {t_all} evaluations, 90% after {t_90}", flush=True)

    def med(name, key):
        v = [r[key] for r in results[name] if r[key] is not None]
        return statistics.median(v) if v else None

    summary = {name: {"median_evals_all_cells": med(name, "evals_all_cells_within_1pct"),
                      "median_evals_90pct_cells": med(name, "evals_90pct_cells_within_1pct"),
                      "runs_reaching_all_cells": sum(r["evals_all_cells_within_1pct"] is not None for r in results[name])}
               for name in results}
    doc = {"what": "(genome, cell) evaluations until the best found is within 1% of the sweep's best on every cell "
                   "(and on 90% of cells); replay of the committed H200 sweep",
           "replay_data": cfg.run.replay_data, "sweep_rows": len(df), "cells": len(best), "seeds": args.seeds,
           "population": s.population, "summary": summary, "runs": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
