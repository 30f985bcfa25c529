"""The GPU machine's missing wheels are listed in one place, pinned, and cover what the search imports."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LISTED = {m.group(1).lower(): m.group(2) for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)$",
          (ROOT / "experiments" / "gpu_wheels.txt").read_text(), re.M)}


def test_every_line_is_pinned():
    lines = [ln for ln in (ROOT / "experiments" / "gpu_wheels.txt").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(lines) == len(LISTED) >= 3


def test_deap_and_its_runtime_dependencies_travel():
    """deap imports moocore (the GA cannot start without it): every non-optional requirement of both is listed."""
    for dist in ("deap", "moocore"):
        assert dist in LISTED
        for req in md.requires(dist) or []:
            if "extra ==" in req:
                continue
            name = re.split(r"[\s<>=!;\[]", req, maxsplit=1)[0].lower()
            assert name in LISTED or name == "numpy", f"{dist} needs {name}, not in gpu_wheels.txt"
    assert "duckdb" in LISTED
