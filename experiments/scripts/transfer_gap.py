"""How far can champions of neighbouring shapes carry over? Per half-B cell, from the H200 sweep alone.

For every cell of half B (N in {2048, 8192, 32768}) and each nearest half-A shape of the same dtypes
and M (N / 2 and N * 2 where they are in half A), this reports:
- `top3_rel_here`: time / best on the B cell of that A cell's three fastest genomes (what a warm
  start that seeds them would get; null where such a genome is illegal on the B cell or unmeasured);
- `first_within_1pct_rank`: the rank, by time on the A cell, of the first genome within 1% of the
  best on the B cell (0 = the A champion itself is good enough there).

A B cell whose every nearest A shape gives a large rank is out of reach of warm-start transfer: its
fast genomes have to be found by search. The sweep covers the replay space near-exhaustively, so
this is the best case for any transfer from half A.

Rerun: python experiments/scripts/transfer_gap.py  (seconds; writes experiments/results/transfer_gap.json)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "experiments" / "data" / "rmsnorm_h200_sweep.parquet"
HALF_A = (1024, 4096, 16384)
HALF_B = (2048, 8192, 32768)


def rel_times(sweep: pd.DataFrame) -> pd.DataFrame:
    """OK rows with rel = median_us / the cell's best."""
    ok = sweep[sweep.status == "OK"]
    return ok.assign(rel=ok.median_us / ok.groupby("cell").median_us.transform("min"))


def gap(rows: pd.DataFrame, dtype: str, m: int, n: int, source_n: int, top: int = 3) -> dict:
    """What the A cell (dtype, m, source_n) offers the B cell (dtype, m, n)."""
    here = rows[(rows.dtype == dtype) & (rows.M == m) & (rows.N == n)].set_index("genome_key").rel
    src = rows[(rows.dtype == dtype) & (rows.M == m) & (rows.N == source_n)].sort_values(["rel", "genome_key"])
    within = set(here[here <= 1.01].index)
    ranks = [i for i, k in enumerate(src.genome_key) if k in within]
    top_rel = [None if k not in here.index or math.isnan(here[k]) else round(float(here[k]), 4)
               for k in src.genome_key[:top]]
    return {"source_N": source_n, "top3_rel_here": top_rel,
            "first_within_1pct_rank": ranks[0] if ranks else None, "source_genomes": int(len(src))}


def report(sweep: pd.DataFrame) -> dict:
    rows = rel_times(sweep)
    cells = []
    for (dtype, m, n), grp in rows[rows.N.isin(HALF_B)].groupby(["dtype", "M", "N"], sort=True):
        sources = [gap(rows, dtype, m, n, s) for s in (n // 2, n * 2) if s in HALF_A]
        ranks = [s["first_within_1pct_rank"] for s in sources if s["first_within_1pct_rank"] is not None]
        cells.append({"cell": grp.cell.iloc[0], "within_1pct_genomes": int((grp.rel <= 1.01).sum()),
                      "genomes": int(len(grp)), "sources": sources, "best_rank": min(ranks) if ranks else None})
    out_of_reach = [c["cell"] for c in cells if c["best_rank"] is None or c["best_rank"] >= 3]
    return {"what": __doc__.strip().splitlines()[0], "half_a_N": list(HALF_A), "half_b_N": list(HALF_B),
            "cells": cells, "out_of_reach_of_top3_transfer": out_of_reach}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", type=Path, default=SWEEP)
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "transfer_gap.json")
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
