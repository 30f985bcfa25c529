"""(c) Champions: the fastest genomes per cell (and machine class), and per dtype and shape bucket."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from memory import queries as q
from memory.lessons.relative import _ok_sql, _row, with_cells
from memory.lessons.stats import params_text
from memory.rows import LessonRow


def _entry(r: Any) -> dict[str, Any]:
    speedup = r.speedup if r.speedup == r.speedup else None
    frac = r.gbps / r.ceiling_gbps if r.gbps == r.gbps and r.ceiling_gbps == r.ceiling_gbps and r.ceiling_gbps else None
    return {
        "template": r.template,
        "params": json.loads(r.params_json),
        "genome_key": r.genome_key,
        "source_hash": r.source_hash if isinstance(r.source_hash, str) else None,
        "eval_id": r.eval_id,
        "median_us": float(r.median_us),
        "rel": float(r.median_us / r.cell_best_us),
        "speedup": None if speedup is None else float(speedup),
        "baseline": r.baseline if isinstance(r.baseline, str) else None,
        "ceiling_fraction": None if frac is None else float(frac),
    }


def rank_genomes(rows: pd.DataFrame) -> pd.DataFrame:
    """Genomes of a set of cells, best first: those covering the most (cell, machine class) pairs, by the
    geometric mean of time / cell best (their best time per cell); with mean speedup where known."""
    per_cell = rows.sort_values(["median_us", "eval_id"]).drop_duplicates(["genome_key", "cell", "fingerprint_class"])
    per_cell = per_cell.assign(
        rel=np.log(per_cell.median_us / per_cell.cell_best_us), log_speedup=np.log(per_cell.speedup.astype(float))
    )
    g = per_cell.groupby("genome_key", as_index=False).agg(
        covered=("rel", "size"),
        mean_rel=("rel", "mean"),
        mean_log_speedup=("log_speedup", "mean"),
        template=("template", "first"),
        params_json=("params_json", "first"),
    )
    g = g.assign(geomean_rel=np.exp(g.mean_rel), geomean_speedup=np.exp(g.mean_log_speedup))
    g = g[g.covered == g.covered.max()]
    return g.sort_values(["mean_rel", "genome_key"]).reset_index(drop=True)


def champion_lessons(
    ok: pd.DataFrame, run_id: str, *, top: int = 3, edges: Mapping[str, tuple[int, int]] | None = None
) -> list[LessonRow]:
    """The fastest genomes per cell (and machine class), and per dtype and shape bucket."""
    if ok.empty:
        return []
    rows = with_cells(ok, edges)
    as_of = rows.created_at.max()
    out = []
    for (op, arch, cell, fp), grp in rows.groupby(["op", "arch", "cell", "fingerprint_class"], sort=True):
        ranked = grp.sort_values(["median_us", "eval_id"]).drop_duplicates("genome_key").head(top)
        entries = [_entry(r) for r in ranked.itertuples(index=False)]
        first = grp.iloc[0]
        b = entries[0]
        text = f"fastest on {cell}: {b['template']}({params_text(b['params'])}) {b['median_us']:.2f} us"
        if b["speedup"] is not None:
            text += f", {b['speedup']:.2f}x vs {b['baseline'] or 'baseline'}"
        if len(entries) > 1:
            text += "; next " + ", ".join(
                f"{e['template']}({params_text(e['params'])}) +{100 * (e['rel'] - 1):.1f}%" for e in entries[1:]
            )
        scope = {"level": "cell", "cell": cell, "fingerprint_class": fp}
        structured = {
            "level": "cell",
            "cell": cell,
            "fingerprint_class": fp,
            "dtype": first["dtype"],
            "dtypes": json.loads(first["dtypes_json"]),
            "dims": json.loads(first["dims_json"]),
            "bucket": json.loads(first["bucket_json"]),
            "top": entries,
        }
        provenance = {
            "sql": _ok_sql(op, arch, [cell], as_of, f"WHERE ok.fingerprint_class = {q.sql_literal(fp)}"),
            "count": len(grp),
            "eval_ids": [e["eval_id"] for e in entries],
            "as_of": as_of.isoformat(sep=" "),
            "recompute": "the champion is the row with the least median_us",
        }
        out.append(_row(q.CHAMPION, op, arch, scope, text, structured, provenance, run_id, len(grp)))
    for (op, arch, dtype, bucket_json), grp in rows.groupby(["op", "arch", "dtype", "bucket_json"], sort=True):
        ranked = rank_genomes(grp).head(top)
        bucket = json.loads(bucket_json)
        cells = sorted(grp.cell.unique())
        entries = [
            {
                "template": r.template,
                "params": json.loads(r.params_json),
                "genome_key": r.genome_key,
                "geomean_rel": float(r.geomean_rel),
                "cells_covered": int(r.covered),
                "geomean_speedup": float(r.geomean_speedup) if r.geomean_speedup == r.geomean_speedup else None,
            }
            for r in ranked.itertuples(index=False)
        ]
        b = entries[0]
        text = (
            f"best on {dtype} {q.bucket_label(bucket)} ({len(cells)} cells): {b['template']}"
            f"({params_text(b['params'])}) {100 * (b['geomean_rel'] - 1):.1f}% off the per-cell best (geomean)"
        )
        if b["geomean_speedup"] is not None:
            text += f", {b['geomean_speedup']:.2f}x vs baseline"
        scope = {"level": "bucket", "dtype": dtype, "bucket": bucket}
        structured = {"level": "bucket", "dtype": dtype, "bucket": bucket, "cells": cells, "top": entries}
        provenance = {
            "sql": _ok_sql(op, arch, cells, as_of),
            "count": len(grp),
            "as_of": as_of.isoformat(sep=" "),
            "recompute": "memory.lessons.rank_genomes(rows)",
        }
        out.append(_row(q.CHAMPION, op, arch, scope, text, structured, provenance, run_id, len(grp)))
    return out
