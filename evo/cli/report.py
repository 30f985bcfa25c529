"""A run's report: markdown summary of one run in the store, with best-so-far, speedup and %-of-ceiling plots.

Best per cell means what the search means by it (evo.loop.search.update_progress): the fastest OK evaluation
(lowest median_us, the earlier one on a tie), and its speedup is that row's baseline_us / median_us. The run's
counts and geomean speedup are memory.queries.run_totals', which the console prints at the end of the run too.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evo.cli.errors import UnknownNameError, UsageError
from evo.core.config import Runner
from evo.loop.build_summary import split_built_only
from memory.queries import RunTotals, counts_text, run_totals
from memory.results import run_evaluations
from memory.runs import run_ids, run_row, status_counts
from memory.store import Store, StoreError

# Plots are drawn on an explicit Agg canvas instead of through pyplot: no display is needed, and
# importing this module never switches pyplot's global backend (which would break a notebook's plots).

LATEST = "latest"
BEST_SO_FAR_PNG = "best_so_far.png"
SPEEDUP_PNG = "speedup_per_cell.png"
CEILING_PNG = "pct_ceiling.png"
_KNOWN_LISTED = 20  # run ids named in an unknown-run error

@dataclass(frozen=True)
class CellBest:
    """The fastest OK evaluation of one cell."""

    cell: str
    genome_key: str
    template: str
    params: dict[str, Any]
    median_us: float
    baseline_us: float | None
    speedup: float | None
    gbps: float | None
    ceiling_gbps: float | None

    @property
    def pct_ceiling(self) -> float | None:
        if self.gbps is None or not self.ceiling_gbps:
            return None
        return 100.0 * self.gbps / self.ceiling_gbps


def _num(x: Any) -> float | None:
    """A float, or None for SQL NULL / NaN."""
    return None if x is None or pd.isna(x) else float(x)


def _speedup(row: Any) -> float | None:
    """The row's speedup; computed from baseline_us when the column is NULL."""
    s = _num(row.speedup)
    if s is None and _num(row.baseline_us) and _num(row.median_us):
        s = row.baseline_us / row.median_us
    return s if s is not None and s > 0 and math.isfinite(s) else None


def _natural_key(label: str) -> list[Any]:
    """Sort key that orders N4096 before N16384."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", label)]


def resolve_run_id(store: Store, run_id: str) -> str:
    """run_id itself if the store has it; 'latest' means the most recent run; else UnknownNameError (a KeyError)."""
    runs = run_ids(store)[::-1]  # newest first
    if run_id in runs:
        return run_id
    if run_id == LATEST and runs:
        return runs[0]
    if not runs:
        raise UnknownNameError(f"no run {run_id!r}: {store.path} holds no runs")
    shown = ", ".join(runs[:_KNOWN_LISTED]) + (f", ... ({len(runs) - _KNOWN_LISTED} more)"
                                               if len(runs) > _KNOWN_LISTED else "")
    raise UnknownNameError(f"no run {run_id!r} in {store.path}; known runs (newest first): {shown}")


def best_per_cell(evals: pd.DataFrame) -> list[CellBest]:
    """Fastest OK evaluation of each cell, cells in natural order; evals must be in evaluation order."""
    ok = evals[(evals.status == "OK") & evals.median_us.notna()]
    firsts = ok.sort_values("median_us", kind="stable").drop_duplicates("cell")
    out = [
        CellBest(cell=r.cell, genome_key=r.genome_key, template=r.template if isinstance(r.template, str) else "?",
                 params=json.loads(r.params_json) if isinstance(r.params_json, str) else {},
                 median_us=float(r.median_us), baseline_us=_num(r.baseline_us), speedup=_speedup(r),
                 gbps=_num(r.gbps), ceiling_gbps=_num(r.ceiling_gbps))
        for r in firsts.itertuples(index=False)
    ]
    return sorted(out, key=lambda b: _natural_key(b.cell))


def best_so_far(evals: pd.DataFrame) -> list[float]:
    """After each evaluation (in order): the geomean, over every cell the run evaluated, of each cell's best speedup
    so far, a cell counting at the baseline (speedup 1.0) until it has an OK result faster than the baseline."""
    # Over every cell from the start, never only those with a result: averaging just those made the curve drop
    # (1.43 to 1.17) when a cell got its first, slower result. Each term only rises, so the curve never goes down;
    # it ends at the report's geomean once every cell has an OK result beating its baseline (with one baseline time
    # per cell, as in replay, a cell's fastest result is also its highest speedup).
    cells = evals.cell.nunique()
    best: dict[str, float] = {}  # cell -> best speedup so far, above 1.0
    log_sum, curve = 0.0, []
    for r in evals.itertuples(index=False):
        s = _speedup(r) if r.status == "OK" and _num(r.median_us) is not None else None
        if s is not None and s > best.get(r.cell, 1.0):
            log_sum += math.log(s) - math.log(best.get(r.cell, 1.0))
            best[r.cell] = s
        curve.append(math.exp(log_sum / cells))
    return curve


def _all_cells_covered_at(evals: pd.DataFrame) -> int | None:
    """1-based evaluation count at which every cell with an OK evaluation has one, or None."""
    ok = evals.reset_index(drop=True)
    ok = ok[(ok.status == "OK") & ok.median_us.notna()]
    return None if ok.empty else int(ok.drop_duplicates("cell").index.max()) + 1


def _save(fig: Figure, path: Path) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=100, bbox_inches="tight")


def best_so_far_caption(cells: int) -> str:
    """What the best-so-far curve is, in words: the report's caption under it (its axis says the same, shorter)."""
    return (f"geomean over all {cells} cells of the run of each cell's best speedup so far, a cell counting at the "
            "baseline (1.0) until it has an OK result faster than the baseline")


