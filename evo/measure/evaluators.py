"""Evaluators: answer (genome, cell) measurements from the GPU, or from recorded data (replay).

Both speak the same interface, `evaluate(items) -> list[Outcome]`, so the search loop does not know
which one it talks to.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

import pandas as pd

from evo.build.nvrtc import BuildResult
from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.measure.draws import implied_tile, new_secret, shape_rng
from evo.measure.evaluate import make_job, variant_gap
from evo.measure.jobs import Timing
from evo.measure.verify import judge, replay_note, with_replay
from evo.templates.template import TemplateDef
from evo.core.spec import Cell, OpSpec


@dataclass(frozen=True)
class EvalItem:
    genome: Genome
    tdef: TemplateDef
    cell: Cell
    build: BuildResult


class Evaluator(Protocol):
    source: str  # 'gpu' or 'replay'
    fingerprint: dict[str, str]
    ceiling_gbps: float

    def evaluate(self, items: Sequence[EvalItem]) -> list[Outcome]: ...


def build_failed(item: EvalItem) -> Outcome:
    """The Outcome of an item whose build failed: nothing to run."""
    return Outcome(item.genome, item.cell, item.build.status, item.build.build_key, item.build.error)


def gate_cells_for(op: OpSpec, tdef: TemplateDef, genome: Genome, cell: Cell, arch: int,
                   rng: random.Random | None = None) -> list[Cell]:
    """The cells the genome's cubin for `cell` must also be right on: the op's gate cells, drawn from `rng`
    where given and the op declares gate_shapes (at residues of the tile the genome's plan implies), else its
    fixed ones (M = 1, odd M); and every edge cell of the same dtypes that the template admits with the same
    build (runtime N)."""
    params = genome.params_dict()
    dtypes = cell.dtypes_dict()
    if rng is not None and op.gate_shapes is not None:
        shapes = op.gate_shapes(cell, rng, lambda dim: implied_tile(tdef, params, arch, cell, dim))
    else:
        shapes = op.gate_cells(cell)
    out = []
    for c in [*shapes, *op.edge_cells()]:
        if c == cell or c.dtypes_dict() != dtypes or c in out:
            continue
        if any(op.dim_value(c, d) != op.dim_value(cell, d) for d in tdef.specialize):
            continue
        if tdef.is_valid(params, arch, dtypes, c.dims_dict()):
            out.append(c)
    return out


class GpuEvaluator:
    """Verify and time on the GPU through the watchdog runner; the baseline (or the named `baselines`)
    is timed beside every candidate. The search loop, `kfactory bench` and the sweep all use it."""

    source = "gpu"

    def __init__(self, op: OpSpec, arch: int, runner: Any, timing: Timing, seed: int,
                 baselines: Sequence[str] | None = None, baseline: bool = True) -> None:
        self.op, self.arch, self.runner, self.timing, self.seed = op, arch, runner, timing, seed
        self.baselines = None if baselines is None else tuple(baselines)
        self.baseline = baseline  # False: no peer timed beside the candidates
        from evo.build.nvrtc import compiler_version

        self.fingerprint = dict(runner.fingerprint, nvrtc_build=compiler_version())
        self.ceiling_gbps = runner.ceiling_gbps
        self._n = 0
        # (build key, gate cell label) pairs an OK job of this evaluator has passed: a gate cell runs the
        # build's own cubin, so a second cell sharing the build (the same N at another M) need not rerun it
        self._passed: set[tuple[str, str]] = set()

    def evaluate(self, items: Sequence[EvalItem]) -> list[Outcome]:
        """One runner call per batch, so several devices work in parallel. Each job draws its own secret: its
        gate cells' shapes and scalars, its decode loop, guards and fills (the outcome's `replay`, and a
        failure's error). A plan that leaves out a tensor of its cell's variant is INVALID there, never run."""
        jobs, ok_items, checked = [], [], []
        judged = {}
        for it in items:
            if not it.build.status.ok:
                continue
            why = variant_gap(self.op, it.tdef, it.genome, it.cell, self.arch)
            if why:
                judged[id(it)] = Outcome(it.genome, it.cell, Status.INVALID, it.build.build_key, why,
                                         "variant left out")
                continue
            self._n += 1
            secret = new_secret()
            gates = [gc for gc in gate_cells_for(self.op, it.tdef, it.genome, it.cell, self.arch, shape_rng(secret))
                     if (it.build.build_key, gc.label()) not in self._passed]
            jobs.append(make_job(self.op, it.tdef, it.genome, it.build, it.cell, self.arch,
                                 self.seed * 100003 + self._n, self.timing, baseline=self.baseline, gate_cells=gates,
                                 baselines=self.baselines, secret=secret))
            ok_items.append(it)
            checked.append([gc.label() for gc in gates])
        for it, job, labels, res in zip(ok_items, jobs, checked, self.runner.run(jobs)):
            o = judge(res, {k: t[2] for k, t in job.tolerances}, it.genome, it.cell, it.build.build_key)
            judged[id(it)] = with_replay(o, replay_note(job))
            if o.status is Status.OK:
                self._passed |= {(it.build.build_key, label) for label in labels}
        return [judged[id(it)] if it.build.status.ok else build_failed(it) for it in items]


class ReplayEvaluator:
    """Answer from a recorded sweep (Parquet); a pair never recorded is UNKNOWN, never invented."""

    source = "replay"

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"replay data not found: {p}")
        df = pd.read_parquet(p)
        need = {"genome_key", "cell", "status", "median_us", "baseline_us", "fingerprint_json"}
        missing = need - set(df.columns)
        if missing:
            raise ValueError(f"replay data {p} lacks columns {sorted(missing)}")
        self.path = p
        self._rows = {(r.genome_key, r.cell): r for r in df.itertuples(index=False)}
        base = df.dropna(subset=["baseline_us"]).groupby("cell")["baseline_us"].median()
        self._baseline = base.to_dict()
        self.fingerprint = dict(json.loads(df["fingerprint_json"].iloc[0]), replay=str(p.name))
        self.ceiling_gbps = float(df["ceiling_gbps"].iloc[0]) if "ceiling_gbps" in df else 0.0

    def best_per_cell(self) -> dict[str, float]:
        """The fastest OK time recorded for every cell (what 'within 1% of the best' refers to)."""
        best: dict[str, float] = {}
        for (_, cell), r in self._rows.items():
            if r.status == "OK" and r.median_us == r.median_us:
                best[cell] = min(best.get(cell, math.inf), float(r.median_us))
        return best

    def evaluate(self, items: Sequence[EvalItem]) -> list[Outcome]:
        out = []
        for it in items:
            if not it.build.status.ok:
                out.append(build_failed(it))
                continue
            r = self._rows.get((it.genome.key(), it.cell.label()))
            base = self._baseline.get(it.cell.label(), math.inf)
            if r is None:
                out.append(Outcome(it.genome, it.cell, Status.UNKNOWN, it.build.build_key,
                                   "no recorded measurement for this genome and cell", baseline_us=base))
                continue
            status = Status(r.status)
            ok = status is Status.OK
            out.append(Outcome(it.genome, it.cell, status, it.build.build_key, str(r.error or "") if not ok else "",
                               median_us=float(r.median_us) if ok else math.inf,
                               p10_us=float(getattr(r, "p10_us", math.inf) or math.inf) if ok else math.inf,
                               p90_us=float(getattr(r, "p90_us", math.inf) or math.inf) if ok else math.inf,
                               samples=int(getattr(r, "samples", 0) or 0), baseline_us=base))
        return out
