"""(a) Parameter effects: how each value of a param moves time, per template, dtype and shape bucket.

The choice of template is a parameter too: its lesson (scope template "*", param "template") compares
each template's best genome with the best of the others, cell by cell.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pandas as pd

from memory import queries as q
from memory.lessons.relative import _ok_sql, _row, effect_of, genome_rel, template_rel, with_cells
from memory.lessons.stats import _show
from memory.rows import LessonRow


def param_effect_lessons(
    ok: pd.DataFrame, run_id: str, *, min_n: int = 3, edges: Mapping[str, tuple[int, int]] | None = None
) -> list[LessonRow]:
    """One lesson per (op, arch, template, dtype, shape bucket, param): how each value of the param moves time."""
    if ok.empty:
        return []
    rows = with_cells(ok, edges)
    as_of = rows.created_at.max()
    out = []
    for (op, arch, template, dtype, bucket_json), grp in rows.groupby(
        ["op", "arch", "template", "dtype", "bucket_json"], sort=True
    ):
        per_genome = genome_rel(grp)
        bucket = json.loads(bucket_json)
        cells = sorted(grp.cell.unique())
        for param in sorted({k for p in per_genome.params for k in p}):
            eff = effect_of(per_genome, param, min_n)
            if eff is None:
                continue
            best, runner = eff["values"][0], eff["values"][1]
            text = (
                f"{template} on {dtype} {q.bucket_label(bucket)}: {param}={_show(eff['best'])} is "
                f"{eff['faster_pct']:.0f}% faster than {param}={_show(eff['runner_up'])} "
                f"(n={best['n']}/{runner['n']} genomes, ±{eff['pm_pct']:.0f}%"
                + ("" if eff["method"] == "adjusted" else ", unadjusted")
                + ("" if eff["significant"] else ", not significant")
                + ")"
            )
            scope = {"template": template, "param": param, "dtype": dtype, "bucket": bucket}
            structured = {"template": template, "dtype": dtype, "bucket": bucket, "cells": cells, "min_n": min_n, **eff}
            provenance = {
                "sql": _ok_sql(op, arch, cells, as_of, f"WHERE ok.template = {q.sql_literal(template)}"),
                "count": int(per_genome.n_evals.sum()),
                "as_of": as_of.isoformat(sep=" "),
                "recompute": "memory.lessons.effect_of(genome_rel(rows), param, min_n)",
            }
            out.append(_row(q.PARAM_EFFECT, op, arch, scope, text, structured, provenance, run_id, eff["n"]))
    return out


def template_effect_lessons(
    ok: pd.DataFrame, run_id: str, *, min_n: int = 2, edges: Mapping[str, tuple[int, int]] | None = None
) -> list[LessonRow]:
    """One lesson per (op, arch, dtype, shape bucket): how much slower each template's best is than the others'.

    Units are (template, cell) pairs, so min_n counts cells on which a template has an OK time.
    """
    if ok.empty:
        return []
    rows = with_cells(ok, edges)
    as_of = rows.created_at.max()
    out = []
    for (op, arch, dtype, bucket_json), grp in rows.groupby(["op", "arch", "dtype", "bucket_json"], sort=True):
        per_template = template_rel(grp)
        eff = effect_of(per_template, "template", min_n)
        if eff is None:
            continue
        bucket = json.loads(bucket_json)
        cells = sorted(grp.cell.unique())
        best, runner = eff["values"][0], eff["values"][1]
        text = (
            f"choice of template on {dtype} {q.bucket_label(bucket)}: the best {eff['best']} is "
            f"{eff['faster_pct']:.0f}% faster than "
            f"the best {eff['runner_up']} (n={best['n']}/{runner['n']} cells, ±{eff['pm_pct']:.0f}%"
            + ("" if eff["significant"] else ", not significant")
            + ")"
        )
        scope = {"template": q.ANY_TEMPLATE, "param": "template", "dtype": dtype, "bucket": bucket}
        structured = {"template": q.ANY_TEMPLATE, "dtype": dtype, "bucket": bucket, "cells": cells, "min_n": min_n,
                      **eff, "unit": "a template's best log(time / best time in the cell), per cell"}
        provenance = {
            "sql": _ok_sql(op, arch, cells, as_of),
            "count": int(per_template.n_evals.sum()),
            "as_of": as_of.isoformat(sep=" "),
            "recompute": "memory.lessons.effect_of(template_rel(rows), 'template', min_n)",
        }
        out.append(_row(q.PARAM_EFFECT, op, arch, scope, text, structured, provenance, run_id, eff["n"]))
    return out
