"""`kfactory bench`: verify and time given candidates against the baselines over an op's matrix."""

from __future__ import annotations

import csv
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from evo.build.nvrtc import Builder, prepare
from evo.measure.evaluators import EvalItem, GpuEvaluator
from evo.core.genome import Genome
from evo.measure.jobs import Timing
from evo.loop.pipeline import arch_number
from evo.measure.run import GpuRunner, gpu_available
from evo.search.space import repair
from evo.core.status import Status
from evo.templates.template import TemplateDef, load_templates
from ops import KNOWN, get_op
from ops.spec import Cell, OpSpec, gbps


@dataclass(frozen=True)
class BenchRow:
    candidate: str
    template: str
    genome_key: str
    params: str
    cell: str
    dtype: str
    dims: str
    status: str
    median_us: float
    p10_us: float
    p90_us: float
    samples: int
    baseline_us: float
    speedup: float
    gbps: float
    pct_ceiling: float
    graph: bool
    regs: int
    error: str
    peers: str = "{}"  # JSON: every named baseline timed beside it -> median us
    absent: str = "{}"  # JSON: baselines asked for that could not be had -> why
    best_peer: str = ""
    speedup_vs_best_peer: float = 0.0


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
                params = fixed.params_dict() if fixed else default_for_cell(tdef, arch_n, cell)
                if params is None or not tdef.is_valid(params, arch_n, cell.dtypes_dict(), cell.dims_dict()):
                    rows.append(_row(label, tdef, None, cell, Status.INVALID, "no legal point for this cell"))
                    continue
                g = Genome.make(op.name, tdef.name, tdef.source_hash, params)
                (b,) = builder.build([prepare(tdef, g, arch, cell.dtypes_dict(), cell.dims_dict())])
                (ev,) = evaluator.evaluate([EvalItem(g, tdef, cell, b)])
                ok = ev.status is Status.OK
                bw = gbps(op.bytes_moved(cell), ev.median_us * 1e-6) if ok else 0.0
                best = min(ev.peers, key=lambda p: p[1]) if ev.peers else ("", math.inf)
                rows.append(BenchRow(
                    label, tdef.name, g.key(), g.params_json(), cell.label(), cell.dtype(op.dtype_roles[0]).short,
                    json.dumps(cell.dims_dict(), sort_keys=True), ev.status.value, ev.median_us, ev.p10_us, ev.p90_us,
                    ev.samples, ev.baseline_us, ev.baseline_us / ev.median_us if ok else 0.0, bw,
                    100.0 * bw / runner.ceiling_gbps if ok and runner.ceiling_gbps else 0.0, ev.graph, b.regs,
                    ev.error, json.dumps(dict(ev.peers)), json.dumps(dict(ev.absent)), best[0],
                    best[1] / ev.median_us if ok and best[0] else 0.0))
                print(f"{label:>10} {cell.label():<28} {ev.status.value:<12} {ev.median_us:9.2f} us "
                      f"{ev.baseline or 'baseline'} {ev.baseline_us:9.2f} us  x{rows[-1].speedup:5.2f}  "
                      f"best peer {best[0] or '-'} x{rows[-1].speedup_vs_best_peer:5.2f}  {bw:7.0f} GB/s", flush=True)
    return rows


def _row(label: str, tdef: TemplateDef, g: Genome | None, cell: Cell, status: Status, error: str, regs: int = 0) -> BenchRow:
    return BenchRow(label, tdef.name, g.key() if g else "", g.params_json() if g else "", cell.label(),
                    cell.dtypes[0][1].short, json.dumps(cell.dims_dict(), sort_keys=True), status.value,
                    math.inf, math.inf, math.inf, 0, math.inf, 0.0, 0.0, 0.0, False, regs, error)


def geomean(xs: Iterable[float]) -> float:
    v = [x for x in xs if x > 0 and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(v)))) if v else 0.0


