"""The exported benchmarks' timer: CUDA events around each call, the L2 flushed before each by reading
256 MiB (clean lines only: no write-back of the flush's own lines falls in the timed call, as the factory's
gate does by default), the functions taking turns in both orders (every family's bench.py uses it)."""

from __future__ import annotations

from collections.abc import Callable

import torch

_FLUSH_BYTES = 256 << 20


def samples_us(fns: list[Callable[[], object]], n: int, warmup: int = 10) -> list[list[float]]:
    """n CUDA-event timings per function, L2 flushed before each, the functions taking turns in both orders."""
    flush = torch.ones(_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    for fn in fns:
        for _ in range(warmup):
            fn()
    out: list[list[float]] = [[] for _ in fns]
    for i in range(n):
        order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
        for j in order:
            flush.sum()  # reads every line: the L2 left holding clean lines of `flush` only
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[j]()
            end.record()
            end.synchronize()
            out[j].append(start.elapsed_time(end) * 1e3)
    return out
