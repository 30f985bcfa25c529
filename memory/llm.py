"""What the LLM operator reads: its recorded calls (to replay them), the lessons and latest failures for its
prompts, and what its calls cost per accepted improvement."""

from __future__ import annotations

import pandas as pd

from memory.store import Store

# Per run: what the mutate calls cost, and how many LLM-written templates were accepted
# improvements: evaluated OK on some cell faster than the best OK time of their parent template there.
COST_PER_ACCEPTED_SQL = """
WITH spend AS (
    SELECT run_id,
           COUNT(*) AS calls,
           SUM(COALESCE(cost_usd, 0)) AS usd,
           SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)) AS tokens
    FROM llm_calls
    WHERE role = 'mutate'
    GROUP BY run_id
),
child AS (
    SELECT l.run_id, s.source_hash, s.parent_hash, e.cell, MIN(e.median_us) AS us
    FROM sources s
    JOIN llm_calls l ON l.call_id = s.llm_call_id
    JOIN candidates c ON c.source_hash = s.source_hash
    JOIN evaluations e ON e.genome_key = c.genome_key
    WHERE s.origin = 'llm' AND e.status = 'OK'
    GROUP BY l.run_id, s.source_hash, s.parent_hash, e.cell
),
parent AS (
    SELECT c.source_hash, e.cell, MIN(e.median_us) AS us
    FROM candidates c
    JOIN evaluations e ON e.genome_key = c.genome_key
    WHERE e.status = 'OK'
    GROUP BY c.source_hash, e.cell
),
accepted AS (
    SELECT DISTINCT child.run_id, child.source_hash
    FROM child
    JOIN parent ON parent.source_hash = child.parent_hash AND parent.cell = child.cell
    WHERE child.us < parent.us
)
SELECT spend.run_id,
       spend.calls,
       spend.usd,
       spend.tokens,
       COUNT(accepted.source_hash) AS accepted,
       spend.usd / NULLIF(COUNT(accepted.source_hash), 0) AS usd_per_accepted,
       spend.tokens / NULLIF(COUNT(accepted.source_hash), 0) AS tokens_per_accepted
FROM spend
LEFT JOIN accepted ON accepted.run_id = spend.run_id
GROUP BY spend.run_id, spend.calls, spend.usd, spend.tokens
ORDER BY spend.run_id
"""


def recorded_calls(store: Store, run_id: str) -> pd.DataFrame:
    """Every LLM call of the run, oldest first."""
    return store.sql("SELECT * FROM llm_calls WHERE run_id = ? ORDER BY created_at", [run_id])


def lesson_texts(store: Store, op: str, arch_prefix: str, kind: str | None, k: int) -> tuple[str, ...]:
    """The texts of the k most useful lessons (then best supported) of op on an arch starting with arch_prefix,
    optionally of one kind."""
    q = "SELECT text FROM lessons WHERE op = ? AND arch LIKE ? || '%'"
    args: list = [op, arch_prefix]
    if kind:
        q += " AND kind = ?"
        args.append(kind)
    return tuple(store.sql(q + " ORDER BY usefulness DESC, support DESC LIMIT ?", args + [k]).text)


def recent_failures(store: Store, op: str, k: int) -> pd.DataFrame:
    """The k latest failed evaluations of op (not UNKNOWN, REJECTED or SUSPECT): template, params, status, error."""
    return store.sql(
        "SELECT c.template, c.params_json, e.status, e.error FROM evaluations e JOIN candidates c USING (genome_key) "
        "WHERE c.op = ? AND e.status NOT IN ('OK', 'UNKNOWN', 'REJECTED', 'SUSPECT') "
        "ORDER BY e.created_at DESC LIMIT ?",
        [op, k])


def cost_per_accepted(store: Store) -> pd.DataFrame:
    """Per run: mutate calls, USD, tokens, accepted improvements, and USD/tokens per accepted one."""
    return store.sql(COST_PER_ACCEPTED_SQL)
