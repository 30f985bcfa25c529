"""On a GPU: the KDA chunk template's two launches (kda_chunk_prep, kda_chunk_recur) timed one by one, and
together, on every prefill cell at a few points of its space, to tell which launch dominates.

The plan and the timing loop are evo/measure/launches.py; everything but the loop is the gate's own code:
`make_job` resolves the plan (TemplateDef.plan through bind_cell: grids, blocks, smem, workspaces, bound
args), the gate's Geometry/InputSet allocate the buffers, `Gate._fill` fills the inputs with the op's FILLS ("normal" kind, device fills, never zeros), `Gate._bind`
binds each launch's args, and the first launch pair (and the outputs after timing) is checked against the
float64 device reference. Each launch is then timed alone with CUDA events (Worker.time: L2 flushed and the
stream held busy before every sample, so the host's launch work falls outside the events), median of REPS
after WARMUP. recur alone re-reads the workspace the checked prep left (it never writes it).

Run: KF_LAUNCH_TIMES_OUT=kda_launch_times.json pytest -s tests/gpu/test_kda_launch_times.py
Prints one line per cell and point; with KF_LAUNCH_TIMES_OUT set, every row so far is (re)written there as
JSON after each test ({"fingerprint": ..., "rows": [...]}; the first committed file, kda_prefill_h200_2/, is
the bare list of rows: its fingerprint is that folder's summary.json, the same machine and lease).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from ops.kda import SPEC
from ops.kda.spec import prefill_matrix

TEMPLATE = "chunk"
KERNELS = ("kda_chunk_prep", "kda_chunk_recur")
# kda_prefill_h200_4's fastest point (recur_lean + recur_ldsm; its split diagonal, a prep option since removed, as
# warp_row's), which the later prep options vary
LDSM = {"chunk": 32, "warps": 2, "stages": 6, "prep_threads": 256, "stage_in": True, "u_prefetch": True,
        "recur_lean": True, "recur_ldsm": True}
POINTS = [{}, {"chunk": 32, "warps": 4, "stages": 3, "prep_threads": 128}, {"chunk": 32, "warps": 1},
          {"chunk": 32, "warps": 4, "stages": 3, "prep_threads": 128, "stage_in": True, "u_prefetch": True},
          {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True},
          {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True, "recur_lean": True},
          LDSM, LDSM | {"recur_fuse": True},
          # the prep's tf32 by one add
          LDSM | {"prep_round": "add"}, LDSM | {"prep_round": "add", "prep_exp": "fast"},
          # the GA's point (kda_prefill_h200_5) and the same with the elementwise outputs vectorized
          LDSM | {"prep_threads": 128, "prep_round": "add", "prep_exp": "fast"},
          LDSM | {"prep_threads": 128, "prep_round": "add", "prep_exp": "fast", "prep_vec": True}]
# that point's prep with launch 2's K split across the warps of a value group (kwarps): the one-warp-a-column
# recurrence's options (u_prefetch, recur_lean, recur_ldsm) off, the ring depth and the group counts varied
KSPLIT = {k: v for k, v in POINTS[-1].items() if k not in ("u_prefetch", "recur_lean", "recur_ldsm")}
POINTS += [KSPLIT | {"warps": w, "kwarps": kw, "stages": s}
           for w, kw, s in [(1, 4, 3), (1, 4, 4), (1, 4, 6), (1, 2, 3), (1, 2, 4), (2, 4, 3), (2, 2, 3), (2, 4, 6),
                            (4, 4, 3), (4, 2, 3), (8, 2, 3)]]
# chunk 64 with the split K (half the recurrence's serial steps; a one-warp group legal there): 128 and 256 prep threads
# (its kwarps-2 points spill and are refused: ksplit_2_spills_at_chunk_64)
POINTS += [KSPLIT | {"chunk": 64, "warps": w, "kwarps": kw, "stages": 3, "prep_threads": pt}
           for w, kw, pt in [(1, 4, 128), (1, 4, 256)]]
# kda_prefill_h200_10's dispatch genomes (kwarps 2 and 4 at B = 1, the one-warp recurrence at B = 4, 8; their split
# diagonal, a prep option since removed, as warp_row's) and with the diagonal blocks by tf32 mma (prep_diag = mma):
# ids start "chunk32-kwarps" (-k)
GA10 = {"chunk": 32, "kwarps": 1, "prep_diag": "warp_row", "prep_exp": "fast", "prep_round": "add",
        "prep_threads": 128, "prep_vec": True, "recur_fuse": False, "recur_ldsm": True, "recur_lean": True,
        "stage_in": True, "stages": 6, "state_split": False, "u_prefetch": True, "warps": 2}
GA10_KSPLIT = {"kwarps": 2, "recur_ldsm": False, "recur_lean": False, "stages": 3, "u_prefetch": False, "warps": 1}
POINTS += [GA10 | over | {"prep_diag": d} for over in ({}, GA10_KSPLIT, GA10_KSPLIT | {"kwarps": 4, "stages": 6})
           for d in ("warp_row", "mma")]
# and the mma prep at 256 prep threads
POINTS += [GA10 | over | {"prep_diag": "mma", "prep_threads": 256} for over in ({}, GA10_KSPLIT)]
ARCH = 90
REPS = 50
WARMUP = 5
SUM_TOL = 0.25  # |prep + recur - together| <= SUM_TOL * together
ROWS: list[dict[str, Any]] = []


def point_id(p: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in p.items()) or "default"


def plan_job(c, params: dict, build: Any = None):
    """(genome, EvalJob) of the chunk template at `params` on cell c (evo.measure.launches.plan_job)."""
    from evo.measure.launches import plan_job as plan

    try:
        return plan(SPEC, TEMPLATE, c, params, ARCH, build)
    except ValueError as e:
        raise AssertionError(str(e)) from None


def time_launches(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, reps: int = REPS, warmup: int = WARMUP,
                  kind: str = "normal", seed: int = 0, order: str = "declared") -> dict[str, Any]:
    """Each launch timed alone, then all together (evo.measure.launches.time_launches)."""
    from evo.measure.launches import time_launches as timed

    return timed(dev, obj, ref_obj, ref_mod, job, reps, warmup, kind, seed, order)


def check_row(row: dict[str, Any]) -> None:
    """What must hold of a timed row: two launches, every time finite and > 0, their sum near the together time."""
    assert [ln["kernel"] for ln in row["launches"]] == list(KERNELS), row["launches"]
    for t in [*(ln["median_us"] for ln in row["launches"]), row["total_us"]]:
        assert math.isfinite(t) and t > 0, row
    assert abs(row["sum_us"] - row["total_us"]) <= SUM_TOL * row["total_us"], (
        f"prep + recur = {row['sum_us']:.1f} us, together {row['total_us']:.1f} us: off by more than {SUM_TOL:.0%}")


def describe(row: dict[str, Any]) -> str:
    prep, recur = row["launches"]
    return (f"kda launches {row['cell']} {row['point']}: prep {prep['median_us']:.1f} us grid {tuple(prep['grid'])} "
            f"block {prep['block'][0]}, recur {recur['median_us']:.1f} us grid {tuple(recur['grid'])} "
            f"block {recur['block'][0]}, sum {row['sum_us']:.1f} us, total {row['total_us']:.1f} us "
            f"(prep {prep['median_us'] / row['sum_us'] if row['sum_us'] > 0 else math.nan:.0%} of the sum)")


FINGERPRINT: dict[str, str] = {}


def write_rows() -> None:
    """The rows so far, under the worker's fingerprint (GPU, clocks, driver, CUDA, NVRTC, library versions)."""
    path = os.environ.get("KF_LAUNCH_TIMES_OUT")
    if path:
        with open(path, "w") as f:
            json.dump({"fingerprint": FINGERPRINT, "rows": ROWS}, f, indent=1)


