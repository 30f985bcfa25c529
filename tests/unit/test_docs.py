"""The README stays a user's page: at most 300 lines, every link it makes resolves, and its test command is the
one CI runs, verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 300
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and [p for p in links if not (ROOT / p).exists()] == []


def test_the_readme_test_command_is_the_one_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python -m pytest")]
    assert len(ci) == 1 and f"\n{ci[0]}\n" in README
