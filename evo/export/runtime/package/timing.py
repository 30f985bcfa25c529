"""The exported benchmarks' timer: CUDA events around each call, the L2 flushed before each by reading
256 MiB (clean lines only: no write-back of the flush's own lines falls in the timed call, as the factory's
gate does by default), the functions taking turns in both orders (every family's bench.py uses it).

`split_us` divides a call's time into the GPU's and the host's: the same loop with the stream held busy (a
sleep kernel after the flush) while the host issues the call, so the events bracket the call's kernels only,
and the host's own time per call (perf_counter around it). A call's events time (samples_us) is about the
larger of its GPU time and its host time before its first kernel, plus the rest."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

_FLUSH_BYTES = 256 << 20
HOLD_CYCLES = 4_000_000  # ~2 ms at the H200's 1.98 GHz: longer than any call's host work before its last launch


def samples_us(fns: list[Callable[[], object]], n: int, warmup: int = 10) -> list[list[float]]:
    """n CUDA-event timings per function, L2 flushed before each, the functions taking turns in both orders."""
    return _loop(fns, n, warmup, hold=False)[0]


def split_us(fns: list[Callable[[], object]], n: int, warmup: int = 3) -> tuple[list[list[float]], list[list[float]]]:
    """(GPU times, host times) per function, n samples each in us: CUDA events around each call with the stream
    held busy while the host issues it (the GPU's share), and perf_counter around the call (the host's)."""
    return _loop(fns, n, warmup, hold=True)


def _loop(fns: list[Callable[[], object]], n: int, warmup: int, hold: bool) -> tuple[list[list[float]],
                                                                                    list[list[float]]]:
    flush = torch.ones(_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    for fn in fns:
        for _ in range(warmup):
            fn()
    gpu: list[list[float]] = [[] for _ in fns]
    host: list[list[float]] = [[] for _ in fns]
    for i in range(n):
        order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
        for j in order:
            flush.sum()  # reads every line: the L2 left holding clean lines of `flush` only
            if hold:
                torch.cuda._sleep(HOLD_CYCLES)  # the stream busy while the host issues the call
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fns[j]()
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            gpu[j].append(start.elapsed_time(end) * 1e3)
            host[j].append((t1 - t0) * 1e6)
    return gpu, host


def kernel_and_call_us(fns: list[Callable[[], object]], n: int, warmup: int = 5) -> tuple[list[list[float]],
                                                                                        list[list[float]],
                                                                                        list[list[float]]]:
    """(kernel times, call times, host times) per function, n samples of each in us, taken sample by sample: in sample
    i every function is timed once each way, the first of them rotating with i. Kernel time: CUDA events with the
    stream held busy while the host issues the call (host time hidden, as the factory's gate times); host time:
    perf_counter around that same call, what issuing it costs the host (its Python and its launches). Call time: the
    GPU idle (synchronized after the flush) when the call starts, so the events span the host's issue and the GPU's
    work: what a Python caller waits. The L2 is flushed before every sample."""
    flush = torch.ones(_FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    for fn in fns:
        for _ in range(warmup):
            fn()
    kernel: list[list[float]] = [[] for _ in fns]
    call: list[list[float]] = [[] for _ in fns]
    host: list[list[float]] = [[] for _ in fns]
    k = len(fns)
    for i in range(n):
        for j in [(i + r) % k for r in range(k)]:
            gpu_us, host_us = _once(fns[j], flush, hold=True)
            kernel[j].append(gpu_us)
            host[j].append(host_us)
            call[j].append(_once(fns[j], flush, hold=False)[0])
    return kernel, call, host


def _once(fn: Callable[[], object], flush: "torch.Tensor", hold: bool) -> tuple[float, float]:
    """(the events' time, the host's time around the call) of one sample, in us."""
    flush.sum()
    if hold:
        torch.cuda._sleep(HOLD_CYCLES)
    else:
        torch.cuda.synchronize()  # the GPU idle when the call starts
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3, (t1 - t0) * 1e6