@pytest.fixture(scope="module")
def worker():
    from evo.measure.worker import Worker

    w = Worker()
    FINGERPRINT.update(dict(w.fingerprint))
    return w


_BUILDS: dict[tuple, Any] = {}


def build_for(c, params: dict):
    """The NVRTC build of a point on c, shared by the cells that agree on what it specializes (K, V)."""
    from evo.build.nvrtc import compile_one, prepare
    from evo.templates.template import load_templates

    tdef = load_templates("kda")[TEMPLATE]
    key = (json.dumps(params, sort_keys=True), tuple(sorted(c.dtypes_dict().items())),
           tuple(sorted(tdef.consts(c.dims_dict()).items())))
    if key not in _BUILDS:
        g, _ = plan_job(c, params)
        build = compile_one(prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
        assert build.status.ok, build.error
        _BUILDS[key] = build
    return _BUILDS[key]


PREFILL = prefill_matrix()


@pytest.mark.gpu
@pytest.mark.parametrize("params", POINTS, ids=point_id)
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_chunk_launches_timed_one_by_one(worker, c, params):
    from cuda.core import ObjectCode

    build = build_for(c, params)
    g, job = plan_job(c, params, build)
    mod, ref_obj = worker._op("kda")
    obj = ObjectCode.from_cubin(build.cubin)
    worker.smem_allowed.clear()  # keyed by id(obj), as Worker.run does per job
    res = time_launches(worker, obj, ref_obj, mod, job)
    row = {"cell": c.label(), "B": c.dim("B"), "T": c.dim("T"), "H": c.dim("H"), "HV": c.dim("HV"),
           "point": point_id(params), "params": g.params_dict(), "regs": dict((k, r.regs) for k, r in build.resources),
           **res}
    ROWS.append(row)
    write_rows()
    print("\n" + describe(row))
    check_row(row)


# The recurrence beside the prep: the committed prefill dispatch's genomes (kda_export_h200_3's prefill run) with
# launch 2 started first on a second, higher-priority stream, then launch 1, unsynchronized
# (evo.measure.launches.time_overlap: what an overlapped plan could save at most; the outputs still checked).
# Run: KF_LAUNCH_TIMES_OUT=kda_overlap.json pytest -s tests/gpu/test_kda_launch_times.py -k beside
OVERLAP_TABLE = Path(__file__).resolve().parents[2] / "tests/fixtures/results/kda_export_h200_3/prefill_run/dispatch.json"


@pytest.mark.gpu
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_chunk_recurrence_beside_the_prep(worker, c):
    from cuda.core import ObjectCode

    from evo.measure.launches import time_overlap

    params = json.loads(OVERLAP_TABLE.read_text())["dispatch"][c.label()]["params"]
    build = build_for(c, params)
    g, job = plan_job(c, params, build)
    mod, ref_obj = worker._op("kda")
    obj = ObjectCode.from_cubin(build.cubin)
    worker.smem_allowed.clear()
    res = time_overlap(worker, obj, ref_obj, mod, job, REPS, WARMUP)
    row = {"cell": c.label(), "B": c.dim("B"), "T": c.dim("T"), "H": c.dim("H"), "HV": c.dim("HV"), "test": "beside",
           "point": point_id(params), "params": g.params_dict(),
           "regs": dict((k, r.regs) for k, r in build.resources), **res}
    ROWS.append(row)
    write_rows()
    prep, recur = res["launches"]
    seq, over = res["sequential"]["median_us"], res["overlapped"]["median_us"]
    print(f"\nkda beside {c.label()}: prep {prep['median_us']:.1f} us ({prep['ctas']} CTAs), recur "
          f"{recur['median_us']:.1f} us ({recur['ctas']} CTAs), in order {seq:.1f} us, recur beside prep {over:.1f} us "
          f"({over / seq:.2f}x)")
    assert [ln["kernel"] for ln in res["launches"]] == list(KERNELS)
    for t in (prep["median_us"], recur["median_us"], seq, over):
        assert math.isfinite(t) and t > 0, res
    # both launches must finish: no schedule beats the longer one alone (10% for the timer's spread)
    assert over >= 0.9 * max(prep["median_us"], recur["median_us"]), res


# The overlapped plan's schedules (docs/kda_prefill_overlap.md): kda_chunk_flags, the chunk-major prep, the recurrence
# on the side stream, each timed alone and together, issued by the host in the declared order (the recurrence last)
# or side first (the recurrence right after the flags, its CTAs queued before the prep's), under the driver's
# shared-memory carveout or 100% (every SM in the split both kernels' CTAs can share; evo/measure/carveout.py).
# recur alone runs after prep alone, its flags set: no waits. The gate's first run (kda_overlap_h200_1) had the
# overlapped plan at 720 us against 733 us in order at B1-T8192, and 22 ms against 1.65 ms at B1-T32768.
# Run: KF_LAUNCH_TIMES_OUT=kda_overlap.json pytest -s tests/gpu/test_kda_launch_times.py -k schedules
OVERLAP = {"chunk": 32, "stages": 3, "prep_threads": 128, "stage_in": True, "prep_diag": "mma", "prep_round": "add",
           "prep_exp": "fast", "prep_vec": True, "kwarps": 2, "overlap": True}
OVERLAP_KERNELS = ("kda_chunk_flags", "kda_chunk_prep", "kda_chunk_recur")


@pytest.mark.gpu
@pytest.mark.parametrize("carveout", [None, 100], ids=["carveout-driver", "carveout-100"])
@pytest.mark.parametrize("order", ["declared", "side_first"])
@pytest.mark.parametrize("c", [c for c in PREFILL if c.dim("B") == 1], ids=lambda c: c.label())
def test_overlap_schedules(worker, c, order, carveout):
    from cuda.core import ObjectCode

    params = OVERLAP | {"warps": 2 if c.dim("HV") == 32 else 1}
    build = build_for(c, params)
    g, job = plan_job(c, params, build)
    mod, ref_obj = worker._op("kda")
    obj = ObjectCode.from_cubin(build.cubin)  # a module of its own: no attribute of an earlier test's kernels
    worker.smem_allowed.clear()
    worker.carved.clear()
    before, worker.carveout = worker.carveout, carveout
    try:
        res = time_launches(worker, obj, ref_obj, mod, job, order=order)
    finally:
        worker.carveout = before
    row = {"cell": c.label(), "B": c.dim("B"), "T": c.dim("T"), "H": c.dim("H"), "HV": c.dim("HV"), "test": "schedules",
           "carveout": carveout, "point": point_id(params), "params": g.params_dict(),
           "regs": dict((k, r.regs) for k, r in build.resources), **res}
    ROWS.append(row)
    write_rows()
    flags, prep, recur = res["launches"]
    tog = res["total_us"]
    print(f"\nkda schedules {c.label()} order {order} carveout {carveout}: prep {prep['median_us']:.1f} us "
          f"({prep['ctas']} CTAs), recur {recur['median_us']:.1f} us ({recur['ctas']} CTAs), flags "
          f"{flags['median_us']:.1f} us, sum {res['sum_us']:.1f} us, together {tog:.1f} us "
          f"({tog / res['sum_us']:.2f} of the sum, "
          f"{tog / max(prep['median_us'], recur['median_us']):.2f} of the longer)")
    assert [ln["kernel"] for ln in res["launches"]] == list(OVERLAP_KERNELS)
    for t in [*(ln["median_us"] for ln in res["launches"]), tog]:
        assert math.isfinite(t) and t > 0, res
    # both launches must finish: no schedule beats the longer one alone (10% for the timer's spread)
    assert tog >= 0.9 * max(prep["median_us"], recur["median_us"]), res


# The split-K recurrence's own partials of o (2026-12-04): it read po[n] with n = kw + KW m, a run-time index that put
# po in local memory (a 64-byte stack frame); it now reads its own partials back from shared memory like the other
# warps' (the same bits). A/B in one process at the B = 1 cells' dispatch genomes (kda_prefill_h200_13, kwarps 2 and
# 4): today's template, and the same text with that one line as it was (LOCAL_PO). Rows: test "own_partials".
# Compiled (NVRTC 13.5): kwarps 2 from 244 registers and a 64-byte stack to 214 and none; kwarps 4, 128 -> 133
# registers, no stack either way.
# Run: KF_LAUNCH_TIMES_OUT=kda_po.json pytest -s tests/gpu/test_kda_launch_times.py -k own_partials
PO_TABLE = Path(__file__).resolve().parents[2] / "tests/fixtures/results/kda_prefill_h200_13/dispatch.json"
SHARED_PO = "const float4 p = xo[(j * (C / 8) + n) * 32 + lane];"
LOCAL_PO = ("const float4 p = j == kw ? make_float4(po[n][0], po[n][1], po[n][2], po[n][3]) : "
            "xo[(j * (C / 8) + n) * 32 + lane];")


def time_variant(worker, c, test: str, variant: str, params: dict, g, build, job, mod, ref_obj, **extra) -> dict:
    """One variant of an A/B in this process: its launches timed one by one (time_launches checks the outputs
    first), its row (`test`, `variant`, the build's registers and `extra`) appended to ROWS and written; the result."""
    from cuda.core import ObjectCode

    obj = ObjectCode.from_cubin(build.cubin)
    worker.smem_allowed.clear()  # keyed by id(obj), as Worker.run does per job
    worker.carved.clear()
    res = time_launches(worker, obj, ref_obj, mod, job)
    ROWS.append({"cell": c.label(), "B": c.dim("B"), "T": c.dim("T"), "H": c.dim("H"), "HV": c.dim("HV"),
                 "test": test, "variant": variant, "point": point_id(params), "params": g.params_dict(),
                 "regs": {k: r.regs for k, r in build.resources}, **extra, **res})
    write_rows()
    return res


def time_overrides(worker, c, test: str, params: dict, overrides: dict[str, dict], launch: int) -> dict[str, float]:
    """An A/B of `params` with each of `overrides` (variant -> params over it) in this process, built with this
    process's NVRTC: each variant's median of launch `launch` (time_variant, a row each)."""
    mod, ref_obj = worker._op("kda")
    out = {}
    for variant, over in overrides.items():
        p = params | over
        build = build_for(c, p)
        g, job = plan_job(c, p, build)
        out[variant] = time_variant(worker, c, test, variant, p, g, build, job, mod, ref_obj)["launches"][launch][
            "median_us"]
    assert all(math.isfinite(t) and t > 0 for t in out.values()), out
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in PREFILL if c.dim("B") == 1], ids=lambda c: c.label())
def test_split_k_recurrence_own_partials_from_shared_against_local(worker, c):
    from evo.build.nvrtc import compile_one, prepare
    from evo.core.genome import Genome
    from evo.measure.launches import plan_job as plan
    from evo.templates.template import load_templates, parse_template

    params = json.loads(PO_TABLE.read_text())["dispatch"][c.label()]["params"]
    assert params["kwarps"] > 1, params
    today = load_templates("kda")[TEMPLATE]
    assert today.text.count(SHARED_PO) == 1
    before = parse_template(today.text.replace(SHARED_PO, LOCAL_PO), "chunk with po indexed at run time", trusted=True)
    mod, ref_obj = worker._op("kda")
    out = {}
    for variant, tdef in (("shared", today), ("local", before)):
        g = Genome.make("kda", TEMPLATE, tdef.source_hash, tdef.default_params() | params)
        build = compile_one(prepare(tdef, g, "sm_90a", c.dtypes_dict(), c.dims_dict()))
        assert build.status.ok, build.error
        recur = dict(build.resources)["kda_chunk_recur"]
        # what the change is about: today's has no stack; as it was, 64 bytes at kwarps 2 (at kwarps 4 ptxas kept
        # po in registers: one token tile a warp, NVRTC 13.5)
        assert variant == "local" or recur.stack_bytes == 0, recur
        _, job = plan(SPEC, TEMPLATE, c, params, ARCH, build, tdef=tdef)
        res = time_variant(worker, c, "own_partials", variant, params, g, build, job, mod, ref_obj,
                           stack_bytes=recur.stack_bytes)
        out[variant] = res["launches"][1]["median_us"]
    print(f"\nkda own partials {c.label()}: recur from shared {out['shared']:.1f} us, from local memory "
          f"{out['local']:.1f} us ({out['local'] / out['shared']:.3f}x)")
    assert all(math.isfinite(t) and t > 0 for t in out.values()), out


