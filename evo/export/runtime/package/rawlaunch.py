"""A serving call's launch through the driver's cuLaunchKernel by ctypes, its kernel-parameter array built once.

cuda.core's `launch` packs every argument into a new parameter array on each call (~4.6 us of host time on an
H100's host, most of a few-row RMSNorm call's). Here the array of argument addresses is made once per Direct
launch; a call writes the pointers and scalars into their fixed cells and makes one foreign call. What a kernel
receives is the same bytes (tests/unit/test_rawlaunch.py reads them back); the runtime checks a Direct launch's
outputs against the routed call's once, before it serves from it (the caller's `agrees`), and falls back to
cuda.core's launch where they differ or where the driver library is not found.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

# the C type of each numpy scalar type an ArgPlan binds (args._SCALAR's); a Python int is a pointer-sized value
_CTYPES: dict[Any, Any] = {np.uint64: ctypes.c_uint64, np.int32: ctypes.c_int32, np.int64: ctypes.c_int64,
                           np.float32: ctypes.c_float, np.float64: ctypes.c_double, int: ctypes.c_uint64}
_DRIVER: list[Any] = []  # [cuLaunchKernel, cuGetErrorName] once loaded, [None, None] where there is no driver library


def driver() -> tuple[Any, Any]:
    """(cuLaunchKernel, cuGetErrorName) from the driver library, typed; (None, None) where it does not load."""
    if not _DRIVER:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            launch = lib.cuLaunchKernel
            launch.restype = ctypes.c_int
            launch.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_void_p]
            name = lib.cuGetErrorName
            name.restype = ctypes.c_int
            name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            _DRIVER.extend((launch, name))
        except (OSError, AttributeError):
            _DRIVER.extend((None, None))
    return _DRIVER[0], _DRIVER[1]


def _cell(kind: Any, value: Any = 0) -> Any:
    c = _CTYPES[kind]()
    c.value = value
    return c


class RawLaunch:
    """One kernel's launch with its grid, block and dynamic shared memory fixed and its parameter array made once:
    `fixed` the bound args (numpy scalars, or a Python int for a null pointer; None where a call fills in), `slots`
    (arg position, value index, numpy cast or None for a pointer) as args.direct_args gives them. A call passes the
    stream's handle and the values; a launch the driver refuses raises RuntimeError with its error name."""

    __slots__ = ("_fn", "_name", "_func", "_dims", "_cells", "_params", "_ptrs", "_casts", "_lock")

    def __init__(self, fn: Any, name: Any, func: int, grid: Sequence[int], block: Sequence[int], smem: int,
                 fixed: Sequence[Any], slots: Sequence[tuple[int, int, Any]]) -> None:
        cells: list[Any] = [None if v is None else _cell(type(v), v.item() if isinstance(v, np.generic) else v)
                            for v in fixed]
        for i, _k, cast in slots:
            cells[i] = _cell(np.uint64 if cast is None else cast)
        if any(c is None for c in cells):
            raise ValueError("a launch arg is neither bound nor filled by a call")
        self._fn, self._name, self._func = fn, name, ctypes.c_void_p(func)
        g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        self._dims = (*g, *b, int(smem))
        self._cells = cells  # alive as long as the array of their addresses
        self._params = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        self._ptrs = tuple((cells[i], k) for i, k, cast in slots if cast is None)
        self._casts = tuple((cells[i], k) for i, k, cast in slots if cast is not None)
        self._lock = threading.Lock()  # the cells are shared: one call writes and launches at a time

    def __call__(self, stream: int, values: Sequence[Any]) -> None:
        with self._lock:
            for c, k in self._ptrs:
                c.value = values[k]
            for c, k in self._casts:
                c.value = values[k]
            rc = self._fn(self._func, *self._dims, stream, self._params, None)
        if rc:
            text = ctypes.c_char_p()
            named = self._name is not None and self._name(rc, ctypes.byref(text)) == 0 and text.value
            raise RuntimeError(f"cuLaunchKernel: {named.decode() if named else f'CUresult {rc}'}")
