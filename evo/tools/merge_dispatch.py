"""Merge dispatch tables: every cell of the first table, then the cells the first lacks from each later one, in
order (a search over some cells, completed by an earlier run's table for the rest); with `fastest`, per cell the
entry with the lowest recorded median of all the tables (each timed in its own run: a choice of what to bench,
which `kfactory bench --dispatch` then times beside the peers in one process). Each entry keeps its
`measured_in`; the merged table names its sources."""

from __future__ import annotations

from evo.tools.errors import ToolInputError


def _rank(entry: dict, i: int) -> tuple[float, int]:
    t = entry.get("median_us")
    return (float(t) if isinstance(t, (int, float)) and t > 0 else float("inf"), i)


def merge(tables: list[dict], fastest: bool = False) -> dict:
    """The union of the tables' dispatch entries: on a cell, the first table's entry wins, or with
    `fastest` the entry with the lowest recorded median_us (one without a time ranks last; ties: first)."""
    if not tables:
        raise ToolInputError("no dispatch table to merge")
    out: dict = {}
    rank: dict = {}
    for i, t in enumerate(tables):
        if not isinstance(t.get("dispatch"), dict):
            raise ToolInputError(f"table {i} has no 'dispatch' object")
        for cell, entry in t["dispatch"].items():
            r = _rank(entry, i) if fastest else (0.0, i)
            if cell not in out or r < rank[cell]:
                out[cell], rank[cell] = entry, r
    return {"run_id": tables[0].get("run_id"), "merged_from": [t.get("run_id") for t in tables],
            "dispatch": dict(sorted(out.items()))}
