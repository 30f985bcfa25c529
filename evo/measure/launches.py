"""A template's launches one by one, outside the search: the plan the gate would run (make_job: grids,
blocks, smem, workspaces, bound args) on one input set of the gate's own making, each launch timed alone
and all together, or simply run for a profiler. Everything but the loop is the gate's code (Geometry,
InputSet, the op's fills, never zeros), and the outputs are checked against the float64 device reference
before and after, so a launch that is wrong alone, or a workspace the loop left stale, fails loudly.

Used by tests/gpu/test_kda_launch_times.py (which KDA launch dominates, and what running the recurrence beside
the prep could save) and `kfactory profile` (evo/tools/profile/: Nsight Compute over the same launches)."""

from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np

from evo.core.genome import Genome
from evo.core.spec import Cell, OpSpec

class _NoBuild:
    """A stand-in for a BuildResult where only the plan is wanted (make_job reads only `.cubin`)."""

    cubin = b""


def plan_job(op: OpSpec, template: str, c: Cell, params: dict, arch: int, build: Any = None,
             seed: int = 17, tdef: Any = None) -> tuple[Genome, Any]:
    """(genome, EvalJob) of `template` at `params` (over its defaults) on cell c, as the gate gets it from
    make_job: the launches resolved, the workspaces declared, the args bound; no gate cells, no timing.
    `build` only supplies the cubin; `tdef`, a TemplateDef in place of today's file (an A/B of two texts).
    Raises ValueError naming the violated constraints of an illegal point."""
    from evo.measure.evaluate import make_job
    from evo.templates.template import load_templates

    tdef = tdef or load_templates(op.name)[template]
    g = Genome.make(op.name, template, tdef.source_hash, tdef.default_params() | params)
    bad = tdef.violations(g.params_dict(), arch, c.dtypes_dict(), c.dims_dict())
    if bad:
        raise ValueError(f"{op.name}/{template} at {params} on {c.label()}: {bad}")
    job = make_job(op, tdef, g, build or _NoBuild(), c, arch, seed=seed, timing=None, baseline=False,
                   stress_launches=1)
    return g, job


def _stats(xs: list[float]) -> dict[str, float]:
    p10, p50, p90 = (float(v) for v in np.percentile(xs, [10, 50, 90]))
    return {"median_us": p50, "p10_us": p10, "p90_us": p90, "min_us": float(min(xs))}


def _with_set(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, kind: str, seed: int,
              body: Callable[[Any, list], Any]) -> Any:
    """body(geometry, [(launch, bound args)]) on one checked input set; the outputs checked again after."""
    from evo.measure.gate import Failed, Gate, Geometry

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
        out = body(geo, [(lj, gate._bind(lj.args, bufs)) for lj in geo.launches])
        dev.sync("launches")
        try:
            gate._check(geo, [(s, "after timing")])
            gate._integrity(geo, [s], "after timing")
        except Failed:
            raise AssertionError(f"wrong after timing: {gate.faults} {gate.checks[-2:]}") from None
        return out
    finally:
        gate.close()


ORDERS = ("declared", "side_first")


def side_first(bound: list) -> list:
    """A plan's bound launches with each side launch moved up to just after the main launch it forks after: the
    host then issues it before the main launches declared between (its CTAs queued before theirs), where the
    declared order issues it last. The streams, marks and joins are launch_plan's either way. Raises ValueError
    for a side launch whose fork_after names no main launch before it."""
    out: list = []
    for item in bound:
        lj = item[0]
        if lj.stream != "side":
            out.append(item)
            continue
        at = [i for i, (m, _) in enumerate(out) if m.stream != "side" and m.kernel == lj.fork_after]
        if not at:
            raise ValueError(f"side launch {lj.kernel} forks after {lj.fork_after!r}, which no main launch before "
                             "it ran")
        i = at[-1] + 1
        while i < len(out) and out[i][0].stream == "side":  # after the side launches already moved there
            i += 1
        out.insert(i, item)
    return out


