"""Merge dispatch tables: every cell of the first table, then the cells the first lacks from each later
one, in order (a GA over some cells, completed by an earlier run's table for the rest); with --fastest,
per cell the entry with the lowest recorded median of all the tables (each timed in its own run: a
choice of what to bench, which `kfactory bench --dispatch` then times beside the peers in one process).
Each entry keeps its `measured_in`; the merged table names its sources.

    python experiments/scripts/merge_dispatch.py [--fastest] OUT.json FIRST.json [MORE.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _rank(entry: dict, i: int) -> tuple[float, int]:
    t = entry.get("median_us")
    return (float(t) if isinstance(t, (int, float)) and t > 0 else float("inf"), i)


def merge(tables: list[dict], fastest: bool = False) -> dict:
    """The union of the tables' dispatch entries: on a cell, the first table's entry wins, or with
    `fastest` the entry with the lowest recorded median_us (one without a time ranks last; ties: first)."""
    if not tables:
        raise ValueError("merge_dispatch: no table given")
    out: dict = {}
    rank: dict = {}
    for i, t in enumerate(tables):
        if not isinstance(t.get("dispatch"), dict):
            raise ValueError(f"merge_dispatch: table {i} has no 'dispatch' object")
        for cell, entry in t["dispatch"].items():
            r = _rank(entry, i) if fastest else (0.0, i)
            if cell not in out or r < rank[cell]:
                out[cell], rank[cell] = entry, r
    return {"run_id": tables[0].get("run_id"), "merged_from": [t.get("run_id") for t in tables],
            "dispatch": dict(sorted(out.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fastest", action="store_true", help="per cell, the entry with the lowest recorded median")
    ap.add_argument("out", type=Path)
    ap.add_argument("tables", type=Path, nargs="+")
    args = ap.parse_args(argv)
    tables = [json.loads(p.read_text()) for p in args.tables if p.is_file()]
    missing = [str(p) for p in args.tables if not p.is_file()]
    if missing:
        print(f"merge_dispatch: skipped (no such file): {', '.join(missing)}", file=sys.stderr)
    merged = merge(tables, fastest=args.fastest)
    args.out.write_text(json.dumps(merged, indent=1))
    print(f"merge_dispatch: {len(merged['dispatch'])} cells from {merged['merged_from']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
