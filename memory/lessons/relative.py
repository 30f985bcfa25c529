"""Relative times: each time against its cell's best, per genome, and the effect of a param on it.

Also the SQL and LessonRow helpers the extractors share.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from memory import queries as q
from memory.lessons.ids import lesson_id
from memory.lessons.stats import _t95, _welch
from memory.rows import LessonRow, canonical_json


def with_cells(ok: pd.DataFrame, edges: Mapping[str, tuple[int, int]] | None = None) -> pd.DataFrame:
    """ok plus dtype ('bf16'), bucket ('M:medium N:small') and bucket_json, and cell_best_us and rel.

    cell_best_us is the fastest OK time of the cell on the same kind of machine (fingerprint class),
    over every template; rel = log(median_us / cell_best_us), 0 for the best.
    """
    facts = {}
    for dt, dm in set(zip(ok.dtypes_json, ok.dims_json)):
        bucket = q.shape_bucket(json.loads(dm), edges)
        facts[(dt, dm)] = (q.dtype_key(json.loads(dt)), q.bucket_label(bucket), canonical_json(bucket))
    keys = list(zip(ok.dtypes_json, ok.dims_json))
    best = ok.groupby(["arch", "cell", "fingerprint_class"])["median_us"].transform("min")
    return ok.assign(
        dtype=[facts[k][0] for k in keys],
        bucket=[facts[k][1] for k in keys],
        bucket_json=[facts[k][2] for k in keys],
        cell_best_us=best,
        rel=np.log(ok["median_us"] / best),
    )


def _per_genome_cell(rows: pd.DataFrame, keys: list[str], **extra: tuple[str, str]) -> pd.DataFrame:
    """log(time / cell best) averaged over repeated measurements of a genome on a cell (grouped by keys,
    cell and fingerprint class), with the number of evaluations and any `extra` aggregations."""
    rel = np.log(rows["median_us"].to_numpy(float) / rows["cell_best_us"].to_numpy(float))
    return (
        rows.assign(rel=rel)
        .groupby([*keys, "cell", "fingerprint_class"], as_index=False)
        .agg(rel=("rel", "mean"), n_evals=("rel", "size"), **extra)
    )


def genome_rel(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per genome: mean over its cells of log(time / cell best), params, evaluation count.

    Repeated measurements of a genome on a cell are averaged first, so a genome counts once per cell,
    and the genome (not the evaluation) is the unit of the statistics: its cells are not independent.
    rows: OK evaluations with genome_key, cell, fingerprint_class, median_us, cell_best_us, params_json.
    """
    per_cell = _per_genome_cell(rows, ["genome_key"], params_json=("params_json", "first"))
    per_genome = per_cell.groupby("genome_key", as_index=False).agg(
        rel=("rel", "mean"), n_evals=("n_evals", "sum"), params_json=("params_json", "first")
    )
    return per_genome.assign(params=[json.loads(p) for p in per_genome.params_json])


