"""The arguments of `kfactory dispatch`, `evals`, `profile` and `regate` (evo/cli/tools.py runs them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from evo.cli.args import positive_int
from evo.cli.errors import DEFAULT_STORE

COMMANDS = ("dispatch", "evals", "profile", "regate")  # what add_parsers adds
TARGETS_FILE = ("A [[target]] has name, op, cell (one of the op's cell labels) and either template + params (over the "
                "template's defaults) or dispatch (a dispatch.json relative to the file) whose entry for the cell gives "
                "them. Writes OUT/NAME.csv, OUT/NAME.log, OUT/summary.json and OUT/summary.md.")

def _evals_action(acts: argparse._SubParsersAction, name: str, **kw: str) -> argparse.ArgumentParser:  # noqa: SLF001
    """An action of `kfactory evals`, its first argument the run's evaluations file."""
    a = acts.add_parser(name, **kw)
    a.add_argument("evals", type=Path, help="the run's evaluations.parquet")
    return a


def add_parsers(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001
    """The tool commands, each with its actions, on the main parser's subcommands."""
    p = sub.add_parser("dispatch", help="merge, translate or rebuild runs' dispatch tables (dispatch.json)",
                       description="Work on dispatch tables: a run's per-cell choice of template and params.")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    a = acts.add_parser("merge", help="the union of tables: the first table's entry per cell, or the fastest",
                        description="Every cell of the first table, then the cells it lacks from each later one, in "
                                    "order; with --fastest, per cell the entry with the lowest recorded median. "
                                    "`kfactory bench --dispatch` then times the result beside the peers.")
    a.add_argument("out", type=Path, help="the merged table to write (JSON)")
    a.add_argument("tables", type=Path, nargs="+", metavar="TABLE",
                   help="dispatch tables in order of precedence; a missing file is skipped with a note")
    a.add_argument("--fastest", action="store_true", help="per cell, the entry with the lowest recorded median")
    a = acts.add_parser("translate", help="predictions for other dtypes by bytes per row, to seed a run",
                        description="Each cell's fastest entry carried to the other dtypes with the same bytes a row "
                                    "(vector widths scaled to keep the bytes a load): a table of predictions that "
                                    "[search] seed_tables starts a run from.")
    a.add_argument("out", type=Path, help="the predictions table to write (JSON)")
    a.add_argument("tables", type=Path, nargs="+", metavar="TABLE", help="dispatch tables to translate")
    a = acts.add_parser("spills", help="rebuild every entry with NVRTC (no GPU): registers, spills, stack",
                        description="Every entry of a dispatch table rebuilt for sm_90a, each kernel's registers, "
                                    "spill stores and loads and stack as ptxas reports them.")
    a.add_argument("op", help="the op the table is for, e.g. rmsnorm_bwd")
    a.add_argument("table", type=Path, help="a run's dispatch.json")
    a.add_argument("out", type=Path, help="the report to write (JSON)")
    a.add_argument("--nvrtc", default=None, metavar="DIR",
                   help="a folder with another NVRTC to build with (default: this process's)")

    p = sub.add_parser("evals", help="a run's evaluations.parquet from the store, and tables over it",
                       description="Same-run tables over a run's exported evaluations (the store's evaluations "
                                   "joined with their candidates).")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    a = acts.add_parser("export", help="write a run's evaluations file from the store (what the other actions read)",
                        description="A run's evaluations, every column, joined with their candidate's template and "
                                    "params, by cell then generation, as a parquet file; an existing file is refused.")
    a.add_argument("run_id", help="the run ('latest': the newest in the store)")
    a.add_argument("out", type=Path, help="the evaluations.parquet to write")
    a.add_argument("--store", type=Path, default=DEFAULT_STORE,
                   help=f"DuckDB lesson store (default: {DEFAULT_STORE} in the working directory)")
    a = _evals_action(acts, "templates", help="fastest OK time per cell and template, ratios to the cell's winner",
                        description="Per cell, each template's fastest OK time and its ratio to the winner's; the "
                                    "failures per template and status. Writes OUT.json and OUT.md.")
    a.add_argument("out", type=Path, help="output prefix: writes OUT.json and OUT.md")
    a = _evals_action(acts, "ceiling", help="each dispatch entry against the copy ceiling and the peer in its job",
                        description="Each dispatch entry's time, its bandwidth as a share of the run's copy ceiling, "
                                    "and the op's first peer timed in the same job. Writes OUT.json and OUT.md.")
    a.add_argument("dispatch", type=Path, help="the run's dispatch.json")
    a.add_argument("out", type=Path, help="output prefix: writes OUT.json and OUT.md")
    a = _evals_action(acts, "learned", help="what the search learned per parameter value, in SQL",
                        description="Per template parameter value, its best genome against each cell's best "
                                    "(geomean; 1.000 is the winners' value), and the outcomes per template: "
                                    "markdown with the queries, to rerun with `kfactory sql`.")
    a.add_argument("out", type=Path, help="the markdown page to write")
    a = _evals_action(acts, "compare", help="one parameter's values against each other, per cell",
                        description="Per cell, the fastest OK evaluation with each value of PARAM and its time over "
                                    "the fastest value's; a value not reached on a cell is reported absent.")
    a.add_argument("param", help="the template parameter to compare, e.g. prefetch")
    a.add_argument("--template", default=None, help="only this template's evaluations (default: every template)")
    a.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")

    p = sub.add_parser("profile", help="Nsight Compute over kernels launched as the gate would",
                       description="Each target built, planned and checked as the gate would launch it, then "
                                   "profiled by ncu (clocks left alone, one round after the checked one).")
    acts = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=type(p))
    a = acts.add_parser("targets", help="every [[target]] of a TOML file under ncu, one process each",
                        description=TARGETS_FILE)
    a.add_argument("file", type=Path, help="targets TOML, e.g. experiments/profile_h200.toml")
    a.add_argument("out", type=Path, help="output folder")
    a.add_argument("--times", type=positive_int, default=2, help="rounds of the plan's launches (default 2)")
    a.add_argument("--timeout-s", type=float, default=240.0, help="limit for each ncu run (default 240)")
    a = acts.add_parser("run", help="build, plan, check and run one target's launches (what ncu wraps)",
                        description="Build one point with NVRTC, plan and check it as the gate would, then run its "
                                    "launches; prints the launches' geometry and the registers as JSON.")
    a.add_argument("--op", required=True, help="the op, e.g. kda")
    a.add_argument("--template", required=True, help="the op's template")
    a.add_argument("--cell", required=True, help="a cell label of the op")
    a.add_argument("--params", required=True, help="the point's params as a JSON object")
    a.add_argument("--times", type=positive_int, default=2, help="rounds of the plan's launches (default 2)")
    a = acts.add_parser("summarize", help="summary.json and summary.md again from a folder's ncu CSVs",
                        description="Read every NAME.csv of ncu's output in OUT into summary.json and summary.md.")
    a.add_argument("out", type=Path, help="a folder `kfactory profile targets` wrote")

    p = sub.add_parser("regate", help="one genome or more through the full gate many times: is a rejection rare?",
                       description="Each case's genome built and put through a fresh gate (its own seed: inputs, "
                                   "poison and checked samples differ) REPS times in one worker process, on a GPU. "
                                   "CASES is a JSON list of {op, template, params, cell (a cell label or a prefix "
                                   "of one), reps}.")
    p.add_argument("cases", type=Path, help="the cases JSON, e.g. experiments/regate/bwd_fp32_h100.json")
    p.add_argument("--out", type=Path, required=True,
                   help="JSON with every repetition's status and errors, rewritten after each case")
