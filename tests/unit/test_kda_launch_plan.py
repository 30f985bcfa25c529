"""On the CPU: the plan resolution tests/gpu/test_kda_launch_times.py times by (its `plan_job`: make_job over
the chunk template, no build) gives, on every prefill cell and timed point, exactly the two launches with
the grids, blocks, smem and workspace sizes the template header's expressions say, args bound to declared
buffers; and its timing routine (`time_launches`) runs on the numpy fake device with the two launches
emulated: each launch timed alone and together, the outputs checked before and after timing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evo.measure.gate import Geometry, _nbytes
from evo.templates.template import load_templates
from ops.kda import SPEC
from ops.kda import device as kda_device
from ops.kda.spec import cell, prefill_matrix
from evo.core.spec import DType
from tests.gpu.test_kda_launch_times import KERNELS, POINTS, check_row, plan_job, point_id, time_launches

TDEF = load_templates("kda")["chunk"]
PREFILL = prefill_matrix()
WS = ("ws_qg", "ws_kg", "ws_w", "ws_aqk", "ws_u", "ws_gl")


def expected(c, p: dict) -> tuple[list[tuple], dict[str, int]]:
    """The header's [[launch]] and [workspace] expressions, written out by hand."""
    B, T, H, HV, K, V = (c.dim(d) for d in ("B", "T", "H", "HV", "K", "V"))
    C, warps, kw = p["chunk"], p["warps"], p["kwarps"]
    nt = -(-T // C)
    launches = [
        # G and A in fp32; with stage_in also the chunk's q, k (bf16 [C][K]), v (bf16 [C][V]) and beta (fp32 [C])
        ("kda_chunk_prep", (nt, HV, B), (p["prep_threads"], 1, 1),
         C * (K + C) * 4 + (C * (2 * K * 2 + V * 2 + 4) if p["stage_in"] else 0)),
        # the ring of C K bf16 slots; with kwarps > 1 (K split across a value group's warps) one slot a chunk
        # (-w, qg, kgT, A_qk, exp(G_last) fp32 [K], u fp32 [C][16 warps]) and the partials (float4 [warps][2][kw][C / 8][32])
        ("kda_chunk_recur", (V // (16 * warps), HV, B), (32 * warps * kw, 1, 1),
         p["stages"] * C * K * 2 if kw == 1 else
         p["stages"] * (3 * C * K * 2 + C * C * 2 + K * 4 + C * 16 * warps * 4) + warps * 2 * kw * (C // 8) * 32 * 16),
    ]
    n = B * HV * nt
    ws = {"ws_qg": 2 * n * C * K, "ws_kg": 2 * n * C * K, "ws_w": 2 * n * C * K, "ws_aqk": 2 * n * C * C,
          "ws_u": 4 * n * C * V, "ws_gl": 4 * n * K,
          "ws_flag": 4 * n if p.get("overlap") else 0}  # a flag a chunk with overlap (test_kda_chunk -k overlap)
    return launches, ws


@pytest.mark.parametrize("params", POINTS, ids=point_id)
@pytest.mark.parametrize("c", PREFILL, ids=lambda c: c.label())
def test_plan_has_the_headers_two_launches_and_workspaces(c, params):
    g, job = plan_job(c, params)
    p = g.params_dict()
    assert p == TDEF.default_params() | params
    want_launches, want_ws = expected(c, p)
    got = [(lj.kernel, lj.grid, lj.block, lj.smem) for lj in job.launches]
    assert got == want_launches
    assert tuple(lj.kernel for lj in job.launches) == KERNELS
    assert {name for name, _ in TDEF.workspaces} == set(WS) | {"ws_flag"} == set(want_ws)

    geo = Geometry("", dict(job.dims), job.buffers, job.launches, dict(job.scalars))
    assert {b.name: (b.dtype, b.shape) for b in geo.ws} == {k: ("uint8", (v,)) for k, v in want_ws.items()}
    assert {b.name: _nbytes(b) for b in geo.ws} == {k: max(1, v) for k, v in want_ws.items()}
    assert {b.name for b in geo.ins} == {"q", "k", "v", "g", "beta", "initial_state"}
    assert {b.name for b in geo.outs} == {"o", "final_state"}
    assert set(job.left_out) == {"A_log", "dt_bias", "cu_seqlens"}

    # every buffer arg names a declared buffer; the header's arg order, scalars from the cell
    declared = {b.name for b in job.buffers}
    prep, recur = job.launches
    assert [v for k, v in prep.args[:11]] == ["q", "k", "v", "g", "beta", *WS]
    assert [v for k, v in recur.args[:9]] == [*WS, "initial_state", "o", "final_state"]
    for lj in job.launches:
        assert all(v in declared for k, v in lj.args if k == "buf"), lj.args
    assert prep.args[11:14] == (("i32", c.dim("T")), ("i32", c.dim("H")), ("i32", c.dim("HV")))
    assert prep.args[14][0] == "f32" and math.isclose(prep.args[14][1], c.dim("K") ** -0.5)
    # cu_seqlens last: a null pointer on an equal-length cell (a varlen cell binds the buffer)
    assert recur.args[9:] == (("i32", c.dim("T")), ("i32", c.dim("HV")), ("ptr", 0))

    # every input has a fill of the "normal" kind the GPU test uses, none of them zeros
    fills = job.fill_of("normal")
    for b in geo.ins:
        assert b.name in fills and not (fills[b.name].std == 0 and fills[b.name].mean == 0), b.name


def test_prefill_cells_and_points_are_the_timed_ones():
    assert [(c.dim("B"), c.dim("T"), c.dim("H")) for c in PREFILL] == [(1, 8192, 32), (4, 4096, 32), (8, 2048, 16),
                                                                        (1, 32768, 16)]
    assert {"chunk": 32, "warps": 4, "stages": 3, "prep_threads": 128} in POINTS and {"chunk": 32, "warps": 1} in POINTS
    assert {} in POINTS


PREP_US = 7.0


@pytest.mark.parametrize("params", POINTS, ids=point_id)
def test_time_launches_on_the_fake_device(params):
    """The GPU test's timing routine with the template's two launches emulated in numpy (the emulated
    recur asserts its grid is V // (16 warps)): prep timed alone at its fake cost, recur at its own, the
    pair at the sum; outputs right before and after timing; every sample behind an L2 flush and a hold."""
    from tests.unit.test_kda_chunk import emulated_kernels
    from tests.unit.test_kda_recurrent import KdaFakeDevice

    c = cell(DType.BF16, 2, 70, 2)
    g, job = plan_job(c, params)
    kernels = emulated_kernels(c, g.params_dict())
    emulated_prep = kernels["kda_chunk_prep"]

    def prep(dev, args):
        emulated_prep(dev, args)
        dev.clock += PREP_US

    kernels["kda_chunk_prep"] = prep
    dev = KdaFakeDevice(kernels)
    row = time_launches(dev, "cand", "ref", kda_device, job, reps=4, warmup=1)
    recur_us = SPEC.bytes_moved(cell(DType.BF16, 2, 70, 1, hv=2)) / 3e6  # the emulated recur's cost (H = 1 there)
    assert [ln["kernel"] for ln in row["launches"]] == list(KERNELS)
    assert row["launches"][0]["median_us"] == pytest.approx(PREP_US)
    assert row["launches"][1]["median_us"] == pytest.approx(recur_us)
    assert row["total_us"] == pytest.approx(PREP_US + recur_us) == pytest.approx(row["sum_us"])
    assert [tuple(ln["grid"]) for ln in row["launches"]] == [lj.grid for lj in job.launches]
    assert dev.resets == 3 * (4 + 1) and len(dev.holds) == dev.resets
    # one checked pair, then (alone, alone, together) per sample
    assert dev.launches == 2 + 4 * (4 + 1)
    check_row({"cell": c.label(), "point": point_id(params), **row})


def test_a_launch_wrong_alone_fails_the_check_after_timing():
    """A recur that corrupts its workspace when launched again (stale across the timing loop) is caught."""
    from tests.unit.test_kda_chunk import emulated_kernels
    from tests.unit.test_kda_recurrent import KdaFakeDevice

    c = cell(DType.BF16, 2, 70, 2)
    g, job = plan_job(c, {"chunk": 32, "warps": 1})
    kernels = emulated_kernels(c, g.params_dict())
    emulated_recur = kernels["kda_chunk_recur"]

    def recur(dev, args):
        emulated_recur(dev, args)
        dev.clock += 1.0
        dev.view(args[4][1], "float32", 16)[:] = np.float32(1e3)  # ws_u scribbled

    kernels["kda_chunk_recur"] = recur
    dev = KdaFakeDevice(kernels)
    with pytest.raises(AssertionError, match="after timing"):
        time_launches(dev, "cand", "ref", kda_device, job, reps=2, warmup=1)


@pytest.mark.parametrize("row, why", [
    ({"launches": [{"kernel": "kda_chunk_prep", "median_us": 0.0}, {"kernel": "kda_chunk_recur", "median_us": 5.0}],
      "sum_us": 5.0, "total_us": 5.0}, "> 0"),
    ({"launches": [{"kernel": "kda_chunk_prep", "median_us": float("nan")},
                   {"kernel": "kda_chunk_recur", "median_us": 5.0}], "sum_us": float("nan"), "total_us": 5.0}, "finite"),
    ({"launches": [{"kernel": "kda_chunk_prep", "median_us": 5.0}, {"kernel": "kda_chunk_recur", "median_us": 5.0}],
      "sum_us": 10.0, "total_us": 7.0}, "25%"),
    ({"launches": [{"kernel": "kda_chunk_recur", "median_us": 5.0}], "sum_us": 5.0, "total_us": 5.0}, "two"),
])
def test_check_row_refuses_bad_rows(row, why):
    with pytest.raises(AssertionError):
        check_row(row)


def test_check_row_accepts_a_good_row():
    check_row({"launches": [{"kernel": "kda_chunk_prep", "median_us": 300.0},
                            {"kernel": "kda_chunk_recur", "median_us": 1800.0}], "sum_us": 2100.0, "total_us": 2000.0})


def test_run_launches_runs_rounds_after_the_checked_one_and_checks_after():
    """What `kfactory profile run` runs under ncu: the checked pair, then `times` rounds of the plan's launches
    (L2 flushed before each, nothing timed), the outputs checked again after; a launch that is right only
    on its first call fails."""
    from evo.measure.launches import run_launches
    from tests.unit.test_kda_chunk import emulated_kernels
    from tests.unit.test_kda_recurrent import KdaFakeDevice

    c = cell(DType.BF16, 2, 70, 2)
    g, job = plan_job(c, {"chunk": 32, "warps": 1})
    dev = KdaFakeDevice(emulated_kernels(c, g.params_dict()))
    geo = run_launches(dev, "cand", "ref", kda_device, job, times=3)
    assert [x["kernel"] for x in geo] == list(KERNELS) and [tuple(x["grid"]) for x in geo] == [lj.grid for lj in job.launches]
    assert dev.launches == 2 + 3 * 2 and dev.resets == 3 and not dev.holds

    kernels = emulated_kernels(c, g.params_dict())
    emulated_recur = kernels["kda_chunk_recur"]

    calls = []

    def recur(d, args):
        emulated_recur(d, args)
        calls.append(1)
        if len(calls) > 1:
            d.view(args[8][1], "float32", 16)[:] = np.float32(1e3)  # final_state wrong after the first call

    kernels["kda_chunk_recur"] = recur
    with pytest.raises(AssertionError, match="after timing"):
        run_launches(KdaFakeDevice(kernels), "cand", "ref", kda_device, job, times=2)
    assert len(calls) == 3
