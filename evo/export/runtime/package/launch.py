"""Launch a choice's plan (one or more kernels, with workspaces) on torch tensors, on torch's stream.
The module, kernel handles, shared-memory attributes and launch configs of a choice are made ready on its
first call on a device and kept: a decode call is microseconds of GPU work, so the host's share matters.

Workspaces (the template's `[workspace]` sizes for the shape, e.g. the backward's fp32 dw partials)
are one allocation per call from torch's caching allocator, on the call's device and stream, each workspace
at a 256-byte aligned offset; the kernels write them before they read them (the factory's gate fills them
with garbage before every launch), so they are not cleared. Per call the host reads the current stream's
handle (no torch Stream object where torch exposes it), binds pointers and scalars (ArgPlan) and launches.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from .args import ArgPlan, direct_args, plan_args
from .choice import Choice
from .loader import Modules, PlanError, check_grid
from .rawlaunch import RawLaunch, driver
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


MAX_BY_ID = 4096  # choices kept by id (cleared when full; the by-value map keeps every plan made ready)
WORKSPACE_ALIGN = 256  # bytes: each workspace's offset in a call's one workspace allocation
# the current stream's handle without a torch Stream object (what Triton's launcher reads); None: the public way
_RAW_STREAM = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)


def workspace_offsets(sizes: Mapping[str, int]) -> tuple[tuple[tuple[str, int], ...], int]:
    """((name, byte offset), ...) of each workspace in one allocation, each at a multiple of WORKSPACE_ALIGN and
    at least one byte long, and the allocation's size."""
    offsets, end = [], 0
    for name, nbytes in sizes.items():
        offsets.append((name, end))
        end += -(-max(1, nbytes) // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return tuple(offsets), end


def current_stream_handle(index: int) -> int:
    """The handle of torch's current stream on device `index`."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(index)
    return torch.cuda.current_stream(index).cuda_stream


@dataclass(frozen=True)
class _Prepared:
    """A choice's plan made ready on one device once: each launch with its kernel handle, LaunchConfig (dynamic
    shared memory allowed) and ArgPlan (the dims bound), and the workspace sizes. Per call only the pointers and
    scalars are bound."""

    launches: tuple[tuple[Launch, Any, Any, ArgPlan], ...]  # (launch, kernel, LaunchConfig, its args)
    workspaces: tuple[tuple[str, int], ...]  # (name, byte offset in the call's one workspace allocation)
    workspace_bytes: int
    forks: frozenset[str] = frozenset()  # the main launches a side launch forks after (marked by an event)
    side: bool = False  # any launch on the side stream


class Launcher:
    """Binds a plan's args to tensors, dims and scalars and launches it. What does not change between calls
    of one choice on one device (the module, the kernels, their shared-memory attribute, the launch configs,
    the grid check) is done on the first call and kept; a call binds the args and launches."""

    def __init__(self) -> None:
        self.modules = Modules()
        self._local = threading.local()  # the devices made current in this thread
        self._prepared: dict[tuple[Choice, int], _Prepared] = {}  # (choice, device) -> its plan made ready
        self._by_id: dict[tuple[int, int], tuple[Choice, _Prepared]] = {}  # the same by the choice's id
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
        offsets, nbytes = workspace_offsets(workspaces)
        return _Prepared(tuple(ready), offsets, nbytes, forks, any(ln.stream == "side" for ln in launches))

    def _stream(self, index: int, handle: int) -> Any:
        s = self._streams.get((index, handle))
        if s is None:
            from cuda.core import Stream

            s = self._streams.setdefault((index, handle), Stream.from_handle(handle))
        return s

    def prepared(self, c: Choice, index: int) -> _Prepared:
        """The choice's plan made ready on device `index`, kept by the choice's id too (a choice is a frozen value
        made once per call signature: hashing its fields on every call costs more than the lookup)."""
        held = self._by_id.get((id(c), index))
        if held is not None and held[0] is c:
            return held[1]
        ready = self._prepared.get((c, index))  # an equal choice made before
        if ready is None:
            ready = self._prepare(c, index)  # raises CompileError / PlanError: nothing kept, nothing launched
        with self._lock:
            ready = self._prepared.setdefault((c, index), ready)
            if len(self._by_id) >= MAX_BY_ID:
                self._by_id.clear()
            self._by_id[(id(c), index)] = (c, ready)  # c held: its id is no other choice's while kept
        return ready

    def run(self, c: Choice, tensors: Mapping[str, torch.Tensor], scalars: Mapping[str, float]) -> None:
        from cuda.core import launch

        first = next(iter(tensors.values()))
        index = first.get_device()
        self._current(index)
        ready = self.prepared(c, index)
        ptrs = {n: b.data_ptr() for n, b in tensors.items()}
        if ready.workspaces:
            keep = torch.empty(ready.workspace_bytes, dtype=torch.uint8, device=first.device)
            base = keep.data_ptr()
            for n, offset in ready.workspaces:
                ptrs[n] = base + offset
        stream = self._stream(index, current_stream_handle(index))
        if not ready.side:
            for _ln, kernel, config, args in ready.launches:
                launch(stream, config, kernel, *args.bind(ptrs, scalars))
            return
        main = torch.cuda.current_stream(first.device)
        marks: dict[str, Any] = {}
        side = self._side(index, first.device)
        for ln, kernel, config, args in ready.launches:
            if ln.stream == "side":  # beside the main stream, after its launch of fork_after (the plan language)
                side.wait_event(marks[ln.fork_after])
                launch(self._stream(index, side.cuda_stream), config, kernel, *args.bind(ptrs, scalars))
            else:
                launch(stream, config, kernel, *args.bind(ptrs, scalars))
                if ln.kernel in ready.forks:
                    marks[ln.kernel] = torch.cuda.Event()
                    marks[ln.kernel].record(main)
        # the caller's stream waits for the side stream, so whatever it queues next (freeing this call's
        # workspaces to the caching allocator included) comes after the side launches
        main.wait_stream(side)

    def direct(self, c: Choice, index: int, tensors: tuple[str, ...], scalars: tuple[str, ...]) -> "Direct | None":
        """The choice's plan as a Direct launch on device `index` whose calls pass the pointers of `tensors` and the
        values of `scalars` in that order (a tensor of the plan not among them is a null pointer where optional),
        or None where the plan is more than one launch on the call's stream without workspaces."""
        ready = self.prepared(c, index)
        if ready.side or ready.workspaces or len(ready.launches) != 1:
            return None
        ln, kernel, config, args = ready.launches[0]
        fixed, slots = direct_args(args, tensors, scalars)
        if fixed is None:
            return None
        raw = None
        fn, name = driver()
        if fn is not None and not ln.pdl and os.environ.get("KF_RAW_LAUNCH", "1") != "0":
            raw = RawLaunch(fn, name, int(kernel.handle), ln.grid, ln.block, ln.smem, fixed, slots)
        return Direct(self, index, kernel, config, fixed, slots, raw)

    def _side(self, index: int, device: torch.device) -> torch.cuda.Stream:
        """The side stream of a device at the greatest stream priority (a side launch's few CTAs are dispatched
        ahead of the main launch's pending ones), made once."""
        s = self._sides.get(index)
        if s is None:
            with self._lock:
                _least, greatest = torch.cuda.Stream.priority_range()
                s = self._sides.setdefault(index, torch.cuda.Stream(device=device, priority=greatest))
        return s