def time_launches(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, reps: int, warmup: int,
                  kind: str = "normal", seed: int = 0, order: str = "declared") -> dict[str, Any]:
    """Each launch of the job's plan timed alone, then all together (L2 flushed and the stream held busy
    before every sample, so the host's launch work falls outside the events): the medians and spreads in
    us, and each launch's geometry. `order` is the host's order of the launches together: "declared" (the
    gate's), or "side_first" (side_first). Raises AssertionError with the gate's checks when the outputs are
    wrong before or after timing."""
    from evo.measure.gate import HOLD_US, launch_plan

    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")

    def body(geo: Any, bound: list) -> list:
        def one(lj: Any, args: tuple):
            return lambda i: dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args)

        singles = [one(lj, args) for lj, args in bound]

        plan = side_first(bound) if order == "side_first" else bound

        def together(i: int) -> None:  # the plan as the gate launches it (side launches beside)
            launch_plan(dev, obj, plan)

        def prep(i: int) -> None:  # cold L2; the stream busy while the host launches what is timed
            dev.reset_l2()
            dev.hold(HOLD_US)

        fns = [*singles, together]
        preps = [prep] * len(fns)
        dev.time(fns, preps, warmup, 1, lambda i: None)
        return bound, dev.time(fns, preps, reps, 1, lambda i: None)

    bound, samples = _with_set(dev, obj, ref_obj, ref_mod, job, kind, seed, body)
    launches = [{"kernel": lj.kernel, "grid": list(lj.grid), "block": list(lj.block), "smem": lj.smem,
                 "ctas": lj.grid[0] * lj.grid[1] * lj.grid[2], "pdl": lj.pdl, **_stats(xs)}
                for (lj, _), xs in zip(bound, samples)]  # pdl as declared; a launch alone is launched without it
    tog = _stats(samples[-1])
    return {"launches": launches, "together": tog, "sum_us": sum(ln["median_us"] for ln in launches),
            "total_us": tog["median_us"], "reps": reps, "kind": kind, "order": order,
            "workspace_bytes": sum(b.numel for b in job_workspaces(job))}


def overlap_fns(dev: Any, obj: Any, bound: list) -> tuple[Callable[[int], None], Callable[[int], None]]:
    """(sequential, overlapped) callables over a plan's bound launches: sequential launches them in order on the
    device's stream; overlapped starts the last launch first on the device's side stream (at the device's
    greatest priority, Worker.side_stream), after what the device's stream held before (the hold), then the
    others on the device's stream, and joins the two, so one pair of events on the device's stream brackets
    either."""
    *firsts, last = bound

    def sequential(i: int) -> None:
        for lj, args in bound:
            dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args)

    def overlapped(i: int) -> None:
        dev.fork(dev.mark())
        lj, args = last
        dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args, side=True)
        for lj, args in firsts:
            dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args)
        dev.join()

    return sequential, overlapped


def time_overlap(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, reps: int, warmup: int,
                 kind: str = "normal", seed: int = 0) -> dict[str, Any]:
    """What running a plan's last launch beside the others could save, at most: each launch alone, the plan in
    order, and the plan with its last launch started first on a second stream (overlap_fns), each sample after
    an L2 flush and a hold. Overlapped, the last launch reads a workspace the first launches are rewriting
    unsynchronized; they write the same bits every sample (the same inputs), so what it reads is right, and the
    outputs are checked after timing, but a real overlapped plan must make it wait for each piece it reads:
    this bounds what such a plan can reach. Raises AssertionError when the outputs are wrong before or after."""
    from evo.measure.gate import HOLD_US

    def body(geo: Any, bound: list) -> list:
        singles = [(lambda lj, args: lambda i: dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args))(lj, a)
                   for lj, a in bound]

        def prep(i: int) -> None:
            dev.reset_l2()
            dev.hold(HOLD_US)

        fns = [*singles, *overlap_fns(dev, obj, bound)]
        dev.time(fns, [prep] * len(fns), warmup, 1, lambda i: None)
        return bound, dev.time(fns, [prep] * len(fns), reps, 1, lambda i: None)

    bound, samples = _with_set(dev, obj, ref_obj, ref_mod, job, kind, seed, body)
    launches = [{"kernel": lj.kernel, "grid": list(lj.grid), "block": list(lj.block), "smem": lj.smem,
                 "ctas": lj.grid[0] * lj.grid[1] * lj.grid[2], **_stats(xs)}
                for (lj, _), xs in zip(bound, samples)]
    return {"launches": launches, "sequential": _stats(samples[-2]), "overlapped": _stats(samples[-1]),
            "reps": reps, "kind": kind}


def run_launches(dev: Any, obj: Any, ref_obj: Any, ref_mod: Any, job: Any, times: int, kind: str = "normal",
                 seed: int = 0) -> list[dict[str, Any]]:
    """The job's launches `times` times in order on one checked input set, L2 flushed before each round,
    nothing timed (for a profiler that replays each kernel itself); the launches' geometry."""
    from evo.measure.gate import launch_plan

    def body(geo: Any, bound: list) -> list:
        for _ in range(times):
            dev.reset_l2()
            launch_plan(dev, obj, bound)
        return bound

    bound = _with_set(dev, obj, ref_obj, ref_mod, job, kind, seed, body)
    return [{"kernel": lj.kernel, "grid": list(lj.grid), "block": list(lj.block), "smem": lj.smem} for lj, _ in bound]


def job_workspaces(job: Any) -> list:
    from evo.measure.gate import Geometry

    return list(Geometry("", dict(job.dims), job.buffers, job.launches, dict(job.scalars)).ws)
