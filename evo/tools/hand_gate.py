"""A genome's gate job built as the search's evaluator builds it, for running the gate by hand (`kfactory regate`,
experiments/scripts/gate_overhead.py): the genome built by NVRTC for one cell, its job
(the search's timing protocol, its gate cells, a baseline or none), a gate of any class over it, and the verdict."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from evo.tools.errors import ToolInputError


def cell_by_prefix(op: Any, prefix: str) -> Any:
    """The first matrix cell of `op` whose label starts with `prefix`; ValueError naming both when none does."""
    cell = next((c for c in op.matrix() if c.label().startswith(prefix)), None)
    if cell is None:
        raise ToolInputError(f"no {op.name} matrix cell starts with {prefix!r}")
    return cell


def fresh_rng() -> random.Random:
    """A gate's own random stream, seeded from the OS (each repetition's inputs, poison and checks differ)."""
    return random.Random(int.from_bytes(os.urandom(8), "little"))


@dataclass(frozen=True)
class HandJob:
    op: Any
    tdef: Any
    genome: Any
    build: Any
    cell: Any
    job: Any
    gate_cells: tuple[Any, ...] = field(default=())

    @cached_property
    def object_code(self) -> Any:
        from cuda.core import ObjectCode

        return ObjectCode.from_cubin(self.job.cubin)

    def gate(self, cls: Any, worker: Any, rng: random.Random) -> Any:
        """A gate of class `cls` (evo.measure.gate.Gate or a subclass) over this job in `worker`, not yet run."""
        mod, ref_obj = worker._op(self.op.name)
        return cls(worker, self.job, self.object_code, ref_obj, mod, rng, worker.fingerprint, worker.ceiling_gbps)

    def judge(self, result: Any) -> Any:
        """The verdict on a gate's result, with the job's tolerances (evo.measure.verify.judge)."""
        from evo.measure.verify import judge

        return judge(result, {k: tol[2] for k, tol in self.job.tolerances}, self.genome, self.cell,
                     self.build.build_key)


def hand_job(builder: Any, op: Any, tdef: Any, params: dict[str, Any], cell: Any, *, seed: int,
             baseline: bool = False, gate_cells: bool = True, arch: int = 90, secret: int = 0) -> HandJob:
    """The genome of `tdef` at `params` built for `cell` (RuntimeError with NVRTC's message when it does not build)
    and its gate job drawn from `secret` (a fresh one from the OS when 0; a failure's replay note names it); with
    `gate_cells` the GA's gate cells too (evo.measure.evaluators.gate_cells_for)."""
    from evo.build.nvrtc import prepare
    from evo.core.genome import Genome
    from evo.measure.draws import new_secret, shape_rng
    from evo.measure.evaluate import make_job
    from evo.measure.evaluators import gate_cells_for
    from evo.measure.jobs import Timing

    g = Genome.make(op.name, tdef.name, tdef.source_hash, params)
    (b,) = builder.build([prepare(tdef, g, f"sm_{arch}a", cell.dtypes_dict(), cell.dims_dict())])
    if not b.status.ok:
        raise RuntimeError(f"{tdef.name} {params} on {cell.label()} did not build: {b.error}")
    secret = secret or new_secret()
    gates = tuple(gate_cells_for(op, tdef, g, cell, arch, shape_rng(secret))) if gate_cells else ()
    job = make_job(op, tdef, g, b, cell, arch, seed=seed, timing=Timing(), baseline=baseline, gate_cells=gates,
                   secret=secret)
    return HandJob(op, tdef, g, b, cell, job, gates)
