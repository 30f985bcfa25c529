"""The regime templates (RMSNorm backward's cluster_rows, the forward's cluster_row) build
with real NVRTC for sm_90a where their constraints admit a cell, and the register check reads each
kernel of a plan against its own block size."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from evo.build.nvrtc import KernelResources, check_resources, prepare
from evo.core.genome import Genome
from evo.core.status import Status
from evo.search.space import repair
from evo.templates.template import load_templates, parse_template
from ops.rmsnorm.spec import SPEC as FWD
from ops.rmsnorm_bwd.spec import SPEC as BWD
from evo.core.spec import Cell
from tests.unit.template_points import build_point

ROOT = Path(__file__).resolve().parents[2]
BWD_T = load_templates("rmsnorm_bwd")["cluster_rows"]
FWD_T = load_templates("rmsnorm")["cluster_row"]
BWD_DISPATCH = json.loads((ROOT / "tests/fixtures/results/rmsnorm_bwd_h200/dispatch.json").read_text())["dispatch"]


def _build(op: str, tdef, params: dict, cell: Cell):
    assert tdef.op == op
    return build_point(tdef, cell, params)


def _repaired(tdef, cell: Cell) -> dict | None:
    return repair(tdef, tdef.default_params(), random.Random(0), 90, [cell.dtypes_dict()], [cell.dims_dict()])


BWD_NEW = "thread_elements_fit_registers"  # the constraint the register calibration below stands behind


def read_budget_rows(path: Path) -> list[dict]:
    """The calibration's CSV rows beside `path`, typed."""
    ints = {"N", "cluster", "threads", "vec", "elements", "regs", "spill_stores", "spill_loads", "stack_bytes"}
    with open(path.with_suffix(".csv"), newline="") as f:
        return [{k: int(v) if k in ints else (v == "True" if k in ("keep_rows", "w_regs", "refused") else v)
                 for k, v in r.items()} for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def recorded_cluster_rows(tmp_path_factory):
    """cluster_rows as the committed H200 backward run recorded it (the store's text of the template)."""
    from memory.store import Store
    from tests.unit import bwd_export_fixtures as bx

    store = bx.copy_results(tmp_path_factory.mktemp("bwd_run"))
    with Store.open(store, read_only=True) as s:
        texts = s.sql("SELECT DISTINCT text FROM sources WHERE template = 'cluster_rows'").text.tolist()
    assert len(texts) == 1, len(texts)
    return parse_template(texts[0], "the run's cluster_rows", trusted=True)


@pytest.mark.parametrize("label", sorted(BWD_DISPATCH))
def test_backward_dispatch_entries_rebuild(label, recorded_cluster_rows):
    """The H200 run's winners rebuild from today's template, the params added since at their defaults, both launches'
    kernels in the cubin; an entry that thread_elements_fit_registers refuses spills or has no registers to spare, the
    others build spill-free. Its genome key is the run's under the template text the run recorded, which renders the
    same code as today's: a param added since renders the code as it was at its default."""
    cell = next(c for c in BWD.matrix() if c.label() == label)
    entry = BWD_DISPATCH[label]
    params = BWD_T.complete(entry["params"])
    refused = BWD_T.violations(params, 90, cell.dtypes_dict(), cell.dims_dict())
    assert refused in ([], [BWD_NEW]), refused
    bi, r = _build("rmsnorm_bwd", BWD_T, params, cell)
    before = recorded_cluster_rows
    g = Genome.make("rmsnorm_bwd", "cluster_rows", before.source_hash, entry["params"])
    assert g.key() == entry["genome_key"]
    assert prepare(before, g, "sm_90a", cell.dtypes_dict(), cell.dims_dict()).source == bi.source
    assert r.status is Status.OK, r.error + r.log
    rows = dict(r.resources)["rmsnorm_bwd_rows"]
    cap = min(255, 65536 // entry["params"]["threads"])
    if refused:  # it spills, or builds with no room to spare (within 5 registers of its block's cap)
        assert rows.spill_stores > 0 or rows.stack_bytes > 0 or rows.regs >= cap - 5, rows
    else:
        assert rows.spill_stores == 0 and rows.stack_bytes == 0, rows
    assert {k for k, _ in r.resources} == {"rmsnorm_bwd_rows", "rmsnorm_bwd_dw_reduce"}
    assert ("__cluster_dims__(" in bi.source) == (entry["params"]["cluster"] > 1)
    # each kernel is checked against its own block: the column sum's block is 32 x reduce_rows
    assert dict(bi.kernel_threads) == {"rmsnorm_bwd_rows": entry["params"]["threads"],
                                       "rmsnorm_bwd_dw_reduce": 32 * entry["params"]["reduce_rows"]}


def _regs_model(params: dict, n: int) -> int:
    """Registers of the rows kernel, measured with ptxas over this template's legal points (fp32 and
    bf16, N 16384..65536): about 4 per element a thread owns (its fp32 dw sums, plus x, dout and w)
    plus 40. Points over the block's cap spill; the template's register_budget estimate admitted some of
    them, which thread_elements_fit_registers now refuses (tests/fixtures/results/rmsnorm_bwd_register_budget.json)."""
    ept = -(-(n // params["cluster"]) // (params["threads"] * params["vec"])) * params["vec"]
    return 4 * ept + 40


@pytest.mark.parametrize("cell", [c for c in BWD.edge_cells()] + [c for c in BWD.matrix() if c.dtype("x").short == "fp32"],
                         ids=lambda c: c.label())
def test_backward_template_covers_edges_and_fp32_without_spills(cell):
    """Every edge cell (M = 1, odd M, N off the vector width, fp32 weight) and fp32 cell has a legal
    point the register model keeps under its block's cap, and that point builds without spilling."""
    n = cell.dim("N")
    points = [dict(BWD_T.default_params(), cluster=c, threads=t, vec=v)
              for c in (1, 2, 4, 8) for t in (256, 512, 128, 1024) for v in (8, 4, 2, 1)]
    legal = [p for p in points if BWD_T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict())
             and _regs_model(p, n) <= min(255, 65536 // p["threads"])]
    assert legal, f"no legal, non-spilling cluster_rows point for {cell.label()}"
    _, r = _build("rmsnorm_bwd", BWD_T, legal[0], cell)
    assert r.status is Status.OK, r.error + r.log
    assert r.spill_stores == 0
    assert dict(r.resources)["rmsnorm_bwd_rows"].regs <= min(255, 65536 // legal[0]["threads"])


def test_backward_plan_sizes_the_partials_by_groups():
    cell = BWD.matrix()[0]
    params = dict(BWD_T.default_params(), groups=132, cluster=2, threads=256)
    launches, ws = BWD_T.plan(params, 90, cell.dtypes_dict(), cell.dims_dict())
    rows, reduce = launches
    assert rows.grid == (2, 132, 1) and rows.block == (256, 1, 1)
    assert ws == {"dw_partial": 4 * 132 * cell.dim("N")}
    assert reduce.grid == (cell.dim("N") // 32, 1, 1) and reduce.block == (32, params["reduce_rows"], 1)
    small = Cell.make(cell.dtypes_dict(), {"M": 37, "N": 1024})  # fewer rows than groups: one group per row
    _, ws = BWD_T.plan(params, 90, small.dtypes_dict(), small.dims_dict())
    assert ws == {"dw_partial": 4 * 37 * 1024}


@pytest.mark.parametrize("cell", [c for c in FWD.matrix() if c.dim("M") == 4096 and c.dim("N") in (1024, 32768)],
                         ids=lambda c: c.label())
def test_forward_cluster_row_builds(cell):
    params = _repaired(FWD_T, cell)
    assert params is not None
    bi, r = _build("rmsnorm", FWD_T, params, cell)
    assert r.status is Status.OK, r.error + r.log
    assert r.spill_stores == 0 and f"__cluster_dims__({params['cluster']}, 1, 1)" in bi.source
    (launch,), _ = FWD_T.plan(params, 90, cell.dtypes_dict(), cell.dims_dict())
    assert launch.grid == (params["cluster"] * cell.dim("M"), 1, 1)  # rows along x: no 65535 limit


def test_forward_cluster_row_refuses_rows_it_cannot_split():
    """N = 33 cannot be split into vector-aligned slices: no legal point, so the search never picks it."""
    cell = Cell.make({"x": "bfloat16", "w": "bfloat16"}, {"M": 3, "N": 33})
    assert _repaired(FWD_T, cell) is None


def test_register_check_reads_each_kernels_own_block():
    res = {"big": KernelResources(regs=128), "small": KernelResources(regs=32)}
    assert check_resources(res, {"big": 512, "small": 1024})[0] is Status.OK
    status, why = check_resources(res, {"big": 1024, "small": 128})
    assert status is Status.RESOURCE_ERROR and "big: 128 regs x 1024" in why
    assert check_resources(res, 1024)[0] is Status.RESOURCE_ERROR  # one size for all: the old rule


def test_backward_experiment_builds_through_kfactory_run(tmp_path, capsys, monkeypatch):
    """The backward op's experiment runs through `kfactory run` with no engine change: real NVRTC
    builds of cluster_rows for every bf16 cell, recorded in a real DuckDB store (no GPU: it stops there)."""
    from evo.cli.main import main

    monkeypatch.setattr("evo.measure.run.gpu_available", lambda: False)
    store = tmp_path / "s.duckdb"
    rc = main(["run", str(ROOT / "experiments" / "rmsnorm_bwd_h200.toml"), "--store", str(store)])
    assert rc == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err
    rc = main(["sql", "SELECT count(DISTINCT b.build_key) AS n FROM builds b JOIN candidates c USING (genome_key) "
               "WHERE b.status = 'OK' AND c.op = 'rmsnorm_bwd' AND c.template = 'cluster_rows'", "--store", str(store)])
    assert rc == 0 and int(capsys.readouterr().out.split()[-1]) >= 7


PIPE_T = load_templates("rmsnorm")["rows_pipelined"]


@pytest.mark.parametrize("cell", [c for c in FWD.matrix() if c.dim("M") == 4096 and c.dim("N") <= 8192]
                         + [c for c in FWD.edge_cells() if c.dim("N") >= 1000], ids=lambda c: c.label())
def test_rows_pipelined_builds_without_spills(cell):
    """The short-row template (persistent grid, next row loaded before the current one is reduced): its
    register_budget keeps two rows, w and the addressing under the block's cap at every legal point."""
    import itertools

    points = [dict(PIPE_T.default_params(), threads=t, vec=v, min_blocks=b)
              for t, v, b in itertools.product((64, 128, 256, 512), (2, 4, 8), (1, 2, 4, 8))]
    legal = [p for p in points if PIPE_T.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict())]
    assert legal, f"no legal rows_pipelined point for {cell.label()}"
    for p in legal[:: max(1, len(legal) // 4)]:  # a spread of them: NVRTC takes ~0.2 s each
        _, r = _build("rmsnorm", PIPE_T, p, cell)
        assert r.status is Status.OK and r.spill_stores == 0, (p, r.error, r.spill_stores)
    (launch,), _ = PIPE_T.plan(legal[0], 90, cell.dtypes_dict(), cell.dims_dict())
    assert launch.grid == (min(cell.dim("M"), legal[0]["ctas"]), 1, 1)  # persistent: at most `ctas` CTAs


def test_backward_register_calibration_rebuilds_and_its_constraint_refuses_the_spills():
    """The committed calibration (tests/fixtures/results/rmsnorm_bwd_register_budget.{json,csv}) against today's template
    and NVRTC: its refused column is what thread_elements_fit_registers says; refused points spill or have no registers to
    spare, and the legal ones that spill are the few it names (16 B at most); a sample of rows, refused and legal at
    32 and 64 elements a thread, rebuild with the file's registers and spills."""
    from evo.build.nvrtc import compiler_version

    path = ROOT / "tests/fixtures/results/rmsnorm_bwd_register_budget.json"
    doc, rows = json.loads(path.read_text()), read_budget_rows(path)
    assert len(rows) == doc["points"] and doc["rows_csv"] == path.with_suffix(".csv").name
    cells = {(c.dtype("x").value, c.dim("N")): c for c in BWD.matrix()}

    def point(r: dict) -> tuple[Cell, dict]:
        keys = ("cluster", "threads", "vec", "keep_rows", "w_regs", "load_hint", "store_hint")
        return cells[(r["x"], r["N"])], BWD_T.default_params() | {k: r[k] for k in keys}

    for r in rows:
        c, p = point(r)
        assert r["refused"] == (not BWD_T.is_valid(p, 90, c.dtypes_dict(), c.dims_dict())), r
        if r["refused"]:
            assert r["spill_stores"] or r["stack_bytes"] or r["regs"] >= min(255, 65536 // r["threads"]) - 8, r
        else:
            assert r["spill_stores"] <= 16 and r["stack_bytes"] <= 16, r
    assert doc["spilling_and_legal"] <= 32 and doc["refused"] >= doc["spilling"] - doc["spilling_and_legal"]
    if compiler_version() != doc["compiler"]:
        pytest.skip(f"the file was built with {doc['compiler']}, this NVRTC is {compiler_version()}")
    rng = random.Random(5)
    sample = []
    for pick in (lambda r: r["refused"] and r["spill_stores"] > 0,
                 lambda r: not r["refused"] and r["elements"] == 64,
                 lambda r: not r["refused"] and r["elements"] == 32 and r["threads"] == 512):
        sample += rng.sample([r for r in rows if pick(r)], 2)
    for r in sample:
        c, p = point(r)
        _, b = _build("rmsnorm_bwd", BWD_T, p, c)
        got = dict(b.resources)["rmsnorm_bwd_rows"]
        assert (got.regs, got.spill_stores, got.stack_bytes) == (r["regs"], r["spill_stores"], r["stack_bytes"]), r


@pytest.mark.parametrize("label,kw", [("w=bf16,x=bf16 M32768-N4096", dict(cluster=1, threads=256, vec=8)),
                                      ("w=fp16,x=fp16 M32768-N8192", dict(cluster=1, threads=512, vec=8)),
                                      ("w=fp32,x=fp32 M32768-N8192", dict(cluster=2, threads=256, vec=4))])
def test_backward_prefetch_keeps_the_next_rows_loads_in_flight_across_the_rows_reduction(label, kw):
    """cluster_rows with prefetch builds spill-free, and in its row loop's SASS no instruction between the loop's
    first global load and the barrier of the row's reduction waits on a global load's scoreboard: the loads there
    are the next row's, in flight while this row is reduced and written. Without prefetch the dot waits on them."""
    from evo.build.sass import inner_loops, opcode, scheduled

    cell = next(c for c in BWD.matrix() if c.label() == label)
    waits = {}
    for prefetch in (False, True):
        params = dict(BWD_T.default_params(), keep_rows=True, prefetch=prefetch, **kw)
        assert BWD_T.is_valid(params, 90, cell.dtypes_dict(), cell.dims_dict()), params
        _, r = _build("rmsnorm_bwd", BWD_T, params, cell)
        assert r.status is Status.OK and r.spill_stores == 0, (r.error, r.spill_stores)
        sched = scheduled(r.cubin, "rmsnorm_bwd_rows")
        loop = inner_loops([s for s, _ in sched])[0]
        body = [(opcode(s), c) for s, c in sched[loop.first:loop.last + 1] if c is not None]
        loads = [i for i, (op, _) in enumerate(body) if op == "LDG"]
        boards = {body[i][1].write for i in loads} - {None}
        bar = next(i for i, (op, _) in enumerate(body) if op in ("BAR", "UCGABAR_ARV", "UCGABAR_WAIT"))
        assert loads and loads[0] < bar
        waits[prefetch] = [op for op, c in body[loads[0] + 1:bar] if any(c.wait >> b & 1 for b in boards)]
    assert waits[False] and not waits[True], waits


def test_backward_prefetch_only_beside_keep_rows_and_short_slices():
    cell = next(c for c in BWD.matrix() if c.label() == "w=fp32,x=fp32 M32768-N8192")
    base = dict(BWD_T.default_params(), prefetch=True, cluster=1, threads=256, vec=4)
    assert "prefetch_keeps_rows" in BWD_T.violations(dict(base, keep_rows=False), 90, cell.dtypes_dict(), cell.dims_dict())
    # 8192 / (256 x 4) = 8 items of 4: 32 elements a thread, over the 16 prefetch allows
    assert "prefetch_fits_registers" in BWD_T.violations(base, 90, cell.dtypes_dict(), cell.dims_dict())
    assert BWD_T.is_valid(dict(base, cluster=2, threads=512), 90, cell.dtypes_dict(), cell.dims_dict())
