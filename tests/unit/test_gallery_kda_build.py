"""The KDA adversarial gallery (tests/gpu/gallery_kda.cu.j2) without a GPU: every cheat is a legal genome of the
gallery's template on the gallery's cell and on every check cell the gate may draw there, and builds for sm_90a;
each cheat renders code the honest kernel does not have."""

from __future__ import annotations

import pytest

from evo.build.nvrtc import prepare
from evo.core.status import Status
from evo.measure.draws import shape_rng
from evo.measure.evaluators import gate_cells_for
from tests.gpu.gallery_kda import ARCH, CASES, CELL, SPEC, build, genome, template

TDEF = template()
CHEATS = sorted({c for c, _, _ in CASES})


def test_every_cheat_is_a_legal_genome_on_every_cell_the_gate_may_draw():
    assert set(TDEF.values("cheat")) == set(CHEATS)
    for cheat in CHEATS:
        g = genome(TDEF, cheat)
        cells = [CELL, *gate_cells_for(SPEC, TDEF, g, CELL, ARCH, shape_rng(7))]
        assert len(cells) >= 4
        for c in cells:
            assert TDEF.is_valid(g.params_dict(), ARCH, c.dtypes_dict(), c.dims_dict()), (cheat, c.label())


def _source(cheat: str) -> str:
    return prepare(TDEF, genome(TDEF, cheat), "sm_90a", CELL.dtypes_dict(), CELL.dims_dict()).source


@pytest.mark.parametrize("cheat", CHEATS)
def test_every_cheat_builds_and_renders_code_the_honest_kernel_lacks(cheat):
    r = build(TDEF, cheat)
    assert r.status is Status.OK and r.cubin[:4] == b"\x7fELF", r.error
    assert (_source(cheat) != _source("none")) == (cheat != "none")
