"""Lessons re-derived from every evaluation in the store: parameter effects, failure rules, champions.

Pure functions turn the DataFrames of memory.queries into LessonRows; `refresh_lessons` reads,
derives and upserts them, after a generation or at the end of a run. A lesson's id hashes its kind
and scope, so deriving it again updates the same row (its usefulness is kept). Every lesson carries
provenance that re-selects the rows behind its number.

Credit: `record_uses` makes LessonUseRows when the search applies a lesson; `update_usefulness`
re-scores the lessons a run used from how the genomes they influenced did.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from memory import queries as q
from memory.rows import LessonRow, LessonUseRow, canonical_json
from memory.store import Store

# evo.verify.pattern's names for how an output is wrong, most specific first.
_WRONG_PATTERNS = (
    "wrote outside output",
    "all unwritten or NaN",
    "last row unwritten or NaN",
    "tail elements unwritten or NaN",
    "some unwritten or NaN",
    "all wrong",
    "last row wrong",
    "tail elements wrong",
    "some elements wrong",
    "error norm too large",
)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_PATH = re.compile(
    r"(?:[A-Za-z]:)?(?:~|\.{1,2})?/?(?:[\w.+-]+/)+[\w.+-]*|\b[\w.+-]+\.(?:cu|cuh|h|hpp|cpp|cc|c|py|ptx|cubin|j2|o)\b"
)
_HEX = re.compile(r"\b0[xX][0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*[a-fA-F])(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_IDENT = re.compile(r"\b(?=\w*[_\d])[A-Za-z_]\w*\b")  # names with an underscore or digit: kernels, symbols
_NUMBER = re.compile(r"[-+]?\b\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b")
MAX_SIGNATURE_CHARS = 160
MAX_PROVENANCE_IDS = 2000
Z95 = 1.959964


class Use(str, enum.Enum):
    """How a lesson touched a genome (lesson_uses.effect)."""

    SEEDED = "seeded"  # warm start put the genome in the population
    BIASED = "biased"  # a parameter prior steered the mutation that made it
    REJECTED = "rejected"  # predicted to fail, never built or run (not scored: nothing was observed)
    CHECKED = "checked"  # predicted to fail, evaluated anyway (scored: was the prediction right?)


def lesson_id(kind: str, op: str, arch: str, scope: Mapping[str, Any]) -> str:
    """Stable id of a lesson: a hash of its kind and scope."""
    return hashlib.sha256(canonical_json([kind, op, arch, dict(scope)]).encode()).hexdigest()[:24]


# ---------------------------------------------------------------- failure signatures


def normalize_error(text: str | None) -> str:
    """The first error line with quoted names, paths, hex, identifiers and numbers replaced by placeholders."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return ""
    line = next((ln for ln in lines if "error" in ln.lower()), lines[0])
    line = _QUOTED.sub("<id>", line)
    line = _PATH.sub("<path>", line)
    line = _HEX.sub("<hex>", line)
    line = _IDENT.sub("<id>", line)
    line = _NUMBER.sub("<n>", line)
    return " ".join(line.split())[:MAX_SIGNATURE_CHARS]


def signature(status: str, error: str | None) -> str:
    """What a failure looks like, stripped of specifics: a wrong-answer pattern, else the normalized message."""
    text = error or ""
    if status == "WRONG_ANSWER":
        for p in _WRONG_PATTERNS:
            if p in text:
                return p
        if "nan" in text.lower():
            return "NaN"
    return normalize_error(text) or "(no message)"


# ---------------------------------------------------------------- small statistics


def _t95(dof: float) -> float:
    """Two-sided 95% Student t quantile (Cornish-Fisher expansion; exact enough for dof >= 3)."""
    if not math.isfinite(dof) or dof > 1e6:
        return Z95
    if dof < 1.5:
        return 12.706
    if dof < 2.5:
        return 4.303
    z = Z95
    return z + (z**3 + z) / (4 * dof) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * dof**2)