def _plot_best_so_far(evals: pd.DataFrame, run_id: str, path: Path) -> None:
    curve = best_so_far(evals)
    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    xs = range(1, len(curve) + 1)
    ax.plot(xs, curve, drawstyle="steps-post", color="tab:blue")
    gens = evals.generation.tolist()
    for i in range(1, len(gens)):  # faint line where each generation starts
        if gens[i] != gens[i - 1]:
            ax.axvline(i + 1, color="0.85", lw=0.8, zorder=0)
    ax.axhline(1.0, color="0.4", ls="--", lw=1)
    covered = _all_cells_covered_at(evals)
    if covered is not None:  # from here on no cell with an OK result is still counted at the baseline for lack of one
        ax.axvline(covered, color="tab:orange", ls=":", lw=1.2, label="every cell has an OK result")
        ax.legend(loc="lower right")
    ax.set_xlabel("(genome, cell) evaluations, in evaluation order (grey lines: generation starts)")
    ax.set_ylabel(f"geomean over all {evals.cell.nunique()} cells of\neach cell's best speedup so far\n"
                  "(1.0 until an OK result beats the baseline)", fontsize=9)
    ax.set_title(f"{run_id}: best so far vs baseline")
    ax.grid(alpha=0.3)
    _save(fig, path)


def _bar_plot(labels: list[str], values: list[float], ref: float, ylabel: str, title: str, path: Path,
              color_by_ref: bool) -> None:
    fig = Figure(figsize=(max(6.0, 0.28 * len(labels) + 2), 5))
    ax = fig.add_subplot()
    colors = ["tab:green" if v >= ref else "tab:red" for v in values] if color_by_ref else "tab:blue"
    ax.bar(range(len(labels)), values, color=colors)
    ax.axhline(ref, color="0.2", ls="--", lw=1)
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    _save(fig, path)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _md(text: Any) -> str:
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _counts_table(df: pd.DataFrame, what: str) -> list[str]:
    if df.empty:
        return [f"No {what}.", ""]
    lines = ["| status | count |", "| --- | ---: |"]
    lines += [f"| {_md(r.status)} | {r.n} |" for r in df.itertuples(index=False)]
    lines.append(f"| **total** | **{int(df.n.sum())}** |")
    return lines + [""]


