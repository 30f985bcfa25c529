"""The exported launcher's side launches (evo/export/runtime/package/launch.py) without torch or a GPU: a fake torch
and a recording cuda.core launch. A plan's side launch runs on the device's side stream (made once, at the greatest
priority) after an event recorded on the caller's stream right after its fork point, the caller's stream waits for
the side stream at the end, and a side launch with more CTAs than the device has SMs is refused (PlanError). A pdl
launch's config asks for programmatic stream serialization, or falls back to an ordinary launch with a warning."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest
from cuda.core import LaunchConfig

from evo.export.runtime.package.choice import Choice
from evo.export.runtime.package.table import Launch
from tests.unit.test_pdl_launch import OldLaunchConfig


class _Log(list):
    pass


def _fake_torch(log: _Log, sms: int = 132) -> SimpleNamespace:
    class Stream:
        def __init__(self, device=None, priority=0, handle=2):
            self.cuda_stream, self.priority = handle, priority
            log.append(("side stream", priority)) if handle == 2 else None

        @staticmethod
        def priority_range():
            return (0, -5)

        def wait_event(self, e):
            log.append(("side waits", e.name))

        def wait_stream(self, s):
            log.append(("main waits for", s.cuda_stream))

    class Event:
        n = 0

        def __init__(self):
            Event.n += 1
            self.name = f"e{Event.n}"

        def record(self, stream):
            log.append(("record", self.name, stream.cuda_stream))

    main = Stream(handle=1)
    cuda = SimpleNamespace(Stream=Stream, Event=Event, current_stream=lambda device: main, current_device=lambda: 0,
                           get_device_properties=lambda i: SimpleNamespace(multi_processor_count=sms))
    return SimpleNamespace(cuda=cuda, uint8="uint8", Tensor=object,
                           empty=lambda n, dtype, device: SimpleNamespace(data_ptr=lambda: 4096))


@pytest.fixture
def launch_mod(monkeypatch):
    log = _Log()
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    monkeypatch.delitem(sys.modules, "evo.export.runtime.package.launch", raising=False)
    mod = importlib.import_module("evo.export.runtime.package.launch")
    import cuda.core

    monkeypatch.setattr(cuda.core, "launch", lambda stream, config, kernel, *args: log.append(
        ("launch", kernel, stream, *args)), raising=False)
    yield mod, log
    sys.modules.pop("evo.export.runtime.package.launch", None)


def _ln(kernel: str, grid=(4, 32, 1), stream: str = "main", fork_after: str = "", args=("ws_flag",)) -> Launch:
    return Launch(kernel, grid, (128, 1, 1), 0, args, stream, fork_after)


def _run(mod, launches, workspaces=(("ws_flag", 64),)):
    c = Choice("kda", "kernel", (), (), 90, "")
    launcher = mod.Launcher()
    launcher._current = lambda index: None
    launcher._stream = lambda index, handle: f"stream{handle}"
    names = {"q"} | {n for n, _ in workspaces}
    offsets, nbytes = mod.workspace_offsets(dict(workspaces))
    launcher._prepared[(c, 0)] = mod._Prepared(
        tuple((ln, ln.kernel, None, mod.plan_args(ln.args, names, {}, {}, "t")) for ln in launches), offsets, nbytes,
        frozenset(ln.fork_after for ln in launches if ln.stream == "side"), any(ln.stream == "side" for ln in launches))
    t = SimpleNamespace(device=SimpleNamespace(index=0), data_ptr=lambda: 8192, get_device=lambda: 0)
    launcher.run(c, {"q": t}, {})
    return launcher


def _launches(log):
    return [e[:3] for e in log if e[0] == "launch"]


def test_a_side_launch_forks_after_its_mark_and_the_callers_stream_joins_it(launch_mod):
    mod, log = launch_mod
    _run(mod, [_ln("kda_chunk_flags"), _ln("kda_chunk_prep"), _ln("kda_chunk_recur", stream="side",
                                                                  fork_after="kda_chunk_flags")])
    assert [e[:3] for e in log if e[0] != "side stream"] == [
        ("launch", "kda_chunk_flags", "stream1"), ("record", "e1", 1),  # marked right after the fork point
        ("launch", "kda_chunk_prep", "stream1"),                        # not marked
        ("side waits", "e1"), ("launch", "kda_chunk_recur", "stream2"),
        ("main waits for", 2)]
    assert ("side stream", -5) in log  # made at the greatest priority


def test_a_plan_without_side_launches_records_nothing(launch_mod):
    mod, log = launch_mod
    _run(mod, [_ln("prep"), _ln("recur")])
    assert [e[:3] for e in log] == [("launch", "prep", "stream1"), ("launch", "recur", "stream1")]


def test_a_calls_workspaces_are_one_allocation_each_at_its_aligned_offset(launch_mod):
    mod, log = launch_mod
    assert mod.workspace_offsets({"a": 100, "b": 0, "c": 513}) == ((("a", 0), ("b", 256), ("c", 512)), 1280)
    _run(mod, [_ln("prep", args=("q", "a", "b")), _ln("recur", args=("c", "q"))],
         workspaces=(("a", 100), ("b", 0), ("c", 513)))
    base = 4096  # the fake torch.empty's pointer
    assert [e[3:] for e in log] == [(8192, base, base + 256), (base + 512, 8192)]  # pointers as Python ints


def test_a_side_launch_with_more_ctas_than_sms_is_refused(launch_mod):
    mod, _ = launch_mod
    plan = (_ln("kda_chunk_flags"), _ln("kda_chunk_recur", grid=(8, 32, 1), stream="side", fork_after="kda_chunk_flags"))
    with pytest.raises(mod.PlanError, match="256 CTAs beside the main stream's launches need one an SM, and this GPU "
                                            "has 132 SMs"):
        mod._check_side_residency(plan, 0)
    mod._check_side_residency((plan[0], _ln("kda_chunk_recur", stream="side", fork_after="kda_chunk_flags")), 0)


def test_a_package_launches_pdl_where_it_can_and_in_order_with_a_warning_where_it_cannot(launch_mod):
    _config = launch_mod[0]._config
    ln = Launch("kda_chunk_recur", (4, 32, 1), (128, 1, 1), 1024, (), pdl=True)
    assert _config(LaunchConfig, ln).programmatic_stream_serialization is True
    assert _config(LaunchConfig, Launch("prep", (4, 1, 1), (128, 1, 1), 0, ())
                   ).programmatic_stream_serialization is False
    with pytest.warns(RuntimeWarning, match="kda_chunk_recur: this cuda.core cannot launch it as a programmatic"):
        cfg = _config(OldLaunchConfig, ln)
    assert isinstance(cfg, OldLaunchConfig) and cfg.grid == (4, 32, 1) and cfg.shmem_size == 1024
