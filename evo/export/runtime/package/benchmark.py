"""What every family's `bench.py` shares: its command line (`--out`, `--samples`, `--quick`), the JSON
document's header (package, device, versions, the timer, the runs) and the verdict (exit 1 when a cell
was wrong, 2 without a GPU). The family measures its cells; `timing.samples_us` times them. torch is
imported when the benchmark runs, not with this module.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from .loader import PACKAGE
from .table import provenance

TIMER = "CUDA events, L2 flushed by reading 256 MiB before each launch, sides interleaved in both orders, median"
# what a family's measure(args) gives: the rows (one per cell), its own fields of the document (after
# the header, before "cells"), and the summary line's middle ("geomean speedup over torch eager: 1.2")
Measured = tuple[list[dict[str, Any]], dict[str, Any], str]


def geomean(values: Iterable[float]) -> float | None:
    """The geometric mean of positive values, None for none."""
    v = list(values)
    return math.exp(sum(math.log(s) for s in v) / len(v)) if v else None


def header(versions: Mapping[str, Any]) -> dict[str, Any]:
    """The document's first fields: package, GPU, torch, CUDA and Python versions, `versions` (a family's
    peers, e.g. fla), the timer and the exported runs of each op ("a+b" where runs were merged, e.g. KDA's decode
    and prefill runs)."""
    import torch

    return {"package": PACKAGE, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), **versions, "timer": TIMER,
            "runs": {op: "+".join(r["run"]["run_id"] for r in d.get("runs") or [d])
                     for op, d in provenance()["ops"].items()}}


def parser(description: str, quick: str, split: bool = False) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"python -m {PACKAGE}.bench", description=description)
    ap.add_argument("--out", type=Path, default=Path(f"{PACKAGE}_bench.json"))
    ap.add_argument("--samples", type=int, default=100, help="timed launches per side and cell (default 100)")
    ap.add_argument("--quick", action="store_true", help=quick)
    if split:
        ap.add_argument("--split", action="store_true",
                        help="also time each side with the stream held busy while the host issues the call (its GPU "
                             "time) and measure its host time per call, --samples more of each")
    return ap


def main(argv: list[str] | None, description: str, quick: str, measure: Callable[[argparse.Namespace], Measured],
         versions: Callable[[], Mapping[str, Any]] = dict, split: bool = False) -> int:
    """Parse the command line (`quick`: what --quick keeps; `split`: the family's measure reads --split), measure,
    write the JSON document to --out and say it in one line; 1 when a cell was wrong (named on stderr), 2 without a
    CUDA GPU."""
    args = parser(description, quick, split).parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"{PACKAGE}.bench: no CUDA GPU visible", file=sys.stderr)
        return 2
    rows, fields, summary = measure(args)
    doc = {**header(versions()), **fields, "cells": rows}
    args.out.write_text(json.dumps(doc, indent=2))
    wrong = [r["cell"] for r in rows if not r["correct"]]
    print(f"{len(rows)} cells; {summary}; wrote {args.out}")
    if wrong:
        print(f"WRONG on {len(wrong)} cells: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0
