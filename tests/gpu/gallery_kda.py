"""Run the KDA adversarial gallery (gallery_kda.cu.j2) through the real evaluator path: each cheat is a genome of a
template written for the purpose, built by NVRTC, its job made as the search makes one (gate cells and scalars drawn
from a fresh secret, the decode loop, the causal check), run by the GPU runner and judged. Every cheat must be
rejected; the honest kernel must pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evo.build.nvrtc import build_point
from evo.core.genome import Genome
from evo.core.status import Status
from evo.measure.draws import new_secret, shape_rng
from evo.measure.evaluate import make_job
from evo.measure.evaluators import gate_cells_for
from evo.measure.jobs import Timing
from evo.measure.verify import judge
from evo.templates.template import TemplateDef, parse_template
from ops.kda.spec import SPEC, cell

SOURCE = Path(__file__).with_name("gallery_kda.cu.j2")
ARCH = 90
WRONG = (Status.WRONG_ANSWER,)
# (cheat, statuses it may get, the class of the gate it meets)
CASES: tuple[tuple[str, tuple[Status, ...], str], ...] = (
    ("none", (Status.OK,), "honest control"),
    ("state_frozen", WRONG, "drawn shapes: a long check cell (48-80 tokens)"),
    ("head_group_ignored", WRONG, "drawn shapes: several qk heads of several value heads"),
    ("no_state_write", WRONG, "the cell's variant: its final state is an output"),
    ("state_bf16", WRONG, "per-dtype tolerance and the decode loop"),
    ("peek_ahead", WRONG, "the causal check"),
    ("shared_scratch", WRONG, "the launch beside a second stream's"),
    ("grid_barrier", (Status.INVALID, Status.TIMEOUT), "the launch beside a kernel holding most SMs"),
    ("none", (Status.OK,), "honest control"),
)
# a decode cell of 16 sequences: 512 CTAs, more than a crowded GPU holds at once, fewer than a whole one
CELL = cell("bf16", 16, 1, 32)


@dataclass(frozen=True)
class Outcome:
    cheat: str
    allowed: tuple[str, ...]
    got: str
    passed: bool
    error: str


def template() -> TemplateDef:
    return parse_template(SOURCE.read_text(), str(SOURCE), trusted=True)


def genome(tdef: TemplateDef, cheat: str) -> Genome:
    return Genome.make("kda", tdef.name, tdef.source_hash, tdef.default_params() | {"cheat": cheat})


def build(tdef: TemplateDef, cheat: str, c=CELL):
    return build_point(tdef, genome(tdef, cheat).params_dict(), c.dtypes_dict(), c.dims_dict())


def run_gallery(timeout_s: float = 60.0) -> tuple[list[Outcome], dict[str, str]]:
    """Every case in one runner, in order; the fingerprint of the GPU it ran on."""
    from evo.measure.run import GpuRunner

    tdef = template()
    out = []
    with GpuRunner(timeout_s=timeout_s) as runner:
        for i, (cheat, allowed, _) in enumerate(CASES):
            g, b = genome(tdef, cheat), build(tdef, cheat)
            secret = new_secret()
            gates = gate_cells_for(SPEC, tdef, g, CELL, ARCH, shape_rng(secret))
            job = make_job(SPEC, tdef, g, b, CELL, ARCH, seed=i, timing=Timing(min_samples=20, max_samples=40),
                           baseline=False, job_id=f"gallery-kda-{cheat}-{i}", gate_cells=gates, secret=secret)
            res = runner.run([job])[0]
            v = judge(res, {n: t[2] for n, t in job.tolerances}, g, CELL, b.build_key)
            out.append(Outcome(cheat, tuple(s.value for s in allowed), v.status.value, v.status in allowed,
                               v.error))
        return out, dict(runner.fingerprint)
