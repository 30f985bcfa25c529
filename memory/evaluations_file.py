"""Queries over a run's exported evaluations file (evaluations.parquet: the store's evaluations joined with their
candidates), outside any store; `kfactory evals learned` prints them beside their results so they can be rerun
on a store with `kfactory sql`."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pandas as pd

# Per template parameter value: the best genome with it against each cell's best, geomean over the cells.
PARAM_EFFECTS = """\
WITH ok AS (SELECT cell, template, params_json, median_us FROM evals WHERE status = 'OK'),
best AS (SELECT cell, min(median_us) AS b FROM ok GROUP BY cell),
kv AS (SELECT o.cell, o.template, j.key AS param, j.value::VARCHAR AS value, o.median_us / best.b AS rel
       FROM ok o JOIN best USING (cell), json_each(o.params_json) j),
per_cell AS (SELECT template, param, value, cell, min(rel) AS r, count(*) AS n FROM kv GROUP BY ALL)
SELECT template, param, value, sum(n)::INTEGER AS evals, count(*)::INTEGER AS cells,
       round(exp(avg(ln(r))), 3) AS best_vs_cell_best
FROM per_cell GROUP BY ALL ORDER BY template, param, best_vs_cell_best, value"""

OUTCOMES = """\
SELECT template, status, count(*)::INTEGER AS evals, count(DISTINCT cell)::INTEGER AS cells,
       any_value(left(error, 120)) AS an_error
FROM evals GROUP BY ALL ORDER BY template, evals DESC"""

NEEDED = frozenset({"cell", "template", "params_json", "median_us", "status", "error"})


def _quote(s: str) -> str:
    """A SQL string literal (a view's definition takes no prepared parameter)."""
    return "'" + s.replace("'", "''") + "'"


def learned_tables(evals: Path) -> dict[str, pd.DataFrame]:
    """PARAM_EFFECTS and OUTCOMES over the file, as 'param_effects' and 'outcomes'; ValueError naming the
    columns the file lacks."""
    con = duckdb.connect()
    con.execute("CREATE VIEW evals AS SELECT * FROM read_parquet(" + _quote(str(evals)) + ")")
    missing = NEEDED - {r[0] for r in con.execute("DESCRIBE evals").fetchall()}
    if missing:
        raise ValueError(f"{evals} lacks columns {sorted(missing)} (an exported evaluations.parquet has them)")
    return {"param_effects": con.execute(PARAM_EFFECTS).df(), "outcomes": con.execute(OUTCOMES).df()}
