"""A finished run's dispatch table as the store holds it: the winning evaluation per cell, with its
genome, template text, build and measurement, plus the run's row and every evaluation it recorded.

The table is the one the run published (`runs/RUN/dispatch.json` beside the store, written by the
search loop at its end, or `dispatch.json` beside the store naming the run, as a committed results
folder keeps it), each entry checked against the store; where there is none, the same rule is applied
to the store: per cell, the run's fastest OK evaluation (ties by genome key).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from evo.core.genome import Genome
from evo.export.errors import ExportError
from memory.results import ok_entries, run_evaluations_by_cell
from memory.runs import run_ids, run_row
from memory.sources import source_texts
from memory.store import Store

_FINISHED = "done"

@dataclass(frozen=True)
class Entry:
    """One cell of the dispatch table and the evaluation that put its genome there."""

    cell: str
    dtypes: dict[str, str]
    dims: dict[str, int]
    genome: Genome
    eval_id: str
    build_key: str
    measured_in: str
    median_us: float
    p10_us: float | None
    p90_us: float | None
    samples: int | None
    gbps: float | None
    ceiling_gbps: float | None
    baseline: str
    baseline_us: float | None
    speedup: float | None
    fingerprint: dict[str, Any]
    fingerprint_class: str
    source: str


@dataclass(frozen=True)
class RunTable:
    """What an export needs from one run."""

    run: dict[str, Any]
    op: str
    arch: str
    entries: tuple[Entry, ...]
    sources: dict[str, tuple[str, str]]  # source hash -> (text, origin)
    evaluations: pd.DataFrame  # every evaluation the run recorded (the raw results)
    table_from: str  # "dispatch.json" or "store"
    parts: tuple[RunTable, ...] = ()  # the runs merged into this table (merge_runs), none for one run

    @property
    def run_ids(self) -> tuple[str, ...]:
        """The id of the run, or of each run merged into this table."""
        return tuple(p.run["run_id"] for p in self.parts) if self.parts else (self.run["run_id"],)


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) or not math.isfinite(float(v)) else float(v)


def _entry(r: Any) -> Entry:
    fp = json.loads(r.fingerprint_json) if isinstance(r.fingerprint_json, str) else {}
    genome = Genome.make(r.op, r.template, r.source_hash, json.loads(r.params_json))
    if genome.key() != r.genome_key:
        raise ExportError(f"cell {r.cell}: candidate {r.genome_key[:12]} does not hash to its own genome "
                          f"({genome.short()}); the store is inconsistent")
    return Entry(r.cell, json.loads(r.dtypes_json), json.loads(r.dims_json), genome, r.eval_id,
                 r.build_key if isinstance(r.build_key, str) else "", r.measured_in, float(r.median_us),
                 _num(r.p10_us), _num(r.p90_us), None if pd.isna(r.samples) else int(r.samples),
                 _num(r.gbps), _num(r.ceiling_gbps), r.baseline if isinstance(r.baseline, str) else "",
                 _num(r.baseline_us), _num(r.speedup), fp,
                 r.fingerprint_class if isinstance(r.fingerprint_class, str) else "", r.source)


def published_table(store: Store, run_id: str) -> Path | None:
    """The table the run published, if it lies beside the store."""
    path = store.path.parent / "runs" / run_id / "dispatch.json"
    if path.exists():
        return path
    path = store.path.parent / "dispatch.json"  # a results folder: the store and its run's table
    if not path.exists():
        return None
    try:
        named = json.loads(path.read_text()).get("run_id")
    except (json.JSONDecodeError, AttributeError) as e:
        raise ExportError(f"{path} is not a dispatch table: {e}") from None
    return path if named == run_id else None


def _from_file(store: Store, run_id: str, path: Path) -> list[Entry]:
    table = json.loads(path.read_text()).get("dispatch", {})
    if not table:
        return []
    df = ok_entries(store, genome_keys=sorted({d["genome_key"] for d in table.values()}))
    out = []
    for cell, d in sorted(table.items()):
        # the run's own row for the pair, else the row of the run it says measured it
        rows = df[(df.cell == cell) & (df.genome_key == d["genome_key"])]
        mine = rows[rows.run_id == run_id]
        rows = mine if not mine.empty else rows[rows.measured_in == d.get("measured_in", "")]
        if rows.empty:
            raise ExportError(f"run {run_id}: {path} names genome {d['genome_key'][:12]} for cell {cell!r}, but the "
                              f"store {store.path} holds no OK evaluation of it there")
        out.append(_entry(next(rows.itertuples(index=False))))
    return out


def _from_store(store: Store, run_id: str) -> list[Entry]:
    df = ok_entries(store, run_id=run_id)
    return [_entry(next(g.itertuples(index=False))) for _, g in df.groupby("cell", sort=True)]


def read_run(store: Store, run_id: str) -> RunTable:
    """The run's dispatch table and provenance; ExportError when the run is unknown, unfinished or empty."""
    row = run_row(store, run_id)
    if row is None:
        known = run_ids(store)
        raise ExportError(f"no run {run_id!r} in {store.path}; known runs: {', '.join(known) or 'none'}")
    run = {k: (v.isoformat() if isinstance(v, pd.Timestamp) else v) for k, v in row.to_dict().items()}
    run = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in run.items()}
    if run["status"] != _FINISHED:
        hint = {"running": f"still running, or stopped without a record; `kfactory resume {run_id}` finishes it",
                "interrupted": f"interrupted; `kfactory resume {run_id}` finishes it",
                "stopped": "built only, never evaluated (no GPU)", "failed": f"failed: {run.get('message') or ''}"}
        raise ExportError(f"run {run_id} is not finished (status {run['status']!r}: "
                          f"{hint.get(run['status'], 'not done')}); only a finished run can be exported")
    path = published_table(store, run_id)
    entries = _from_file(store, run_id, path) if path else _from_store(store, run_id)
    if not entries:
        raise ExportError(f"run {run_id} has an empty dispatch table: no OK evaluation with a time, so there is "
                          "no kernel to export")
    hashes = sorted({e.genome.source_hash for e in entries})
    sources = source_texts(store, hashes)
    missing = [h[:12] for h in hashes if h not in sources]
    if missing:
        raise ExportError(f"run {run_id}: the store holds no template text for source(s) {', '.join(missing)}")
    evals = run_evaluations_by_cell(store, run_id)
    return RunTable(run, run["op"], run["arch"], tuple(entries), sources, evals,
                    "dispatch.json" if path else "store")


