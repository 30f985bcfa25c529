"""Shared fixtures; GPU tests skip loudly when no NVIDIA GPU is visible."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@functools.lru_cache(maxsize=1)
def _has_gpu() -> bool:
    from evo.measure.run import gpu_available

    return gpu_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [i for i in items if i.get_closest_marker("gpu")]
    for item in gpu_items:  # under pytest-xdist (--dist loadgroup) every GPU test runs in one worker: one at a time
        item.add_marker(pytest.mark.xdist_group("gpu"))
    if gpu_items and not _has_gpu():
        skip = pytest.mark.skip(reason="SKIPPED: needs an NVIDIA GPU (none visible: no driver or no device)")
        for item in gpu_items:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "NVIDIA GPU" in str(r.longrepr)]
    if skipped:
        terminalreporter.write_line(f"WARNING: {len(skipped)} GPU test(s) skipped: no NVIDIA GPU on this machine",
                                    yellow=True, bold=True)