def write(rows: Sequence[BenchRow], prefix: Path, fingerprint: dict[str, str], ceiling: float) -> None:
    """PREFIX.csv (every cell), PREFIX.md (table + geomean), PREFIX.json (fingerprint and summary)."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    fields = list(BenchRow.__dataclass_fields__)
    with open(prefix.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(fields)
        for r in rows:
            w.writerow([getattr(r, k) for k in fields])
    summary = {}
    for label in dict.fromkeys(r.candidate for r in rows):
        mine = [r for r in rows if r.candidate == label]
        ok = [r for r in mine if r.status == "OK"]
        summary[label] = {"cells": len(mine), "ok": len(ok), "geomean_speedup_vs_torch": geomean(r.speedup for r in ok),
                          "geomean_speedup_vs_best_peer": geomean(r.speedup_vs_best_peer for r in ok),
                          "cells_at_or_above_best_peer": sum(r.speedup_vs_best_peer >= 1.0 for r in ok),
                          "geomean_pct_ceiling": geomean(r.pct_ceiling for r in ok)}
    meta = {"fingerprint": fingerprint, "copy_ceiling_gbps": ceiling, "summary": summary,
            "method": "the gate (evo/measure/gate.py): median of >=100 samples, L2 flushed and persisting lines reset before "
                      "each, CUDA graph of one launch per input set when the cell's bytes take < 5 us at the copy "
                      "ceiling, every named peer timed beside the candidate on the same inputs, interleaved in "
                      "one process, both orders"}
    prefix.with_suffix(".json").write_text(json.dumps(meta, indent=2, sort_keys=True))
    lines = [f"# Bench: {', '.join(summary)}", "",
             f"GPU: {fingerprint.get('gpu')}, SM clock {fingerprint.get('sm_clock_mhz')} MHz (max "
             f"{fingerprint.get('sm_clock_max_mhz')}), driver {fingerprint.get('driver')}, copy ceiling "
             f"{ceiling:.0f} GB/s.", "",
             "| candidate | cell | status | µs | torch µs | speedup | best peer | vs best peer | GB/s | % copy | regs |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.candidate} | {r.cell} | {r.status} | {r.median_us:.2f} | {r.baseline_us:.2f} | "
                     f"{r.speedup:.2f} | {r.best_peer or '-'} | {r.speedup_vs_best_peer:.3f} | {r.gbps:.0f} | "
                     f"{r.pct_ceiling:.0f}% | {r.regs} |")
    absent = sorted({f"{k}: {v}" for r in rows for k, v in json.loads(r.absent).items()})
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
    """Each entry of a dispatch.json (cell label -> template, params) as (its genome, [its cell]).
    The genome is rebuilt from today's template text; an entry whose template is gone is an error."""
    from evo.cli.errors import UnknownNameError

    try:
        table = json.loads(Path(path).read_text())["dispatch"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UnknownNameError(f"{path}: not a dispatch table ({type(e).__name__}: {e})") from None
    by_label = {c.label(): c for c in [*op.matrix(), *op.edge_cells()]}
    plan = []
    for label, e in table.items():
        if label not in by_label:
            raise UnknownNameError(f"{path}: cell {label!r} is not in op {op.name}'s matrix or edge cells")
        if e.get("template") not in tdefs:
            raise UnknownNameError(f"{path}: template {e.get('template')!r} of {label!r} is not a template of {op.name}")
        t = tdefs[e["template"]]
        g = Genome.make(op.name, t.name, t.source_hash, e["params"])
        plan.append(([(f"{t.name}:{g.key()[:8]}", t, g)], [by_label[label]]))
    return plan


def cmd_bench(args: Any) -> int:
    from evo.cli.errors import UnknownNameError

    if args.op not in KNOWN:
        raise UnknownNameError(f"unknown op {args.op!r}; known ops: {', '.join(KNOWN)}")
    op = get_op(args.op)
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
        from memory.store import Store

        with Store.open(args.store, read_only=True) as store:
            for key in args.genome:
                df = store.sql("SELECT template, params_json FROM candidates WHERE genome_key = ?", [key])
                if df.empty:
                    raise UnknownNameError(f"no candidate with genome key {key} in {args.store}")
                t = tdefs[df.template[0]]
                cands.append((key[:10], t, Genome.make(op.name, t.name, t.source_hash, json.loads(df.params_json[0]))))
    cells = op.matrix()
    if args.quick:
        cells = [c for i, c in enumerate(cells) if i % 12 == 0]
    plan = [(cands, cells)] if not args.dispatch else dispatch_plan(op, tdefs, args.dispatch)
    if args.cells:
        import re

        try:
            pick = re.compile(args.cells)
        except re.error as e:
            raise UnknownNameError(f"--cells {args.cells!r} is not a regular expression: {e}") from None
        plan = [(cs, [c for c in cl if pick.search(c.label())]) for cs, cl in plan]
        plan = [(cs, cl) for cs, cl in plan if cl]
        if not plan:
            raise UnknownNameError(f"--cells {args.cells!r} matches no cell (labels look like 'w=bf16,x=bf16 M4096-N1024')")
    peers = args.peer if args.peer is not None else None
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