# The prep's exponentials and shared-memory offsets (2026-12-05): each prefill cell's dispatch genome of
# kda_prefill_h200_13 as it was (prep_exp fast, prep_addr swz), with one ex2.approx.ftz an exponential on a base-2
# decay (ex2), with the offsets from row and column apart (rowcol), and with both. Compiled (NVRTC 13.5, SASS in
# prep_sass.json, in git history): both together ~24% fewer prep instructions a CTA, 93 -> 80 registers. A/B
# in one process, launch by launch (time_launches checks the outputs against float64 first). Rows: test "prep_ex2".
# Run: KF_LAUNCH_TIMES_OUT=kda_ex2.json pytest -s tests/gpu/test_kda_launch_times.py -k prep_ex2
PREP_VARIANTS = {"fast-swz": {"prep_exp": "fast", "prep_addr": "swz"},
                 "ex2-swz": {"prep_exp": "ex2", "prep_addr": "swz"},
                 "fast-rowcol": {"prep_exp": "fast", "prep_addr": "rowcol"},
                 "ex2-rowcol": {"prep_exp": "ex2", "prep_addr": "rowcol"}}


@pytest.mark.gpu
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_prep_ex2_and_rowcol_against_the_dispatch(worker, c):
    params = json.loads(PO_TABLE.read_text())["dispatch"][c.label()]["params"]
    out = time_overrides(worker, c, "prep_ex2", params, PREP_VARIANTS, launch=0)
    print(f"\nkda prep {c.label()}: "
          + ", ".join(f"{v} {t:.1f} us ({t / out['fast-swz']:.3f}x)" for v, t in out.items()))


