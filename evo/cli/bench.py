"""`kfactory bench`: verify and time given candidates against the baselines over an op's matrix."""

from __future__ import annotations

import csv
import json
import math
import random
import time
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from evo.build.nvrtc import Builder, prepare
from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.loop.pipeline import arch_number
from evo.measure.evaluators import EvalItem, GpuEvaluator
from evo.measure.flush import FLUSH_HOW
from evo.measure.gate import HOLD_US, PEER_TOL_FACTOR
from evo.measure.jobs import Timing
from evo.measure.run import GpuRunner, gpu_available
from evo.search.space import repair
from evo.templates.template import TemplateDef, load_templates
from evo.core.registry import get_op
from evo.core.spec import Cell, OpSpec, gbps

# PREFIX.csv's columns (the committed bench files have them, in this order)
CSV_COLUMNS = ("candidate", "template", "genome_key", "params", "cell", "dtype", "dims", "status", "median_us", "p10_us",
               "p90_us", "samples", "baseline_us", "speedup", "gbps", "pct_ceiling", "graph", "regs", "error", "peers",
               "absent", "best_peer", "speedup_vs_best_peer", "peers_checked")


@dataclass(frozen=True)
class BenchRow:
    """One bench line: a candidate's Outcome on one cell (None: no legal point there). The CSV columns
    (`columns()`) are derived from it, with the cell's bytes and the run's copy ceiling."""

    candidate: str
    template: str
    cell: Cell
    dtype: str  # the op's first dtype role on this cell, short ('bf16')
    outcome: Outcome | None
    regs: int
    bytes_moved: int
    ceiling_gbps: float
    refused: str = ""  # without an outcome: why the cell got no point (the constraints a given point breaks)

    @property
    def status(self) -> str:
        return (self.outcome.status if self.outcome else Status.INVALID).value

    @property
    def ok(self) -> bool:
        return self.outcome is not None and self.outcome.status is Status.OK

    @property
    def speedup(self) -> float:
        """vs the first named baseline (the one the store records)."""
        o = self.outcome
        return o.baseline_us / o.median_us if o and self.ok else 0.0

    @property
    def gbps(self) -> float:
        return gbps(self.bytes_moved, self.outcome.median_us * 1e-6) if self.outcome and self.ok else 0.0

    @property
    def pct_ceiling(self) -> float:
        return 100.0 * self.gbps / self.ceiling_gbps if self.ok and self.ceiling_gbps else 0.0

    @property
    def best_peer(self) -> tuple[str, float]:
        """The fastest named baseline timed beside it, and its median ('' and inf when none)."""
        peers = self.outcome.peers if self.outcome else ()
        return min(peers, key=lambda p: p[1]) if peers else ("", math.inf)

    @property
    def speedup_vs_best_peer(self) -> float:
        name, us = self.best_peer
        return us / self.outcome.median_us if self.outcome and self.ok and name else 0.0

    def columns(self) -> dict[str, Any]:
        """The CSV line, in column order."""
        o, g = self.outcome, self.outcome.genome if self.outcome else None
        return {"candidate": self.candidate, "template": self.template, "genome_key": g.key() if g else "",
                "params": g.params_json() if g else "", "cell": self.cell.label(), "dtype": self.dtype,
                "dims": json.dumps(self.cell.dims_dict(), sort_keys=True), "status": self.status,
                "median_us": o.median_us if o else math.inf, "p10_us": o.p10_us if o else math.inf,
                "p90_us": o.p90_us if o else math.inf, "samples": o.samples if o else 0,
                "baseline_us": o.baseline_us if o else math.inf, "speedup": self.speedup, "gbps": self.gbps,
                "pct_ceiling": self.pct_ceiling, "graph": o.graph if o else False, "regs": self.regs,
                "error": o.error if o else self.refused or "no legal point for this cell",
                "peers": json.dumps(dict(o.peers if o else ())), "absent": json.dumps(dict(o.absent if o else ())),
                "best_peer": self.best_peer[0], "speedup_vs_best_peer": self.speedup_vs_best_peer,
                "peers_checked": json.dumps(dict(o.peers_checked if o else ()))}