class Direct:
    """One launch made ready for a call signature the runtime trusts (its kernel checked on first use): a call
    passes the tensors' pointers and the scalars positionally and the kernel is launched on torch's current stream
    with nothing else looked up. The serving path: a few-row call is mostly host time."""

    __slots__ = ("_launcher", "_index", "_kernel", "_config", "_fixed", "_ptrs", "_casts", "_launch", "_raw", "calls")

    def __init__(self, launcher: Launcher, index: int, kernel: Any, config: Any, fixed: tuple[Any, ...],
                 slots: tuple[tuple[int, int, Any], ...], raw: RawLaunch | None = None) -> None:
        from cuda.core import launch

        self._launcher, self._index, self._kernel, self._config = launcher, index, kernel, config
        self._fixed = list(fixed)
        self._ptrs = tuple((i, k) for i, k, cast in slots if cast is None)
        self._casts = tuple((i, k, cast) for i, k, cast in slots if cast is not None)
        self._launch = launch
        self._raw = raw  # the driver's cuLaunchKernel on a parameter array made once (rawlaunch.py), or None
        self.calls = 0

    @property
    def raw(self) -> bool:
        """Whether calls go through the driver's cuLaunchKernel directly (else cuda.core's launch)."""
        return self._raw is not None

    def use_cuda_core(self) -> None:
        """Launch by cuda.core from now on (where the raw launch's outputs disagreed with the routed call's)."""
        self._raw = None

    def __call__(self, *values: Any) -> None:
        index, launcher = self._index, self._launcher
        launcher._current(index)
        raw = self._raw
        if raw is not None:
            raw(current_stream_handle(index), values)
        else:
            args = self._fixed.copy()
            for i, k in self._ptrs:
                args[i] = values[k]
            for i, k, cast in self._casts:
                args[i] = cast(values[k])
            self._launch(launcher._stream(index, current_stream_handle(index)), self._config, self._kernel, *args)
        self.calls += 1
