"""Credit: record how the search applied lessons, and re-score their usefulness from the outcomes."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from memory import queries as q
from memory.rows import LessonRow, LessonUseRow
from memory.store import Store


class Use(str, enum.Enum):
    """How a lesson touched a genome (lesson_uses.effect)."""

    SEEDED = "seeded"  # warm start put the genome in the population
    BIASED = "biased"  # a parameter prior steered the mutation that made it
    REFINED = "refined"  # a neighbour polled where the champion predicted for a cell missed (targeted refinement)
    REJECTED = "rejected"  # predicted to fail, never built or run (not scored: nothing was observed)
    CHECKED = "checked"  # predicted to fail, evaluated anyway (scored: was the prediction right?)


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
