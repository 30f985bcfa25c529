"""NVRTC builds shared by the template tests of one pytest process: a point compiled by one test (the default point,
an option's baseline built beside it) is not compiled again by the next. NVRTC's output is a function of the build
input (its key hashes the genome, arch, dtypes, dims, compiler, flags and rendered source), and a BuildResult is
frozen, so a repeated build gives the same object."""

from __future__ import annotations

import os
import threading

from evo.build.nvrtc import BuildInput, BuildResult, compile_one

_DONE: dict[tuple, BuildResult] = {}
_LOCK = threading.Lock()


def compile_memo(bi: BuildInput) -> BuildResult:
    """compile_one(bi), once per build input in this process (two threads asking at once may both compile)."""
    key = (bi.key(), bi.kernels, bi.threads, bi.kernel_threads, bi.render_error)
    with _LOCK:
        hit = _DONE.get(key)
    if hit is None:
        hit = compile_one(bi)
        with _LOCK:
            hit = _DONE.setdefault(key, hit)
    return hit


def compile_threads() -> int:
    """Threads a test may compile on at once: this machine's cores shared among the pytest-xdist workers (NVRTC
    releases the GIL, so each thread is a core; more than the share only oversubscribes the machine)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, (os.cpu_count() or 1) // workers)
