"""Run the template galleries through the real evaluator path: KDA's (gallery_kda.cu.j2), the RMSNorm backward's
(gallery_bwd.cu.j2) and the RMSNorm forward's variant cases (gallery_fwd.cu.j2). Each cheat is a genome of a template
written for the purpose (its `cheat` parameter), built by NVRTC; a plan that leaves out a tensor of its cell's variant
is INVALID before it runs (as the evaluator judges it); any other gets its job made as the search makes one (check
cells and scalars drawn from a fresh secret; for KDA the decode loop and the causal check), run by the GPU runner and
judged. Every cheat must be rejected; the honest kernel must pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from evo.build.nvrtc import build_point
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.draws import new_secret, shape_rng
from evo.measure.evaluate import make_job, variant_gap
from evo.measure.evaluators import gate_cells_for
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.templates.template import TemplateDef, parse_template
from ops.kda.spec import SPEC as KDA_SPEC
from ops.kda.spec import cell as kda_cell
from ops.rmsnorm.spec import VARIANT_SPEC as FWD_SPEC
from ops.rmsnorm.spec import cell as fwd_cell
from ops.rmsnorm_bwd.spec import SPEC as BWD_SPEC
from ops.rmsnorm_bwd.spec import cell as bwd_cell

ARCH = 90
WRONG = (Status.WRONG_ANSWER,)
NEEDS_WHOLE_GPU = (Status.INVALID, Status.TIMEOUT)
# a launch that left its set to the replay's first: its outputs poisoned in the replay that refreshes each set before
# its launch (WRONG_ANSWER), or a replay's launch far cheaper than a launch outside it (verify.GRAPH_FLOOR, SUSPECT)
REPLAY_NOT_INDEPENDENT = (Status.WRONG_ANSWER, Status.SUSPECT)


class Case(NamedTuple):
    """A cheat, the statuses it may get, the part of the gate it meets, and whether it runs on the gallery's small
    cell (one the gate times by CUDA-graph replay) instead of its main cell."""

    cheat: str
    allowed: tuple[Status, ...]
    meets: str
    small: bool = False


# the last cases of a gallery whose kernel can batch a replay's sets: an honest control on the small (graph-timed) cell,
# the batched cheat there, and a last honest control on the main cell
HONEST = Case("none", (Status.OK,), "honest control")
REPLAY_CASES = (
    Case("none", (Status.OK,), "honest control on the graph-timed cell", small=True),
    Case("batched", REPLAY_NOT_INDEPENDENT, "a replay's launches against launches outside it", small=True),
    HONEST,
)
# the KDA and backward galleries' cheats that wait across the grid and that tell the gate by its guard bytes
GRID_AND_GUARD_CASES = (
    Case("grid_barrier", NEEDS_WHOLE_GPU, "the launch beside a kernel holding most SMs"),
    Case("guard_sniff", WRONG, "guard bytes drawn per job"),
)


@dataclass(frozen=True)
class Gallery:
    """A template gallery: its file, op spec, the cell its jobs run on, a small cell (graph-timed), and its cases in
    the order they run."""

    source: Path
    spec: Any
    cell: Any
    small: Any
    cases: tuple[Case, ...]

    def cell_of(self, case: Case) -> Any:
        return self.small if case.small else self.cell


KDA = Gallery(Path(__file__).with_name("gallery_kda.cu.j2"), KDA_SPEC,
              # a decode cell of 16 sequences: 512 CTAs, more than a crowded GPU holds at once, fewer than a whole one
              kda_cell("bf16", 16, 1, 32),
              kda_cell("bf16", 1, 1, 32),  # one sequence's decode: a replay's launches are timed
              (
                  HONEST,
                  Case("state_frozen", WRONG, "drawn shapes: a long check cell (48-80 tokens)"),
                  Case("head_group_ignored", WRONG, "drawn shapes: several qk heads of several value heads"),
                  Case("no_state_write", WRONG, "the cell's variant: its final state is an output"),
                  Case("state_bf16", WRONG, "per-dtype tolerance and the decode loop"),
                  Case("peek_ahead", WRONG, "the causal check"),
                  Case("shared_scratch", WRONG, "the launch beside a second stream's"),
              ) + GRID_AND_GUARD_CASES + REPLAY_CASES)
BWD = Gallery(Path(__file__).with_name("gallery_bwd.cu.j2"), BWD_SPEC,
              bwd_cell("bf16", 4096, 4096),
              bwd_cell("bf16", 16, 1024),  # a replay's launches are timed
              (
                  HONEST,
                  Case("tail_rows_dropped", WRONG, "drawn shapes: M at residues of the rows a CTA takes"),
                  Case("pow2_partials", WRONG, "drawn shapes: a small M not a power of two"),
                  Case("dw_unzeroed", WRONG, "poisoned workspaces"),
                  Case("partials_in_scratch", WRONG, "the launch beside a second stream's"),
              ) + GRID_AND_GUARD_CASES + REPLAY_CASES)
FWD = Gallery(Path(__file__).with_name("gallery_fwd.cu.j2"), FWD_SPEC,
              fwd_cell("bf16", 4096, 4096, residual=True),
              fwd_cell("bf16", 64, 1024, residual=True),
              (
                  HONEST,
                  Case("residual_left_out", (Status.INVALID,), "the cell's variant: a plan binds every tensor of it"),
                  HONEST,
              ))
GALLERIES = {"kda": KDA, "rmsnorm_bwd": BWD, "rmsnorm": FWD}


@dataclass(frozen=True)
class Outcome:
    op: str
    cheat: str
    cell: str
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


def run_gallery(timeout_s: float = 60.0, galleries: tuple[Gallery, ...] = (KDA, BWD, FWD)
                ) -> tuple[list[Outcome], dict[str, str]]:
    """Every case of each gallery in one runner, in order; the fingerprint of the GPU it ran on."""
    from evo.measure.run import GpuRunner

    out = []
    with GpuRunner(timeout_s=timeout_s) as runner:
        for gal in galleries:
            tdef = template(gal)
            for i, case in enumerate(gal.cases):
                cheat, allowed, cell = case.cheat, case.allowed, gal.cell_of(case)
                g, b = genome(tdef, cheat), build(tdef, cheat, cell)
                why = variant_gap(gal.spec, tdef, g, cell, ARCH)  # as the evaluator does: INVALID, never run
                if why:
                    out.append(Outcome(tdef.op, cheat, cell.label(), tuple(s.value for s in allowed),
                                       Status.INVALID.value, Status.INVALID in allowed, why))
                    continue
                secret = new_secret()
                gates = gate_cells_for(gal.spec, tdef, g, cell, ARCH, shape_rng(secret))
                job = make_job(gal.spec, tdef, g, b, cell, ARCH, seed=i,
                               timing=Timing(min_samples=20, max_samples=40), baseline=False,
                               job_id=f"gallery-{tdef.op}-{cheat}-{i}", gate_cells=gates, secret=secret)
                res = runner.run([job])[0]
                v = judge(res, {n: t[2] for n, t in job.tolerances}, g, cell, b.build_key)
                out.append(Outcome(tdef.op, cheat, cell.label(), tuple(s.value for s in allowed), v.status.value,
                                   v.status in allowed, v.error))
        return out, dict(runner.fingerprint)
