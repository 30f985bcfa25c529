"""Launch a choice's plan (one or more kernels, with workspaces) on torch tensors, on torch's stream.

Workspaces (the template's `[workspace]` sizes for the shape, e.g. the backward's fp32 dw partials)
are allocated here per call from torch's caching allocator, on the call's device and stream; the
kernels write them before they read them (the factory's gate fills them with garbage before every
launch), so they are not cleared.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import torch

from .args import bind_args
from .choice import Choice
from .loader import Modules, check_grid
from .table import Launch, tables


@lru_cache(maxsize=4096)
def plan(c: Choice) -> tuple[tuple[Launch, ...], dict[str, int]]:
    """The launches and workspace bytes of a choice (its template's plan evaluated for its shape)."""
    t = tables()[c.op].templates[c.template]
    return t.plan(dict(c.params), c.arch, dict(c.dtypes), dict(c.dims))


def _allow_smem(kernel: Any, nbytes: int, device: int) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    h = kernel.handle
    if isinstance(h, driver.CUkernel):
        (err,) = driver.cuKernelSetAttribute(attr, nbytes, h, driver.CUdevice(device))
    else:
        (err,) = driver.cuFuncSetAttribute(h, attr, nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot allow {nbytes} B of dynamic shared memory: {err}")


class Launcher:
    """Binds a plan's args to tensors, dims and scalars and launches it."""

    def __init__(self) -> None:
        self.modules = Modules()
        self._local = threading.local()  # the devices made current in this thread

    def _current(self, index: int) -> None:
        done = getattr(self._local, "devices", None)
        if done is None:
            done = self._local.devices = set()
        if index not in done:
            from cuda.core import Device

            Device(index).set_current()  # torch's primary context: the same one
            done.add(index)

    def run(self, c: Choice, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, float]) -> None:
        from cuda.core import LaunchConfig, Stream, launch

        table = tables()[c.op]
        launches, workspaces = plan(c)
        device = next(iter(tensors.values())).device
        bufs = dict(tensors)
        bufs.update({n: torch.empty(max(1, b), dtype=torch.uint8, device=device) for n, b in workspaces.items()})
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._current(index)
        loaded = self.modules.get(table, c)
        for ln in launches:  # before the first launch: a plan is launched whole or not at all
            check_grid(ln, loaded.clusters)
        stream = Stream.from_handle(torch.cuda.current_stream(device).cuda_stream)
        dims, kinds = dict(c.dims), dict(table.scalars)
        ptrs = {n: b.data_ptr() for n, b in bufs.items()}
        for ln in launches:
            args = bind_args(ln.args, ptrs, dims, scalars, kinds, f"{c.template} ({c.op})")
            kernel = loaded.module.get_kernel(ln.kernel)
            if ln.smem > 0:
                _allow_smem(kernel, ln.smem, index)
            launch(stream, LaunchConfig(grid=ln.grid, block=ln.block, shmem_size=ln.smem), kernel, *args)
