"""The one writer of a run's generations: Outcomes become `evaluations` rows, and everything a generation
produced (LLM calls, sources, candidates, builds, evaluations, lesson uses, the time spent) is written
in one DuckDB transaction: all of it, or, if anything fails, none of it."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence

from evo.core.outcome import Outcome
from evo.loop.generation import Generation
from evo.loop.pipeline import Session
from memory.rows import EvaluationRow, Row
from evo.core.spec import OpSpec, gbps


def eval_id(run_id: str, genome_key: str, cell: str) -> str:
    """Deterministic id: a (genome, cell) pair is evaluated at most once per run, and reruns of a seeded
    run produce the same ids (lesson extraction orders by them, so ties break the same way)."""
    return hashlib.sha256(f"{run_id}|{genome_key}|{cell}".encode()).hexdigest()[:32]


def fingerprint_class(fp: dict[str, str]) -> str:
    """Measurements are comparable within a class: same GPU, arch, driver, compiler of the cubins, gate (a
    result an older gate accepted is not evidence under a stricter one) and L2 flush before each sample.
    Every measurement before the flush was recorded used a memset ("write"): that mode keeps the classes
    those rows were stored with; another mode ("read", evo/measure/worker.py) adds itself."""
    base = "|".join(fp.get(k, "?") for k in ("gpu", "arch", "driver", "nvrtc_build", "gate"))
    flush = fp.get("l2_flush", "write")
    return base if flush == "write" else f"{base}|l2 {flush}"


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def evaluation_rows(op: OpSpec, run_id: str, outcomes: Sequence[Outcome], generation: int,
                    fingerprint: dict[str, str], ceiling: float, source: str) -> list[EvaluationRow]:
    """The store's view of a batch of Outcomes: one `evaluations` row each (a ceiling of 0 records none)."""
    fp_json = json.dumps(fingerprint, sort_keys=True)
    fp_class = fingerprint_class(fingerprint)
    default_base = op.baselines[0] if op.baselines else "baseline"
    rows = []
    for o in outcomes:
        ok = o.timed
        has_base = math.isfinite(o.baseline_us)
        rows.append(EvaluationRow(
            eval_id=eval_id(run_id, o.genome.key(), o.cell.label()), run_id=run_id, genome_key=o.genome.key(),
            build_key=o.build_key or None, cell=o.cell.label(),
            dtypes_json=json.dumps(o.cell.dtypes_dict(), sort_keys=True),
            dims_json=json.dumps(o.cell.dims_dict(), sort_keys=True), status=o.status.value,
            median_us=o.median_us if ok else None, p10_us=_finite(o.p10_us) if ok else None,
            p90_us=_finite(o.p90_us) if ok else None, samples=o.samples or None,
            gbps=gbps(op.bytes_moved(o.cell), o.median_us * 1e-6) if ok else None,
            ceiling_gbps=ceiling or None, baseline=(o.baseline or default_base) if has_base else None,
            baseline_us=o.baseline_us if has_base else None,
            speedup=o.baseline_us / o.median_us if ok and has_base else None,
            max_abs_err=_finite(o.max_abs_err), rel_norm_err=_finite(o.rel_norm_err),
            error=o.error or None, fingerprint_json=fp_json, fingerprint_class=fp_class,
            generation=generation, source=source, reused_from=o.reused_from or None))
    return rows


class Recorder:
    """Writes each generation of a run through one store batch (one transaction), with the time spent."""

    def __init__(self, session: Session, fingerprint: dict[str, str], ceiling_gbps: float, source: str) -> None:
        self.session, self.fingerprint, self.ceiling_gbps, self.source = session, fingerprint, ceiling_gbps, source

    def rows(self, gen: Generation, credits: Sequence[Row]) -> list[Row]:
        """Every row of the generation; within a table, in the order the stages produced them."""
        s = self.session
        measured = evaluation_rows(s.op, s.run_id, gen.outcomes, gen.number, self.fingerprint, self.ceiling_gbps,
                                   self.source)
        # a rejection was never run: no ceiling was measured for it
        rejected = evaluation_rows(s.op, s.run_id, gen.rejections, gen.number, self.fingerprint, 0.0, self.source)
        return [*gen.rows, *measured, *rejected, *credits]

    def __call__(self, gen: Generation, credits: Sequence[Row]) -> None:
        rows = self.rows(gen, credits)
        with self.session.store.batch() as b:
            b.add_all(rows)
            b.record_elapsed(self.session.run_id, gen.elapsed_s)