def _fingerprint_lines(evals: pd.DataFrame) -> list[str]:
    fps = evals.fingerprint_json.dropna().value_counts()
    if fps.empty:
        return ["No fingerprint recorded.", ""]
    lines = []
    if evals.fingerprint_class.nunique() > 1:
        lines += ["**Warning:** evaluations from more than one fingerprint class; timings across classes "
                  "are not comparable.", ""]
    for text, n in fps.items():
        fp = json.loads(text)
        lines += [f"{n} evaluation(s):", "", "| key | value |", "| --- | --- |"]
        lines += [f"| {_md(k)} | {_md(fp[k])} |" for k in sorted(fp)]
        lines.append("")
    return lines


def _cells_table(bests: list[CellBest]) -> list[str]:
    lines = ["| cell | template | params | µs | baseline µs | speedup | GB/s | % of copy ceiling |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for b in bests:
        params = ", ".join(f"{k}={v}" for k, v in sorted(b.params.items()))
        lines.append(f"| {_md(b.cell)} | {_md(b.template)} | `{_md(params)}` | {b.median_us:.2f} | "
                     f"{_fmt(b.baseline_us, '.2f')} | {_fmt(b.speedup, '.3f')} | {_fmt(b.gbps, '.0f')} | "
                     f"{_fmt(b.pct_ceiling, '.1f')} |")
    return lines + [""]


def run_runner(config_toml: Any) -> Runner | None:
    """The runner a run's stored config names (absent: gpu, the default); None where the text cannot tell."""
    try:  # read directly, not through parse_config: an older config may hold keys since renamed
        run = tomllib.loads(config_toml).get("run", {})
        return Runner(run.get("runner", Runner.GPU.value))
    except (TypeError, ValueError, AttributeError):  # TOMLDecodeError is a ValueError
        return None


def _header_lines(run: pd.Series, evals: pd.DataFrame, totals: RunTotals, build_counts: pd.DataFrame) -> list[str]:
    what, builds = split_built_only(run.message) if isinstance(run.message, str) else ("", "")
    message = f": {_md(what)}" if what else ""
    finished = run.finished_at if pd.notna(run.finished_at) else "n/a"
    elapsed = f"{run.elapsed_s:.0f} s" if pd.notna(run.elapsed_s) else "n/a"
    sources = ", ".join(sorted(evals.source.dropna().unique())) or "n/a"
    n_gens = evals.generation.nunique()
    runner = run_runner(run.config_toml)
    head = [f"# Run report: {run.run_id}", "", "| | |", "| --- | --- |",
            f"| op | {_md(run.op)} |", f"| arch | {_md(run.arch)} |",
            f"| config hash | `{_md(run.config_hash)}` |", f"| seed | {run.seed} |",
            f"| runner | {runner.value if runner else 'n/a'} |",
            f"| status | {_md(run.status)}{message} |", f"| started | {run.created_at} |", f"| finished | {finished} |",
            f"| search time | {elapsed} |"]
    kind = "compile-only run (run.runner = 'compile'): " if runner is Runner.COMPILE else ""
    if evals.empty:  # never evaluated: no evaluation counts (all 0) beside the builds
        # the builds as the run's console said them, kept in its message (the builds table holds a build once, under
        # the run that built it first); else, from an older store or a failed run, those first built in this run
        builds = builds or (f"{int(build_counts.n.sum())} distinct, first built in this run: "
                            f"{counts_text(dict(zip(build_counts.status, build_counts.n)))}")
        return [*head, f"| candidates | {kind}none evaluated |", f"| builds | {_md(builds)} |", ""]
    return [*head,
            f"| candidates | {evals.genome_key.nunique()} genomes over {n_gens} generation(s) |",
            # the console's end of run prints these same RunTotals texts
            f"| evaluations | {totals.evaluations_text()} |",
            f"| builds | {totals.builds_text()} |",
            f"| measurements | {sources} |", ""]


def _best_lines_and_plots(evals: pd.DataFrame, totals: RunTotals, run_id: str, out_dir: Path,
                          compile_only: bool = False) -> list[str]:
    """The best-per-cell section and the plots section; draws the plots into out_dir."""
    bests = best_per_cell(evals)
    if not bests and compile_only:
        return ["**Compile-only run**: nothing was evaluated, so no best per cell, no speedup, no plots.", ""]
    if not bests:
        return ["**No OK evaluation in this run**: no best per cell, no speedup, no plots.", ""]
    with_s = [b for b in bests if b.speedup is not None]
    with_c = [b for b in bests if b.pct_ceiling is not None]
    baselines = ", ".join(sorted(evals[evals.status == "OK"].baseline.dropna().unique())) or "none"
    lines = [f"Fastest OK evaluation per cell; speedup = baseline µs / µs (baseline: {_md(baselines)}).", "",
             f"**Geomean speedup: {totals.geomean_text()}**.", "", *_cells_table(bests), "## Plots", ""]
    _plot_best_so_far(evals, run_id, out_dir / BEST_SO_FAR_PNG)
    lines += [f"![best so far]({BEST_SO_FAR_PNG})", "",
              f"Best so far: after each evaluation, the {best_so_far_caption(evals.cell.nunique())}.", ""]
    if with_s:
        _bar_plot([b.cell for b in with_s], [b.speedup for b in with_s if b.speedup is not None], 1.0,
                  "best speedup vs baseline", f"{run_id}: best speedup per cell", out_dir / SPEEDUP_PNG,
                  color_by_ref=True)
        lines += [f"![speedup per cell]({SPEEDUP_PNG})", ""]
    if with_c:
        _bar_plot([b.cell for b in with_c], [b.pct_ceiling for b in with_c if b.pct_ceiling is not None], 100.0,
                  "best GB/s, % of copy ceiling", f"{run_id}: bandwidth of the best per cell",
                  out_dir / CEILING_PNG, color_by_ref=False)
        lines += [f"![% of copy ceiling]({CEILING_PNG})", ""]
    else:
        lines += ["No copy ceiling recorded: no %-of-ceiling plot.", ""]
    return lines


def write_report(store_path: Path, run_id: str, out_dir: Path) -> Path:
    """Write report.md and its plots for run_id ('latest': the most recent run) into out_dir; return report.md."""
    with Store.open(store_path, read_only=True) as store:
        run_id = resolve_run_id(store, run_id)
        run = run_row(store, run_id)
        evals = run_evaluations(store, run_id)
        eval_counts = status_counts(store, "evaluations", run_id)
        build_counts = status_counts(store, "builds", run_id)
        totals = run_totals(store, run_id)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"--out {out_dir}: a file is in the way (the report needs a folder)") from None
    for name in (BEST_SO_FAR_PNG, SPEEDUP_PNG, CEILING_PNG):  # no stale plot from an earlier report
        (out_dir / name).unlink(missing_ok=True)
    compile_only = evals.empty and run_runner(run.config_toml) is Runner.COMPILE
    lines = [*_header_lines(run, evals, totals, build_counts),
             "## Fingerprint", "", *_fingerprint_lines(evals),
             "## Evaluations by status", "", *_counts_table(eval_counts, "evaluations"),
             "## Builds by status (first built in this run)", "", *_counts_table(build_counts, "builds"),
             "## Best per cell", "", *_best_lines_and_plots(evals, totals, run_id, out_dir, compile_only)]
    md = out_dir / "report.md"
    md.write_text("\n".join(lines))
    return md


def cmd_report(store: Path, run_id: str, out: Path | None) -> int:
    """Write a run's report (default folder: <store dir>/runs/<run_id>/report/) and print where."""
    if not store.exists():
        raise StoreError(f"no store at {store} (run an experiment first, or pass --store PATH)")
    if out is not None and out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: is a file; give a folder (it is created if missing)")
    if out is not None and out.is_dir() and any(out.iterdir()):  # a folder the user named may hold other work
        raise UsageError(f"--out {out}: is not empty; give a new or empty folder (nothing is overwritten)")
    from evo.cli.commands import open_reader

    with open_reader(store) as s:
        run_id = resolve_run_id(s, run_id)
    md = write_report(store, run_id, out if out is not None else store.parent / "runs" / run_id / "report")
    plots = [n for n in (BEST_SO_FAR_PNG, SPEEDUP_PNG, CEILING_PNG) if (md.parent / n).exists()]
    print(f"report for run {run_id}: {md}" + (f" (plots: {', '.join(plots)})" if plots else " (no plots)"))
    return 0
