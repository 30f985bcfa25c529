"""The worker's crowded launch (the gate's round beside a kernel holding most SMs) launches the plan exactly once on
every path: where it cannot crowd the GPU (a plan with a cluster launch; a GPU that other work holds already) the
plan runs alone, and the gate checks what it wrote. A path that skipped the launch left the poisoned outputs
unwritten, and every right cluster kernel came back WRONG_ANSWER."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from evo.measure import worker as W


class _Stream:
    def record(self):
        return "event"

    def wait(self, event):
        pass

    def sync(self):
        pass


def _worker(monkeypatch, cluster: int):
    monkeypatch.setattr(W, "cluster_size", lambda kernel, device: cluster)
    monkeypatch.setattr(W, "CROWD_START_S", 0.0)
    w = object.__new__(W.Worker)  # no device: only what crowded() reads
    w.dev, w.stream, w.support = SimpleNamespace(device_id=0), _Stream(), object()
    w.crowd_plan = (132, 116, 232448)
    flags = np.zeros(4096, np.uint32)
    w.host_flags = lambda: (0, flags)
    w.other_stream = lambda: _Stream()
    w.carved = {(id(w.support), "kf_occupy")}
    holders = []
    w.launch = lambda obj, kernel, *rest: holders.append(kernel)  # the holder's CTAs never report: a busy GPU
    return w, flags, holders


def test_a_cluster_plan_is_launched_alone(monkeypatch):
    w, _, holders = _worker(monkeypatch, cluster=2)
    calls = []
    assert w.crowded(lambda: calls.append("plan"), SimpleNamespace(get_kernel=lambda k: k), ["k"]) == ""
    assert calls == ["plan"] and holders == []


def test_a_plan_on_a_gpu_held_by_other_work_is_launched_once_the_holder_lets_go(monkeypatch):
    w, flags, holders = _worker(monkeypatch, cluster=1)
    calls = []

    def plan():
        calls.append(int(flags[0]))  # the release flag when the plan was launched

    assert w.crowded(plan, SimpleNamespace(get_kernel=lambda k: k), ["k"]) == ""
    assert holders == ["kf_occupy"] and calls == [1]
