"""How far can champions of neighbouring shapes carry over? Per half-B cell, from the H200 sweep alone.

For every cell of half B (N in {2048, 8192, 32768}): its best genome (`best`), how many genomes
are within 1% of it, the count of each param value among those (`within_1pct_values`) and the range
of their recorded register counts (`within_1pct_regs`). For each nearest half-A shape of the same M
(N / 2 and N * 2 where they are in half A), of the same dtypes (`sources`) and of each other dtype
(`other_dtype_sources`):
- `top3` and `top3_rel_here`: that A cell's three fastest genomes, and their time / best on the B
  cell (what a warm start that seeds them would get; null where illegal on the B cell or unmeasured);
- `first_within_1pct_rank`: the rank, by time on the A cell, of the first genome within 1% of the
  best on the B cell (0 = the A champion itself is good enough there);
- `source_within_1pct_values`: the param value counts among the A cell's own genomes within 1%.

A B cell whose every nearest A shape gives a large rank is out of reach of warm-start transfer: its
fast genomes have to be found by search. The sweep covers the replay space near-exhaustively, so
this is the best case for any transfer from half A.

Rerun: python experiments/scripts/transfer_gap.py  (seconds; writes build/transfer_gap.json)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet"
HALF_A = (1024, 4096, 16384)
HALF_B = (2048, 8192, 32768)


def rel_times(sweep: pd.DataFrame) -> pd.DataFrame:
    """OK rows with rel = median_us / the cell's best."""
    ok = sweep[sweep.status == "OK"]
    return ok.assign(rel=ok.median_us / ok.groupby("cell").median_us.transform("min"))


def params_of(r: Any) -> dict:
    return {"template": r.template, **json.loads(r.params_json)}


def value_counts(rows: pd.DataFrame) -> dict[str, dict[str, int]]:
    """param -> value (as text) -> number of rows, over the rows' genomes (template included)."""
    out: dict[str, dict[str, int]] = {}
    for r in rows.itertuples(index=False):
        for k, v in params_of(r).items():
            out.setdefault(k, {}).setdefault(json.dumps(v), 0)
            out[k][json.dumps(v)] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def gap(rows: pd.DataFrame, here_rows: pd.DataFrame, dtype: str, m: int, source_n: int, top: int = 3) -> dict:
    """What the A cell (dtype, m, source_n) offers the B cell whose rows are here_rows."""
    here = here_rows.set_index("genome_key").rel
    src = rows[(rows.dtype == dtype) & (rows.M == m) & (rows.N == source_n)].sort_values(["rel", "genome_key"])
    within = set(here[here <= 1.01].index)
    ranks = [i for i, k in enumerate(src.genome_key) if k in within]
    top_rel = [None if k not in here.index or math.isnan(here[k]) else round(float(here[k]), 4)
               for k in src.genome_key[:top]]
    return {"source_dtype": dtype, "source_N": source_n, "top3": [params_of(r) for r in src.head(top).itertuples()],
            "top3_rel_here": top_rel, "first_within_1pct_rank": ranks[0] if ranks else None,
            "source_genomes": int(len(src)), "source_within_1pct_values": value_counts(src[src.rel <= 1.01])}


def report(sweep: pd.DataFrame) -> dict:
    rows = rel_times(sweep)
    cells = []
    for (dtype, m, n), grp in rows[rows.N.isin(HALF_B)].groupby(["dtype", "M", "N"], sort=True):
        near = [s for s in (n // 2, n * 2) if s in HALF_A]
        sources = [gap(rows, grp, dtype, m, s) for s in near]
        others = [gap(rows, grp, d, m, s) for d in sorted(set(rows.dtype) - {dtype}) for s in near]
        ranks = [s["first_within_1pct_rank"] for s in sources if s["first_within_1pct_rank"] is not None]
        within = grp[grp.rel <= 1.01]
        regs = within.regs[within.regs > 0] if "regs" in within else within.rel.iloc[:0]
        cells.append({"cell": grp.cell.iloc[0], "best": params_of(grp.sort_values(["rel", "genome_key"]).iloc[0]),
                      "within_1pct_genomes": int(len(within)), "genomes": int(len(grp)),
                      "within_1pct_values": value_counts(within),
                      "within_1pct_regs": [int(regs.min()), int(regs.max())] if len(regs) else None,
                      "sources": sources, "other_dtype_sources": others,
                      "best_rank": min(ranks) if ranks else None})
    out_of_reach = [c["cell"] for c in cells if c["best_rank"] is None or c["best_rank"] >= 3]
    return {"what": __doc__.strip().splitlines()[0], "half_a_N": list(HALF_A), "half_b_N": list(HALF_B),
            "cells": cells, "out_of_reach_of_top3_transfer": out_of_reach}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", type=Path, default=SWEEP)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "transfer_gap.json")
    args = ap.parse_args()
    doc = report(pd.read_parquet(args.sweep))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    for c in doc["cells"]:
        print(f"{c['cell']:32s} best rank {c['best_rank']}  "
              + "  ".join(f"N={s['source_N']}: {s['top3_rel_here']}" for s in c["sources"]))
    print("out of reach of top-3 transfer:", doc["out_of_reach_of_top3_transfer"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
