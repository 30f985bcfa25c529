"""evo.measure.launches.overlap_fns: the plan in order on the device's stream, or its last launch started first on a
side stream (after the device's stream's earlier work) and joined back before anything after it on the device's
stream, so one pair of events on that stream brackets either schedule."""

from __future__ import annotations

from types import SimpleNamespace

from evo.measure.launches import overlap_fns


class _Stream:
    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def wait(self, other: "_Stream") -> None:
        self.log.append(("wait", self.name, other.name))


class _Dev:
    def __init__(self) -> None:
        self.log: list = []
        self.stream = _Stream("main", self.log)

    def launch(self, obj, kernel, grid, block, smem, args, stream=None) -> None:
        self.log.append(("launch", kernel, (stream or self.stream).name, args))


def _bound():
    ln = lambda name: SimpleNamespace(kernel=name, grid=(4, 2, 1), block=(128, 1, 1), smem=0)  # noqa: E731
    return [(ln("prep"), (("ptr", 1),)), (ln("recur"), (("ptr", 2),))]


def test_in_order_every_launch_on_the_device_stream():
    dev = _Dev()
    seq, _ = overlap_fns(dev, None, _bound(), _Stream("side", dev.log))
    seq(0)
    assert dev.log == [("launch", "prep", "main", (("ptr", 1),)), ("launch", "recur", "main", (("ptr", 2),))]


def test_overlapped_the_last_launch_goes_first_on_the_side_stream_and_is_joined_back():
    dev = _Dev()
    side = _Stream("side", dev.log)
    _, over = overlap_fns(dev, None, _bound(), side)
    over(0)
    assert dev.log == [("wait", "side", "main"),  # after what the device's stream held (the flush, the hold)
                       ("launch", "recur", "side", (("ptr", 2),)),
                       ("launch", "prep", "main", (("ptr", 1),)),
                       ("wait", "main", "side")]  # the end event on the device's stream waits for both


def test_a_three_launch_plan_keeps_its_first_launches_in_order():
    dev = _Dev()
    bound = _bound()
    bound.insert(1, (SimpleNamespace(kernel="mid", grid=(1, 1, 1), block=(32, 1, 1), smem=0), ()))
    _, over = overlap_fns(dev, None, bound, _Stream("side", dev.log))
    over(0)
    assert [e[1] for e in dev.log if e[0] == "launch"] == ["recur", "prep", "mid"]
