"""A run's build summary per template: each template's counts, its first distinct errors verbatim (a few), failing
templates first, and the templates past the listed ones in one line."""

from __future__ import annotations

from evo.build.nvrtc import BuildResult
from evo.core.status import Status
from evo.loop import build_summary
from evo.loop.build_summary import BuildSummary


def _r(key: str, status: Status = Status.OK, error: str = "") -> BuildResult:
    return BuildResult(key, status, error=error)


def test_each_template_gets_its_counts_and_its_first_distinct_errors() -> None:
    ce = Status.COMPILE_ERROR
    s = BuildSummary().add([("a", _r("k1")), ("b", _r("k2", ce, "e1")), ("b", _r("k3", ce, "e1")),
                            ("b", _r("k4", ce, "e2")), ("b", _r("k5", ce, "e3")), ("b", _r("k2", ce, "e1"))])
    assert s.lines() == ["builds: 5 distinct: 4 COMPILE_ERROR, 1 OK",
                         "  template b: 4 COMPILE_ERROR", "    COMPILE_ERROR: e1", "    COMPILE_ERROR: e2",
                         "  template a: 1 OK"]


def test_templates_past_the_listed_ones_share_one_line(monkeypatch) -> None:
    monkeypatch.setattr(build_summary, "SHOWN_TEMPLATES", 1)
    s = BuildSummary().add([("a", _r("k1")), ("b", _r("k2")), ("c", _r("k3", Status.RENDER_ERROR, "bad"))])
    assert s.lines()[1:] == ["  template c: 1 RENDER_ERROR", "    RENDER_ERROR: bad",
                             "  ... 2 more templates: 2 OK"]