def _welch(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """mean(a) - mean(b), its standard error and Welch's degrees of freedom."""
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    se2 = va + vb
    denom = (va**2 / (len(a) - 1) if len(a) > 1 else 0.0) + (vb**2 / (len(b) - 1) if len(b) > 1 else 0.0)
    dof = se2**2 / denom if denom > 0 else float(len(a) + len(b) - 2)
    return float(a.mean() - b.mean()), math.sqrt(se2), dof


def wilson_lower(k: int, n: int, z: float = Z95) -> float:
    """Lower end of the Wilson score interval for k successes in n: precision that accounts for support."""
    if n == 0:
        return 0.0
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def _show(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def params_text(params: Mapping[str, Any]) -> str:
    """'a=1,b=nc': params sorted by name."""
    return ",".join(f"{k}={_show(v)}" for k, v in sorted(params.items()))


# ---------------------------------------------------------------- relative times


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


def genome_rel(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per genome: mean over its cells of log(time / cell best), params, evaluation count.

    Repeated measurements of a genome on a cell are averaged first, so a genome counts once per cell,
    and the genome (not the evaluation) is the unit of the statistics: its cells are not independent.
    rows: OK evaluations with genome_key, cell, fingerprint_class, median_us, cell_best_us, params_json.
    """
    rel = np.log(rows["median_us"].to_numpy(float) / rows["cell_best_us"].to_numpy(float))
    per_cell = (
        rows.assign(rel=rel)
        .groupby(["genome_key", "cell", "fingerprint_class"], as_index=False)
        .agg(rel=("rel", "mean"), n_evals=("rel", "size"), params_json=("params_json", "first"))
    )
    per_genome = per_cell.groupby("genome_key", as_index=False).agg(
        rel=("rel", "mean"), n_evals=("n_evals", "sum"), params_json=("params_json", "first")
    )
    return per_genome.assign(params=[json.loads(p) for p in per_genome.params_json])


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


# ---------------------------------------------------------------- (a) parameter effects


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


# ---------------------------------------------------------------- (b) failure rules


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


# ---------------------------------------------------------------- (c) champions


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


# ---------------------------------------------------------------- extraction entry points


def extract_lessons(
    store: Store, op: str, arch: str, run_id: str, *, min_n: int = 3, edges: Mapping[str, tuple[int, int]] | None = None
) -> list[LessonRow]:
    """Every lesson the store supports for op on arch (or its suffixed variants); writes nothing."""
    ok = q.ok_evaluations(store, op, arch)
    return [
        *param_effect_lessons(ok, run_id, min_n=min_n, edges=edges),
        *failure_lessons(q.outcomes(store, op, arch), run_id),
        *champion_lessons(ok, run_id, edges=edges),
    ]


def write_lessons(store: Store, rows: Iterable[LessonRow]) -> None:
    """Upsert lessons in one batch, keeping the usefulness they have earned (and, by the store, created_run)."""
    rows = list(rows)
    if not rows:
        return
    earned = store.sql(
        "SELECT lesson_id, usefulness FROM lessons WHERE list_contains(?::VARCHAR[], lesson_id)",
        [[r.lesson_id for r in rows]],
    )
    kept = dict(zip(earned.lesson_id, earned.usefulness.astype(float)))
    store.write(dataclasses.replace(r, usefulness=kept.get(r.lesson_id, r.usefulness)) for r in rows)


def refresh_lessons(store: Store, op: str, arch: str, run_id: str, **kw: Any) -> list[LessonRow]:
    """Re-derive and upsert every lesson of op on arch; call after a generation and at the end of a run."""
    rows = extract_lessons(store, op, arch, run_id, **kw)
    write_lessons(store, rows)
    return rows


# ---------------------------------------------------------------- credit

SCORE_GOOD, SCORE_SLOW, SCORE_FAILED = 1.0, -0.5, -1.0
PRIOR_USES = 5.0  # shrinks usefulness towards 0 until a lesson has been used a few times


def record_uses(run_id: str, effect: Use | str, uses: Iterable[tuple[str, str]]) -> list[LessonUseRow]:
    """LessonUseRows for (genome_key, lesson_id) pairs: how the search applied lessons in this run."""
    e = Use(effect)
    return [LessonUseRow(genome_key=g, lesson_id=lid, run_id=run_id, effect=e.value) for g, lid in dict.fromkeys(uses)]


def outcome_scores(evals: pd.DataFrame, within: float = 0.05) -> np.ndarray:
    """+1 for OK within `within` of the cell best, -0.5 for OK but slower, -1 for a failure."""
    ok = (evals.status == "OK").to_numpy()
    good = ok & (evals.median_us.to_numpy(float) <= (1 + within) * evals.cell_best_us.to_numpy(float))
    return np.where(good, SCORE_GOOD, np.where(ok, SCORE_SLOW, SCORE_FAILED))


def usefulness_scores(
    uses: pd.DataFrame, evals: pd.DataFrame, predicts: Mapping[str, str], within: float = 0.05
) -> dict[str, float]:
    """Usefulness per lesson from every recorded use of it (so re-scoring is idempotent).

    seeded/biased: each evaluation of an influenced genome in that run scores (outcome_scores) minus
    the run's mean score, so a lesson earns credit only for doing better than the run's other
    candidates. checked: +1 per evaluation that failed with the predicted status, -1 per OK one.
    rejected: nothing observed, no credit. Sum / (n + PRIOR_USES).
    uses: lesson_id, genome_key, run_id, effect. evals: run_id, genome_key, status, median_us,
    cell_best_us (UNKNOWN and other non-outcomes left out). predicts: lesson_id -> status of failure lessons.
    """
    evals = evals.assign(score=outcome_scores(evals, within))
    baseline = evals.groupby("run_id").score.mean()
    by_genome = {k: g for k, g in evals.groupby(["run_id", "genome_key"])}
    total: dict[str, list[float]] = {lid: [0.0, 0.0] for lid in uses.lesson_id.unique()}
    for u in uses.drop_duplicates(["lesson_id", "genome_key", "run_id", "effect"]).itertuples(index=False):
        ev = by_genome.get((u.run_id, u.genome_key))
        if ev is None or u.effect == Use.REJECTED.value:
            continue
        if u.effect == Use.CHECKED.value:
            hit = (ev.status == predicts.get(u.lesson_id)).to_numpy()
            contrib = np.where(hit, 1.0, np.where(ev.status == "OK", -1.0, 0.0))
        else:
            contrib = ev.score.to_numpy() - baseline[u.run_id]
        total[u.lesson_id][0] += float(contrib.sum())
        total[u.lesson_id][1] += len(contrib)
    return {lid: s / (n + PRIOR_USES) for lid, (s, n) in total.items()}


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values, NaN/NaT as None."""
    return [
        {
            k: (None if v is None or (not isinstance(v, str) and pd.isna(v)) else v.item() if hasattr(v, "item") else v)
            for k, v in r.items()
        }
        for r in df.astype(object).to_dict("records")
    ]


def update_usefulness(store: Store, run_id: str, within: float = 0.05) -> dict[str, float]:
    """Re-score every lesson used in run_id from all its recorded uses; returns lesson_id -> usefulness."""
    used = store.sql("SELECT DISTINCT lesson_id FROM lesson_uses WHERE run_id = ?", [run_id]).lesson_id.tolist()
    if not used:
        return {}
    uses = store.sql(
        "SELECT lesson_id, genome_key, run_id, effect FROM lesson_uses WHERE list_contains(?::VARCHAR[], lesson_id)",
        [used],
    )
    marks = ", ".join("?" for _ in q.OUTCOME_STATUSES)
    evals = store.sql(
        f"""WITH ev AS (
            SELECT e.run_id, e.genome_key, e.cell, coalesce(e.fingerprint_class, '') AS fp, e.status, e.median_us, c.op
            FROM evaluations e JOIN candidates c ON c.genome_key = e.genome_key WHERE e.status IN ({marks})),
        best AS (SELECT op, cell, fp, min(median_us) AS cell_best_us FROM ev WHERE status = 'OK' AND median_us > 0
                 GROUP BY op, cell, fp)
        SELECT ev.*, best.cell_best_us FROM ev LEFT JOIN best USING (op, cell, fp)
        WHERE list_contains(?::VARCHAR[], ev.run_id)""",
        [*q.OUTCOME_STATUSES, sorted(set(uses.run_id))],
    )
    rows = _records(store.sql("SELECT * FROM lessons WHERE list_contains(?::VARCHAR[], lesson_id)", [used]))
    predicts = {
        r["lesson_id"]: json.loads(r["structured_json"]).get("predicts") for r in rows if r["kind"] == q.FAILURE
    }
    scores = usefulness_scores(uses, evals, predicts, within)
    store.write(LessonRow(**{**r, "usefulness": scores.get(r["lesson_id"], 0.0), "updated_at": None}) for r in rows)
    return {r["lesson_id"]: scores.get(r["lesson_id"], 0.0) for r in rows}
