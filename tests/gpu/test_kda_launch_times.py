"""On a GPU: the KDA chunk template's two launches (kda_chunk_prep, kda_chunk_recur) timed one by one, and
together, on every prefill cell at a few points of its space, to tell which launch dominates.

Everything but the timing loop is the gate's own code: `make_job` resolves the plan (TemplateDef.plan through
bind_cell: grids, blocks, smem, workspaces, bound args), the gate's Geometry/InputSet allocate the buffers,
`Gate._fill` fills the inputs with the op's FILLS ("normal" kind, device fills, never zeros), `Gate._bind`
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
import random
from typing import Any

import numpy as np
import pytest

from ops.kda import SPEC
from ops.kda.spec import prefill_matrix

TEMPLATE = "chunk"
KERNELS = ("kda_chunk_prep", "kda_chunk_recur")
POINTS = [{}, {"chunk": 32, "warps": 4, "stages": 3, "prep_threads": 128}, {"chunk": 32, "warps": 1},
          {"chunk": 32, "warps": 4, "stages": 3, "prep_threads": 128, "stage_in": True, "u_prefetch": True},
          {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True},
          {"chunk": 32, "warps": 2, "stages": 6, "stage_in": True, "u_prefetch": True, "prep_diag": "folded"}]
ARCH = 90
REPS = 50
WARMUP = 5
SUM_TOL = 0.25  # |prep + recur - together| <= SUM_TOL * together
ROWS: list[dict[str, Any]] = []


def point_id(p: dict) -> str:
    return "-".join(f"{k}{v}" for k, v in p.items()) or "default"


class _NoBuild:
    """A stand-in for a BuildResult where only the plan is wanted (make_job reads only `.cubin`)."""

    cubin = b""


def plan_job(c, params: dict, build: Any = None):
    """(genome, EvalJob) of the chunk template at `params` (over its defaults) on cell c, as the gate gets
    it from make_job: the launches resolved, the workspaces declared, the args bound. No gate cells, no
    timing (this file times by itself); `build` only supplies the cubin."""
    from evo.core.genome import Genome
    from evo.measure.evaluate import make_job
    from evo.templates.template import load_templates

    tdef = load_templates("kda")[TEMPLATE]
    g = Genome.make("kda", TEMPLATE, tdef.source_hash, tdef.default_params() | params)
    bad = tdef.violations(g.params_dict(), ARCH, c.dtypes_dict(), c.dims_dict())
    assert not bad, (c.label(), params, bad)
    job = make_job(SPEC, tdef, g, build or _NoBuild(), c, ARCH, seed=17, timing=None, baseline=False,
                   stress_launches=1)
    return g, job


def time_launches(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, reps: int = REPS, warmup: int = WARMUP,
                  kind: str = "normal", seed: int = 0) -> dict[str, Any]:
    """Each launch of the job's plan timed alone, then all together, on one input set of the gate's own
    making (filled with the op's `kind` fills): the medians and spreads in us, and each launch's geometry.
    Checks the outputs against the reference before timing and after it (a workspace the timing loop
    left stale, or a launch that is wrong alone, fails); raises AssertionError with the gate's checks."""
    from evo.measure.gate import HOLD_US, Failed, Gate, Geometry

    gate = Gate(dev, job, obj, ref_obj, ref_mod, random.Random(seed))
    geo = Geometry("", dict(job.dims), job.buffers, job.launches, dict(job.scalars))
    try:
        s = gate._new_set(geo)
        gate._fill(geo, s, kind)
        try:
            gate._launch_and_check(geo, s, f"kind {kind} before timing")
        except Failed:
            raise AssertionError(f"wrong before timing: {gate.faults} {gate.checks[-2:]}") from None
        bufs = {**s.ins, **s.outs, **s.ws}
        bound = [(lj, gate._bind(lj.args, bufs)) for lj in geo.launches]

        def one(lj: Any, args: tuple):
            return lambda i: dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args)

        singles = [one(lj, args) for lj, args in bound]

        def together(i: int) -> None:
            for f in singles:
                f(i)

        def prep(i: int) -> None:  # cold L2; the stream busy while the host launches what is timed
            dev.reset_l2()
            dev.hold(HOLD_US)

        fns = [*singles, together]
        preps = [prep] * len(fns)
        dev.time(fns, preps, warmup, 1, lambda i: None)
        samples = dev.time(fns, preps, reps, 1, lambda i: None)
        dev.sync("launch timing")
        try:
            gate._check(geo, [(s, "after timing")])
            gate._integrity(geo, [s], "after timing")
        except Failed:
            raise AssertionError(f"wrong after timing: {gate.faults} {gate.checks[-2:]}") from None
    finally:
        gate.close()

    def stats(xs: list[float]) -> dict[str, float]:
        p10, p50, p90 = (float(v) for v in np.percentile(xs, [10, 50, 90]))
        return {"median_us": p50, "p10_us": p10, "p90_us": p90, "min_us": float(min(xs))}

    launches = [{"kernel": lj.kernel, "grid": list(lj.grid), "block": list(lj.block), "smem": lj.smem,
                 "ctas": lj.grid[0] * lj.grid[1] * lj.grid[2], **stats(xs)}
                for (lj, _), xs in zip(bound, samples)]
    tog = stats(samples[-1])
    return {"launches": launches, "together": tog, "sum_us": sum(ln["median_us"] for ln in launches),
            "total_us": tog["median_us"], "reps": reps, "kind": kind,
            "workspace_bytes": sum(b.numel for b in geo.ws)}


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
