"""Evaluations read back with their candidate's template and params: a run's own (for resume, its dispatch
table, the report, export) and other runs' measurements it may reuse."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from memory.store import Store

# An evaluation row as the search reads it back into an Outcome (with its candidate's template and params).
_STORED = ("SELECT e.genome_key, e.build_key, e.cell, e.status, e.median_us, e.p10_us, e.p90_us, e.samples, "
           "e.baseline_us, e.error, coalesce(e.reused_from, e.run_id) AS measured_in, c.template, c.params_json "
           "FROM evaluations e JOIN candidates c USING (genome_key) ")

_EVALS_SQL = """
SELECT e.cell, e.status, e.genome_key, e.median_us, e.baseline, e.baseline_us, e.speedup, e.gbps,
       e.ceiling_gbps, e.generation, e.fingerprint_json, e.fingerprint_class, e.source, e.reused_from,
       c.template, c.params_json
FROM evaluations e LEFT JOIN candidates c USING (genome_key)
WHERE e.run_id = ?
ORDER BY e.generation NULLS LAST, e.created_at, e.rowid
"""  # rowid keeps insertion order among the rows of one batch, which share created_at

_ENTRY_SQL = """
SELECT e.eval_id, e.run_id, e.genome_key, e.build_key, e.cell, e.dtypes_json, e.dims_json, e.median_us, e.p10_us,
       e.p90_us, e.samples, e.gbps, e.ceiling_gbps, e.baseline, e.baseline_us, e.speedup, e.fingerprint_json,
       e.fingerprint_class, e.source, coalesce(e.reused_from, e.run_id) AS measured_in,
       c.op, c.template, c.source_hash, c.params_json
FROM evaluations e JOIN candidates c USING (genome_key)
WHERE e.status = 'OK' AND e.median_us IS NOT NULL AND {where}
ORDER BY e.cell, e.median_us, e.genome_key, e.eval_id
"""


def recorded_outcomes(store: Store, run_id: str) -> pd.DataFrame:
    """The run's evaluations as the search reads them back, in generation order."""
    return store.sql(_STORED + "WHERE e.run_id = ? ORDER BY e.generation, e.created_at", [run_id])


def reusable_results(store: Store, fingerprint_class: str, source: str, other_than: str) -> pd.DataFrame:
    """Evaluations of runs other than other_than under this fingerprint class and source that say something
    about the kernel (not REJECTED, UNKNOWN, TIMEOUT or CRASH), oldest first."""
    return store.sql(
        _STORED + "WHERE e.fingerprint_class = ? AND e.source = ? AND e.run_id != ? "
        "AND e.status NOT IN ('REJECTED', 'UNKNOWN', 'TIMEOUT', 'CRASH') ORDER BY e.created_at, e.eval_id",
        [fingerprint_class, source, other_than])


def ok_results(store: Store, run_id: str) -> pd.DataFrame:
    """The run's OK evaluations with a time: genome, cell, times, template, params and the run that measured it."""
    return store.sql(
        "SELECT e.genome_key, e.cell, e.median_us, e.baseline_us, c.template, c.params_json, "
        "coalesce(e.reused_from, e.run_id) AS measured_in FROM evaluations e "
        "JOIN candidates c USING (genome_key) WHERE e.run_id = ? AND e.status = 'OK' AND e.median_us IS NOT NULL",
        [run_id])


def run_evaluations(store: Store, run_id: str) -> pd.DataFrame:
    """A run's evaluations with their template and params, in evaluation order (generation, then time)."""
    return store.sql(_EVALS_SQL, [run_id])


def run_evaluations_by_cell(store: Store, run_id: str) -> pd.DataFrame:
    """Every column of a run's evaluations with their template and params, by cell, then generation."""
    return store.sql("SELECT e.*, c.template, c.params_json FROM evaluations e JOIN candidates c USING (genome_key) "
                     "WHERE e.run_id = ? ORDER BY e.cell, e.generation, e.eval_id", [run_id])


def ok_entries(store: Store, *, run_id: str | None = None, genome_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """OK evaluations with a time, with their measurement, fingerprint and genome, of one run or of these
    genomes (in any run), fastest first within each cell."""
    if (run_id is None) == (genome_keys is None):
        raise ValueError("ok_entries: pass run_id or genome_keys")
    if run_id is not None:
        return store.sql(_ENTRY_SQL.format(where="e.run_id = ?"), [run_id])
    return store.sql(_ENTRY_SQL.format(where="list_contains(?::VARCHAR[], e.genome_key)"), [list(genome_keys or ())])
