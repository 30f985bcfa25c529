"""Where an exported KDA package's Python call spends its host time: per searched cell, the median host time of
a call (perf_counter around it, the GPU kept from falling behind by a synchronize every SYNC_EVERY calls, outside
the timed calls) and a cProfile of as many calls, its functions by own time per call.

    python experiments/scripts/kda_host_profile.py OUT.json [--package kf_kda] [--calls 300] [--top 25]
    python experiments/scripts/kda_host_profile.py --compare BASE.json NEW.json   (a markdown table, no GPU)

Needs the installed package (kfactory export of a KDA run, pip-installed), torch and a CUDA device. The call's
inputs are the package bench's (its `inputs`), so the cells and keywords are the bench's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Any

from evo import host_times_us, profile_rows


def _call_fn(pkg: Any, entry: Any) -> tuple[str, Any]:
    """(entry point name, a function of no args calling it on the bench's inputs of the entry's cell)."""
    choose = importlib.import_module(f"{pkg.__name__}.choose")
    bench = importlib.import_module(f"{pkg.__name__}.bench")
    api = importlib.import_module(f"{pkg.__name__}.api")
    name = next(ep for ep, (kind, _) in choose.ENTRY_POINTS.items() if kind == choose.kind_of(entry.template))
    t, kw = bench.inputs(dict(entry.dims), dict(entry.dtypes))
    fn = getattr(api, name)
    return name, lambda: fn(**t, **kw)


def compare(base: dict[str, Any], new: dict[str, Any]) -> str:
    """Per cell of both files, the median host time a call of each and their ratio, as a markdown table."""
    if base["gpu"] != new["gpu"]:
        raise ValueError(f"the two profiles ran on different GPUs ({base['gpu']}, {new['gpu']})")
    old = {c["cell"]: c for c in base["cells"]}
    rows = ["| entry | cell | base µs a call | new µs a call | base / new |", "|---|---|---:|---:|---:|"]
    for c in new["cells"]:
        b = old.get(c["cell"])
        if b is None:
            continue
        short = "-".join(p for p in c["cell"].split(" ")[-1].split("-") if p[:1] in "BTH" and p[1:2].isdigit())
        rows.append(f"| {c['entry']} | {short} | {b['host_us_median']:.1f} | {c['host_us_median']:.1f} | "
                    f"{b['host_us_median'] / c['host_us_median']:.2f}x |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--compare"]:
        if len(argv) != 3:
            print("usage: kda_host_profile.py --compare BASE.json NEW.json", file=sys.stderr)
            return 2
        print(compare(*(json.loads(Path(p).read_text()) for p in argv[1:])), end="")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--package", default="kf_kda")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("kda_host_profile: no CUDA device", file=sys.stderr)
        return 2
    pkg = importlib.import_module(args.package)
    table = importlib.import_module(f"{args.package}.table").tables()["kda"]
    sync = torch.cuda.synchronize
    cells = []
    for e in table.entries:
        name, fn = _call_fn(pkg, e)
        host = host_times_us(fn, args.calls, sync)
        cells.append({"cell": e.cell, "entry": name, "template": e.template, "calls": args.calls,
                      "host_us_median": statistics.median(host), "host_us_p10": sorted(host)[len(host) // 10],
                      "profile": profile_rows(fn, args.calls, sync, args.top)})
        print(f"{name} {e.cell}: host {cells[-1]['host_us_median']:.1f} us a call (median of {args.calls})",
              flush=True)
    try:
        import cuda.core as cc
        cuda_core = getattr(cc, "__version__", "?")
    except ImportError:
        cuda_core = None
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda_core": cuda_core,
           "python": platform.python_version(), "package": args.package,
           "package_stats": pkg.stats() if hasattr(pkg, "stats") else None,
           "cpu_count": os.cpu_count(), "method": __doc__.split("\n\n")[0], "cells": cells}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