# The recurrence's addresses (2026-12-05): kda_prefill_h200_15's dispatch genomes as they are (recur_addr swz) and with
# carry; at the K-split entries (B1-T8192 kwarps 2, B1-T32768 kwarps 4) also hoist (the ring's and ldmatrix's shared
# addresses as bases plus immediates; carry adds the refill's sources, u's words and o's address carried from chunk to
# chunk), at the one-warp-a-column entries (B4, B8) carry only (its items' slots and each kind's source carried).
# Compiled (NVRTC 13.0, recur_sass_nvrtc13_0.json in git history): the chunk loop 501 -> 443 -> 364 instructions
# a warp at B1-T8192, 417 -> 387 -> 325 at B1-T32768, 630 -> 522 at B4 and B8. A/B in one process, launch by launch.
# Run: KF_LAUNCH_TIMES_OUT=kda_hoist.json pytest -s tests/gpu/test_kda_launch_times.py -k recur_hoist
HOIST_TABLE = Path(__file__).resolve().parents[2] / "tests/fixtures/results/kda_prefill_h200_15/dispatch.json"


def table_params(table: Path, c) -> dict:
    return json.loads(table.read_text())["dispatch"][c.label()]["params"]


def ab(worker, c, test: str, params: dict, param: str, values: tuple, launch: int, title: str) -> dict:
    """`param`'s values on `params`, one launch timed for each in this process (time_overrides: the outputs checked
    first), printed as times and ratios to the first value's."""
    out = time_overrides(worker, c, test, params, {v: {param: v} for v in values}, launch=launch)
    print(f"\n{title} {c.label()}: " + ", ".join(f"{v} {t:.1f} us ({t / out[values[0]]:.3f}x)" for v, t in out.items()))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_recur_hoist_against_the_dispatch(worker, c):
    params = table_params(HOIST_TABLE, c)
    addrs = ("swz", "hoist", "carry") if params["kwarps"] > 1 else ("swz", "carry")
    ab(worker, c, "recur_hoist", params, "recur_addr", addrs, 1, "kda recurrence")


