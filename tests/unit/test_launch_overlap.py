"""Side launches on a device: evo.measure.gate.launch_plan (a plan's side launch after its fork point's mark, the
streams joined at the end, host order the declared order) and evo.measure.launches.overlap_fns (the plan in order,
or its last launch started first on the side stream)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evo.measure.gate import launch_plan
from evo.measure.launches import overlap_fns


class _Dev:
    """Logs what a plan asks of the device, in order."""

    def __init__(self) -> None:
        self.log: list = []
        self.marks = 0

    def launch(self, obj, kernel, grid, block, smem, args, side=False, pdl=False) -> None:
        self.log.append(("launch", kernel, "side" if side else "main") + (("pdl",) if pdl else ()))

    def mark(self):
        self.marks += 1
        self.log.append(("mark", self.marks))
        return self.marks

    def fork(self, mark) -> None:
        self.log.append(("fork", mark))

    def join(self) -> None:
        self.log.append(("join",))


def ln(kernel: str, stream: str = "main", fork_after: str = "", pdl: bool = False):
    return SimpleNamespace(kernel=kernel, grid=(4, 2, 1), block=(128, 1, 1), smem=0, args=(), stream=stream,
                           fork_after=fork_after, pdl=pdl)


def test_a_plan_without_side_launches_is_the_launches_in_order():
    dev = _Dev()
    launch_plan(dev, None, [(ln("a"), ()), (ln("b"), ())])
    assert dev.log == [("launch", "a", "main"), ("launch", "b", "main")]


def test_a_side_launch_waits_for_its_fork_point_only_and_the_streams_join_at_the_end():
    dev = _Dev()
    launch_plan(dev, None, [(ln("zero"), ()), (ln("prep"), ()), (ln("recur", "side", "zero"), ())])
    assert dev.log == [("launch", "zero", "main"), ("mark", 1),  # marked: the side launch forks after it
                       ("launch", "prep", "main"),               # not marked: nothing forks after it
                       ("fork", 1), ("launch", "recur", "side"),  # issued after prep on the host
                       ("join",)]


def test_a_pdl_launch_reaches_the_device_as_one_and_only_it():
    dev = _Dev()
    launch_plan(dev, None, [(ln("prep"), ()), (ln("recur", pdl=True), ())])
    assert dev.log == [("launch", "prep", "main"), ("launch", "recur", "main", "pdl")]


def test_a_side_launch_before_its_fork_point_is_refused():
    with pytest.raises(ValueError, match="forks after 'zero', which no main launch before it ran"):
        launch_plan(_Dev(), None, [(ln("recur", "side", "zero"), ()), (ln("zero"), ())])


def test_in_order_every_launch_on_the_device_stream():
    dev = _Dev()
    seq, _ = overlap_fns(dev, None, [(ln("prep"), ()), (ln("recur"), ())])
    seq(0)
    assert dev.log == [("launch", "prep", "main"), ("launch", "recur", "main")]


def test_overlapped_the_last_launch_goes_first_on_the_side_stream_and_is_joined_back():
    dev = _Dev()
    _, over = overlap_fns(dev, None, [(ln("prep"), ()), (ln("recur"), ())])
    over(0)
    assert dev.log == [("mark", 1), ("fork", 1),  # after what the device's stream held (the flush, the hold)
                       ("launch", "recur", "side"), ("launch", "prep", "main"),
                       ("join",)]  # the end event on the device's stream waits for both


def test_a_three_launch_plan_keeps_its_first_launches_in_order():
    dev = _Dev()
    _, over = overlap_fns(dev, None, [(ln("prep"), ()), (ln("mid"), ()), (ln("recur"), ())])
    over(0)
    assert [e[1] for e in dev.log if e[0] == "launch"] == ["recur", "prep", "mid"]


def test_side_first_issues_the_side_launch_right_after_its_fork_point():
    from evo.measure.launches import side_first

    plan = [(ln("zero"), ()), (ln("prep"), ()), (ln("recur", "side", "zero"), ())]
    dev = _Dev()
    launch_plan(dev, None, side_first(plan))
    assert dev.log == [("launch", "zero", "main"), ("mark", 1), ("fork", 1), ("launch", "recur", "side"),
                       ("launch", "prep", "main"), ("join",)]
    assert [lj.kernel for lj, _ in plan] == ["zero", "prep", "recur"]  # the plan itself untouched


def test_side_first_keeps_two_side_launches_of_one_fork_point_in_their_order():
    from evo.measure.launches import side_first

    plan = [(ln("zero"), ()), (ln("prep"), ()), (ln("r1", "side", "zero"), ()), (ln("post"), ()),
            (ln("r2", "side", "zero"), ())]
    assert [lj.kernel for lj, _ in side_first(plan)] == ["zero", "r1", "r2", "prep", "post"]


def test_side_first_refuses_a_side_launch_without_its_fork_point():
    from evo.measure.launches import side_first

    with pytest.raises(ValueError, match="forks after 'zero'"):
        side_first([(ln("recur", "side", "zero"), ()), (ln("zero"), ())])


def test_time_launches_refuses_an_unknown_order():
    from evo.measure.launches import time_launches

    with pytest.raises(ValueError, match="order 'backwards': expected one of declared, side_first"):
        time_launches(_Dev(), None, None, None, None, 1, 1, order="backwards")


@pytest.mark.parametrize("raw, pct", [("", None), ("100", 100), (" 0 ", 0), ("37", 37)])
def test_the_carveout_knob_reads_a_percentage(monkeypatch, raw, pct):
    from evo.measure.carveout import smem_carveout

    monkeypatch.setenv("KF_SMEM_CARVEOUT", raw)
    assert smem_carveout() == pct


@pytest.mark.parametrize("raw", ["101", "-1", "max", "50%"])
def test_the_carveout_knob_refuses_anything_else_by_name(monkeypatch, raw):
    from evo.measure.carveout import smem_carveout

    monkeypatch.setenv("KF_SMEM_CARVEOUT", raw)
    with pytest.raises(ValueError, match="KF_SMEM_CARVEOUT="):
        smem_carveout()
