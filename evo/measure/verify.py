"""Turn what the worker measured into an Outcome: a Status, with a readable wrong-answer pattern.

Pure functions over JobResult records, so every rule is unit-tested without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.measure.gate import failed
from evo.measure.jobs import CheckStats, EvalJob, JobResult
from evo.measure.run import CRASH, TIMEOUT
from evo.core.spec import Cell

# A time implying more than (1 + this) x the copy ceiling measured in the same process is SUSPECT.
SUSPECT_MARGIN = 0.05
# A graph replay's median launch under this share of the same kernel's launches outside a graph is SUSPECT: a
# replay saves a launch's host and scheduling overhead (an honest kernel of ~2 us keeps more than half its direct
# time), not its work; a first launch doing every set's work while the others return keeps 1 / sets of it.
GRAPH_FLOOR = 1 / 3


def pattern(c: CheckStats) -> str:
    """A short name for how an output is wrong (used to cluster failures)."""
    if c.canary_bad:
        return "wrote outside output"
    if c.nonfinite == c.numel:
        return "all unwritten or NaN"
    if c.nonfinite:
        # the last-row/tail counts include finite wrong values: name a place only when every bad is NaN
        if c.bad != c.nonfinite:
            return "some unwritten or NaN"
        if c.bad_last_row == c.nonfinite:
            return "last row unwritten or NaN"
        if c.bad_tail_cols == c.nonfinite:
            return "tail elements unwritten or NaN"
        return "some unwritten or NaN"
    if c.bad == c.numel or c.bad >= 0.9 * c.numel:
        return "all wrong"
    if c.bad and c.bad == c.bad_last_row:
        return "last row wrong"
    if c.bad and c.bad == c.bad_tail_cols:
        return "tail elements wrong"
    if c.bad:
        return "some elements wrong"
    return "error norm too large"


def replay_note(job: EvalJob) -> str:
    """'secret 0x...; checked on ...': what the job drew, so its run can be replayed ('' when it drew nothing)."""
    if not job.secret:
        return ""
    labels = [gc.label for gc in (*job.gate, *job.loop)]
    return f"secret {job.secret:#x}; checked on: " + ("; ".join(labels) or "the cell alone")


def with_replay(o: Outcome, note: str) -> Outcome:
    """The outcome with its job's replay note; a failure's error text carries it too (the store keeps that)."""
    if not note:
        return o
    return replace(o, replay=note, error=f"{o.error}\nreplay: {note}" if o.status is not Status.OK else o.error)


def judge(result: JobResult, rel_norms: Mapping[str, float], genome: Genome, cell: Cell, build_key: str = "",
          margin: float = SUSPECT_MARGIN) -> Outcome:
    """The Outcome of one (candidate, cell) evaluation.

    In order: the worker's own errors; an input a launch changed (INPUT_MODIFIED); a plan that only works on an
    idle, whole GPU (INVALID: it did not finish beside a kernel holding most SMs); any failed check
    (WRONG_ANSWER); a median implying more than the copy ceiling plus `margin`, or a graph replay's median
    launch under GRAPH_FLOOR of its launches outside the graph (SUSPECT, its time kept only in the message,
    so it is never ranked); else OK.
    """

    def verdict(status: Status, error: str = "", how: str = "", **measured: Any) -> Outcome:
        return Outcome(genome, cell, status, build_key, error, how, **measured)

    if result.error_kind == TIMEOUT:
        return verdict(Status.TIMEOUT, result.error)
    if result.error_kind == CRASH:
        return verdict(Status.CRASH, result.error)
    if result.error_kind:
        return verdict(Status.LAUNCH_ERROR, result.error)
    if result.input_faults:
        return verdict(Status.INPUT_MODIFIED, "; ".join(result.input_faults[:3]), "input modified")
    if result.invalid:
        return verdict(Status.INVALID, result.invalid, "needs an idle, whole GPU")
    if result.wrong:
        return verdict(Status.WRONG_ANSWER, result.wrong, "acausal")
    if not result.checks:
        return verdict(Status.CRASH, "worker returned no checks")
    worst_abs, worst_rel = 0.0, 0.0
    for where, stats in result.checks:
        for c in stats:
            worst_abs = max(worst_abs, c.max_abs_err)
            worst_rel = max(worst_rel, c.rel_norm_err)
            if failed(c, rel_norms[c.output]):
                p = pattern(c)
                msg = (f"{c.output} on {where}: {p} ({c.bad} bad, {c.nonfinite} non-finite, {c.canary_bad} canary bytes"
                       f" of {c.numel}; first bad index {c.first_bad}; max abs err {c.max_abs_err:.3g};"
                       f" rel norm {c.rel_norm_err:.3g})")
                return verdict(Status.WRONG_ANSWER, msg, p, max_abs_err=c.max_abs_err, rel_norm_err=c.rel_norm_err)
    if not result.times_us:
        return verdict(Status.OK, max_abs_err=worst_abs, rel_norm_err=worst_rel)
    p10, p50, p90 = np.percentile(result.times_us, [10, 50, 90])
    base = float(np.median(result.baseline_us)) if result.baseline_us else math.inf
    limit = result.ceiling_gbps * (1.0 + margin)
    gbps = result.bytes_moved / (p50 * 1e3) if p50 > 0 else math.inf
    if result.bytes_moved and result.ceiling_gbps > 0 and gbps > limit:
        return verdict(Status.SUSPECT, f"median {p50:.3f} us implies {gbps:.0f} GB/s, above {1 + margin:.2f} x the copy "
                       f"ceiling {result.ceiling_gbps:.0f} GB/s measured in the same process; never ranked",
                       "faster than the copy ceiling", baseline_us=base, max_abs_err=worst_abs, rel_norm_err=worst_rel)
    direct = float(np.median(result.direct_us)) if result.direct_us else math.inf
    if result.graph and p50 < GRAPH_FLOOR * direct:
        return verdict(Status.SUSPECT, f"median {p50:.3f} us a launch in a graph replay is under {GRAPH_FLOOR:.2f} x "
                       f"its {direct:.3f} us a launch outside one: the replay's launches are not independent; "
                       "never ranked", "graph far below direct", baseline_us=base, max_abs_err=worst_abs,
                       rel_norm_err=worst_rel)
    peers = tuple((name, float(np.median(t))) for name, t in result.peers if t)
    return verdict(Status.OK, median_us=float(p50), p10_us=float(p10), p90_us=float(p90),
                   samples=len(result.times_us), baseline_us=base, baseline=result.baseline_name, peers=peers,
                   absent=result.absent, peers_checked=result.peers_checked, graph=result.graph, max_abs_err=worst_abs,
                   rel_norm_err=worst_rel)
