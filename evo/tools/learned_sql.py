"""What a search learned, in SQL over its evaluations (memory/evaluations_file.py): for each template parameter
value, how close the best genome with that value came to each cell's best (1.000 is the winner's value), and
the outcomes per template, as markdown that shows the queries themselves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evo.tools.errors import ToolInputError, require_file
from memory.evaluations_file import OUTCOMES, PARAM_EFFECTS, learned_tables


def tables(evals: Path) -> dict[str, pd.DataFrame]:
    """The two query results over the evaluations file; ToolInputError for a missing file or missing columns."""
    require_file(evals, "evaluations file")
    try:
        return learned_tables(evals)
    except ValueError as e:
        raise ToolInputError(str(e)) from None


def _md_table(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def markdown(evals: Path, t: dict[str, pd.DataFrame]) -> str:
    """The queries and their results as one markdown page."""
    return "\n".join([
        f"# What the search learned: {evals}", "",
        "Each parameter value: the best genome with it against each cell's best, geomean over the cells where "
        "it was tried (1.000: the winners' value; 1.24: its best is 24% slower).", "",
        "```sql", PARAM_EFFECTS, "```", "", _md_table(t["param_effects"]), "",
        "## Outcomes", "", "```sql", OUTCOMES, "```", "", _md_table(t["outcomes"]), ""])
