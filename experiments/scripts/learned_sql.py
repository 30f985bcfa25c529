"""What a search learned, in SQL (DuckDB) over its evaluations: for each template parameter value, how
close the best genome with that value came to each cell's best (geomean over the cells where the value
was tried: 1.000 is the winner's value), and the outcomes per template. Reads a run's exported
evaluations.parquet (ga_h200.py writes it; the store's evaluations joined with candidates) and writes
markdown with the queries themselves, so anyone can rerun them on a store (`kfactory sql`).

    python experiments/scripts/learned_sql.py experiments/results/kda_prefill_h200/evaluations.parquet \
        experiments/results/kda_prefill_h200/learned.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def _quote(s: str) -> str:
    """A SQL string literal (a view's definition takes no prepared parameter)."""
    return "'" + s.replace("'", "''") + "'"


def tables(evals: Path) -> dict[str, object]:
    """The two query results as DataFrames, over the evaluations file."""
    import duckdb

    if not evals.is_file():
        raise FileNotFoundError(f"learned_sql: no evaluations file at {evals}")
    con = duckdb.connect()
    con.execute("CREATE VIEW evals AS SELECT * FROM read_parquet(" + _quote(str(evals)) + ")")
    missing = {"cell", "template", "params_json", "median_us", "status", "error"} - {
        r[0] for r in con.execute("DESCRIBE evals").fetchall()}
    if missing:
        raise ValueError(f"learned_sql: {evals} lacks columns {sorted(missing)} (an exported evaluations.parquet has them)")
    return {"param_effects": con.execute(PARAM_EFFECTS).df(), "outcomes": con.execute(OUTCOMES).df()}


def markdown(evals: Path, t: dict) -> str:
    def md(df) -> str:
        cols = list(df.columns)
        rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        rows += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
        return "\n".join(rows)

    return "\n".join([
        f"# What the search learned: {evals}", "",
        "Each parameter value: the best genome with it against each cell's best, geomean over the cells where "
        "it was tried (1.000: the winners' value; 1.24: its best is 24% slower).", "",
        "```sql", PARAM_EFFECTS, "```", "", md(t["param_effects"]), "",
        "## Outcomes", "", "```sql", OUTCOMES, "```", "", md(t["outcomes"]), ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    try:
        t = tables(args.evals)
    except (FileNotFoundError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    args.out.write_text(markdown(args.evals, t))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
