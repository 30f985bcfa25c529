"""The serving path's raw launch (evo/export/runtime/package/rawlaunch.py): through a real ctypes foreign call typed
as the driver's cuLaunchKernel, the kernel receives for each argument the bytes cuda.core's launch would pack from
ArgPlan.bind's values (pointers pointer-sized, dims and scalars in their declared types), with the grid, block,
shared memory and stream given; a refused launch raises with the driver's error name; Direct takes it where given
and falls back to cuda.core's launch when told to."""

from __future__ import annotations

import ctypes
import importlib
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from evo.export.runtime.package import rawlaunch as R
from evo.export.runtime.package.args import direct_args, plan_args

ARGS = ("x", "w", "y", "residual?", "bias?", "M", "N:i64", "eps")
TENSORS = ("x", "w", "y", "residual")
PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_void_p)
NAME = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
_KEEP = []  # the error name's buffer outlives the callback


def _driver(seen: list, rc: int = 0):
    """A cuLaunchKernel and a cuGetErrorName, as ctypes function pointers typed as the driver's."""
    def launch(func, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        seen.append(((func, gx, gy, gz, bx, by, bz, smem, stream, extra), params))
        return rc

    def name(code, out):
        buf = ctypes.create_string_buffer(b"CUDA_ERROR_INVALID_VALUE")
        _KEEP.append(buf)
        out[0] = ctypes.cast(buf, ctypes.c_char_p).value
        return 0

    fn, nm = PROTO(launch), NAME(name)
    _KEEP.extend((fn, nm))
    return fn, nm


def _plan():
    plan = plan_args(ARGS, {"x", "w", "y", "residual", "bias"}, {"M": 7, "N": 4100}, {"eps": "f32"}, "t")
    fixed, slots = direct_args(plan, TENSORS, ("eps",))
    return plan, fixed, slots


def _packed(values: list) -> list[bytes]:
    """What cuda.core packs for bind's values: a Python int pointer-sized, a numpy scalar in its own type."""
    return [v.to_bytes(8, "little") if isinstance(v, int) else v.tobytes() for v in values]


def test_the_kernel_receives_what_cuda_core_would_pack():
    plan, fixed, slots = _plan()
    seen: list = []
    fn, nm = _driver(seen)
    raw = R.RawLaunch(fn, nm, 0xABC000, (7, 1, 1), (256,), 1024, fixed, slots)
    for values in ((0x7F00_1000, 0x7F00_2000, 0x7F00_3000, 0x7F00_5000, 1e-5),
                   (0x1_0000, 0x2_0000, 0x3_0000, 0x4_0000, 3.25e-7)):
        raw(0x5151, values)
        dims, params = seen[-1]
        assert dims == (0xABC000, 7, 1, 1, 256, 1, 1, 1024, 0x5151, None)
        want = _packed(plan.bind(dict(zip(TENSORS, values[:4])), {"eps": values[4]}))
        addrs = (ctypes.c_void_p * len(want)).from_address(params)
        got = [ctypes.string_at(addrs[i], len(w)) for i, w in enumerate(want)]
        assert got == want
    assert len(want) == len(ARGS) and want[4] == bytes(8)  # the bias never passed: a null pointer


def test_a_refused_launch_raises_with_the_drivers_error_name():
    _plan_, fixed, slots = _plan()
    fn, nm = _driver([], rc=1)
    raw = R.RawLaunch(fn, nm, 1, (1, 1, 1), (32, 1, 1), 0, fixed, slots)
    with pytest.raises(RuntimeError, match="cuLaunchKernel: CUDA_ERROR_INVALID_VALUE"):
        raw(0, (1, 2, 3, 4, 1e-6))


def test_without_a_driver_library_there_is_no_raw_launch(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(R, "_DRIVER", [])
    monkeypatch.setattr(R.ctypes, "CDLL", missing)
    assert R.driver() == (None, None)


@pytest.fixture
def launch_mod(monkeypatch):
    """The runtime's launch module imported beside a stand-in torch (it reads torch only when a call launches)."""
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(_C=None, cuda=SimpleNamespace()))
    monkeypatch.delitem(sys.modules, "evo.export.runtime.package.launch", raising=False)
    yield importlib.import_module("evo.export.runtime.package.launch")
    sys.modules.pop("evo.export.runtime.package.launch", None)


def test_a_direct_launch_takes_the_raw_launch_until_told_to_use_cuda_core(launch_mod, monkeypatch):
    L = launch_mod
    _plan_, fixed, slots = _plan()
    seen: list = []
    fn, nm = _driver(seen)
    raw = R.RawLaunch(fn, nm, 1, (7, 1, 1), (256, 1, 1), 0, fixed, slots)

    class Launcher:
        def _current(self, index):
            pass

        def _stream(self, index, handle):
            return ("stream", handle)

    monkeypatch.setattr(L, "current_stream_handle", lambda index: 0x77)
    d = L.Direct(Launcher(), 0, "kernel", "config", fixed, slots, raw)
    d(1, 2, 3, 4, 1e-6)
    assert d.raw and d.calls == 1 and seen[-1][0][8] == 0x77
    launched = []
    d._launch = lambda stream, config, kernel, *args: launched.append((stream, config, kernel, args))
    d.use_cuda_core()
    d(5, 6, 7, 8, 1e-6)
    assert not d.raw and d.calls == 2 and len(seen) == 1
    stream, config, kernel, args = launched[0]
    assert stream == ("stream", 0x77) and (config, kernel) == ("config", "kernel")
    assert list(args[:4]) == [5, 6, 7, 8] and args[7] == np.float32(1e-6)