# w, u by bf16 mma (2026-12-05): the carry dispatch (experiments/seeds/kda_prefill_carry.json) with prep_wu tf32 (as it
# is) and bf16 (Tinv diag(beta) as bf16 hi + lo tiles, k exp(G) over the staged k as bf16, A and B fragments by
# ldmatrix: the items' tf32 rounding and widening of every B operand gone). A/B of the prep launch in one process.
# Run: KF_LAUNCH_TIMES_OUT=kda_wu.json pytest -s tests/gpu/test_kda_launch_times.py -k prep_wu
CARRY_TABLE = Path(__file__).resolve().parents[2] / "experiments/seeds/kda_prefill_carry.json"


@pytest.mark.gpu
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_prep_wu_against_the_carry_dispatch(worker, c):
    ab(worker, c, "prep_wu", table_params(CARRY_TABLE, c), "prep_wu", ("tf32", "bf16"), 0, "kda prep w, u")


# recur_early (2026-12-05): the carry dispatch's K-split entries (the B = 1 cells) with the recurrence as it is (none),
# u's words and exp(G_last) read at the chunk's start and the refill without a branch before the group's barrier (mid)
# or after the state update (late). A/B of the recurrence launch in one process.
# Run: KF_LAUNCH_TIMES_OUT=kda_early.json pytest -s tests/gpu/test_kda_launch_times.py -k recur_early
@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in PREFILL if c.dim("B") == 1], ids=lambda c: c.label())
def test_recur_early_against_the_carry_dispatch(worker, c):
    params = table_params(CARRY_TABLE, c)
    assert params["kwarps"] > 1 and params["recur_addr"] == "carry", params
    ab(worker, c, "recur_early", params, "recur_early", ("none", "mid", "late"), 1, "kda recurrence early")