def default_for_cell(tdef: TemplateDef, arch: int, cell: Cell) -> dict[str, Any] | None:
    """The template's default point, repaired to the nearest point legal on this cell."""
    return repair(tdef, tdef.default_params(), random.Random(0), arch, [cell.dtypes_dict()], [cell.dims_dict()])


def bench(
    op: OpSpec,
    candidates: Sequence[tuple[str, TemplateDef, Genome | None]],
    cells: Sequence[Cell],
    arch: str,
    runner: GpuRunner,
    timing: Timing,
    seed: int = 1,
    peers: Sequence[str] | None = None,
) -> list[BenchRow]:
    """Every candidate on every cell; a candidate given as None uses its template's default per cell.
    `peers` names the baselines timed beside each candidate (default: every baseline the op declares)."""
    peers = tuple(op.baselines if peers is None else peers)
    arch_n = arch_number(arch)
    evaluator = GpuEvaluator(op, arch_n, runner, timing, seed, baselines=peers)
    rows: list[BenchRow] = []
    with Builder(workers=2) as builder:
        for label, tdef, fixed in candidates:
            for cell in cells:
                where = {"candidate": label, "template": tdef.name, "cell": cell,
                         "dtype": cell.dtype(op.dtype_roles[0]).short, "bytes_moved": op.bytes_moved(cell),
                         "ceiling_gbps": runner.ceiling_gbps}
                params = fixed.params_dict() if fixed else default_for_cell(tdef, arch_n, cell)
                bad = [] if params is None else tdef.violations(params, arch_n, cell.dtypes_dict(), cell.dims_dict())
                if params is None or bad:
                    rows.append(BenchRow(**where, outcome=None, regs=0,
                                         refused=f"the point breaks {', '.join(bad)} here" if bad else ""))
                    continue
                g = Genome.make(op.name, tdef.name, tdef.source_hash, params)
                t0 = time.monotonic()
                (b,) = builder.build([prepare(tdef, g, arch, cell.dtypes_dict(), cell.dims_dict())])
                (o,) = evaluator.evaluate([EvalItem(g, tdef, cell, b)])
                r = BenchRow(**where, outcome=o, regs=b.regs)
                rows.append(r)
                print(f"{label:>10} {cell.label():<28} {o.status.value:<12} {o.median_us:9.2f} us "
                      f"{o.baseline or 'baseline'} {o.baseline_us:9.2f} us  x{r.speedup:5.2f}  "
                      f"best peer {r.best_peer[0] or '-'} x{r.speedup_vs_best_peer:5.2f}  {r.gbps:7.0f} GB/s  "
                      f"(build, check, peers' first calls and timing: {time.monotonic() - t0:.0f} s)",
                      flush=True)
    return rows


def geomean(xs: Iterable[float]) -> float:
    v = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(v)))) if v else 0.0


