"""Turn what the worker measured into a Status, with a readable wrong-answer pattern.

Pure functions over JobResult records, so every rule is unit-tested without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from evo.measure.gate import failed
from evo.measure.jobs import CheckStats, JobResult
from evo.measure.run import CRASH, TIMEOUT
from evo.core.status import Status

# A time implying more than (1 + this) x the copy ceiling measured in the same process is SUSPECT.
SUSPECT_MARGIN = 0.05


@dataclass(frozen=True)
class Verdict:
    status: Status
    error: str = ""
    pattern: str = ""
    median_us: float = math.inf
    p10_us: float = math.inf
    p90_us: float = math.inf
    samples: int = 0
    baseline_us: float = math.inf
    baseline: str = ""  # the baseline's name, as the worker's device hooks gave it
    peers: tuple[tuple[str, float], ...] = ()  # median of every baseline timed beside it, in order
    absent: tuple[tuple[str, str], ...] = ()  # baselines asked for that could not be had, and why
    graph: bool = False  # timed as a CUDA graph
    max_abs_err: float = math.nan
    rel_norm_err: float = math.nan


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


def judge(result: JobResult, rel_norms: Mapping[str, float], margin: float = SUSPECT_MARGIN) -> Verdict:
    """The Status of one (candidate, cell) evaluation.

    In order: the worker's own errors; an input a launch changed (INPUT_MODIFIED); any failed check
    (WRONG_ANSWER); a median implying more than the copy ceiling plus `margin` (SUSPECT, its time
    kept only in the message, so it is never ranked); else OK.
    """
    if result.error_kind == TIMEOUT:
        return Verdict(Status.TIMEOUT, result.error)
    if result.error_kind == CRASH:
        return Verdict(Status.CRASH, result.error)
    if result.error_kind:
        return Verdict(Status.LAUNCH_ERROR, result.error)
    if result.input_faults:
        return Verdict(Status.INPUT_MODIFIED, "; ".join(result.input_faults[:3]), "input modified")
    if not result.checks:
        return Verdict(Status.CRASH, "worker returned no checks")
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
                return Verdict(Status.WRONG_ANSWER, msg, p, max_abs_err=c.max_abs_err, rel_norm_err=c.rel_norm_err)
    if not result.times_us:
        return Verdict(Status.OK, max_abs_err=worst_abs, rel_norm_err=worst_rel)
    p10, p50, p90 = np.percentile(result.times_us, [10, 50, 90])
    base = float(np.median(result.baseline_us)) if result.baseline_us else math.inf
    limit = result.ceiling_gbps * (1.0 + margin)
    gbps = result.bytes_moved / (p50 * 1e3) if p50 > 0 else math.inf
    if result.bytes_moved and result.ceiling_gbps > 0 and gbps > limit:
        return Verdict(Status.SUSPECT, f"median {p50:.3f} us implies {gbps:.0f} GB/s, above {1 + margin:.2f} x the copy "
                       f"ceiling {result.ceiling_gbps:.0f} GB/s measured in the same process; never ranked",
                       "faster than the copy ceiling", baseline_us=base, max_abs_err=worst_abs, rel_norm_err=worst_rel)
    peers = tuple((name, float(np.median(t))) for name, t in result.peers if t)
    return Verdict(Status.OK, median_us=float(p50), p10_us=float(p10), p90_us=float(p90),
                   samples=len(result.times_us), baseline_us=base, baseline=result.baseline_name, peers=peers,
                   absent=result.absent, graph=result.graph, max_abs_err=worst_abs, rel_norm_err=worst_rel)