# the carry dispatch with w, u by bf16 mma (experiments/seeds/kda_prefill_carry_bf16wu.json). A/B of the prep launch
# in one process. Run: KF_LAUNCH_TIMES_OUT=kda_v.json pytest -s tests/gpu/test_kda_launch_times.py -k prep_v
BF16_TABLE = Path(__file__).resolve().parents[2] / "experiments/seeds/kda_prefill_carry_bf16wu.json"


@pytest.mark.gpu
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_prep_v_against_the_bf16_dispatch(worker, c):
    """The prep launch with v staged with q and k (5 CTAs an SM) and over q after the A phase (prep_v = late: 6)."""
    ab(worker, c, "prep_v", table_params(BF16_TABLE, c), "prep_v", ("early", "late"), 0, "kda prep v staging")


H100_TABLE = Path(__file__).resolve().parents[2] / "tests/fixtures/results/kda_prefill_h100_2/dispatch.json"
# the K-split recurrence's shapes on the B = 1 cells, each 128-256 CTAs: value groups a CTA (warps), warps a group
# (kwarps), ring depth (stages) and recur_early; the dispatch's own entry first
RECUR_SHAPES = {"dispatch": {}, "k2w2s3": {"kwarps": 2, "warps": 2, "stages": 3},
                "k2w1s3": {"kwarps": 2, "warps": 1, "stages": 3}, "k4w1s3": {"kwarps": 4, "warps": 1, "stages": 3},
                "k4w2s3": {"kwarps": 4, "warps": 2, "stages": 3}, "k4w2s6": {"kwarps": 4, "warps": 2, "stages": 6},
                "k4w1s6": {"kwarps": 4, "warps": 1, "stages": 6}}


@pytest.mark.gpu
@pytest.mark.parametrize("c", [c for c in PREFILL if c.dim("B") == 1], ids=lambda c: c.label())
@pytest.mark.parametrize("early", ["mid", "late"])
def test_recur_shape_on_the_h100_dispatch(worker, c, early):
    """The recurrence launch of kda_prefill_h100_2's B = 1 entries at each K-split shape and recur_early mode."""
    params = table_params(H100_TABLE, c) | {"recur_early": early}
    out = time_overrides(worker, c, f"recur_shape_{early}", params, RECUR_SHAPES, launch=1)
    print(f"\nkda recurrence shape, recur_early {early}, {c.label()}: "
          + ", ".join(f"{v} {t:.1f} us ({t / out['dispatch']:.3f}x)" for v, t in out.items()))
