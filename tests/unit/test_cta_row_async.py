"""cta_row_async (RMSNorm forward): one CTA per row, the row copied to dynamic shared memory by cp.async
(16-byte .cg, or 4/8-byte .ca pieces) in commit groups, reduced part by part as the parts land, normalized from shared memory. Real
NVRTC builds for sm_90a of a spread of legal points on every forward dtype and N of the matrix, without
spills; the constraints refuse what the kernel cannot do; the plan asks for exactly the row's shared
memory; the rendered copies cover the row once, group by group; experiments/rmsnorm_h200_long.toml loads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evo.build.nvrtc import prepare
from evo.core.genome import Genome
from evo.core.status import Status
from evo.templates.template import load_templates
from ops.rmsnorm.spec import SPEC
from evo.core.spec import Cell
from tests.unit.template_points import build_point, legal_points

ROOT = Path(__file__).resolve().parents[2]
T = load_templates("rmsnorm")["cta_row_async"]
# M is not specialized: the M = 32768 cells build the same code as these
CELLS = [c for c in SPEC.matrix() if c.dim("M") == 4096]


def _legal(cell: Cell, n: int, seed: int, **fixed) -> list[dict]:
    return legal_points(T, cell, n, seed, **fixed)


def _build(cell: Cell, params: dict):
    return build_point(T, cell, params)


def _pieces(cell: Cell, p: dict) -> int:
    return cell.dim("N") // p["vec"]


def _vec16(cell: Cell) -> int:
    """vec of 16-byte pieces (cp.async.cg) for the cell's x."""
    return 16 // cell.dtype("x").nbytes


def _check_plan(cell: Cell, p: dict) -> None:
    (launch,), ws = T.plan(p, 90, cell.dtypes_dict(), cell.dims_dict())
    assert launch.smem == cell.dim("N") * cell.dtype("x").nbytes
    assert launch.grid == (cell.dim("M"), 1, 1) and launch.block == (p["threads"], 1, 1) and ws == {}


