"""Shared fixtures; GPU tests skip loudly when no NVIDIA GPU is visible."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# BLAS on one thread a process, set before anything imports numpy: the emulations' and references' many small float64
# products run on OpenBLAS, whose threads spin against each other and against the other pytest-xdist worker on a
# machine of few cores (one emulated test: 1.7 s on one thread, 23 s on two beside a second worker). The children the
# tests start (kfactory commands, compile processes, nested pytest) inherit it. A value the caller set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    """One build cache on disk for the whole run ($KF_BUILD_CACHE, evo/build/cache.py): made by the first process
    (the xdist controller, or a lone pytest) before any worker starts, so the workers, their compile processes and
    the `kfactory` commands the tests spawn inherit it, and a build one of them made is not compiled again. A cache
    the caller set is used as it is."""
    from evo.build.cache import ENV

    if not os.environ.get(ENV):
        os.environ[ENV] = tempfile.mkdtemp(prefix="kf-test-builds-")
        config._kf_build_cache = os.environ[ENV]  # this process made it: it removes it at the end


def pytest_unconfigure(config: pytest.Config) -> None:
    made = getattr(config, "_kf_build_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        from evo.build.cache import ENV

        os.environ.pop(ENV, None)


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
