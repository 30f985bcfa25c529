"""The template galleries (tests/gpu/gallery_kda.cu.j2, gallery_bwd.cu.j2) without a GPU: every cheat is a legal
genome of its gallery's template on the gallery's cell and on the check cells the gate draws there, builds for
sm_90a, and renders code the honest kernel lacks."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import prepare
from evo.core.status import Status
from evo.measure.draws import shape_rng
from evo.measure.evaluators import gate_cells_for
from tests.gpu.gallery_templates import ARCH, GALLERIES, build, genome, template

TDEFS = {op: template(g) for op, g in GALLERIES.items()}
CASES = [(op, cheat) for op, g in GALLERIES.items() for cheat in sorted({c for c, _, _ in g.cases})]


@pytest.mark.parametrize("op", sorted(GALLERIES))
def test_every_cheat_is_a_legal_genome_on_every_cell_the_gate_draws(op):
    gal, tdef = GALLERIES[op], TDEFS[op]
    assert set(tdef.values("cheat")) == {c for c, _, _ in gal.cases}
    for cheat in tdef.values("cheat"):
        g = genome(tdef, cheat)
        cells = [gal.cell, *gate_cells_for(gal.spec, tdef, g, gal.cell, ARCH, shape_rng(7))]
        assert len(cells) >= 4
        for c in cells:
            assert tdef.is_valid(g.params_dict(), ARCH, c.dtypes_dict(), c.dims_dict()), (cheat, c.label())


def _source(op: str, cheat: str) -> str:
    gal, tdef = GALLERIES[op], TDEFS[op]
    return prepare(tdef, genome(tdef, cheat), "sm_90a", gal.cell.dtypes_dict(), gal.cell.dims_dict()).source


@pytest.mark.parametrize("op,cheat", CASES)
def test_every_cheat_builds_and_renders_code_the_honest_kernel_lacks(op, cheat):
    r = build(TDEFS[op], cheat, GALLERIES[op].cell)
    assert r.status is Status.OK and r.cubin[:4] == b"\x7fELF", r.error
    src = _source(op, cheat)
    assert src and (src != _source(op, "none")) == (cheat != "none")
