"""RMSNorm backward's rows_smem template (x and dout staged in shared memory by bulk async copies on
mbarriers) builds with real NVRTC for sm_90a without spills at a spread of legal points on every backward
matrix cell and edge cell, its plan sizes the dynamic smem and the partials, and its constraints refuse
what it cannot stage."""

from __future__ import annotations

import itertools
import random

import pytest

from evo.build.nvrtc import MAX_SMEM_PER_BLOCK
from evo.core.status import Status
from evo.templates.template import load_templates
from ops.rmsnorm_bwd.spec import SPEC as BWD
from evo.core.spec import Cell
from tests.unit.template_points import build_point

T = load_templates("rmsnorm_bwd")["rows_smem"]
SPACE = dict(T.space)


STRUCT = ("threads", "vec", "cluster", "stages", "chunks", "keep_rows", "acc_smem", "w_src")


def _legal(cell: Cell) -> list[dict]:
    """Every legal point over the structural params (the rest, which no constraint reads, at defaults)."""
    pts = [dict(T.default_params(), **dict(zip(STRUCT, vals))) for vals in itertools.product(*(SPACE[k] for k in STRUCT))]
    return [p for p in pts if T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict())]


def _spread(legal: list[dict], n: int, seed: int) -> list[dict]:
    """n legal points: the largest-smem one, the most register-hungry one, and random others."""
    rng = random.Random(seed)
    heavy = max(legal, key=lambda p: (not p["acc_smem"], p["keep_rows"], p["w_src"] == "regs", -p["threads"]))
    big = max(legal, key=lambda p: p["stages"] * (2 if p["keep_rows"] else 1) // p["cluster"])
    return [heavy, big] + rng.sample(legal, min(n - 2, len(legal)))


def _build(p: dict, cell: Cell):
    return build_point(T, cell, p)


@pytest.mark.parametrize("cell", BWD.matrix() + BWD.edge_cells(), ids=lambda c: c.label())
def test_rows_smem_builds_without_spills(cell):
    legal = _legal(cell)
    if cell.dim("N") == 33:  # 66 B rows cannot be bulk-copied (16 B multiples): refused, never picked
        assert legal == []
        return
    assert legal, f"no legal rows_smem point for {cell.label()}"
    for p in _spread(legal, 6, sum(map(ord, cell.label()))):
        bi, r = _build(p, cell)
        assert r.status is Status.OK, (p, r.error + r.log)
        res = dict(r.resources)
        assert set(res) == {"rmsnorm_bwd_rows_smem", "rmsnorm_bwd_dw_reduce"}
        assert r.spill_stores == 0, (p, r.spill_stores)
        assert res["rmsnorm_bwd_rows_smem"].regs <= min(255, 65536 // p["threads"]), p
        (rows, _), _ = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
        assert rows.smem + res["rmsnorm_bwd_rows_smem"].smem_bytes <= MAX_SMEM_PER_BLOCK, p
        assert ("__cluster_dims__(" in bi.source) == (p["cluster"] > 1)


def test_long_rows_have_a_spill_free_point_that_keeps_the_dw_sums_in_registers():
    """The cell cluster_rows loses (N = 262144): S = 32768 columns per CTA at cluster 8, one 128 KB buffer,
    the fp32 dw sums in registers of a 512-thread block: no spill where cluster_rows spilled."""
    cell = next(c for c in BWD.matrix() if c.dim("N") == 262144 and c.dtype("x").short == "bf16")
    p = dict(T.default_params(), threads=512, vec=8, cluster=8, stages=1, chunks=1, keep_rows=False,
             acc_smem=False, w_src="smem")
    assert T.violations(p, 90, cell.dtypes_dict(), cell.dims_dict()) == []
    _, r = _build(p, cell)
    assert r.status is Status.OK and r.spill_stores == 0, r.log
    # two buffers or the sums in shared memory would not fit beside it
    for bad in (dict(p, stages=2), dict(p, acc_smem=True)):
        assert "smem_budget" in " ".join(T.violations(bad, 90, cell.dtypes_dict(), cell.dims_dict()))


def test_plan_sizes_dynamic_smem_and_partials():
    cell = next(c for c in BWD.matrix() if c.dim("N") == 8192 and c.dtype("x").short == "bf16")
    p = dict(T.default_params(), threads=256, vec=8, cluster=2, stages=2, acc_smem=True, w_src="smem", groups=132)
    (rows, red), ws = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
    s = 8192 // 2
    assert rows.grid == (2, 132, 1) and rows.block == (256, 1, 1)
    assert rows.smem == 2 * 2 * s * 2 + s * 2 + 4 * s  # two buffers of x and dout, w, the dw sums
    assert rows.smem > 48 * 1024  # the worker's opt-in past 48 KB is needed
    assert red.grid == (8192 // 32, 1, 1) and red.block == (32, p["reduce_rows"], 1)
    assert ws == {"dw_partial": 4 * 132 * 8192}
    small = Cell.make(cell.dtypes_dict(), {"M": 37, "N": 8192})  # fewer rows than groups: one group per row
    (rows, _), ws = T.plan(p, 90, small.dtypes_dict(), small.dims_dict())
    assert rows.grid == (2, 37, 1) and ws == {"dw_partial": 4 * 37 * 8192}


def test_constraints_refuse_what_cannot_be_staged():
    cell = next(c for c in BWD.matrix() if c.dim("N") == 32768 and c.dtype("x").short == "fp32")
    p = dict(T.default_params(), cluster=1, stages=2)  # 2 x 256 KB of fp32 x and dout
    assert any("smem_budget" in v for v in T.violations(p, 90, cell.dtypes_dict(), cell.dims_dict()))
    odd = Cell.make({"x": "bfloat16", "w": "bfloat16"}, {"M": 3, "N": 1000})
    q = dict(T.default_params(), cluster=8, vec=1 if 1 in SPACE["vec"] else 2)  # 125-column slices
    assert not T.is_valid(q, 90, odd.dtypes_dict(), odd.dims_dict())


@pytest.mark.parametrize("stages", [3, 4])
def test_deeper_rings_build_at_the_cell_it_lost(stages):
    """bf16 M32768-N4096 (rows_smem 76% of the copy ceiling with 2 buffers, behind cluster_rows and autotuned
    QuACK): 3 and 4 row buffers, one mbarrier per buffer and piece, each row's buffer k % stages, built
    without spills; the smem stays within what lets 2 CTAs share an SM."""
    c = next(c for c in BWD.matrix() if c.label() == "w=bf16,x=bf16 M32768-N4096")
    p = dict(T.default_params(), threads=256, vec=8, cluster=1, groups=264, stages=stages, chunks=2, keep_rows=False)
    assert T.is_valid(p, 90, c.dtypes_dict(), c.dims_dict()), T.violations(p, 90, c.dtypes_dict(), c.dims_dict())
    bi, r = _build(p, c)
    assert r.status is Status.OK and r.spill_stores == 0, r.error + r.log
    assert f"bar[{stages}][2]" in bi.source and f"% {stages})" in bi.source
    (rows, _), _ = T.plan(p, 90, c.dtypes_dict(), c.dims_dict())
    assert rows.smem == stages * 2 * 4096 * 2 and 2 * rows.smem <= MAX_SMEM_PER_BLOCK
