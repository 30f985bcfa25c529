"""One template parameter's values against each other in one run: per cell, the fastest OK evaluation (median µs)
with each value of the parameter, the genome that ran it, and each value's time over the fastest value's. A run's
evaluations are all timed in one process by the gate's timer, so these are same-run ratios; a value the search did
not reach on a cell is reported absent there, never filled in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from evo.tools.errors import ToolInputError, require_file

COLUMNS = ["eval_id", "genome_key", "cell", "status", "median_us", "template", "params_json"]


def best_by_value(rows: list[dict[str, Any]], param: str, template: str | None = None) -> dict[str, dict[str, Any]]:
    """{cell: {value (as JSON text): the fastest OK row with it}} over rows of `template` (all where None) that set
    `param`."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["status"] != "OK" or r["median_us"] is None or (template and r["template"] != template):
            continue
        params = json.loads(r["params_json"])
        if param not in params:
            continue
        value = json.dumps(params[param])
        have = out.setdefault(r["cell"], {}).get(value)
        if have is None or r["median_us"] < have["median_us"]:
            out[r["cell"]][value] = {**r, "params": params}
    return out


def compare(rows: list[dict[str, Any]], param: str, template: str | None = None) -> list[dict[str, Any]]:
    """Per cell (sorted): each value's fastest median, its genome and params, and its time over the cell's fastest."""
    best = best_by_value(rows, param, template)
    if not best:
        raise ToolInputError(f"no OK evaluation sets {param!r}" + (f" in template {template!r}" if template else ""))
    values = sorted({v for per in best.values() for v in per})
    table = []
    for cell in sorted(best):
        per = best[cell]
        fastest = min(r["median_us"] for r in per.values())
        table.append({"cell": cell, "param": param, "fastest_us": fastest,
                      "values": {v: ({"median_us": per[v]["median_us"], "over_fastest": per[v]["median_us"] / fastest,
                                      "genome_key": per[v]["genome_key"], "params": per[v]["params"]}
                                     if v in per else None) for v in values}})
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    """The comparison as a markdown table: one row per cell, one column per value."""
    values = sorted({v for row in table for v in row["values"]})
    param = table[0]["param"]
    head = ["cell", *(f"{param}={v} µs (/ fastest)" for v in values)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(values)]
    for row in table:
        cells = [f"{b['median_us']:.1f} ({b['over_fastest']:.3f})" if b else "absent"
                 for b in (row["values"][v] for v in values)]
        lines.append(f"| {row['cell']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The evaluations file's rows (the COLUMNS only), a missing median as None."""
    require_file(path, "evaluations file")
    try:
        df = pd.read_parquet(path, columns=COLUMNS)
    except (KeyError, ValueError) as e:
        raise ToolInputError(f"{path}: {e}") from None
    return df.astype(object).where(df.notna(), None).to_dict("records")
