"""Launch a choice's plan (one or more kernels, with workspaces) on torch tensors, on torch's stream.
The module, kernel handles, shared-memory attributes and launch configs of a choice are made ready on its
first call on a device and kept: a decode call is microseconds of GPU work, so the host's share matters.

Workspaces (the template's `[workspace]` sizes for the shape, e.g. the backward's fp32 dw partials)
are allocated here per call from torch's caching allocator, on the call's device and stream; the
kernels write them before they read them (the factory's gate fills them with garbage before every
launch), so they are not cleared.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from .args import ArgPlan, plan_args
from .choice import Choice
from .loader import Modules, PlanError, check_grid
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


def _config(make: Any, ln: Launch) -> Any:
    """The launch's LaunchConfig; a pdl launch as a programmatic dependent launch where cuda.core can set it
    (>= 1.2.0), else in order with a warning: its kernel's griddepcontrol.wait then returns at once, so the
    results are the same and only the overlap is lost."""
    if ln.pdl:
        try:
            return make(grid=ln.grid, block=ln.block, shmem_size=ln.smem, programmatic_stream_serialization=True)
        except TypeError:
            warnings.warn(f"{ln.kernel}: this cuda.core cannot launch it as a programmatic dependent launch (needs "
                          ">= 1.2.0); it runs after the launch before it", RuntimeWarning, stacklevel=3)
    return make(grid=ln.grid, block=ln.block, shmem_size=ln.smem)


def _check_side_residency(launches: tuple[Launch, ...], index: int) -> None:
    """PlanError where a side launch has more CTAs than the device has SMs: its CTAs wait for the main launch's
    work, and the template's rule that they fit one an SM beside it was checked for the GPU it was searched on
    (docs/kda_prefill_overlap.md). Such a call takes the torch path, with a warning saying why."""
    side = [ln for ln in launches if ln.stream == "side"]
    if not side:
        return
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    for ln in side:
        ctas = ln.grid[0] * ln.grid[1] * ln.grid[2]
        if ctas > sms:
            raise PlanError(f"{ln.kernel}: {ctas} CTAs beside the main stream's launches need one an SM, and this GPU "
                            f"has {sms} SMs")


@dataclass(frozen=True)
class _Prepared:
    """A choice's plan made ready on one device once: each launch with its kernel handle, LaunchConfig (dynamic
    shared memory allowed) and ArgPlan (the dims bound), and the workspace sizes. Per call only the pointers and
    scalars are bound."""

    launches: tuple[tuple[Launch, Any, Any, ArgPlan], ...]  # (launch, kernel, LaunchConfig, its args)
    workspaces: tuple[tuple[str, int], ...]
    forks: frozenset[str] = frozenset()  # the main launches a side launch forks after (marked by an event)


class Launcher:
    """Binds a plan's args to tensors, dims and scalars and launches it. What does not change between calls
    of one choice on one device (the module, the kernels, their shared-memory attribute, the launch configs,
    the grid check) is done on the first call and kept; a call binds the args and launches."""

    def __init__(self) -> None:
        self.modules = Modules()
        self._local = threading.local()  # the devices made current in this thread
        self._prepared: dict[tuple[Choice, int], _Prepared] = {}
        self._streams: dict[tuple[int, int], Any] = {}  # (device, torch stream handle) -> cuda.core Stream
        self._sides: dict[int, torch.cuda.Stream] = {}  # device -> the side stream of plans with side launches
        self._lock = threading.Lock()

    def _current(self, index: int) -> None:
        done = getattr(self._local, "devices", None)
        if done is None:
            done = self._local.devices = set()
        if index not in done:
            from cuda.core import Device

            Device(index).set_current()  # torch's primary context: the same one
            done.add(index)

    def _prepare(self, c: Choice, index: int) -> _Prepared:
        from cuda.core import LaunchConfig

        launches, workspaces = plan(c)
        loaded = self.modules.get(tables()[c.op], c)
        for ln in launches:  # before the first launch: a plan is launched whole or not at all
            check_grid(ln, loaded.clusters)
        _check_side_residency(launches, index)
        table = tables()[c.op]
        tensors = {t.name for t in table.tensors} | set(workspaces)
        dims, kinds = dict(c.dims), dict(table.scalars)
        ready = []
        for ln in launches:
            args = plan_args(ln.args, tensors, dims, kinds, f"{c.template} ({c.op})")
            kernel = loaded.module.get_kernel(ln.kernel)
            if ln.smem > 0:
                _allow_smem(kernel, ln.smem, index)
            ready.append((ln, kernel, _config(LaunchConfig, ln), args))
        forks = frozenset(ln.fork_after for ln in launches if ln.stream == "side")
        return _Prepared(tuple(ready), tuple(workspaces.items()), forks)

    def _stream(self, index: int, handle: int) -> Any:
        s = self._streams.get((index, handle))
        if s is None:
            from cuda.core import Stream

            s = self._streams.setdefault((index, handle), Stream.from_handle(handle))
        return s

    def run(self, c: Choice, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, float]) -> None:
        from cuda.core import launch

        device = next(iter(tensors.values())).device
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._current(index)
        ready = self._prepared.get((c, index))
        if ready is None:
            ready = self._prepare(c, index)  # raises CompileError / PlanError: nothing kept, nothing launched
            with self._lock:
                ready = self._prepared.setdefault((c, index), ready)
        ptrs = {n: b.data_ptr() for n, b in tensors.items()}
        keep = [torch.empty(max(1, b), dtype=torch.uint8, device=device) for _, b in ready.workspaces]
        ptrs.update((n, w.data_ptr()) for (n, _), w in zip(ready.workspaces, keep))
        main = torch.cuda.current_stream(device)
        stream = self._stream(index, main.cuda_stream)
        marks: dict[str, Any] = {}
        side = None
        for ln, kernel, config, plan_of_args in ready.launches:
            args = plan_of_args.bind(ptrs, scalars)
            if ln.stream == "side":  # beside the main stream, after its launch of fork_after (the plan language)
                side = self._side(index, device)
                side.wait_event(marks[ln.fork_after])
                launch(self._stream(index, side.cuda_stream), config, kernel, *args)
            else:
                launch(stream, config, kernel, *args)
                if ln.kernel in ready.forks:
                    marks[ln.kernel] = torch.cuda.Event()
                    marks[ln.kernel].record(main)
        if side is not None:
            # the caller's stream waits for the side stream, so whatever it queues next (freeing this call's
            # workspaces to the caching allocator included) comes after the side launches
            main.wait_stream(side)

    def _side(self, index: int, device: torch.device) -> torch.cuda.Stream:
        """The side stream of a device at the greatest stream priority (a side launch's few CTAs are dispatched
        ahead of the main launch's pending ones), made once."""
        s = self._sides.get(index)
        if s is None:
            with self._lock:
                _least, greatest = torch.cuda.Stream.priority_range()
                s = self._sides.setdefault(index, torch.cuda.Stream(device=device, priority=greatest))
        return s
