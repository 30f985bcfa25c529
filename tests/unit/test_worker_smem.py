"""The GPU worker opts a kernel in to dynamic shared memory past 48 KB before its launch (the driver
refuses such a launch otherwise), once per job's cubin and kernel, and a refusal is a LaunchFault. With
$KF_SMEM_CARVEOUT set it asks for that shared-memory carveout, once per job's cubin and kernel too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from evo.measure import worker as W


class _Kernel:
    def __init__(self, handle):
        self.handle = handle


class _Obj:
    def __init__(self, handle):
        self.kernel = _Kernel(handle)

    def get_kernel(self, name):
        return self.kernel


def _fake_driver(calls: list, result: str = "ok"):
    ok, bad = SimpleNamespace(name="CUDA_SUCCESS"), SimpleNamespace(name="CUDA_ERROR_INVALID_VALUE")

    class CUkernel:
        pass

    def set_kernel(attr, n, h, dev):
        calls.append(("kernel", attr, n, dev))
        return (ok if result == "ok" else bad,)

    def set_func(h, attr, n):
        calls.append(("func", attr, n))
        return (ok,)

    return SimpleNamespace(
        CUfunction_attribute=SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="MAXDYN",
                                             CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT="CARVEOUT"),
        CUresult=SimpleNamespace(CUDA_SUCCESS=ok), CUkernel=CUkernel, CUdevice=lambda i: f"dev{i}",
        cuKernelSetAttribute=set_kernel, cuFuncSetAttribute=set_func, cuCtxSynchronize=lambda: (ok,))


def _worker(monkeypatch, calls, result="ok", carveout=None):
    drv = _fake_driver(calls, result)
    monkeypatch.setattr(W, "_drv", lambda: drv)
    launched = []
    monkeypatch.setattr("cuda.core.launch", lambda stream, cfg, k, *vals: launched.append(cfg))
    w = object.__new__(W.Worker)  # no device: only what launch() reads
    w.stream, w.dev, w.smem_allowed = None, SimpleNamespace(device_id=0), {}
    w.carveout, w.carved = carveout, set()
    return w, drv, launched


def test_launch_past_48k_opts_the_kernel_in_once(monkeypatch):
    calls: list = []
    w, drv, launched = _worker(monkeypatch, calls)
    obj = _Obj(drv.CUkernel())
    w.launch(obj, "k", (4, 1, 1), (256, 1, 1), 0, ())
    assert calls == [] and len(launched) == 1  # no dynamic shared memory: no opt-in
    w.launch(obj, "k", (4, 1, 1), (256, 1, 1), W.STATIC_SMEM, ())
    # exactly 48 KB dynamic plus the kernel's static bytes passes the default cap: the H200 refused it
    assert calls == [("kernel", "MAXDYN", W.STATIC_SMEM, "dev0")]
    calls.clear()
    for _ in range(3):
        w.launch(obj, "k", (4, 1, 1), (256, 1, 1), 196608, ())
    assert calls == [("kernel", "MAXDYN", 196608, "dev0")]  # once: later launches (and captures) skip it
    assert launched[-1].shmem_size == 196608
    w.launch(obj, "k", (4, 1, 1), (256, 1, 1), 200000, ())  # more than allowed so far: asked again
    assert calls[-1] == ("kernel", "MAXDYN", 200000, "dev0") and len(calls) == 2
    w.launch(obj, "k", (4, 1, 1), (256, 1, 1), 1024, ())  # less than already allowed: nothing asked
    assert len(calls) == 2


def test_a_function_handle_uses_cuFuncSetAttribute(monkeypatch):
    calls: list = []
    w, _, _ = _worker(monkeypatch, calls)
    w.launch(_Obj(object()), "k", (1, 1, 1), (128, 1, 1), 65536, ())
    assert calls == [("func", "MAXDYN", 65536)]


def test_a_refused_opt_in_is_a_launch_fault_not_a_launch(monkeypatch):
    calls: list = []
    w, drv, launched = _worker(monkeypatch, calls, result="refuse")
    with pytest.raises(W.LaunchFault, match="CUDA_ERROR_INVALID_VALUE"):
        w.launch(_Obj(drv.CUkernel()), "k", (1, 1, 1), (128, 1, 1), 240000, ())
    assert launched == [] and w.smem_allowed == {}


def test_without_a_carveout_none_is_asked_for(monkeypatch):
    calls: list = []
    w, drv, launched = _worker(monkeypatch, calls)
    w.launch(_Obj(drv.CUkernel()), "k", (1, 1, 1), (128, 1, 1), 0, ())
    assert calls == [] and len(launched) == 1


def test_a_carveout_is_asked_for_once_per_kernel_before_its_first_launch(monkeypatch):
    calls: list = []
    w, drv, launched = _worker(monkeypatch, calls, carveout=100)
    a, b = _Obj(drv.CUkernel()), _Obj(drv.CUkernel())
    for _ in range(3):
        w.launch(a, "k", (1, 1, 1), (128, 1, 1), 0, ())
    w.launch(b, "k", (1, 1, 1), (128, 1, 1), 65536, ())
    assert calls == [("kernel", "CARVEOUT", 100, "dev0"),  # a's, once
                     ("kernel", "MAXDYN", 65536, "dev0"), ("kernel", "CARVEOUT", 100, "dev0")]  # b's
    assert len(launched) == 4
