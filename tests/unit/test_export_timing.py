"""The exported benchmarks' timer (evo/export/runtime/package/timing.py) without torch or a GPU: a fake torch that
logs what the loop asks of the device. Every sample flushes the L2 before its start event; split_us holds the stream
busy between the flush and the start event, samples_us never does; the host time brackets the call alone; the sides
take turns in both orders."""

from __future__ import annotations

import importlib
import sys
import time
from types import SimpleNamespace

import pytest


def _fake_torch(log: list) -> SimpleNamespace:
    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = time.perf_counter()
            log.append("event")

        def synchronize(self):
            log.append("sync")

        def elapsed_time(self, end):  # ms, as torch's
            return (end.t - self.t) * 1e3

    class Flush:
        def sum(self):
            log.append("flush")

    cuda = SimpleNamespace(Event=Event, _sleep=lambda cycles: log.append(("sleep", cycles)),
                           synchronize=lambda: log.append("idle"))
    return SimpleNamespace(cuda=cuda, float32="float32", ones=lambda n, dtype, device: Flush())


@pytest.fixture
def timing(monkeypatch):
    log: list = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    monkeypatch.delitem(sys.modules, "evo.export.runtime.package.timing", raising=False)
    mod = importlib.import_module("evo.export.runtime.package.timing")
    yield mod, log
    sys.modules.pop("evo.export.runtime.package.timing", None)


def _calls(log: list, name: str):
    def fn():
        time.sleep(0.002)
        log.append(name)
    return fn


def test_split_holds_the_stream_between_the_flush_and_the_start_event(timing):
    mod, log = timing
    gpu, host = mod.split_us([_calls(log, "a"), _calls(log, "b")], n=2, warmup=1)
    timed = log[log.index("b") + 1:]  # after the warm-up calls
    sample = ["flush", ("sleep", mod.HOLD_CYCLES), "event", "a", "event", "sync"]
    assert timed == sample + [*sample[:3], "b", *sample[4:]] + [*sample[:3], "b", *sample[4:]] + sample  # both orders
    assert [len(x) for x in gpu] == [len(x) for x in host] == [2, 2]
    assert all(h >= 2000 for x in host for h in x)  # the call's own 2 ms, in us


def test_samples_never_hold_the_stream(timing):
    mod, log = timing
    out = mod.samples_us([_calls(log, "a")], n=3, warmup=0)
    assert not any(isinstance(x, tuple) for x in log)
    assert log == ["flush", "event", "a", "event", "sync"] * 3
    assert len(out) == 1 and len(out[0]) == 3 and all(t >= 2000 for t in out[0])


def test_kernel_and_call_time_each_side_once_each_way_per_sample_the_first_rotating(timing):
    """Kernel time: the stream held between the flush and the start event; call time: the GPU synchronized (idle)
    there instead; in sample i every side once each way, side i % k first."""
    mod, log = timing
    kernel, call, host = mod.kernel_and_call_us([_calls(log, s) for s in "abc"], n=3, warmup=0)

    def sample(name):
        return ["flush", ("sleep", mod.HOLD_CYCLES), "event", name, "event", "sync",
                "flush", "idle", "event", name, "event", "sync"]

    assert log == [*sample("a"), *sample("b"), *sample("c"), *sample("b"), *sample("c"), *sample("a"),
                   *sample("c"), *sample("a"), *sample("b")]
    assert [len(k) for k in kernel] == [len(c) for c in call] == [len(h) for h in host] == [3, 3, 3]
    assert all(t >= 2000 for side in kernel + call + host for t in side)  # each call's own 2 ms, in us
    # host time: perf_counter around the held sample's call, inside its events
    assert all(h <= k for hs, ks in zip(host, kernel) for h, k in zip(hs, ks))