def template_rel(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (template, cell): the template's best log(time / cell best) there, as params {"template": name}.

    The unit is a template's champion on a cell, so effect_of(template_rel(rows), "template") says how
    much slower the best a template has shown is than the best of the others, cell by cell.
    rows: as for genome_rel, plus template.
    """
    per_genome = _per_genome_cell(rows, ["template", "genome_key"])
    per_template = per_genome.groupby(["template", "cell", "fingerprint_class"], as_index=False).agg(
        rel=("rel", "min"), n_evals=("n_evals", "sum")
    )
    return per_template.assign(params=[{"template": t} for t in per_template.template])


def _adjusted(
    per_genome: pd.DataFrame, rows: np.ndarray, param: str, keep: list[str], rel: np.ndarray
) -> tuple[np.ndarray, np.ndarray, float] | None:
    """Least squares of rel on every param of the genomes (one-hot, first level dropped): coefficients of
    param's kept values (keep[0] is the reference, 0), their covariance and the residual degrees of freedom.

    Adjusting for the other params matters when they are not balanced across param's values: a failure
    that censors (vec=8, unroll=4) leaves only slow vec=4 genomes with unroll=4, which a raw comparison
    would blame on unroll. None when param's contrasts are not estimable (confounded) or no dof is left.
    """
    params = [per_genome.params.iloc[i] for i in rows]
    cols, p_cols = [np.ones(len(rows))], []
    for name in sorted({k for p in params for k in p}):
        vals = np.array([canonical_json(p[name]) if name in p else "" for p in params], dtype=object)
        levels = keep if name == param else sorted(set(vals))
        for lv in levels[1:]:
            if name == param:
                p_cols.append(len(cols))
            cols.append((vals == lv).astype(float))
    x, y = np.column_stack(cols), rel[rows]
    beta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - rank
    pinv = np.linalg.pinv(x)
    if dof < 1 or not np.allclose((pinv @ x)[p_cols], np.eye(x.shape[1])[p_cols], atol=1e-8):
        return None
    resid = y - x @ beta
    cov_all = (resid @ resid / dof) * (pinv @ pinv.T)
    k = len(keep)
    b, cov = np.zeros(k), np.zeros((k, k))
    b[1:] = beta[p_cols]
    cov[1:, 1:] = cov_all[np.ix_(p_cols, p_cols)]
    return b, cov, float(dof)


def effect_of(per_genome: pd.DataFrame, param: str, min_n: int = 3) -> dict[str, Any] | None:
    """How each value of param moves log(time / cell best), over genomes (per_genome from genome_rel).

    Per value: genomes n, raw mean and its standard error, and the effect against the other values
    with a 95% interval, adjusted for the other params by least squares (method 'adjusted'), or the
    raw difference of means (Welch) when that is not estimable (method 'marginal'). Then the best
    value against the runner-up. None unless two values have at least min_n genomes.
    """
    vals = np.array([canonical_json(p[param]) if param in p else "" for p in per_genome.params], dtype=object)
    rel, n_evals = per_genome.rel.to_numpy(float), per_genome.n_evals.to_numpy(int)
    counts = Counter(v for v in vals if v)
    keep = sorted(v for v, c in counts.items() if c >= max(min_n, 2))
    if len(keep) < 2:
        return None
    masks = {v: vals == v for v in keep}
    kept = np.logical_or.reduce(list(masks.values()))
    n = np.array([masks[v].sum() for v in keep], dtype=float)
    adj = _adjusted(per_genome, np.flatnonzero(kept), param, keep, rel)

    def contrast(c: np.ndarray) -> tuple[float, float, float]:
        assert adj is not None
        b, cov, dof = adj
        return float(c @ b), math.sqrt(max(float(c @ cov @ c), 0.0)), dof

    entries = []
    for i, v in enumerate(keep):
        a, rest = rel[masks[v]], rel[kept & ~masks[v]]
        md, mse, mdof = _welch(a, rest)
        mhw = _t95(mdof) * mse
        if adj is not None:
            c = np.where(np.arange(len(keep)) == i, 1.0, -n / (n.sum() - n[i]))
            d, se, dof = contrast(c)
        else:
            d, se, dof = md, mse, mdof
        hw = _t95(dof) * se
        entries.append(
            {
                "value": json.loads(v),
                "n": len(a),
                "n_evals": int(n_evals[masks[v]].sum()),
                "mean_log_rel": float(a.mean()),
                "se": float(a.std(ddof=1) / math.sqrt(len(a))),
                "adjusted_log_rel": None if adj is None else float(adj[0][i]),
                "effect_vs_rest": d,
                "effect_se": se,
                "effect_ci95": [d - hw, d + hw],
                "marginal_effect_vs_rest": md,
                "marginal_effect_ci95": [md - mhw, md + mhw],
            }
        )
    order = "mean_log_rel" if adj is None else "adjusted_log_rel"
    entries.sort(key=lambda e: (e[order], canonical_json(e["value"])))
    best, runner = entries[0], entries[1]
    ib, ir = keep.index(canonical_json(best["value"])), keep.index(canonical_json(runner["value"]))
    if adj is not None:
        d, se, dof = contrast(np.eye(len(keep))[ib] - np.eye(len(keep))[ir])
    else:
        d, se, dof = _welch(rel[masks[keep[ib]]], rel[masks[keep[ir]]])
    hw = _t95(dof) * se
    return {
        "param": param,
        "unit": "log(time / best time in the cell)",
        "method": "marginal" if adj is None else "adjusted",
        "values": entries,
        "best": best["value"],
        "runner_up": runner["value"],
        "log_ratio": d,
        "log_ratio_ci95": [d - hw, d + hw],
        "ratio": math.exp(d),
        "faster_pct": 100 * (1 - math.exp(d)),
        "pm_pct": 100 * (math.exp(hw) - 1),
        "significant": bool(d + hw < 0),
        "n": int(n.sum()),
    }


def _ok_sql(op: str, arch: str, cells: Iterable[str], as_of: pd.Timestamp, where: str = "") -> str:
    """SQL (literals inline, pasteable) for the OK evaluations of op on arch in cells up to as_of, each with
    its cell's best time over every template; `where` filters the result (e.g. one template)."""
    cell_list = ", ".join(q.sql_literal(c) for c in sorted(cells))
    return (
        "WITH ok AS (SELECT e.eval_id, e.genome_key, e.cell, coalesce(e.fingerprint_class, '') AS fingerprint_class, "
        "e.median_us, e.speedup, c.template, c.params_json FROM evaluations e "
        "JOIN candidates c ON c.genome_key = e.genome_key LEFT JOIN builds b ON b.build_key = e.build_key "
        "LEFT JOIN runs r ON r.run_id = e.run_id "
        f"WHERE e.status = 'OK' AND e.median_us > 0 AND c.op = {q.sql_literal(op)} "
        f"AND coalesce(b.arch, r.arch) = {q.sql_literal(arch)} AND e.created_at <= {q.sql_literal(as_of)} "
        f"AND e.cell IN ({cell_list})), "
        "best AS (SELECT cell, fingerprint_class, min(median_us) AS cell_best_us FROM ok "
        "GROUP BY cell, fingerprint_class) "
        f"SELECT ok.*, best.cell_best_us FROM ok JOIN best USING (cell, fingerprint_class) {where} "
        "ORDER BY ok.eval_id"
    )


def _row(
    kind: str,
    op: str,
    arch: str,
    scope: dict[str, Any],
    text: str,
    structured: dict[str, Any],
    provenance: dict[str, Any],
    run_id: str,
    support: int,
) -> LessonRow:
    return LessonRow(
        lesson_id=lesson_id(kind, op, arch, scope),
        kind=kind,
        op=op,
        arch=arch,
        scope_json=canonical_json(scope),
        text=text,
        structured_json=canonical_json(structured),
        provenance_json=canonical_json(provenance),
        created_run=run_id,
        confirmed_run=run_id,
        support=int(support),
    )
