"""rows_bulk (RMSNorm forward, N >= 2048): a ring of whole rows in dynamic shared memory filled by bulk
async copies. Real NVRTC builds for sm_90a of a spread of legal points on every forward dtype and N of
the matrix, without spills; the constraints refuse what the kernel cannot do; the plan asks for the
ring's dynamic shared memory (past 48 KB: the worker opts the kernel in, tests/unit/test_worker_smem.py)."""

from __future__ import annotations


import pytest

from evo.core.status import Status
from ops.rmsnorm.spec import SPEC
from evo.core.spec import Cell
from tests.unit.template_points import build_point, legal_points

from evo.templates.template import load_templates

T = load_templates("rmsnorm")["rows_bulk"]
# M is not specialized: the M = 32768 cells build the same code as these
CELLS = [c for c in SPEC.matrix() if c.dim("M") == 4096 and c.dim("N") >= 2048]


def _legal(cell: Cell, n: int, seed: int, **fixed) -> list[dict]:
    return legal_points(T, cell, n, seed, **fixed)


def _build(cell: Cell, params: dict):
    return build_point(T, cell, params)


def _smem(cell: Cell, p: dict) -> int:
    n = cell.dim("N")
    return p["stages"] * n * cell.dtype("x").nbytes + (n * cell.dtype("w").nbytes if p["w_place"] == "smem" else 0)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.label())
def test_legal_points_build_without_spills(cell):
    fp32_long = cell.dtype("x").short == "fp32" and cell.dim("N") == 32768
    points = [p for seed, fixed in enumerate([{}, {"store": "bulk"}, {"w_place": "smem"}, {"w_place": "regs"}])
              for p in _legal(cell, 2, seed, **fixed)]
    if fp32_long:  # two 128 KB rows do not fit in 227 KB: refused, never built
        assert points == []
        return
    assert {p["store"] for p in points} == {"st", "bulk"} and "smem" in {p["w_place"] for p in points}
    for p in points:
        bi, r = _build(cell, p)
        assert r.status is Status.OK, (p, r.error, r.log[-2000:])
        assert r.spill_stores == 0 and r.spill_loads == 0, (p, dict(r.resources))
        assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in bi.source
        assert ("cp.async.bulk.wait_group.read 1;" in bi.source) == (p["store"] == "bulk")
        (launch,), _ = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
        assert launch.smem == _smem(cell, p) <= 232448 - 1024
        assert launch.grid == (min(cell.dim("M"), p["ctas"]), 1, 1)


def _budget_use(cell: Cell, p: dict) -> float:
    """register_budget's model over its cap: 1.0 is the edge of what the constraint admits."""
    per = -(-(cell.dim("N") // p["vec"]) // p["threads"]) * p["vec"]
    regs = per * (cell.dtype("w").nbytes + cell.dtype("x").nbytes) // 4 + 40
    return regs / min(255, 65536 // (p["threads"] * -(-p["ctas"] // 132)))


@pytest.mark.parametrize("cell", [Cell.make({"x": "bfloat16", "w": "float32"}, {"M": 4096, "N": 16384}),
                                  Cell.make({"x": "bfloat16", "w": "bfloat16"}, {"M": 4096, "N": 32768}),
                                  Cell.make({"x": "float32", "w": "float32"}, {"M": 4096, "N": 4096})],
                         ids=lambda c: c.label())
def test_points_at_the_register_budgets_edge_do_not_spill(cell):
    """w in registers at the points closest to register_budget's limit (the cap of
    __launch_bounds__(threads, ctas / 132)): they build without spilling."""
    import itertools

    points = [dict(T.default_params(), threads=t, vec=v, ctas=c, stages=2, w_place="regs")
              for t, v, c in itertools.product((128, 256, 512, 1024), (2, 4, 8), (132, 264, 396, 528))]
    legal = sorted((p for p in points if T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict())),
                   key=lambda p: -_budget_use(cell, p))
    assert legal and _budget_use(cell, legal[0]) > 0.5
    for p in legal[:3]:
        _, r = _build(cell, p)
        assert r.status is Status.OK and r.spill_stores == 0, (p, r.error, dict(r.resources))


@pytest.mark.parametrize("dims,dtypes,change,why", [
    ({"M": 4096, "N": 1024}, ("bfloat16", "bfloat16"), {}, "long_rows"),
    ({"M": 5, "N": 4100}, ("bfloat16", "bfloat16"), {"vec": 4}, "row_is_16B_aligned"),  # 8200 B rows
    ({"M": 4096, "N": 32768}, ("float32", "float32"), {"vec": 4, "stages": 2}, "smem_per_block"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"store": "bulk", "stages": 2}, "ring_has_lookahead"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"store": "bulk", "store_hint": "cs"}, "store_hint_fits"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"store_hint": "ef"}, "store_hint_fits"),  # st.global: no .v4.b32 with evict_first
    ({"M": 4096, "N": 16384}, ("bfloat16", "bfloat16"), {"ctas": 264, "stages": 4}, "grid_resident_smem"),
    ({"M": 4096, "N": 2048}, ("bfloat16", "bfloat16"), {"threads": 512}, "no_idle_warps"),
    # 128 vectors a thread, fully unrolled: ptxas hoists the loads past 255 registers and spills
    ({"M": 4096, "N": 32768}, ("float16", "float16"), {"threads": 128, "vec": 2, "w_place": "global"}, "unroll_bounded"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_constraints_refuse_what_the_kernel_cannot_do(dims, dtypes, change, why):
    cell = Cell.make({"x": dtypes[0], "w": dtypes[1]}, dims)
    p = dict(T.default_params(), **change)
    assert why in T.violations(p, 90, cell.dtypes_dict(), cell.dims_dict())


def test_odd_rows_and_tails_have_a_legal_point():
    """N = 2056 (not a multiple of threads * vec: the owned-vector guard) and M = 37 < ctas (grid = M)."""
    cell = Cell.make({"x": "float16", "w": "float32"}, {"M": 37, "N": 2056})
    (p,) = _legal(cell, 1, 0, store="bulk")
    bi, r = _build(cell, p)
    assert r.status is Status.OK and r.spill_stores == 0, (p, r.error)
    assert f"< {2056 // p['vec']}" in bi.source  # the guard is rendered: NVEC is no multiple of threads
    (launch,), _ = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
    assert launch.grid == (37, 1, 1)
