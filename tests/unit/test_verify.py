"""verify.judge / pattern / failed on hand-built worker records: every Status branch, no GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evo.core.genome import Genome
from evo.core.outcome import Outcome
from evo.core.status import Status
from evo.measure import verify
from evo.measure.jobs import CheckStats, JobResult
from evo.measure.run import CRASH, TIMEOUT
from evo.measure.verify import failed, pattern
from ops.rmsnorm.spec import cell

N = 1024  # 8 rows of 128
REL = {"y": 1e-3, "s": 1e-3}
G = Genome.make("rmsnorm", "t", "h", {"vec": 4})
CELL = cell("bf16", 8, 128)


def judge(r: JobResult, rel: dict[str, float], **kw: float) -> Outcome:
    """verify.judge for one fixed genome and cell (the Outcome carries them)."""
    return verify.judge(r, rel, G, CELL, "b1", **kw)


def stats(output: str = "y", **kw: float) -> CheckStats:
    """A passing CheckStats for a 1024-element output, with the given fields overridden."""
    base = dict(output=output, numel=N, nonfinite=0, bad=0, bad_last_row=0, bad_tail_cols=0, first_bad=-1,
                max_abs_err=1e-4, rel_norm_err=1e-5, canary_bad=0)
    base.update(kw)
    return CheckStats(**base)


def result(*checks: tuple[str, tuple[CheckStats, ...]], **kw: object) -> JobResult:
    return JobResult("j0", checks=tuple(checks), **kw)


def three_sets(bad: CheckStats | None = None, at: int = 1) -> JobResult:
    """Checks on input sets 0..2 (one output each), with `bad` replacing the check of set `at`."""
    return result(*((f"input set {i}", (bad if (bad is not None and i == at) else stats(),)) for i in range(3)))


# --- failed() -------------------------------------------------------------------------------------

@pytest.mark.parametrize("c, want", [
    (stats(), False),
    (stats(rel_norm_err=1e-3), False),  # the bound itself passes (<=)
    (stats(bad=1, bad_last_row=0, first_bad=5), True),
    (stats(nonfinite=1, bad=0), True),  # NaN fails even when nothing is counted 'bad'
    (stats(canary_bad=1), True),
    (stats(rel_norm_err=2e-3), True),
    (stats(rel_norm_err=math.nan), True),
    (stats(rel_norm_err=math.inf), True),
], ids=["clean", "norm-at-bound", "one-bad", "nan-zero-bad", "canary", "norm-over", "norm-nan", "norm-inf"])
def test_failed(c: CheckStats, want: bool) -> None:
    assert failed(c, 1e-3) is want


# --- pattern() ------------------------------------------------------------------------------------

@pytest.mark.parametrize("c, want", [
    (stats(canary_bad=3, nonfinite=N, bad=N), "wrote outside output"),  # canary wins over everything
    (stats(nonfinite=N, bad=N, bad_last_row=128, bad_tail_cols=64), "all unwritten or NaN"),
    (stats(nonfinite=128, bad=128, bad_last_row=128, bad_tail_cols=8), "last row unwritten or NaN"),
    (stats(nonfinite=64, bad=64, bad_last_row=8, bad_tail_cols=64), "tail elements unwritten or NaN"),
    (stats(nonfinite=5, bad=5, bad_last_row=1, bad_tail_cols=2), "some unwritten or NaN"),
    (stats(nonfinite=1, bad=0), "some unwritten or NaN"),
    (stats(bad=N, bad_last_row=128, bad_tail_cols=64), "all wrong"),
    (stats(bad=int(0.9 * N) + 1), "all wrong"),
    (stats(bad=128, bad_last_row=128, bad_tail_cols=8), "last row wrong"),
    (stats(bad=64, bad_last_row=8, bad_tail_cols=64), "tail elements wrong"),
    (stats(bad=10, bad_last_row=2, bad_tail_cols=3), "some elements wrong"),
    (stats(rel_norm_err=0.5), "error norm too large"),
], ids=["canary", "all-nan", "nan-last-row", "nan-tail", "nan-some", "nan-zero-bad", "all-bad", "90pct-bad",
        "bad-last-row", "bad-tail", "bad-some", "norm-only"])
def test_pattern(c: CheckStats, want: str) -> None:
    assert pattern(c) == want


# --- judge(): error kinds -------------------------------------------------------------------------

def test_timeout() -> None:
    v = judge(JobResult("j0", TIMEOUT, "no answer within 2.0 s"), REL)
    assert v.status is Status.TIMEOUT and v.error == "no answer within 2.0 s"
    assert v.median_us == math.inf and v.samples == 0


def test_crash() -> None:
    v = judge(JobResult("j0", CRASH, "worker died (exit code -9)"), REL)
    assert v.status is Status.CRASH and "exit code -9" in v.error
    assert v.median_us == math.inf


@pytest.mark.parametrize("kind", ["launch", "resource"])
def test_launch_error(kind: str) -> None:
    v = judge(JobResult("j0", kind, "CUDA_ERROR_INVALID_VALUE"), REL)
    assert v.status is Status.LAUNCH_ERROR and v.error == "CUDA_ERROR_INVALID_VALUE"
    assert v.median_us == math.inf


def test_error_kind_wins_over_checks_and_times() -> None:
    v = judge(result(("input set 0", (stats(),)), error_kind="launch", error="refused", times_us=(1.0, 2.0)), REL)
    assert v.status is Status.LAUNCH_ERROR and v.median_us == math.inf


def test_no_checks_is_crash() -> None:
    v = judge(JobResult("j0", times_us=(1.0, 2.0, 3.0)), REL)
    assert v.status is Status.CRASH and v.error == "worker returned no checks"
    assert v.median_us == math.inf


# --- judge(): wrong answers -----------------------------------------------------------------------

def test_canary_hit() -> None:
    v = judge(three_sets(stats(canary_bad=16)), REL)
    assert v.status is Status.WRONG_ANSWER
    assert v.pattern == "wrote outside output"
    assert "y on input set 1: wrote outside output" in v.error and "16 canary bytes" in v.error
    assert v.median_us == math.inf


def test_nan_with_zero_bad_never_passes() -> None:
    v = judge(result(("input set 0", (stats(nonfinite=1, bad=0, first_bad=7),)), times_us=(1.0, 2.0)), REL)
    assert v.status is Status.WRONG_ANSWER
    assert v.pattern == "some unwritten or NaN"
    assert "1 non-finite" in v.error and "first bad index 7" in v.error
    assert v.median_us == math.inf and v.samples == 0


def test_all_nan() -> None:
    v = judge(three_sets(stats(nonfinite=N, bad=N, bad_last_row=128, bad_tail_cols=64, first_bad=0,
                               max_abs_err=0.0, rel_norm_err=math.nan), at=0), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "all unwritten or NaN"
    assert "input set 0" in v.error and math.isnan(v.rel_norm_err)


def test_nan_last_row() -> None:
    v = judge(three_sets(stats(nonfinite=128, bad=128, bad_last_row=128, bad_tail_cols=16, first_bad=N - 128)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "last row unwritten or NaN"
    assert f"first bad index {N - 128}" in v.error


def test_nan_tail_cols() -> None:
    v = judge(three_sets(stats(nonfinite=64, bad=64, bad_last_row=8, bad_tail_cols=64, first_bad=120)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "tail elements unwritten or NaN"


def test_bad_tail_cols() -> None:
    v = judge(three_sets(stats(bad=64, bad_last_row=8, bad_tail_cols=64, first_bad=120, max_abs_err=0.7)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "tail elements wrong"
    assert "64 bad" in v.error and v.max_abs_err == 0.7


def test_norm_bound_with_zero_bad() -> None:
    v = judge(three_sets(stats(rel_norm_err=5e-3)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "error norm too large"
    assert "0 bad, 0 non-finite" in v.error and "rel norm 0.005" in v.error
    assert v.rel_norm_err == 5e-3


def test_norm_bound_is_per_output() -> None:
    c = (stats("y", rel_norm_err=5e-3), stats("s", rel_norm_err=5e-3))
    assert judge(result(("input set 0", c)), {"y": 1e-2, "s": 1e-2}).status is Status.OK
    v = judge(result(("input set 0", c)), {"y": 1e-2, "s": 1e-3})
    assert v.status is Status.WRONG_ANSWER and v.error.startswith("s on input set 0")


def test_rel_norm_nan_fails() -> None:
    v = judge(three_sets(stats(rel_norm_err=math.nan)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "error norm too large"
    assert math.isnan(v.rel_norm_err)


def test_last_timed_launch() -> None:
    good = tuple((f"input set {i}", (stats(),)) for i in range(3))
    v = judge(result(*good, ("last timed launch", (stats(bad=3, first_bad=9),)), times_us=(1.0, 2.0, 3.0)), REL)
    assert v.status is Status.WRONG_ANSWER and v.pattern == "some elements wrong"
    assert v.error.startswith("y on last timed launch: some elements wrong")
    assert v.median_us == math.inf and v.samples == 0


def test_first_failure_is_reported() -> None:
    v = judge(result(("input set 0", (stats(),)), ("input set 1", (stats(bad=N),)), ("input set 2", (stats(canary_bad=1),))), REL)
    assert v.pattern == "all wrong" and "input set 1" in v.error


# --- judge(): OK ----------------------------------------------------------------------------------

def test_ok_with_times() -> None:
    times = tuple(float(t) for t in range(1, 101))  # 1..100 us
    checks = [(f"input set {i}", (stats(max_abs_err=1e-4 * (i + 1), rel_norm_err=1e-5 * (i + 1)),)) for i in range(3)]
    checks.append(("last timed launch", (stats(max_abs_err=5e-5, rel_norm_err=2e-6),)))
    v = judge(result(*checks, times_us=times, baseline_us=(10.0, 30.0, 20.0), baseline_name="torch"), REL)
    assert v.status is Status.OK and v.error == "" and v.pattern == ""
    assert v.median_us == pytest.approx(50.5)
    assert v.p10_us == pytest.approx(float(np.percentile(times, 10)))
    assert v.p90_us == pytest.approx(float(np.percentile(times, 90)))
    assert v.p10_us < v.median_us < v.p90_us
    assert v.samples == 100
    assert v.baseline_us == 20.0
    assert v.max_abs_err == pytest.approx(3e-4) and v.rel_norm_err == pytest.approx(3e-5)


def test_ok_with_times_no_baseline() -> None:
    v = judge(result(("input set 0", (stats(),)), times_us=(4.0, 2.0, 3.0)), REL)
    assert v.status is Status.OK and v.median_us == 3.0 and v.samples == 3
    assert v.baseline_us == math.inf


def test_ok_without_times() -> None:
    v = judge(three_sets(), REL)
    assert v == Outcome(G, CELL, Status.OK, "b1", max_abs_err=1e-4, rel_norm_err=1e-5)
    assert v.median_us == math.inf and v.samples == 0


# --- judge(): inputs changed, faster than the ceiling -----------------------------------------------

def test_input_modified_wins_over_wrong_answer() -> None:
    r = result(("kind normal", (stats(bad=N),)), input_faults=("input w changed (kind normal)",))
    v = judge(r, REL)
    assert v.status is Status.INPUT_MODIFIED and "input w changed" in v.error


def test_input_modified_with_clean_outputs() -> None:
    v = judge(result(("kind normal", (stats(),)), input_faults=("private copy of input x changed (stress 1/4)",)), REL)
    assert v.status is Status.INPUT_MODIFIED and v.median_us == math.inf


@pytest.mark.parametrize("median_us, want", [(1.0, Status.SUSPECT), (1.06, Status.OK), (2.0, Status.OK)],
                         ids=["4.2x-ceiling", "just-under-margin", "half-ceiling"])
def test_suspect_above_the_copy_ceiling(median_us: float, want: Status) -> None:
    # 4.4 MB: 1.0 us is 4400 GB/s, over 1.05 x 4000; 1.06 us is 4151 GB/s, within the 5% margin.
    r = result(("kind normal", (stats(),)), times_us=(median_us,) * 3, ceiling_gbps=4000.0, bytes_moved=4_400_000)
    v = judge(r, REL)
    assert v.status is want, v
    if want is Status.SUSPECT:
        assert v.median_us == math.inf and "copy ceiling" in v.error and "4400 GB/s" in v.error
    else:
        assert v.median_us == pytest.approx(median_us)


def test_no_suspect_without_bytes_or_ceiling() -> None:
    v = judge(result(("kind normal", (stats(),)), times_us=(1e-6,), ceiling_gbps=0.0, bytes_moved=10**9), REL)
    assert v.status is Status.OK
