"""What `kfactory dispatch`, `evals`, `profile` and `regate` do: each action a call into evo.tools whose result
is printed or written (their arguments: evo/cli/tool_args.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _dispatch(args: argparse.Namespace) -> int:
    from evo.tools.errors import read_json

    if args.action == "spills":
        from evo.tools.dispatch_spills import spill_line, spills

        doc = spills(args.op, args.table, args.nvrtc)
        for row in doc["entries"]:
            print(spill_line(row))
        _write(args.out, json.dumps(doc, indent=1) + "\n")
        return 0
    if args.action == "merge":
        from evo.tools.merge_dispatch import merge

        missing = [str(p) for p in args.tables if not p.is_file()]
        if missing:
            print(f"kfactory dispatch merge: skipped (no such file): {', '.join(missing)}", file=sys.stderr)
        merged = merge([read_json(p) for p in args.tables if p.is_file()], fastest=args.fastest)
        _write(args.out, json.dumps(merged, indent=1))
        print(f"{len(merged['dispatch'])} cells from {merged['merged_from']}")
        return 0
    from evo.tools.translate_dispatch import translate

    doc = translate([read_json(p) for p in args.tables])
    _write(args.out, json.dumps(doc, indent=1) + "\n")
    print(f"{len(doc['dispatch'])} cells predicted from {len(args.tables)} table(s)")
    return 0


def _export_evaluations(store_path: Path, run_id: str, out: Path) -> tuple[int, str]:
    """Write run `run_id`'s evaluations (every column, with template and params; 'latest': the newest run) from the
    store at `store_path` to the parquet file `out`, which must not exist; the rows written and the run id."""
    from evo.cli.report import resolve_run_id
    from evo.tools.errors import ToolInputError
    from memory.results import run_evaluations_by_cell
    from memory.store import Store

    if not store_path.is_file():
        raise ToolInputError(f"no store at {store_path}")
    if out.exists():
        raise ToolInputError(f"{out} exists; the evaluations file is written only where nothing is")
    with Store.open(store_path, read_only=True) as store:
        run_id = resolve_run_id(store, run_id)
        ev = run_evaluations_by_cell(store, run_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    ev.to_parquet(out, index=False)
    return len(ev), run_id


def _evals(args: argparse.Namespace) -> int:
    from evo.tools.errors import read_json, require_file

    if args.action == "export":
        n, run_id = _export_evaluations(args.store, args.run_id, args.out)
        print(f"wrote {n} evaluations of run {run_id} to {args.out}")
        return 0
    if args.action == "learned":
        from evo.tools.learned_sql import markdown, tables

        _write(args.out, markdown(args.evals, tables(args.evals)))
        print(f"wrote {args.out}")
        return 0
    if args.action == "compare":
        from evo.tools.param_compare import compare, markdown, read_rows

        table = compare(read_rows(args.evals), args.param, args.template)
        print(markdown(table), end="")
        if args.out:
            _write(args.out, json.dumps({"source": str(args.evals), "rows": table}, indent=1) + "\n")
        return 0
    import pandas as pd

    from evo.tools import run_tables

    ev = pd.read_parquet(require_file(args.evals, "evaluations file"))
    if args.action == "templates":
        doc = run_tables.templates(ev)
        md = run_tables.templates_md(doc)
    else:
        doc = run_tables.ceiling(ev, read_json(args.dispatch))
        md = run_tables.ceiling_md(doc)
    _write(args.out.with_suffix(".json"), json.dumps(doc, indent=2, sort_keys=True))
    _write(args.out.with_suffix(".md"), md)
    print(md)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from evo.tools.errors import ToolInputError

    if args.action == "summarize":
        from evo.tools.profile.ncu import summarize

        if not args.out.is_dir():
            raise ToolInputError(f"no folder at {args.out}")
        summarize(args.out)
        return 0
    from evo.tools.profile import targets

    if args.action == "run":
        t = targets.target_from_args(args.op, args.template, args.cell, args.params)
        print(json.dumps(targets.run(t, args.times)), flush=True)
        return 0
    from evo.tools.profile.runner import profile_targets

    ts = targets.load_targets(args.file)
    n = profile_targets(ts, args.out, args.times, args.timeout_s, say=lambda s: print(s, flush=True))
    print(f"profiled {n} of {len(ts)} targets into {args.out}")
    return 0 if n else 1


def cmd_tool(args: argparse.Namespace) -> int:
    """Run the tool command `args.cmd` with its action."""
    if args.cmd == "dispatch":
        return _dispatch(args)
    if args.cmd == "evals":
        return _evals(args)
    if args.cmd == "profile":
        return _profile(args)
    from evo.tools.regate import load_cases, regate

    regate(load_cases(args.cases), args.out, say=lambda s: print(s, flush=True))
    return 0
