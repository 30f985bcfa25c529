"""Merge dispatch tables: every cell of the first table, then the cells the first lacks from each later
one, in order (a GA over some cells, completed by an earlier run's table for the rest). Each entry keeps
its `measured_in`; the merged table names its sources.

    python experiments/scripts/merge_dispatch.py OUT.json FIRST.json [MORE.json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def merge(tables: list[dict]) -> dict:
    """The union of the tables' dispatch entries, the first table's entry winning on a cell."""
    if not tables:
        raise ValueError("merge_dispatch: no table given")
    out: dict = {}
    for i, t in enumerate(tables):
        if not isinstance(t.get("dispatch"), dict):
            raise ValueError(f"merge_dispatch: table {i} has no 'dispatch' object")
        for cell, entry in t["dispatch"].items():
            out.setdefault(cell, entry)
    return {"run_id": tables[0].get("run_id"), "merged_from": [t.get("run_id") for t in tables],
            "dispatch": dict(sorted(out.items()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("tables", type=Path, nargs="+")
    args = ap.parse_args(argv)
    tables = [json.loads(p.read_text()) for p in args.tables if p.is_file()]
    missing = [str(p) for p in args.tables if not p.is_file()]
    if missing:
        print(f"merge_dispatch: skipped (no such file): {', '.join(missing)}", file=sys.stderr)
    merged = merge(tables)
    args.out.write_text(json.dumps(merged, indent=1))
    print(f"merge_dispatch: {len(merged['dispatch'])} cells from {merged['merged_from']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
