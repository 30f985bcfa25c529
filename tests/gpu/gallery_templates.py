"""Run the template galleries through the real evaluator path: KDA's (gallery_kda.cu.j2) and the RMSNorm backward's
(gallery_bwd.cu.j2). Each cheat is a genome of a template written for the purpose (its `cheat` parameter), built by
NVRTC, its job made as the search makes one (check cells and scalars drawn from a fresh secret; for KDA the decode
loop and the causal check), run by the GPU runner and judged. Every cheat must be rejected; the honest kernel
must pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evo.build.nvrtc import build_point
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.draws import new_secret, shape_rng
from evo.measure.evaluate import make_job
from evo.measure.evaluators import gate_cells_for
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.templates.template import TemplateDef, parse_template
from ops.kda.spec import SPEC as KDA_SPEC
from ops.kda.spec import cell as kda_cell
from ops.rmsnorm_bwd.spec import SPEC as BWD_SPEC
from ops.rmsnorm_bwd.spec import cell as bwd_cell

ARCH = 90
WRONG = (Status.WRONG_ANSWER,)
NEEDS_WHOLE_GPU = (Status.INVALID, Status.TIMEOUT)


@dataclass(frozen=True)
class Gallery:
    """A template gallery: its file, op spec, the cell its jobs run on, and (cheat, statuses it may get, the class
    of the gate it meets) in the order they run."""

    source: Path
    spec: Any
    cell: Any
    cases: tuple[tuple[str, tuple[Status, ...], str], ...]


KDA = Gallery(Path(__file__).with_name("gallery_kda.cu.j2"), KDA_SPEC,
              # a decode cell of 16 sequences: 512 CTAs, more than a crowded GPU holds at once, fewer than a whole one
              kda_cell("bf16", 16, 1, 32), (
                  ("none", (Status.OK,), "honest control"),
                  ("state_frozen", WRONG, "drawn shapes: a long check cell (48-80 tokens)"),
                  ("head_group_ignored", WRONG, "drawn shapes: several qk heads of several value heads"),
                  ("no_state_write", WRONG, "the cell's variant: its final state is an output"),
                  ("state_bf16", WRONG, "per-dtype tolerance and the decode loop"),
                  ("peek_ahead", WRONG, "the causal check"),
                  ("shared_scratch", WRONG, "the launch beside a second stream's"),
                  ("grid_barrier", NEEDS_WHOLE_GPU, "the launch beside a kernel holding most SMs"),
                  ("none", (Status.OK,), "honest control"),
              ))
BWD = Gallery(Path(__file__).with_name("gallery_bwd.cu.j2"), BWD_SPEC,
              bwd_cell("bf16", 4096, 4096), (
                  ("none", (Status.OK,), "honest control"),
                  ("tail_rows_dropped", WRONG, "drawn shapes: M at residues of the rows a CTA takes"),
                  ("pow2_partials", WRONG, "drawn shapes: a small M not a power of two"),
                  ("dw_unzeroed", WRONG, "poisoned workspaces"),
                  ("partials_in_scratch", WRONG, "the launch beside a second stream's"),
                  ("grid_barrier", NEEDS_WHOLE_GPU, "the launch beside a kernel holding most SMs"),
                  ("none", (Status.OK,), "honest control"),
              ))
GALLERIES = {"kda": KDA, "rmsnorm_bwd": BWD}


@dataclass(frozen=True)
class Outcome:
    op: str
    cheat: str
    allowed: tuple[str, ...]
    got: str
    passed: bool
    error: str


def template(gallery: Gallery) -> TemplateDef:
    return parse_template(gallery.source.read_text(), str(gallery.source), trusted=True)


def genome(tdef: TemplateDef, cheat: str) -> Genome:
    return Genome.make(tdef.op, tdef.name, tdef.source_hash, tdef.default_params() | {"cheat": cheat})


def build(tdef: TemplateDef, cheat: str, c: Any):
    return build_point(tdef, genome(tdef, cheat).params_dict(), c.dtypes_dict(), c.dims_dict())


def run_gallery(timeout_s: float = 60.0, galleries: tuple[Gallery, ...] = (KDA, BWD)
                ) -> tuple[list[Outcome], dict[str, str]]:
    """Every case of each gallery in one runner, in order; the fingerprint of the GPU it ran on."""
    from evo.measure.run import GpuRunner

    out = []
    with GpuRunner(timeout_s=timeout_s) as runner:
        for gal in galleries:
            tdef = template(gal)
            for i, (cheat, allowed, _) in enumerate(gal.cases):
                g, b = genome(tdef, cheat), build(tdef, cheat, gal.cell)
                secret = new_secret()
                gates = gate_cells_for(gal.spec, tdef, g, gal.cell, ARCH, shape_rng(secret))
                job = make_job(gal.spec, tdef, g, b, gal.cell, ARCH, seed=i,
                               timing=Timing(min_samples=20, max_samples=40), baseline=False,
                               job_id=f"gallery-{tdef.op}-{cheat}-{i}", gate_cells=gates, secret=secret)
                res = runner.run([job])[0]
                v = judge(res, {n: t[2] for n, t in job.tolerances}, g, gal.cell, b.build_key)
                out.append(Outcome(tdef.op, cheat, tuple(s.value for s in allowed), v.status.value,
                                   v.status in allowed, v.error))
        return out, dict(runner.fingerprint)
