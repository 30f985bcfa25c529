"""One template parameter's values against each other in one run: per cell, the fastest OK evaluation (median µs) with
each value of the parameter, the genome that ran it, and each value's time over the fastest value's. The run's
evaluations are all timed in one process by the gate's timer, so these are same-run ratios; a value the search did
not reach on a cell is reported absent there, never filled in.

    python experiments/scripts/param_compare.py EVALUATIONS.parquet PARAM [--template NAME] [--out OUT.json]

EVALUATIONS.parquet: a run's evaluations as experiments/scripts/ga_h200.py exports them (status, cell, median_us,
template, params_json). Prints a markdown table; --out also writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


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
        raise ValueError(f"no OK evaluation sets {param!r}" + (f" in template {template!r}" if template else ""))
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
    import duckdb

    con = duckdb.connect()
    cur = con.execute("SELECT eval_id, genome_key, cell, status, median_us, template, params_json FROM read_parquet(?)",
                      [str(path)])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("evaluations", type=Path)
    ap.add_argument("param")
    ap.add_argument("--template", default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        table = compare(read_rows(args.evaluations), args.param, args.template)
    except ValueError as e:
        print(f"param_compare: {e}", file=sys.stderr)
        return 2
    print(markdown(table), end="")
    if args.out:
        args.out.write_text(json.dumps({"source": str(args.evaluations), "rows": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
