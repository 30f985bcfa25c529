"""What every family's `bench.py` shares: its command line (`--out`, `--samples`, `--quick`, `--tables`, `--cells`,
`--peers`), the JSON document's header (package, the card, clocks, driver and every version, the copy ceiling
measured in the same process, the timer, the runs) and the verdict (exit 1 when the package was wrong on a cell, 2
without a GPU). The family measures its cells (sides.compare: the package's call beside every peer); torch is
imported when the benchmark runs, not with this module.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from datetime import datetime, timezone
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .loader import PACKAGE
from .table import provenance

TIMER = ("CUDA events, the L2 flushed by reading 256 MiB before each sample, every side timed in turn sample by sample "
         "(the first rotating); kernel time: the stream held busy while the host issues the call; call time: the GPU "
         "idle when the call starts; medians and 10-90% spread; every side checked against float64 first")
# what a family's measure(args) gives: the rows (one per cell), its own fields of the document (after
# the header, before "cells"), and the summary line's middle ("geomean speedup over torch eager: 1.2")
Measured = tuple[list[dict[str, Any]], dict[str, Any], str]


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of positive values, None for none."""
    v = list(values)
    return math.exp(sum(math.log(s) for s in v) / len(v)) if v else None


def header(peer_dists: Iterable[str], ceiling: bool = True) -> dict[str, Any]:
    """The document's first fields: package, where it ran (environment.environment: the card, clocks, driver,
    CUDA, NVRTC, torch, triton, Python and each peer distribution's version), the copy ceiling measured now, the
    timer and the exported runs of each op ("a+b" where runs were merged, e.g. KDA's decode and prefill runs)."""
    from .environment import copy_ceiling_gbps, environment

    return {"package": PACKAGE, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(peer_dists),
            "copy_ceiling": copy_ceiling_gbps() if ceiling else None, "timer": TIMER,
            "runs": {op: "+".join(r["run"]["run_id"] for r in d.get("runs") or [d])
                     for op, d in provenance()["ops"].items()}}


def parser(description: str, quick: str, tables: Sequence[str] = (), peers: Sequence[str] = ()
           ) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.bench", description=description)
    ap.add_argument("--out", type=Path, default=Path(f"{PACKAGE}_bench.json"), help="the JSON document to write")
    ap.add_argument("--samples", type=int, default=100, help="timed samples per side, cell and column (default 100)")
    ap.add_argument("--quick", action="store_true", help=quick)
    if tables:
        ap.add_argument("--tables", type=_choices(tables), default=list(tables),
                        help=f"comma-separated tables to measure (default all: {','.join(tables)})")
    ap.add_argument("--cells", type=re.compile, default=None,
                    help="a regular expression: only the cells whose label it finds")
    if peers:
        ap.add_argument("--peers", type=_choices(peers), default=list(peers),
                        help=f"comma-separated peers to time beside the package (default all: {','.join(peers)})")
    return ap


def _choices(known: Sequence[str]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        got = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in got if t not in known]
        if bad or not got:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad) or 'empty list'}; known: {', '.join(known)}")
        return got

    return parse


def main(argv: list[str] | None, description: str, quick: str, measure: Callable[[argparse.Namespace], Measured],
         peer_dists: Sequence[str] = (), tables: Sequence[str] = (), peers: Sequence[str] = ()) -> int:
    """Parse the command line (`quick`: what --quick keeps; `tables`, `peers`: the family's, for --tables and
    --peers), measure, write the JSON document to --out and say it in one line; 1 when the package was wrong on a
    cell (named on stderr), 2 without a CUDA GPU."""
    args = parser(description, quick, tables, peers).parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"{PACKAGE}.bench: no CUDA GPU visible", file=sys.stderr)
        return 2
    head = header(peer_dists)
    args.ceiling_gbps = (head["copy_ceiling"] or {}).get("gbps")
    # after every cell the rows so far, marked incomplete: a benchmark stopped midway keeps what it measured
    asked = {"cells_regex": args.cells.pattern if args.cells else None, "quick": bool(args.quick),
             "samples": args.samples, **({"tables": list(args.tables)} if hasattr(args, "tables") else {})}
    args.save = lambda rows: args.out.write_text(json.dumps({**head, **asked, "complete": False, "cells": rows},
                                                            indent=2))
    rows, fields, summary = measure(args)
    doc = {**head, **asked, "complete": True, **fields, "cells": rows}
    args.out.write_text(json.dumps(doc, indent=2))
    wrong = [r["cell"] for r in rows if not r["correct"]]
    print(f"{len(rows)} cells; {summary}; wrote {args.out}")
    if wrong:
        print(f"WRONG on {len(wrong)} cells: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


def measure_tables(args: argparse.Namespace, cells_of: Callable[[str], Sequence[Any]],
                   row: Callable[[str, Any, tuple[str, ...], int, float | None], dict[str, Any]]) -> Measured:
    """A family's measure: for each table of --tables, its cells (`cells_of(table)`, those --cells finds; with
    --quick the first) measured by `row(table, cell, peers, samples, ceiling)`, each printed in one line and the rows
    kept after every cell (args.save), each with its wall seconds; the geomean speedup over the best peer per table, by kernel and call time."""
    from .sides import summary_line

    names, ceiling = tuple(args.peers), getattr(args, "ceiling_gbps", None)
    rows: list[dict[str, Any]] = []
    for table in args.tables:
        cells = [c for c in cells_of(table) if args.cells is None or args.cells.search(c.label)]
        for c in cells[:1] if args.quick else cells:
            t0 = time.monotonic()
            r = row(table, c, names, args.samples, ceiling)
            r["seconds"] = round(time.monotonic() - t0, 1)  # the cell's wall time: peers' JIT and autotuning included
            print(f"{table} {c.label}: {summary_line(r)} ({r['seconds']:.0f} s)", flush=True)
            rows.append(r)
            if hasattr(args, "save"):
                args.save(rows)
    gm = {t: {col: geomean(r[f"speedup_{col}"] for r in rows if r["table"] == t and r[f"speedup_{col}"])
              for col in ("kernel", "call")} for t in args.tables}
    return rows, {"peers_asked": list(names), "geomean_speedup_vs_best_peer": gm}, \
        f"geomean speedup over the best peer per table: {gm}"