def _copies(source: str, threads: int, piece: int) -> list[list[int]]:
    """The pieces (of `piece` bytes) each commit group of the rendered phase 1 copies, over all threads."""
    body = source[source.index("// Phase 1"):source.index("// Reduce each part")]
    groups, cur = [], []
    for line in body.splitlines():
        if "cp.async.commit_group" in line:
            groups.append(cur)
            cur = []
        elif "cp.async.c" in line:
            m = re.search(r"(?:if \(t < (\d+)\) )?asm volatile\(\"cp\.async\.(cg|ca)\.shared\.global\S* "
                          r"\[%0\+(\d+)\], \[%1\+(\d+)\], (\d+)", line)
            assert m and m.group(3) == m.group(4) and int(m.group(5)) == piece, line
            assert (m.group(2) == "cg") == (piece == 16), line  # .cg copies 16 bytes only
            active = int(m.group(1)) if m.group(1) else threads
            cur += [t + int(m.group(3)) // piece for t in range(active)]
    assert cur == []
    return groups


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.label())
def test_legal_points_build_without_spills(cell):
    v16 = _vec16(cell)
    points = [p for seed, fixed in enumerate([{"vec": v16}, {"vec": v16, "groups": 4, "unroll": 4},
                                              {"vec": v16, "groups": 1, "load_policy": "evict_first"},
                                              {"vec": v16, "threads": 64, "unroll": 1},
                                              {"vec": v16 // 2, "load_policy": "evict_first"}])  # 8-byte pieces: .ca
              for p in _legal(cell, 1, seed, **fixed)]
    assert len(points) >= 4 and {p["vec"] for p in points} == {v16, v16 // 2}, (cell.label(), points)
    if cell.dim("N") // v16 >= 64 * 4:  # four groups need four items a thread
        assert {1, 4} <= {p["groups"] for p in points}, points
    for p in points:
        bi, r = _build(cell, p)
        assert r.status is Status.OK, (p, r.error, r.log[-2000:])
        assert r.spill_stores == 0 and r.spill_loads == 0, (p, dict(r.resources))
        assert r.regs <= min(255, 65536 // (p["threads"] * p["min_blocks"])), (p, r.regs)
        assert bi.source.count("cp.async.commit_group;") == p["groups"]
        assert ("cp.async.cg.shared.global" in bi.source) == (p["vec"] == v16)
        assert ("createpolicy.fractional.L2::evict_first" in bi.source) == (p["load_policy"] == "evict_first")
        _check_plan(cell, p)


@pytest.mark.parametrize("dtypes,n,params", [
    (("float16", "float32"), 2056, {"threads": 64, "groups": 4}),  # a partial last item, in the last group
    (("bfloat16", "bfloat16"), 8192, {"threads": 256, "groups": 4}),
    (("float32", "float32"), 1000, {"threads": 64, "vec": 4, "groups": 1}),  # fewer pieces (250) than threads * 4
    (("float32", "float32"), 32768, {"threads": 1024, "vec": 4, "groups": 2, "min_blocks": 1}),
    (("bfloat16", "bfloat16"), 4100, {"threads": 64, "vec": 4, "groups": 4}),  # 8-byte pieces (.ca), 1025 of them
    (("float32", "float32"), 33, {"threads": 64, "vec": 1, "groups": 1}),  # 4-byte pieces, fewer than threads
])
def test_copies_cover_the_row_once_in_contiguous_groups(dtypes, n, params):
    """Phase 1 as rendered: every piece of the row copied exactly once, group g the g-th contiguous
    part; the reduction waits for the groups in order and reads the items of group g after its wait."""
    cell = Cell.make({"x": dtypes[0], "w": dtypes[1]}, {"M": 4096, "N": n})
    p = dict(T.default_params(), **params)
    assert T.violations(p, 90, cell.dtypes_dict(), cell.dims_dict()) == []
    g = Genome.make("rmsnorm", T.name, T.source_hash, p)
    source = prepare(T, g, "sm_90a", cell.dtypes_dict(), cell.dims_dict()).source
    groups = _copies(source, p["threads"], p["vec"] * cell.dtype("x").nbytes)
    assert len(groups) == p["groups"] and all(groups)
    flat = [q for grp in groups for q in grp]
    assert sorted(flat) == list(range(_pieces(cell, p)))  # each piece once
    start = 0
    for grp in groups:  # contiguous parts, in order
        assert sorted(grp) == list(range(start, start + len(grp)))
        start += len(grp)
    waits = re.findall(r"cp\.async\.wait_group (\d+);", source)
    assert waits == [str(p["groups"] - 1 - k) for k in range(p["groups"])]
    # the reduction's loop after the k-th wait spans exactly the items group k copied
    loops = re.findall(r"wait_group \d+;.*?for \(int i = (\d+); i < (\d+); \+\+i\)", source, re.DOTALL)
    t = p["threads"]
    assert len(loops) == p["groups"]
    for grp, (lo, hi) in zip(groups, loops):
        assert {q // t for q in grp} == set(range(int(lo), int(hi)))


@pytest.mark.parametrize("cell", [Cell.make({"x": "float16", "w": "float32"}, {"M": 4096, "N": 32768}),
                                  Cell.make({"x": "bfloat16", "w": "bfloat16"}, {"M": 4096, "N": 8192}),
                                  Cell.make({"x": "float32", "w": "float32"}, {"M": 4096, "N": 8192})],
                         ids=lambda c: c.label())
def test_points_at_the_register_budgets_edge_do_not_spill(cell):
    """register_budget's edge: unroll 2 at 2048 threads per SM (a 32-register cap) and unroll 4 at 1024
    (64) build without spilling; unroll 4 at 2048 (which spills) is refused."""
    base = dict(T.default_params(), vec=_vec16(cell))
    points = [dict(base, threads=512, min_blocks=4, unroll=2, groups=4),
              dict(base, threads=1024, min_blocks=2, unroll=2, groups=2),
              dict(base, threads=256, min_blocks=4, unroll=4, groups=4),
              dict(base, threads=512, min_blocks=2, unroll=4, groups=2)]
    legal = [p for p in points if T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict())]
    assert len(legal) >= 2
    for p in legal:
        _, r = _build(cell, p)
        assert r.status is Status.OK and r.spill_stores == 0 and r.spill_loads == 0, (p, r.error, dict(r.resources))
    over = dict(base, threads=256, min_blocks=8, unroll=4)
    assert "register_budget" in T.violations(over, 90, cell.dtypes_dict(), cell.dims_dict())


@pytest.mark.parametrize("dims,dtypes,change,why", [
    ({"M": 5, "N": 4100}, ("bfloat16", "bfloat16"), {"vec": 8}, "row_is_whole_pieces"),  # 8200 B rows: 16 B pieces do not fit
    ({"M": 3, "N": 33}, ("bfloat16", "bfloat16"), {"vec": 2, "threads": 64, "groups": 1}, "row_is_whole_pieces"),
    ({"M": 3, "N": 33}, ("bfloat16", "bfloat16"), {"vec": 1, "threads": 64, "groups": 1}, "piece_is_a_cp_async"),  # 2 B
    ({"M": 4096, "N": 4096}, ("float32", "float32"), {"vec": 8}, "piece_is_a_cp_async"),  # 32 B
    ({"M": 4096, "N": 1024}, ("bfloat16", "bfloat16"), {"threads": 256, "groups": 1}, "no_idle_threads"),  # 128 pieces
    ({"M": 4096, "N": 4096}, ("bfloat16", "bfloat16"), {"threads": 256, "groups": 4}, "no_idle_threads"),  # 512 < 1024
    ({"M": 37, "N": 1000}, ("bfloat16", "bfloat16"), {"threads": 64, "groups": 2}, "no_idle_threads"),  # 125 pieces
    ({"M": 4096, "N": 32768}, ("float32", "float32"), {"vec": 1, "threads": 128}, "unroll_bounded"),  # 256 copies a thread
    ({"M": 4096, "N": 65536}, ("float32", "float32"), {"vec": 4, "threads": 1024}, "smem_per_block"),  # 256 KB
    ({"M": 4096, "N": 58112}, ("float32", "float32"), {"vec": 4, "threads": 1024}, "smem_per_block"),  # 227 KB + partials
    ({"M": 4096, "N": 32768}, ("float32", "float32"), {"vec": 4, "min_blocks": 2}, "smem_per_sm"),  # 2 x 129 KB
    ({"M": 4096, "N": 32768}, ("bfloat16", "bfloat16"), {"min_blocks": 4}, "smem_per_sm"),  # 4 x 65 KB
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"threads": 512, "min_blocks": 8}, "occupancy_fits"),
    ({"M": 4096, "N": 8192}, ("bfloat16", "bfloat16"), {"threads": 1024, "min_blocks": 2, "unroll": 4}, "register_budget"),
    ({"M": 4096, "N": 8192}, ("float32", "bfloat16"), {"vec": 4}, "weight_not_narrower"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_constraints_refuse_what_the_kernel_cannot_do(dims, dtypes, change, why):
    cell = Cell.make({"x": dtypes[0], "w": dtypes[1]}, dims)
    p = dict(T.default_params(), **change)
    assert why in T.violations(p, 90, cell.dtypes_dict(), cell.dims_dict())


def test_shared_memory_limits_admit_what_fits():
    """The largest fp32 row under the block limit (58080 elements, 232320 B plus 16 B of partials) and
    three 64 KB bf16 rows per SM are legal."""
    big = Cell.make({"x": "float32", "w": "float32"}, {"M": 7, "N": 58080})
    p = dict(T.default_params(), vec=4, threads=1024, min_blocks=1)
    assert T.violations(p, 90, big.dtypes_dict(), big.dims_dict()) == []
    bf = Cell.make({"x": "bfloat16", "w": "bfloat16"}, {"M": 4096, "N": 32768})
    assert T.violations(dict(T.default_params(), min_blocks=2), 90, bf.dtypes_dict(), bf.dims_dict()) == []


@pytest.mark.parametrize("cell", SPEC.edge_cells(), ids=lambda c: c.label())
def test_edge_cells_are_served_or_refused(cell):
    """The gate's edge cells: every row of whole 4-, 8- or 16-byte pieces has a legal point that builds
    (M = 1 and odd M are a grid of M rows; N = 4100 in 16-bit dtypes with 8-byte pieces, N = 33 in fp32
    with 4-byte ones); N = 33 in 16-bit dtypes has none (no cp.async of 2 bytes) and is refused."""
    points = _legal(cell, 1, 0)
    if cell.dim("N") == 33 and cell.dtype("x").nbytes == 2:
        assert points == []
        return
    (p,) = points
    bi, r = _build(cell, p)
    assert r.status is Status.OK and r.spill_stores == 0, (p, r.error)
    _check_plan(cell, p)
    for gate in SPEC.gate_cells(cell):  # other M: same code, a grid of M
        _check_plan(gate, p)


def test_long_rows_experiment_loads():
    """experiments/rmsnorm_h200_long.toml: its four templates, their search spaces within the templates'
    spaces, and exactly the forward matrix's N >= 4096 cells, each with legal points of every template."""
    from evo.core.config import load_config
    from evo.loop.pipeline import cells_for
    from tests.unit.config_checks import legal_everywhere

    c = load_config(ROOT / "experiments" / "rmsnorm_h200_long.toml")
    assert c.run.op == "rmsnorm" and c.run.name == "rmsnorm-h200-long"
    assert set(c.run.templates) == {"cta_row", "cta_row_async", "cta_row_l2", "cluster_row"} == set(c.search.space)
    # lab_gpu.sh fwdlong stops the run at 190 s: a generation past the budget must still fit
    assert c.search.population == 24 and 0 < c.budget.max_seconds <= 150 and c.budget.generations == 12
    assert (c.eval.timeout_s, c.eval.min_samples, c.eval.max_samples, c.eval.baseline) == (20, 100, 100, False)
    assert c.build.workers == 12
    cells = cells_for(c, SPEC)
    want = [m for m in SPEC.matrix() if m.dim("N") >= 4096]
    assert sorted(x.label() for x in cells) == sorted(m.label() for m in want) and len(cells) == 24
    legal_everywhere(c, cells)
    searched = dict(load_templates("rmsnorm")["cta_row_async"].restrict(c.search.space["cta_row_async"]).space)
    assert searched.pop("vec") == (4, 8)  # 16-byte pieces on every dtype (and 8-byte ones on 16-bit x)
    assert searched == {k: v for k, v in T.space if k != "vec"}  # the rest of the space, all of it
