"""The GPU worker: one process per device, fed EvalJobs over a pipe by the parent (evo/measure/run.py).

It implements the gate's device interface (evo/measure/gate.py) with cuda.core: buffers inside guard zones,
random fills of the op's input kinds, random poison, keyed checksums, comparison of every element
against a float64 device reference, CUDA-event timing with the L2 flushed (or a CUDA graph), and the
torch baseline on the same input buffers. A kernel that faults poisons the CUDA context: the worker
reports it and exits, and the parent starts a new one. Imports: numpy and cuda.core/cuda.bindings
(torch optional).
"""

from __future__ import annotations

import importlib
import math
import os
import random
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from evo.measure.carveout import smem_carveout
from evo.measure.flush import l2_flush_mode
from evo.measure.gate import GATE_VERSION, SLOTS, Gate, scale_key
from evo.measure.jobs import CheckStats, EvalJob, Guard, JobResult
from evo.core.spec import TRANSFORMS

DEFAULT_GUARD = Guard(4096, 4096, 0xA5A5A5A5)  # a buffer allocated outside a job's gate (the gate draws its own)
FLUSH_BYTES = 256 << 20  # > 4x the H200's 60 MB L2
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
SLOT = 128  # bytes of scratch per comparison: 2 doubles, 6 u64 stats, 1 u64 guard count, 1 u64 reference checksum
AUDIT_AT = SLOTS * SLOT
PAIR_HOLD_US = 400.0  # concurrent(): the stream held while both plans are queued
MAX_AUDIT = 256  # buffers audited in one read-back
NP_SCALAR = {"ptr": np.uint64, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64,
             "u64": np.uint64, "u8": np.uint8}
SUPPORT = Path(__file__).with_name("cuda") / "support.cu"
# A kernel's static plus dynamic shared memory past 48 KB needs its opt-in to the dynamic part (the
# default cap is 48 KB less its static use): every launch with dynamic shared memory opts in, once per
# job and kernel. (Opting in only past 48 KB of dynamic memory failed on the H200 for exactly 48 KB
# dynamic plus the kernel's few static bytes: rows_bulk's 18 CUDA_ERROR_INVALID_VALUE launches.)
STATIC_SMEM = 48 * 1024
# crowded(): kf_occupy holds all SMs but max(2, SMs // CROWD_FREE_SHARE); the launches beside it must finish within
# CROWD_WAIT_S (a legitimate plan only runs in more waves there); the holder lets go after CROWD_MAX_NS regardless
CROWD_FREE_SHARE = 8
CROWD_WAIT_S = 5.0
CROWD_MAX_NS = 15_000_000_000
CROWD_START_S = 2.0  # how long the holder's CTAs may take to become resident (not all of them: the GPU is shared)


class CudaFault(Exception):
    """A sticky CUDA error: the context is unusable and the process must exit."""


class LaunchFault(Exception):
    """A launch was refused (bad configuration, too many resources); the context is fine."""


def _drv():
    from cuda.bindings import driver

    return driver


def check(result: Any, what: str) -> Any:
    """Unpack a cuda.bindings driver call; sticky errors become CudaFault, others LaunchFault."""
    drv = _drv()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        sticky = _sticky_error()
        raise (CudaFault if sticky else LaunchFault)(f"{what}: {err.name}" + (f" (context: {sticky})" if sticky else ""))
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def _set_attribute(kernel: Any, attr: Any, value: int, device: int, what: str) -> None:
    drv = _drv()
    h = kernel.handle
    if isinstance(h, drv.CUkernel):  # cuda.core loads cubins as libraries: a context-free kernel handle
        check(drv.cuKernelSetAttribute(attr, value, h, drv.CUdevice(device)), what)
    else:
        check(drv.cuFuncSetAttribute(h, attr, value), what)


def _get_attribute(kernel: Any, attr: Any, device: int, what: str) -> int:
    drv = _drv()
    h = kernel.handle
    if isinstance(h, drv.CUkernel):
        return int(check(drv.cuKernelGetAttribute(attr, h, drv.CUdevice(device)), what))
    return int(check(drv.cuFuncGetAttribute(attr, h), what))


