"""cta_row_l2 (RMSNorm forward): one CTA per row in two passes over x, the second from L2 (torch.compile's
looped-reduction structure), with L2 cache policies. Real NVRTC builds for sm_90a of a spread of legal
points on every forward dtype and N of the matrix, without spills; the rendered passes carry the policies
asked for and read x twice; the constraints refuse what spills or cannot run; the gate's edge cells are
served."""

from __future__ import annotations

import re

import pytest

from evo.core.status import Status
from evo.templates.template import load_templates
from ops.rmsnorm.spec import SPEC
from evo.core.spec import Cell
from tests.unit.template_points import build_point, legal_points

T = load_templates("rmsnorm")["cta_row_l2"]
CELLS = [c for c in SPEC.matrix() if c.dim("M") == 4096]  # M is not compiled in


def _legal(cell: Cell, n: int, seed: int, **fixed) -> list[dict]:
    return legal_points(T, cell, n, seed, **fixed)


def _build(cell: Cell, params: dict):
    return build_point(T, cell, params)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.label())
def test_legal_points_build_without_spills_and_read_the_row_twice(cell):
    v16 = 16 // cell.dtype("x").nbytes
    points = [p for seed, fixed in enumerate([{"vec": v16, "unroll": 4}, {"vec": v16, "keep": "none", "reread": "none"},
                                              {"vec": 1, "threads": 128}, {"unroll": 1}])
              for p in _legal(cell, 1, seed, **fixed)]
    assert len(points) == 4, (cell.label(), points)
    for p in points:
        bi, r = _build(cell, p)
        assert r.status is Status.OK, (p, r.error, r.log[-2000:])
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, (p, dict(r.resources))
        assert r.regs <= min(255, 65536 // (p["threads"] * p["min_blocks"])), (p, r.regs)
        src = bi.source
        loads = re.findall(r'asm volatile\("ld\.global\.nc(\.L2::cache_hint)?\.', src)
        assert len(loads) == 2, loads  # pass 1 and pass 2 each load x once per step (w goes through kf::load)
        assert [bool(h) for h in loads] == [p["keep"] != "none", p["reread"] != "none"]
        assert ("L2::evict_last" in src) == (p["keep"] == "evict_last")
        assert ("L2::evict_first" in src) == (p["reread"] == "evict_first")
        (launch,), ws = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
        assert launch.smem == 0 and launch.grid == (cell.dim("M"), 1, 1) and ws == {}


@pytest.mark.parametrize("threads,min_blocks", [(1024, 1), (512, 2), (256, 4), (128, 8)])
def test_the_register_budgets_edge_does_not_spill(threads, min_blocks):
    """1024 threads an SM (64 registers) at the widest vectors and deepest unroll, on the longest rows."""
    for x in ("bfloat16", "float32"):
        cell = Cell.make({"x": x, "w": x}, {"M": 4096, "N": 32768})
        for vec in (16 // cell.dtype("x").nbytes, 1):
            p = dict(T.default_params(), threads=threads, min_blocks=min_blocks, vec=vec, unroll=4)
            assert T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict()), p
            _, r = _build(cell, p)
            assert r.status is Status.OK and r.spill_stores == 0 and r.stack_bytes == 0, (x, p, dict(r.resources))


@pytest.mark.parametrize("dims,dtypes,change,why", [
    ({"M": 4096, "N": 8192}, ("float32", "float32"), {"vec": 8}, "vec_fits_16B"),
    ({"M": 3, "N": 33}, ("bfloat16", "bfloat16"), {"vec": 2}, "row_is_vector_aligned"),
    ({"M": 4096, "N": 1024}, ("bfloat16", "bfloat16"), {"threads": 256, "vec": 8}, "no_idle_threads"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"threads": 1024, "min_blocks": 2}, "register_budget"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"threads": 512, "min_blocks": 8}, "occupancy_fits"),
    ({"M": 4096, "N": 8192}, ("float32", "bfloat16"), {"vec": 4}, "weight_not_narrower"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_constraints_refuse_what_the_kernel_cannot_do(dims, dtypes, change, why):
    cell = Cell.make({"x": dtypes[0], "w": dtypes[1]}, dims)
    assert why in T.violations(dict(T.default_params(), **change), 90, cell.dtypes_dict(), cell.dims_dict())


@pytest.mark.parametrize("cell", SPEC.edge_cells(), ids=lambda c: c.label())
def test_edge_cells_are_served(cell):
    """Every edge cell of the gate (odd N, M = 1, fp32 weights with 16-bit x) has a legal point that builds."""
    (p,) = _legal(cell, 1, 0)
    _, r = _build(cell, p)
    assert r.status is Status.OK and r.spill_stores == 0, (p, r.error)
