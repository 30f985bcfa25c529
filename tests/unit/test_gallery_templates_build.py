"""The template galleries (tests/gpu/gallery_kda.cu.j2, gallery_bwd.cu.j2, gallery_fwd.cu.j2) without a GPU: every
cheat is a legal genome of its gallery's template on its cell and on the check cells the gate draws there, builds
for sm_90a, and renders code or a launch plan the honest kernel lacks; a plan that leaves out the cell's variant
tensors is INVALID before it runs."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import prepare
from evo.core.status import Status
from evo.measure.draws import shape_rng
from evo.measure.evaluators import gate_cells_for
from tests.gpu.gallery_templates import ARCH, GALLERIES, build, genome, template

TDEFS = {op: template(g) for op, g in GALLERIES.items()}
CASES = [(op, cheat) for op, g in GALLERIES.items() for cheat in sorted({c.cheat for c in g.cases})]


@pytest.mark.parametrize("op", sorted(GALLERIES))
def test_every_cheat_is_a_legal_genome_on_every_cell_the_gate_draws(op):
    gal, tdef = GALLERIES[op], TDEFS[op]
    assert set(tdef.values("cheat")) == {c.cheat for c in gal.cases}
    for case in gal.cases:
        g, cell = genome(tdef, case.cheat), gal.cell_of(case)
        cells = [cell, *gate_cells_for(gal.spec, tdef, g, cell, ARCH, shape_rng(7))]
        assert len(cells) >= 4
        for c in cells:
            assert tdef.is_valid(g.params_dict(), ARCH, c.dtypes_dict(), c.dims_dict()), (case.cheat, c.label())


def _rendered(op: str, cheat: str) -> tuple[str, tuple]:
    """The source and the launch plan (kernels and args) a cheat renders on the gallery's small cell."""
    gal, tdef = GALLERIES[op], TDEFS[op]
    g, c = genome(tdef, cheat), gal.small
    launches, _ = tdef.plan(g.params_dict(), ARCH, c.dtypes_dict(), c.dims_dict())
    src = prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()).source
    return src, tuple((ln.kernel, ln.args) for ln in launches)


@pytest.mark.parametrize("op,cheat", CASES)
def test_every_cheat_builds_and_renders_code_the_honest_kernel_lacks(op, cheat):
    r = build(TDEFS[op], cheat, GALLERIES[op].small)
    assert r.status is Status.OK and r.cubin[:4] == b"\x7fELF", r.error
    src, plan = _rendered(op, cheat)
    assert src and plan and ((src, plan) != _rendered(op, "none")) == (cheat != "none")


def test_a_plan_that_leaves_out_the_variant_is_invalid_before_it_runs():
    from evo.measure.evaluate import variant_gap

    gal, tdef = GALLERIES["rmsnorm"], TDEFS["rmsnorm"]
    for c in (gal.cell, gal.small):
        assert variant_gap(gal.spec, tdef, genome(tdef, "none"), c, ARCH) == ""
        assert "leaves out residual, residual_out" in variant_gap(gal.spec, tdef, genome(tdef, "residual_left_out"), c,
                                                                   ARCH)
