"""The host time of a Python call on a CUDA device, without letting the GPU fall behind: the median of perf_counter
around each call (a synchronize every SYNC_EVERY calls, outside the timed calls, so the launch queue never fills),
and a cProfile of as many calls, its functions by own time per call. cProfile sees the calling thread only: an
autograd backward of CUDA tensors runs on the autograd engine's device thread, so profile the backward's functions
by calling them directly. Used by experiments/scripts/kda_host_profile.py and rmsnorm_train_step.py."""

from __future__ import annotations

import cProfile
import pstats
import time
from pathlib import Path
from typing import Any

SYNC_EVERY = 20
WARMUP = 20


def host_times_us(fn: Any, calls: int, sync: Any) -> list[float]:
    """The host time of each of `calls` calls of fn, in µs, after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    sync()
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            sync()
    sync()
    return out


def profile_rows(fn: Any, calls: int, sync: Any, top: int) -> list[dict[str, Any]]:
    """cProfile over `calls` calls (the synchronizes outside it): the `top` functions by own time, per call."""
    prof = cProfile.Profile()
    for i in range(calls):
        prof.enable()
        fn()
        prof.disable()
        if i % SYNC_EVERY == SYNC_EVERY - 1:
            sync()
    sync()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(path).parent.name}/{Path(path).name}:{line}" if path != "~" else "builtin"
        rows.append({"function": func, "where": where, "calls_per_call": nc / calls,
                     "own_us_per_call": tt / calls * 1e6, "cum_us_per_call": ct / calls * 1e6})
    rows.sort(key=lambda r: -r["own_us_per_call"])
    return rows[:top]