def write(rows: Sequence[BenchRow], prefix: Path, fingerprint: dict[str, str], ceiling: float) -> None:
    """PREFIX.csv (every cell), PREFIX.md (table + geomean), PREFIX.json (fingerprint and summary)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    lines_csv = [r.columns() for r in rows]
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for c in lines_csv:
            w.writerow([c[k] for k in CSV_COLUMNS])
    summary = {}
    for label in dict.fromkeys(r.candidate for r in rows):
        mine = [r for r in rows if r.candidate == label]
        ok = [r for r in mine if r.status == "OK"]
        summary[label] = {"cells": len(mine), "ok": len(ok), "geomean_speedup_vs_torch": geomean(r.speedup for r in ok),
                          "geomean_speedup_vs_best_peer": geomean(r.speedup_vs_best_peer for r in ok),
                          "cells_at_or_above_best_peer": sum(r.speedup_vs_best_peer >= 1.0 for r in ok),
                          "geomean_pct_ceiling": geomean(r.pct_ceiling for r in ok)}
    meta = {"fingerprint": fingerprint, "copy_ceiling_gbps": ceiling, "summary": summary,
            "method": "the gate (evo/measure/gate.py): median of >=100 samples, persisting L2 lines reset and the L2 "
                      f"flushed before each (by {FLUSH_HOW.get(fingerprint.get('l2_flush', 'write'), '?')}), CUDA "
                      "graph of one launch per input set when the cell's bytes take < 5 us at the copy ceiling, "
                      "every named peer timed beside the candidate on the same inputs, interleaved in one process, "
                      "both orders (launch by launch, each timed call, ours too, queued behind a "
                      f"{HOLD_US:g} us spin kernel so a peer's host-side dispatch is not timed); a peer is timed "
                      "only if its outputs matched the float64 reference "
                      f"({PEER_TOL_FACTOR:g} x the op's tolerances; else absent, 'wrong: ...'), column peers_checked"}
    prefix.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    lines = [f"# Bench: {', '.join(summary)}", "",
             f"GPU: {fingerprint.get('gpu')}, SM clock {fingerprint.get('sm_clock_mhz')} MHz (max "
             f"{fingerprint.get('sm_clock_max_mhz')}), driver {fingerprint.get('driver')}, copy ceiling "
             f"{ceiling:.0f} GB/s.", "",
             "| candidate | cell | status | µs | torch µs | speedup | best peer | vs best peer | GB/s | % copy | regs |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for c in lines_csv:
        lines.append(f"| {c['candidate']} | {c['cell']} | {c['status']} | {c['median_us']:.2f} | {c['baseline_us']:.2f} | "
                     f"{c['speedup']:.2f} | {c['best_peer'] or '-'} | {c['speedup_vs_best_peer']:.3f} | {c['gbps']:.0f} | "
                     f"{c['pct_ceiling']:.0f}% | {c['regs']} |")
    absent = sorted({f"{k}: {v}" for r in rows if r.outcome for k, v in r.outcome.absent})
    if absent:
        lines += ["", "Peers asked for but absent (never replaced): " + "; ".join(absent)]
    lines += ["", "| candidate | OK cells | geomean vs torch | geomean vs best peer | cells >= best peer | "
              "geomean % of copy |", "|---|---:|---:|---:|---:|---:|"]
    for label, s in summary.items():
        lines.append(f"| {label} | {s['ok']}/{s['cells']} | {s['geomean_speedup_vs_torch']:.3f} | "
                     f"{s['geomean_speedup_vs_best_peer']:.3f} | {s['cells_at_or_above_best_peer']} | "
                     f"{s['geomean_pct_ceiling']:.1f}% |")
    prefix.with_suffix(".md").write_text("\n".join(lines) + "\n")


def dispatch_plan(op: OpSpec, tdefs: dict[str, TemplateDef], path: Path
                  ) -> list[tuple[list[tuple[str, TemplateDef, Genome | None]], list[Cell]]]:
    """Each entry of a dispatch.json (cell label -> template, params) as (its genome, [its cell]), the
    cells that move the fewest bytes first. The genome is rebuilt from today's template text, with the params
    added since at their defaults; an entry whose template or one of whose params is gone is an error."""
    from evo.cli.errors import UnknownNameError

    try:
        table = json.loads(Path(path).read_text())["dispatch"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnknownNameError(f"{path}: not a dispatch table ({type(e).__name__}: {e})") from None
    by_label = {c.label(): c for c in op.all_cells()}
    plan = []
    for label, e in table.items():
        if label not in by_label:
            raise UnknownNameError(f"{path}: cell {label!r} is not in op {op.name}'s matrices or edge cells")
        if e.get("template") not in tdefs:
            raise UnknownNameError(f"{path}: template {e.get('template')!r} of {label!r} is not a template of {op.name}")
        t = tdefs[e["template"]]
        try:  # a table recorded before a param was added runs with that param at its default
            params = t.complete(e["params"])
        except ValueError as err:
            raise UnknownNameError(f"{path}: entry {label!r}: {err}") from None
        g = Genome.make(op.name, t.name, t.source_hash, params)
        plan.append(([(f"{t.name}:{g.key()[:8]}", t, g)], [by_label[label]]))
    # smallest cells first: files are written after every entry, so a bench stopped by its time limit
    # (the gate's float64 reference and a peer's autotune grow with the cell) leaves the most rows
    return sorted(plan, key=lambda entry: (op.bytes_moved(entry[1][0]), entry[1][0].label()))


def cmd_bench(args: Any) -> int:
    from evo.cli.errors import UnknownNameError

    op = get_op(args.op)  # an unknown op is UnknownOpError, saying what an op folder being added lacks
    tdefs = load_templates(op.name)
    names = args.template or sorted(tdefs)
    unknown = [n for n in names if n not in tdefs]
    if unknown:
        raise UnknownNameError(f"no template(s) {unknown} for op {op.name} (have {sorted(tdefs)})")
    cands: list[tuple[str, TemplateDef, Genome | None]] = [(n, tdefs[n], None) for n in names]
    if args.params:
        if len(args.template) != 1:
            raise UnknownNameError("--params needs exactly one --template")
        t = tdefs[args.template[0]]
        params = {**t.default_params(), **json.loads(args.params)}
        bad = [k for k in params if k not in t.param_names]
        if bad:
            raise UnknownNameError(f"template {t.name} has no params {bad} (params: {list(t.param_names)})")
        cands = [(t.name, t, Genome.make(op.name, t.name, t.source_hash, params))]
    if args.genome:
        from memory.sources import candidate_params
        from memory.store import Store

        with Store.open(args.store, read_only=True) as store:
            for key in args.genome:
                found = candidate_params(store, key)
                if found is None:
                    raise UnknownNameError(f"no candidate with genome key {key} in {args.store}")
                t = tdefs[found[0]]
                cands.append((key[:10], t, Genome.make(op.name, t.name, t.source_hash, json.loads(found[1]))))
    cells = op.matrix()
    if args.quick:
        cells = [c for i, c in enumerate(cells) if i % 12 == 0]
    plan = [(cands, cells)] if not args.dispatch else dispatch_plan(op, tdefs, args.dispatch)
    if args.cells:
        try:
            pick = re.compile(args.cells)
        except re.error as e:
            raise UnknownNameError(f"--cells {args.cells!r} is not a regular expression: {e}") from None
        plan = [(cs, [c for c in cl if pick.search(c.label())]) for cs, cl in plan]
        plan = [(cs, cl) for cs, cl in plan if cl]
        if not plan:
            raise UnknownNameError(f"--cells {args.cells!r} matches no cell (labels look like 'w=bf16,x=bf16 M4096-N1024')")
    peers = args.peer  # None: every baseline the op declares
    bad = [p for p in (peers or ()) if p not in op.baselines]
    if bad:
        raise UnknownNameError(f"op {op.name} declares no baseline(s) {bad} (declares {list(op.baselines)})")
    if not gpu_available():
        from evo.loop.pipeline import NoGpuError

        raise NoGpuError("kfactory bench needs an NVIDIA GPU and none is visible")
    from evo.build.nvrtc import compiler_version

    with GpuRunner(timeout_s=args.timeout_s) as runner:
        rows: list[BenchRow] = []
        for cs, cl in plan:  # written after every step: a run cut short keeps what it measured
            rows += bench(op, cs, cl, args.arch, runner, Timing(), peers=peers)
            write(rows, args.out, dict(runner.fingerprint, nvrtc_build=compiler_version()), runner.ceiling_gbps)
    print(f"wrote {args.out.with_suffix('.csv')}, .md, .json")
    return 0
