"""The `kfactory` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn, Sequence

from evo.cli import tool_args, tools
from evo.cli.args import positive_int
from evo.cli.errors import DEFAULT_STORE, UnknownNameError, UsageError


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error printed as one line (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", type=Path, default=DEFAULT_STORE,
                   help=f"DuckDB lesson store (default: {DEFAULT_STORE} in the working directory)")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="kfactory",
        description="Kernel Factory: search for fast, correct GPU kernels; every result goes to a DuckDB store.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("run", help="run an experiment: render, build, verify and time candidates (without a GPU: "
                                   "run.runner = 'compile' renders and builds only)",
                       description="Run an experiment TOML. Builds are recorded in the store. run.runner picks "
                                   "what follows them: 'gpu' (the default) verifies and times candidates on an "
                                   "NVIDIA GPU; 'compile' renders and compiles only, summing up build errors per "
                                   "template, and needs no GPU ('none' is its older name); 'replay' searches "
                                   "against measurements recorded on a GPU (run.replay_data). Paths in the TOML "
                                   "are relative to its folder. Ctrl-C or SIGTERM stops the run, recorded as "
                                   "interrupted, and prints the command that resumes it.")
    p.add_argument("config", type=Path, help="experiment TOML, e.g. experiments/rmsnorm_h200.toml")
    p.add_argument("--run-id", default="", help="run id (default: a new id; an existing id resumes that run, "
                                                "if it was started with the same config)")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S",
                   help="the run's time budget in place of the config's budget.max_seconds (recorded with the run)")
    _store_arg(p)

    p = sub.add_parser("resume", help="continue a stopped run with its stored config, re-evaluating nothing",
                       description="Continue RUN_ID (after Ctrl-C, a crash or kill -9) with the config stored "
                                   "with it and what is left of its time budget.")
    p.add_argument("run_id", help="the run to continue (kfactory sql \"SELECT run_id, status FROM runs\" lists them)")
    _store_arg(p)

    p = sub.add_parser("sql", help="run a SQL query against the store and print the result as a table",
                       description="Run any SQL (DuckDB dialect) against the store, read-only; see "
                                   "memory/README.md. While a run writes the store, its snapshot is read.")
    p.add_argument("query", help='e.g. "SELECT status, count(*) FROM builds GROUP BY 1"')
    _store_arg(p)

    p = sub.add_parser("lessons", help="print what the store has learned for an op and arch",
                       description="Lessons (parameter effects, failure rules, champions, LLM notes) with their "
                                   "support and earned usefulness; provenance is in the lessons table (SQL).")
    p.add_argument("--op", default="rmsnorm", help="op whose lessons to print (default rmsnorm)")
    p.add_argument("--arch", default="sm_90", help="arch prefix: sm_90 matches sm_90a")
    p.add_argument("--kind", default=None, choices=("param_effect", "failure", "champion", "llm_failure", "llm_note"),
                   help="only lessons of this kind (default: every kind)")
    p.add_argument("--limit", type=positive_int, default=50, help="lessons shown (default 50)")
    _store_arg(p)

    p = sub.add_parser("report", help="write a markdown report with PNG plots for a run",
                       description="Best-so-far against evaluations, per-cell speedup over the baseline and % of "
                                   "the copy ceiling, from the store; RUN_ID 'latest' picks the newest run.")
    p.add_argument("run_id", nargs="?", default="latest", help="the run to report on (default: latest, the newest)")
    p.add_argument("--out", type=Path, default=None, help="output folder, new or empty (default: <store dir>/runs/"
                                                          "<run_id>/report, rewritten); a file or a non-empty "
                                                          "folder there is refused")
    _store_arg(p)

    p = sub.add_parser("bench", help="time templates at given points against the baselines over the op's matrix",
                       description="Verify and time each template's default point (repaired per cell) or the "
                                   "given genome keys against torch, over the op's shape matrix; writes CSV + markdown.")
    p.add_argument("--op", default="rmsnorm", help="op to benchmark (default rmsnorm)")
    p.add_argument("--arch", default="sm_90a", help="arch the kernels are built for (default sm_90a)")
    p.add_argument("--template", action="append", default=[], help="template name (repeatable; default: all)")
    p.add_argument("--genome", action="append", default=[], help="genome key from the store (repeatable)")
    p.add_argument("--params", default="", help='JSON params for the single --template, e.g. \'{"threads": 256, ...}\'')
    p.add_argument("--out", type=Path, default=Path("bench"), help="output prefix: writes PREFIX.csv and PREFIX.md")
    p.add_argument("--quick", action="store_true", help="first cell of each dtype only (smoke test)")
    p.add_argument("--dispatch", type=Path, default=None,
                   help="a run's dispatch.json: time each entry's genome on its own cell (instead of --template)")
    p.add_argument("--peer", action="append", default=None,
                   help="baseline to time beside each candidate (repeatable; default: every one the op declares)")
    p.add_argument("--cells", default="", help="only the cells whose label matches this regular expression")
    p.add_argument("--timeout-s", type=float, default=120.0,
                   help="per-job limit; first calls of peers (torch.compile, autotuners) count in it")
    _store_arg(p)

    p = sub.add_parser("export", help="write a pip-installable Python package from finished runs' dispatch tables",
                       description="Package the dispatch tables of finished runs of one op family (a forward run, "
                                   "a backward run, or one of each; e.g. rmsnorm and rmsnorm_bwd): rendered .cu "
                                   "and measured cubins per cell, templates for other shapes, a cuda-python loader "
                                   "with an NVRTC fallback, and what the family's exporter adds (for RMSNorm: a "
                                   "torch custom op with autograd, a QuACK-compatible API, tests, a benchmark), "
                                   "with provenance.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run ids of one op family: the forward runs (several where the plug-in merges them: RMSNorm's plain and variant runs, no cell shared) and at most one backward run (e.g. rmsnorm, rmsnorm_bwd); 'latest' is the newest run")
    p.add_argument("--out", type=Path, required=True, help="output folder (new or empty)")
    p.add_argument("--name", default=None, help="package name (default: the op family's exporter's, e.g. kf_rmsnorm)")
    p.add_argument("--nvrtc", type=Path, action="append", default=[], metavar="DIR",
                   help="a folder with the NVRTC that built a run's cubins, when this one is another version "
                        "(the measured cubins are rebuilt and must come out byte for byte); repeatable")
    _store_arg(p)
    tool_args.add_parsers(sub)
    return ap


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's to fix: printed as one clear line, not a traceback."""
    from evo.core.config import ConfigError
    from evo.core.extras import MissingExtraError
    from evo.export.errors import ExportError
    from evo.loop.build_summary import NothingBuiltError
    from evo.loop.pipeline import NoGpuError
    from evo.templates.template import TemplateError
    from evo.tools.errors import ToolInputError
    from memory.store import StoreError

    from evo.core.registry import UnknownOpError

    return (ConfigError, TemplateError, StoreError, NoGpuError, NothingBuiltError, UnknownNameError, UnknownOpError,
            UsageError, ExportError, MissingExtraError, ToolInputError)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    UserError = _user_errors()
    from evo.cli.commands import Interrupted

    try:
        if args.cmd == "run":
            from evo.cli.commands import cmd_run

            return cmd_run(args.config, args.store, args.run_id, args.max_seconds)
        if args.cmd == "resume":
            from evo.cli.commands import cmd_resume

            return cmd_resume(args.run_id, args.store)
        if args.cmd == "sql":
            from evo.cli.commands import cmd_sql

            return cmd_sql(args.query, args.store)
        if args.cmd == "lessons":
            from evo.cli.commands import cmd_lessons

            return cmd_lessons(args.store, args.op, args.arch, args.kind, args.limit)
        if args.cmd == "report":
            from evo.cli.report import cmd_report

            return cmd_report(args.store, args.run_id, args.out)
        if args.cmd == "bench":
            from evo.cli.bench import cmd_bench

            return cmd_bench(args)
        if args.cmd == "export":
            from evo.cli.export import cmd_export

            return cmd_export(args.runs, args.store, args.out, args.name, args.nvrtc)
        if args.cmd in tool_args.COMMANDS:
            return tools.cmd_tool(args)
    except UserError as e:
        what = " ".join(filter(None, (args.cmd, getattr(args, "action", None))))
        print(f"kfactory {what}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Interrupted) as e:  # before a run was recorded, or outside a run
        print(f"kfactory {args.cmd}: interrupted ({str(e) or 'SIGINT'})", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 128 + e.signum
    return 1


def _one_line(e: BaseException) -> str:
    """An error's message on one line (a compiler or DuckDB message may span several)."""
    return " ".join(str(e).split()) or type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
