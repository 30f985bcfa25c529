"""(b) Failure rules: the param condition that best predicts each failure signature."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from memory import queries as q
from memory.lessons.relative import _row
from memory.lessons.signatures import signature
from memory.lessons.stats import _show, params_text, wilson_lower
from memory.rows import LessonRow, canonical_json

MAX_PROVENANCE_IDS = 2000


def best_condition(params: pd.DataFrame, failing: np.ndarray) -> tuple[dict[str, Any], int, int]:
    """The condition (no param, one or two param=value) that best predicts failing among these genomes.

    params: one row per genome, one column per param, values as canonical JSON (None where absent).
    Candidates are the values failing genomes hold; the pick maximises the Wilson lower bound of
    precision (so precision and support both count), then prefers fewer params, then more support.
    Returns (condition with JSON-decoded values, failing genomes with it, genomes with it).
    """
    n_all = len(params)
    masks: dict[tuple[str, str], np.ndarray] = {}
    for p in params.columns:
        col = params[p].to_numpy(object)
        for v in pd.unique(col[failing]):
            if v is not None:
                masks[(p, v)] = col == v
    candidates: list[tuple[tuple[str, str], ...]] = [()] + [(pv,) for pv in masks]
    cols = sorted(params.columns)
    fail_rows = params[failing]
    for i, p1 in enumerate(cols):
        for p2 in cols[i + 1 :]:
            for v1, v2 in fail_rows[[p1, p2]].drop_duplicates().itertuples(index=False):
                if v1 is not None and v2 is not None:
                    candidates.append(((p1, v1), (p2, v2)))
    best: tuple[tuple[float, int, int], tuple[tuple[str, str], ...], int, int] | None = None
    for cond in candidates:
        mask = np.ones(n_all, bool)
        for pv in cond:
            mask &= masks[pv]
        n = int(mask.sum())
        k = int((mask & failing).sum())
        score = (wilson_lower(k, n), -len(cond), k)
        if best is None or score > best[0]:
            best = (score, cond, k, n)
    assert best is not None
    _, cond, k, n = best
    return {p: json.loads(v) for p, v in cond}, k, n


def _denominator_sql(
    op: str, arch: str, template: str, condition: Mapping[str, Any], stages: Iterable[str], as_of: pd.Timestamp
) -> str:
    """SQL (literals inline) for the genomes of template with condition that have an outcome in the stages."""
    statuses = ", ".join(q.sql_literal(s) for s in q.OUTCOME_STATUSES)
    parts = []
    if "build" in stages:
        parts.append(
            f"SELECT b.genome_key FROM builds b WHERE b.arch = {q.sql_literal(arch)} "
            f"AND b.status IN ({statuses}) AND b.created_at <= {q.sql_literal(as_of)}"
        )
    if "eval" in stages:
        parts.append(
            "SELECT e.genome_key FROM evaluations e LEFT JOIN builds b ON b.build_key = e.build_key "
            f"LEFT JOIN runs r ON r.run_id = e.run_id WHERE coalesce(b.arch, r.arch) = {q.sql_literal(arch)} "
            f"AND e.status IN ({statuses}) AND (b.build_key IS NULL OR b.status = 'OK') "
            f"AND e.created_at <= {q.sql_literal(as_of)}"
        )
    conds = "".join(
        f" AND json_extract_string(c.params_json, {q.sql_literal('$.' + p)}) = {q.sql_literal(_show(v))}"
        for p, v in sorted(condition.items())
    )
    return (
        f"SELECT DISTINCT c.genome_key FROM candidates c JOIN ({' UNION ALL '.join(parts)}) o "
        f"ON o.genome_key = c.genome_key WHERE c.op = {q.sql_literal(op)} AND c.template = {q.sql_literal(template)}"
        f"{conds} ORDER BY c.genome_key"
    )


def failure_lessons(outcomes: pd.DataFrame, run_id: str) -> list[LessonRow]:
    """One lesson per (op, arch, template, failure signature): the param condition that predicts it.

    outcomes: memory.queries.outcomes (UNKNOWN never in it). The unit is the genome: precision =
    genomes with the condition that showed the signature / genomes with the condition that have an
    outcome at the stage (build or evaluation) where the signature occurs.
    """
    if outcomes.empty or not (outcomes.status != "OK").any():
        return []
    df = outcomes.assign(sig=[signature(s, e) if s != "OK" else "" for s, e in zip(outcomes.status, outcomes.error)])
    as_of = df.created_at.max()
    out = []
    for (op, arch, template), grp in df.groupby(["op", "arch", "template"], sort=True):
        genomes = grp.drop_duplicates("genome_key").set_index("genome_key").params_json.map(json.loads)
        staged = {s: set(grp.genome_key[grp.stage == s]) for s in ("build", "eval")}
        fails = grp[grp.status != "OK"]
        for (status, sig), srows in fails.groupby(["status", "sig"], sort=True):
            stages = sorted(set(srows.stage))
            keys = sorted(set().union(*(staged[s] for s in stages)))
            names = sorted({k for g in keys for k in genomes[g]})
            table = pd.DataFrame(
                [[canonical_json(genomes[g][p]) if p in genomes[g] else None for p in names] for g in keys],
                columns=names,
                dtype=object,
            )
            failing = np.isin(np.array(keys, dtype=object), srows.genome_key.unique())
            condition, k, n = best_condition(table, failing)
            matched = srows[
                [
                    all(p in genomes[g] and q.same_value(genomes[g][p], v) for p, v in condition.items())
                    for g in srows.genome_key
                ]
            ]
            precision = k / n if n else 0.0
            where = params_text(condition) if condition else "any params"
            text = (
                f"{template} with {where} fails with {status} ({sig}): {k} of {n} genomes (precision {precision:.2f})"
            )
            scope = {"template": template, "status": status, "signature": sig}
            structured = {
                "template": template,
                "condition": condition,
                "predicts": status,
                "precision": precision,
                "support": k,
                "evaluated": n,
                "wilson_lower": wilson_lower(k, n),
                "signature": sig,
                "stages": stages,
                "failing_genomes": int(failing.sum()),
                "failures": len(srows),
                "examples": [str(e) for e in srows.error.dropna().unique()[:3]],
            }
            provenance = {
                "build_keys": sorted(matched.row_id[matched.stage == "build"])[:MAX_PROVENANCE_IDS],
                "eval_ids": sorted(matched.row_id[matched.stage == "eval"])[:MAX_PROVENANCE_IDS],
                "truncated": len(matched) > MAX_PROVENANCE_IDS,
                "sql": _denominator_sql(op, arch, template, condition, stages, as_of),
                "count": n,
                "as_of": as_of.isoformat(sep=" "),
                "recompute": "precision = distinct genomes of the build_keys/eval_ids / rows of sql",
            }
            out.append(_row(q.FAILURE, op, arch, scope, text, structured, provenance, run_id, k))
    return out