def merge_runs(runs: list[RunTable]) -> RunTable:
    """Several finished runs of one op as one table (e.g. the plain op's run and a run of its variants):
    their entries together, their templates and evaluations; `run` is the first's row, `parts` all of
    them. ExportError when they disagree on the arch or a cell is in two of them (which table to ship)."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    ids = ", ".join(r.run["run_id"] for r in runs)
    archs = sorted({r.arch for r in runs})
    if len(archs) > 1:
        raise ExportError(f"{len(runs)} runs of op {first.op} ({ids}) were built for different archs "
                          f"({', '.join(archs)}); export runs of one arch")
    owner: dict[str, str] = {}
    for r in runs:
        for e in r.entries:
            if e.cell in owner:
                raise ExportError(f"{len(runs)} runs of op {first.op} given ({ids}), and cell {e.cell!r} is in the "
                                  f"tables of both {owner[e.cell]} and {r.run['run_id']}; export one per op, or runs "
                                  "with no cell in common")
            owner[e.cell] = r.run["run_id"]
    entries = tuple(sorted((e for r in runs for e in r.entries), key=lambda e: e.cell))
    sources = {h: v for r in runs for h, v in r.sources.items()}
    evaluations = pd.concat([r.evaluations for r in runs], ignore_index=True)
    froms = list(dict.fromkeys(r.table_from for r in runs))
    return RunTable(first.run, first.op, first.arch, entries, sources, evaluations,
                    froms[0] if len(froms) == 1 else " and ".join(froms), tuple(runs))