def cluster_size(kernel: Any, device: int) -> int:
    """The CTAs of the cluster a kernel's code requires (__cluster_dims__), 1 without one."""
    a = _drv().CUfunction_attribute
    dims = [_get_attribute(kernel, getattr(a, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{d}"), device, "cluster dims")
            for d in ("WIDTH", "HEIGHT", "DEPTH")]
    return max(1, dims[0]) * max(1, dims[1]) * max(1, dims[2])


def allow_smem(kernel: Any, nbytes: int, device: int) -> None:
    """Opt a kernel in to `nbytes` of dynamic shared memory (the driver refuses a launch whose static plus
    dynamic bytes pass STATIC_SMEM without it); a refusal (more than the device has) is a LaunchFault."""
    attr = _drv().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _set_attribute(kernel, attr, nbytes, device, f"allow {nbytes} B of dynamic smem")


def prefer_carveout(kernel: Any, pct: int, device: int) -> None:
    """Ask for `pct` percent of the maximum shared memory as the kernel's L1/shared split (evo/measure/carveout.py)."""
    attr = _drv().CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    _set_attribute(kernel, attr, pct, device, f"prefer a {pct}% shared memory carveout")


def launch_config(grid: Sequence[int], block: Sequence[int], smem: int, pdl: bool = False) -> Any:
    """cuda.core's LaunchConfig; pdl: a programmatic dependent launch, which needs cuda.core >= 1.2.0 (an older
    one cannot set the attribute: a LaunchFault naming it, not a silent launch in order)."""
    from cuda.core import LaunchConfig

    kw = {"programmatic_stream_serialization": True} if pdl else {}
    try:
        return LaunchConfig(grid=tuple(grid), block=tuple(block), shmem_size=int(smem), **kw)
    except TypeError as e:
        raise LaunchFault(f"a programmatic dependent launch (pdl) needs cuda.core >= 1.2.0: {e}") from None


def _sticky_error() -> str:
    """The context's error after a synchronize, by enum; '' when the context is healthy."""
    drv = _drv()
    (err,) = drv.cuCtxSynchronize()
    return "" if err == drv.CUresult.CUDA_SUCCESS else err.name


class DeviceBuffer:
    """Device memory inside guard zones before and after the data, laid out and patterned as its Guard says."""

    guarded = True

    def __init__(self, dev: Any, stream: Any, nbytes: int, guard: Guard = DEFAULT_GUARD) -> None:
        self.nbytes, self.guard = nbytes, guard
        self._buf = dev.allocate(nbytes + guard.before + guard.after, stream=stream)
        self.base = int(self._buf.handle)
        self.ptr = self.base + guard.before

    def zones(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(address, bytes, pattern seed) of the guard zone ahead and of the one behind."""
        g = self.guard
        return (self.base, g.before, g.seed), (self.ptr + self.nbytes, g.after, g.seed ^ 0x9E3779B97F4A7C15)

    def close(self) -> None:
        self._buf.close()


class PeerView:
    """A peer's output tensor, read in place by `compare` (no guard zones: it is torch's memory)."""

    guarded = False

    def __init__(self, ptr: int, nbytes: int, keep: Any) -> None:
        self.ptr, self.nbytes, self._keep = ptr, nbytes, keep  # the tensor stays alive while the view is used


class Worker:
    """Owns the device, the support kernels and the timing machinery."""

    def __init__(self) -> None:
        from cuda.core import Device

        self.dev = Device(0)
        self.dev.set_current()
        self.torch = _try_torch()
        # Our own stream (graph capture is not allowed on the legacy default stream); torch's baseline
        # runs on the same stream through ExternalStream, so one pair of events brackets either.
        self.stream = self.dev.create_stream()
        if self.torch is not None:
            self.torch_stream = self.torch.cuda.ExternalStream(int(self.stream.handle))
        self.arch = "sm_" + "".join(map(str, self.dev.compute_capability))
        self.support = self._compile(SUPPORT.read_text())
        self.op_modules: dict[str, tuple[Any, Any]] = {}
        # (id of the job's ObjectCode, kernel) -> dynamic smem bytes allowed; cleared per job, while its
        # ObjectCode is alive, so ids are not reused. Set before the first (checked) launch, never in a capture.
        self.smem_allowed: dict[tuple[int, str], int] = {}
        self.carveout = smem_carveout()  # None: the driver's choice
        # (id of the ObjectCode, kernel) given the carveout; cleared with smem_allowed
        self.carved: set[tuple[int, str]] = set()
        self._numel = [0] * SLOTS  # elements compared in each scratch slot
        self._side: Any = None  # side_stream()
        self._other: Any = None  # other_stream()
        self._flags: tuple[int, np.ndarray] | None = None  # host_flags()
        self.l2_flush = l2_flush_mode()
        self.flush_buf = self.dev.allocate(FLUSH_BYTES, stream=self.stream)
        self.memset8(int(self.flush_buf.handle), 0, FLUSH_BYTES)
        # compare stats (SLOT bytes per slot), then checksums and guard counts (AUDIT_AT on)
        self.scratch = DeviceBuffer(self.dev, self.stream, AUDIT_AT + 16 * MAX_AUDIT)
        self.ceiling_gbps = self._copy_ceiling()
        self.fingerprint = self._fingerprint()  # after the copy, so the SM clock is read under load

    # ---- building blocks -------------------------------------------------------------------
    def _compile(self, src: str) -> Any:
        import cuda.pathfinder
        from cuda.core import Program, ProgramOptions

        inc = cuda.pathfinder.find_nvidia_header_directory("cudart")
        opts = ProgramOptions(arch=self.arch, std="c++17", include_path=[inc] if inc else [])
        return Program(src, code_type="c++", options=opts).compile("cubin")

    def _op(self, op: str) -> tuple[Any, Any]:
        if op not in self.op_modules:
            mod = importlib.import_module(f"ops.{op}.device")
            self.op_modules[op] = (mod, self._compile(mod.SOURCE.read_text()))
        return self.op_modules[op]

    def launch(self, obj: Any, kernel: str, grid: tuple, block: tuple, smem: int, args: tuple,
               side: bool = False, pdl: bool = False) -> None:
        """Launch with bound args: (kind, value) pairs, ("ptr", address) for buffers; on the worker's stream,
        or with side=True on its side stream (evo.measure.gate.launch_plan); pdl: as a programmatic dependent
        launch (cuda.core >= 1.2.0's LaunchConfig.programmatic_stream_serialization)."""
        from cuda.core import launch
        from cuda.core._utils.cuda_utils import CUDAError

        vals = tuple(NP_SCALAR[k](v) for k, v in args)
        try:
            k = obj.get_kernel(kernel)
            if smem > 0 and self.smem_allowed.get((id(obj), kernel), 0) < smem:
                allow_smem(k, int(smem), self.dev.device_id)
                self.smem_allowed[(id(obj), kernel)] = int(smem)
            if self.carveout is not None and (id(obj), kernel) not in self.carved:
                prefer_carveout(k, self.carveout, self.dev.device_id)
                self.carved.add((id(obj), kernel))
            launch(self.side_stream() if side else self.stream, launch_config(grid, block, smem, pdl), k, *vals)
        except CUDAError as e:
            sticky = _sticky_error()
            raise (CudaFault if sticky else LaunchFault)(f"{kernel}: {e}") from None

    def side_stream(self) -> Any:
        """The stream a plan's side launches run on, made on first use at the context's greatest priority: where
        both streams have CTAs waiting, the block scheduler takes the side stream's first, so a side launch's
        few CTAs become resident beside a main launch's many instead of queueing behind them."""
        if self._side is None:
            from cuda.core import StreamOptions

            _least, greatest = check(_drv().cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
            self._side = self.dev.create_stream(options=StreamOptions(priority=greatest))
        return self._side

    def other_stream(self) -> Any:
        """A second stream of the worker's own (concurrent, crowded), made on first use."""
        if self._other is None:
            self._other = self.dev.create_stream()
        return self._other

    def _on(self, stream: Any, fn: Callable[[], None]) -> None:
        """fn()'s launches (and its plan's marks, forks and joins) on `stream` instead of the worker's stream."""
        main, self.stream = self.stream, stream
        try:
            fn()
        finally:
            self.stream = main

    def concurrent(self, first: Callable[[], None], second: Callable[[], None]) -> None:
        """Both launches queued while the stream is held, then let go together: one host launch costs microseconds,
        so without the hold the first grid, when small, finishes before the second starts."""
        other = self.other_stream()
        self.hold(PAIR_HOLD_US)
        start = self.stream.record()
        first()
        other.wait(start)
        self._on(other, second)
        self.stream.wait(other)

    def _attr(self, name: str) -> int:
        drv = _drv()
        return int(check(drv.cuDeviceGetAttribute(getattr(drv.CUdevice_attribute, name), self.dev.device_id), name))

    def host_flags(self) -> tuple[int, np.ndarray]:
        """4096 words of pinned host memory the device reads and writes (mapped): (device address, host view)."""
        if self._flags is None:
            import ctypes

            drv = _drv()
            n = 4096
            ptr = check(drv.cuMemHostAlloc(4 * n, drv.CU_MEMHOSTALLOC_DEVICEMAP | drv.CU_MEMHOSTALLOC_PORTABLE),
                        "cuMemHostAlloc")
            dptr = check(drv.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer")
            view = np.ctypeslib.as_array((ctypes.c_uint32 * n).from_address(int(ptr)))
            self._flags = (int(dptr), view)
        return self._flags

    def _done(self, event: Any) -> bool:
        drv = _drv()
        (err,) = drv.cuEventQuery(event.handle)
        if err == drv.CUresult.CUDA_ERROR_NOT_READY:
            return False
        if err != drv.CUresult.CUDA_SUCCESS:
            raise CudaFault(f"beside a kernel holding most SMs: {err}")
        return True

    @cached_property
    def crowd_plan(self) -> tuple[int, int, int]:
        """(the device's SMs, how many kf_occupy holds, the shared memory a holder CTA takes: all an SM has less the
        block's reserved share), read from the device once."""
        sms = self._attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        smem = min(self._attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                   self._attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR")
                   - self._attr("CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK"))
        return sms, sms - max(2, sms // CROWD_FREE_SHARE), smem

    def crowded(self, fn: Callable[[], None], obj: Any, kernels: Sequence[str]) -> str:
        if any(cluster_size(obj.get_kernel(k), self.dev.device_id) > 1 for k in set(kernels)):
            fn()  # not crowded, launched alone: the caller checks what it wrote
            return ""
        sms, hold, smem = self.crowd_plan
        dptr, flags = self.host_flags()
        flags[:hold + 1] = 0  # [0] release, [1 + i] CTA i started
        other = self.other_stream()
        other.wait(self.stream.record())  # after what the job queued before (fills, poison)
        if (id(self.support), "kf_occupy") not in self.carved:  # all of its SM's shared memory, whatever the job's
            prefer_carveout(self.support.get_kernel("kf_occupy"), 100, self.dev.device_id)
            self.carved.add((id(self.support), "kf_occupy"))
        self._on(other, lambda: self.launch(self.support, "kf_occupy", (hold, 1, 1), (32, 1, 1), smem,
                                            (("ptr", dptr), ("ptr", dptr + 4), ("u64", CROWD_MAX_NS))))
        until = time.monotonic() + CROWD_START_S
        while not flags[1:hold + 1].all() and time.monotonic() < until:
            time.sleep(1e-4)
        if not flags[1:hold + 1].all():  # other work holds SMs already: this GPU cannot be crowded by us
            flags[0] = 1
            other.sync()
            fn()  # launched beside whatever holds them
            return ""
        fn()
        end = self.stream.record()
        until = time.monotonic() + CROWD_WAIT_S
        done = self._done(end)
        while not done and time.monotonic() < until:
            time.sleep(2e-4)
            done = self._done(end)
        flags[0] = 1  # let go: launches that waited for the held SMs finish now
        other.sync()
        self.stream.sync()
        return "" if done else f"{hold} of {sms} SMs (all their shared memory) for {CROWD_WAIT_S:g} s"

    def mark(self) -> Any:
        return self.stream.record()

    def fork(self, mark: Any) -> None:
        self.side_stream().wait(mark)

    def join(self) -> None:
        self.stream.wait(self.side_stream())

    def sync(self, what: str) -> None:
        sticky = _sticky_error()
        if sticky:
            raise CudaFault(f"{what}: {sticky}")

    def memset8(self, ptr: int, value: int, n: int) -> None:
        check(_drv().cuMemsetD8Async(ptr, value, n, int(self.stream.handle)), "cuMemsetD8Async")

    def to_host(self, ptr: int, nbytes: int, dtype: Any) -> np.ndarray:
        out = np.empty(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
        self.sync("before a read-back")  # an asynchronous fault of the candidate surfaces here as CudaFault
        check(_drv().cuMemcpyDtoH(out.ctypes.data, ptr, nbytes), "cuMemcpyDtoH")
        return out

    def _grid_for(self, n: int) -> tuple[int, int, int]:
        return (max(1, min(132 * 16, (n + 255) // 256)), 1, 1)

    def _support(self, kernel: str, n: int, *args: tuple) -> None:
        self.launch(self.support, kernel, self._grid_for(n), (256, 1, 1), 0, args)

    # ---- the gate's device interface (evo.measure.gate.GateDevice) ------------------------------------
    def alloc(self, nbytes: int, guard: Guard | None = None) -> DeviceBuffer:
        buf = DeviceBuffer(self.dev, self.stream, nbytes, guard or DEFAULT_GUARD)
        self._write_guards(buf)
        return buf

    def _write_guards(self, buf: DeviceBuffer) -> None:
        for start, n, seed in buf.zones():
            self._support("kf_guard_fill", n, ("ptr", start), ("i64", n), ("u64", seed))

    def free(self, buf: DeviceBuffer) -> None:
        if not _sticky_error():
            buf.close()

    def fill(self, buf: DeviceBuffer, dtype: str, numel: int, row_len: int, spec: Any, seed: int) -> None:
        if spec.offsets:  # n + 1 int32 offsets ending at spec.end (bound per cell): one thread walks them
            if dtype != "int32":
                raise ValueError(f"an offsets fill needs an int32 tensor, got {dtype}")
            self.launch(self.support, "kf_offsets_i32", (1, 1, 1), (32, 1, 1), 0,
                        (("ptr", buf.ptr), ("i64", numel), ("i64", spec.end), ("u64", seed * 7919 + 17)))
            return
        row_len = max(1, row_len)
        self._support(f"kf_fill_{SHORT[dtype]}", numel, ("ptr", buf.ptr), ("i64", numel), ("u64", seed * 7919 + 17),
                      ("f32", spec.mean), ("f32", spec.std), ("i32", row_len), ("f32", spec.row_shift),
                      ("f32", spec.zero_rows), ("i32", int(spec.constant_rows)), ("f32", spec.outlier),
                      ("i32", TRANSFORMS.index(spec.transform)))
        if spec.transform == "l2norm_rows":  # a second pass: one warp per row divides it by its norm
            rows = numel // row_len
            self.launch(self.support, f"kf_l2norm_rows_{SHORT[dtype]}", (max(1, min(132 * 64, (rows + 7) // 8)), 1, 1),
                        (256, 1, 1), 0, (("ptr", buf.ptr), ("i64", rows), ("i32", row_len)))

    def perturb(self, buf: DeviceBuffer, dtype: str, numel: int, every: int, amount: float, seed: int) -> None:
        self._support(f"kf_perturb_{SHORT[dtype]}", numel, ("ptr", buf.ptr), ("i64", numel), ("u64", seed),
                      ("i32", every), ("f32", amount))

    def poison(self, buf: DeviceBuffer, seed: int) -> None:
        """A fresh random pattern over the data, then the buffer's guard pattern over both guard zones."""
        words = (buf.nbytes + 3) // 4
        self._support("kf_poison", words, ("ptr", buf.ptr), ("i64", words), ("u64", seed))
        self._write_guards(buf)

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer) -> None:
        check(_drv().cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.nbytes, int(self.stream.handle)), "cuMemcpyDtoDAsync")

    def copy_range(self, dst: DeviceBuffer, dst_off: int, src: DeviceBuffer, src_off: int, nbytes: int) -> None:
        if dst_off < 0 or src_off < 0 or dst_off + nbytes > dst.nbytes or src_off + nbytes > src.nbytes:
            raise ValueError(f"copy_range: {nbytes} bytes at {src_off} -> {dst_off} leave a buffer "
                             f"({src.nbytes} -> {dst.nbytes} bytes)")
        check(_drv().cuMemcpyDtoDAsync(dst.ptr + dst_off, src.ptr + src_off, nbytes, int(self.stream.handle)),
              "cuMemcpyDtoDAsync")

    def _guards(self, buf: DeviceBuffer, counter: int) -> None:
        for start, n, seed in buf.zones():
            self._support("kf_guard_check", n, ("ptr", start), ("i64", n), ("u64", seed), ("ptr", counter))

    def audit(self, bufs: Sequence[DeviceBuffer], key: int) -> list[tuple[int, int]]:
        """(keyed checksum, guard-zone bytes hit) per buffer, with one read-back."""
        out: list[tuple[int, int]] = []
        for start in range(0, len(bufs), MAX_AUDIT):
            chunk = bufs[start:start + MAX_AUDIT]
            area = self.scratch.ptr + AUDIT_AT
            self.memset8(area, 0, 16 * len(chunk))
            for i, buf in enumerate(chunk):
                words = (buf.nbytes + 3) // 4
                self._support("kf_checksum", words, ("ptr", buf.ptr), ("i64", buf.nbytes), ("u64", key),
                              ("ptr", area + 16 * i))
                self._guards(buf, area + 16 * i + 8)
            got = self.to_host(area, 16 * len(chunk), np.uint64)
            out += [(int(got[2 * i]), int(got[2 * i + 1])) for i in range(len(chunk))]
        return out

    def compare(self, out: DeviceBuffer, ref: DeviceBuffer, dtype: str, numel: int, row_len: int, tail: int,
                atol: float, rtol: float, slot: int, scale: DeviceBuffer | None = None, key: int = 0) -> None:
        st = self.scratch.ptr + SLOT * slot
        self.memset8(st, 0, SLOT)
        check(_drv().cuMemsetD32Async(st + 16 + 32, 0xFFFFFFFF, 2, int(self.stream.handle)), "memset")
        self._support(f"kf_compare_{SHORT[dtype]}", numel, ("ptr", out.ptr), ("ptr", ref.ptr),
                      ("ptr", scale.ptr if scale is not None else 0), ("i64", numel),
                      ("i32", row_len), ("i32", tail), ("f64", atol), ("f64", rtol), ("ptr", st), ("ptr", st + 16))
        if out.guarded:  # a peer's tensor (PeerView) has no guard zones of ours around it
            self._guards(out, st + 64)
        if key:  # the reference's keyed checksum (and its scale's, keyed apart) into the slot's word 9
            nbytes = 8 * numel  # float64
            self._support("kf_checksum", nbytes // 4, ("ptr", ref.ptr), ("i64", nbytes), ("u64", key), ("ptr", st + 72))
            if scale is not None:
                self._support("kf_checksum", nbytes // 4, ("ptr", scale.ptr), ("i64", nbytes), ("u64", scale_key(key)),
                              ("ptr", st + 72))
        self._numel[slot] = numel

    def collect(self, n: int) -> list[CheckStats]:
        raw = self.to_host(self.scratch.ptr, SLOT * n, np.uint64).reshape(n, SLOT // 8)
        out = []
        for i in range(n):
            d = raw[i, :2].view(np.float64)
            u = raw[i, 2:9]
            rel = math.sqrt(d[0] / d[1]) if d[1] > 0 else (0.0 if d[0] == 0 else math.inf)
            out.append(CheckStats("", self._numel[i], int(u[0]), int(u[1]), int(u[2]), int(u[3]),
                                  int(u[4]) if u[4] != np.uint64(2**64 - 1) else -1,
                                  float(u[5:6].view(np.float64)[0]), rel, int(raw[i, 8]), int(raw[i, 9])))
        return out

    def hold(self, us: float) -> None:
        """One warp spinning on the global timer for `us` microseconds on the stream."""
        self.launch(self.support, "kf_hold", (1, 1, 1), (32, 1, 1), 0, (("u64", int(us * 1000)),))

    def reset_l2(self) -> None:
        """Persisting L2 lines back to normal, then every line evicted (flush_l2)."""
        check(_drv().cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
        self.flush_l2()

    def flush_l2(self) -> None:
        """Every L2 line evicted by 256 MiB of reads (kf_read_flush: no dirty line left for the timed call to
        write back) or of writes (a memset), as self.l2_flush says."""
        if self.l2_flush == "read":
            self.launch(self.support, "kf_read_flush", (132 * 4, 1, 1), (512, 1, 1), 0,
                        (("ptr", int(self.flush_buf.handle)), ("i64", FLUSH_BYTES // 16)))
        else:
            check(_drv().cuMemsetD32Async(int(self.flush_buf.handle), 0, FLUSH_BYTES // 4, int(self.stream.handle)),
                  "flush")

    def _events(self, n: int) -> list:
        from cuda.core import EventOptions

        return [self.dev.create_event(options=EventOptions(timing_enabled=True)) for _ in range(n)]

    def time(self, fns: Sequence[Callable[[int], None]], preps: Sequence[Callable[[int], None]], n: int, per: int,
             after: Callable[[int], None]) -> list[list[float]]:
        """n interleaved samples of each fn (alternating order), each after its prep, in us per call."""
        out: list[list[float]] = [[] for _ in fns]
        evs = self._events(2 * len(fns))
        for i in range(n):
            order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
            for j in order:
                preps[j](i)
                self.stream.record(evs[2 * j])
                fns[j](i)
                self.stream.record(evs[2 * j + 1])
            self.stream.sync()
            for j in range(len(fns)):
                out[j].append((evs[2 * j + 1] - evs[2 * j]) * 1e3 / per)
            after(i)
        self.sync("timing")
        return out

    def capture(self, fn: Callable[[], None]) -> Callable[[int], None]:
        """fn's launches captured into one CUDA graph; returns a replay."""
        drv = _drv()
        h = int(self.stream.handle)
        check(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")
        fn()
        graph = check(drv.cuStreamEndCapture(h), "cuStreamEndCapture")
        exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        return lambda _i: check(drv.cuGraphLaunch(exe, h), "cuGraphLaunch")

    def baselines(self, job: EvalJob, sets: Sequence[dict[str, DeviceBuffer]], check_peer: Callable[[str, Any], str]
                  ) -> tuple[list[tuple[str, Callable[[int], None]]], dict[str, str]]:
        """The op's baselines (job.baselines, or the hooks' first), each reading the candidate's own input
        buffers (set i); a baseline that cannot be had, or whose result for set 0 fails `check_peer` against
        the reference, is reported absent with the reason, never faked."""
        mod, _ = self._op(job.op)
        names = job.baselines
        if self.torch is None:
            return [], {n: "torch with CUDA is not importable" for n in names}
        torch = self.torch
        offered = mod.baselines(torch, names)
        ins = [b for b in job.buffers if b.role == "in"]
        views = [{b.name: _torch_view(torch, s[b.name], b.dtype, b.shape) for b in ins} for s in sets]
        scalars = dict(job.scalars)
        present, absent = [], {}
        for name, fn in offered.items():
            if isinstance(fn, str):
                absent[name] = fn
                continue
            kept: list[Any] = [None] * len(sets)

            def raw(i: int, fn: Any = fn, kept: list = kept) -> None:  # no stream switch: graph capture needs that
                # Keep each set's result alive, so a baseline writes a distinct output per set as the
                # candidate does (a reused output stays in L2 across graph launches and flatters it).
                kept[i] = fn(views[i], scalars)

            try:  # first call outside any timing or capture: compiles (torch.compile, autotuners) happen here
                with torch.cuda.stream(self.torch_stream):
                    for i in range(len(sets)):
                        raw(i)
                self.sync(f"baseline {name}")
            except CudaFault:
                raise
            except Exception as e:  # a peer that fails on this cell is absent, with its own words
                absent[name] = f"{type(e).__name__}: {str(e)[:200]}"
                continue
            wrong = check_peer(name, kept[0])  # outside the try: a result the op's hook cannot map is a harness error
            if wrong:
                absent[name] = wrong
                continue

            def run(i: int, raw: Any = raw) -> None:
                with torch.cuda.stream(self.torch_stream):
                    raw(i)

            run.raw = raw  # type: ignore[attr-defined]
            present.append((name, run))
        return present, absent

    def peer_view(self, tensor: Any) -> tuple[PeerView, str]:
        """A peer's output tensor (contiguous, in place when it is) as a buffer `compare` reads."""
        if not isinstance(tensor, self.torch.Tensor) or not tensor.is_cuda:
            raise TypeError(f"a peer output must be a CUDA torch.Tensor, got {type(tensor).__name__}")
        with self.torch.cuda.stream(self.torch_stream):
            t = tensor.detach().contiguous()
        return PeerView(t.data_ptr(), t.numel() * t.element_size(), t), str(t.dtype).removeprefix("torch.")

    def capture_baseline(self, fn: Callable[[int], None], order: Sequence[int]) -> Callable[[int], None]:
        """The baseline over the sets in `order`, captured into one torch CUDA graph."""
        torch = self.torch
        raw = fn.raw  # type: ignore[attr-defined]
        self.stream.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # captures on torch's own side stream
            for j in order:
                raw(j)

        def replay(_i: int) -> None:
            with torch.cuda.stream(self.torch_stream):
                g.replay()

        return replay

    # ---- the copy ceiling and the fingerprint ----------------------------------------------------
    def _copy_ceiling(self) -> float:
        """Device-to-device copy bandwidth (bytes read + written), median of 20."""
        n = 2 << 30
        a = self.dev.allocate(n, stream=self.stream)
        b = self.dev.allocate(n, stream=self.stream)
        h = int(self.stream.handle)

        def copy(_: int) -> None:
            check(_drv().cuMemcpyDtoDAsync(int(b.handle), int(a.handle), n, h), "cuMemcpyDtoDAsync")

        self.memset8(int(a.handle), 1, n)
        (t,) = self.time([copy], [lambda i: self.reset_l2()], 20, 1, lambda i: None)
        a.close()
        b.close()
        return 2 * n / (float(np.median(t)) * 1e-6) / 1e9

    def _fingerprint(self) -> tuple[tuple[str, str], ...]:
        drv = _drv()
        fp = {
            "gpu": self.dev.name,
            "arch": self.arch,
            "driver_cuda": str(check(drv.cuDriverGetVersion(), "cuDriverGetVersion")),
            "cuda_bindings": _version("cuda-bindings"),
            "cuda_core": _version("cuda-core"),
            "numpy": np.__version__,
            "torch": getattr(self.torch, "__version__", "absent"),
            "python": sys.version.split()[0],
            "gate": GATE_VERSION,
            "l2_flush": self.l2_flush,
        }
        if self.carveout is not None:
            fp["smem_carveout"] = str(self.carveout)
        for dist in ("triton", "liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "fla-core"):  # the peers' versions
            fp[dist.replace("-", "_")] = _version(dist)
        try:
            from cuda.bindings import nvrtc

            _, major, minor = nvrtc.nvrtcVersion()
            fp["nvrtc_worker"] = f"{major}.{minor}"
        except ImportError:
            fp["nvrtc_worker"] = "absent"
        fp.update(_smi())
        return tuple(sorted(fp.items()))

    # ---- one job -----------------------------------------------------------------------------
    def run(self, job: EvalJob) -> JobResult:
        from cuda.core import ObjectCode

        mod, ref_obj = self._op(job.op)
        self.smem_allowed.clear()
        self.carved.clear()
        try:
            obj = ObjectCode.from_cubin(job.cubin)
        except Exception as e:  # a cubin the driver rejects (wrong arch) is a launch error
            return JobResult(job.job_id, "launch", f"cubin rejected: {e}", fingerprint=self.fingerprint)
        # Host randomness the kernel cannot see: launch order, poison, checked samples, checksum key.
        rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        gate = Gate(self, job, obj, ref_obj, mod, rng, self.fingerprint, self.ceiling_gbps)
        try:
            return gate.run()
        except LaunchFault as e:
            gate.close()
            return JobResult(job.job_id, "launch", str(e), fingerprint=self.fingerprint)


def _torch_view(torch: Any, buf: DeviceBuffer, dtype: str, shape: tuple[int, ...]) -> Any:
    """A torch tensor over a worker buffer (no copy): the baseline reads the candidate's inputs."""
    raw = {"float32": ("<f4", torch.float32), "float16": ("<f2", torch.float16), "bfloat16": ("<i2", torch.bfloat16),
           "int32": ("<i4", torch.int32)}
    typestr, tdt = raw[dtype]

    class _Cai:
        __cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (buf.ptr, False), "version": 3,
                                    "strides": None, "stream": None}

    return torch.as_tensor(_Cai(), device="cuda").view(tdt)


def _try_torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def _smi() -> dict[str, str]:
    """SM clock, max SM clock and driver from nvidia-smi (absent where it is not installed)."""
    q = "clocks.sm,clocks.max.sm,clocks.mem,driver_version"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return {"sm_clock_mhz": "unknown", "driver": "unknown"}
    sm, smax, mem, drv = [s.strip() for s in out.split(",")]
    return {"sm_clock_mhz": sm, "sm_clock_max_mhz": smax, "mem_clock_mhz": mem, "driver": drv}


def serve(conn: Any, device: str) -> None:
    """Worker process entry: set the device, then answer jobs until the pipe closes."""
    os.environ["CUDA_VISIBLE_DEVICES"] = device
    try:
        w = Worker()
    except Exception as e:  # report start-up failures (no GPU, no driver) to the parent, then exit
        conn.send(("dead", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", dict(w.fingerprint), w.ceiling_gbps))
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        try:
            conn.send(("result", w.run(job)))
        except CudaFault as e:
            conn.send(("result", JobResult(job.job_id, "crash", str(e), fingerprint=w.fingerprint)))
            conn.close()
            os._exit(3)  # the context is poisoned; the parent starts a fresh worker
        except Exception:  # a bug in the harness itself: the parent raises it instead of blaming the candidate
            import traceback

            conn.send(("bug", traceback.format_exc()))
            conn.close()
            os._exit(4)
