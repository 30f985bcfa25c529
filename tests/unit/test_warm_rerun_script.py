"""The warm-rerun benchmark's bookkeeping (the committed numbers come from this code)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("warm_rerun", ROOT / "experiments" / "scripts" / "warm_rerun.py")
assert _spec and _spec.loader
W = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(W)


def test_compare_flags_cells_that_got_worse_or_went_missing() -> None:
    out = W.compare({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 2.5, "d": 4.0})
    assert out["cells_worse_after"] == ["b", "c"] and out["cells_better_after"] == []
    assert out["per_cell"]["d"] == {"before_us": None, "after_us": 4.0} and out["cells"] == 4
    assert W.compare({"a": 2.0}, {"a": 1.0})["cells_better_after"] == ["a"]


def test_summary_line_is_read_from_a_run() -> None:
    lines = ("evaluations: 5009: 510 measured, 4499 reused from earlier runs' measurements (same fingerprint class); "
             "by status: 4000 OK, 1009 UNKNOWN\nbuilds: 1584 used: 0 compiled in this run, 1584 reused from the store")
    m = W._SUMMARY.search("x\n" + lines + "\ny")
    assert (m["measured"], m["reused"], m["compiled"], m["builds_reused"]) == ("510", "4499", "0", "1584")

