"""The GPU worker: one process per device, fed EvalJobs over a pipe by the parent (evo/run.py).

It loads cubins, makes fresh random inputs on the device, poisons outputs, guards them with canary
zones, compares every element against a float64 device reference, and times with CUDA events (L2
flushed before every sample, or a CUDA graph for short kernels), interleaved with torch's baseline
when torch is importable. A kernel that faults poisons the CUDA context: the worker reports it and
exits, and the parent starts a new one. Imports: numpy and cuda.core/cuda.bindings (torch optional).
"""

from __future__ import annotations

import importlib
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from evo.jobs import CheckStats, EvalJob, JobResult

GUARD = 4096  # bytes of canary before and after every buffer
CANARY = 0xA5
FLUSH_BYTES = 256 << 20  # > 4x the H200's 60 MB L2
ROTATE_BYTES = 192 << 20  # rotating input sets cover at least this much in graph mode
NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
NP_SCALAR = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64, "u64": np.uint64}
SUPPORT = Path(__file__).with_name("cuda") / "support.cu"


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


def _sticky_error() -> str:
    """The context's error after a synchronize, by enum; '' when the context is healthy."""
    drv = _drv()
    (err,) = drv.cuCtxSynchronize()
    return "" if err == drv.CUresult.CUDA_SUCCESS else err.name


class DeviceBuffer:
    """Device memory with canary zones before and after the data."""

    def __init__(self, dev: Any, stream: Any, nbytes: int) -> None:
        self.nbytes = nbytes
        self._buf = dev.allocate(nbytes + 2 * GUARD, stream=stream)
        self.base = int(self._buf.handle)
        self.ptr = self.base + GUARD

    def close(self) -> None:
        self._buf.close()


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
        self.flush_buf = self.dev.allocate(FLUSH_BYTES, stream=self.stream)
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

    def launch(self, obj: Any, kernel: str, grid: tuple, block: tuple, smem: int, args: tuple) -> None:
        from cuda.core import LaunchConfig, launch
        from cuda.core._utils.cuda_utils import CUDAError

        try:
            k = obj.get_kernel(kernel)
            launch(self.stream, LaunchConfig(grid=tuple(grid), block=tuple(block), shmem_size=int(smem)), k, *args)
        except CUDAError as e:
            sticky = _sticky_error()
            raise (CudaFault if sticky else LaunchFault)(f"{kernel}: {e}") from None

    def sync(self, what: str) -> None:
        sticky = _sticky_error()
        if sticky:
            raise CudaFault(f"{what}: {sticky}")

    def memset8(self, ptr: int, value: int, n: int) -> None:
        check(_drv().cuMemsetD8Async(ptr, value, n, int(self.stream.handle)), "cuMemsetD8Async")

    def poison(self, buf: DeviceBuffer, dtype: str) -> None:
        """Fill the data with NaN and the guards with the canary pattern."""
        drv = _drv()
        self.memset8(buf.base, CANARY, GUARD)
        self.memset8(buf.ptr + buf.nbytes, CANARY, GUARD)
        h = int(self.stream.handle)
        if NBYTES[dtype] == 4:
            check(drv.cuMemsetD32Async(buf.ptr, 0x7FFFFFFF, buf.nbytes // 4, h), "cuMemsetD32Async")
        else:
            check(drv.cuMemsetD16Async(buf.ptr, 0x7FFF, buf.nbytes // 2, h), "cuMemsetD16Async")

    def flush_l2(self) -> None:
        check(_drv().cuMemsetD32Async(int(self.flush_buf.handle), 0, FLUSH_BYTES // 4, int(self.stream.handle)), "flush")

    def to_host(self, ptr: int, nbytes: int, dtype: Any) -> np.ndarray:
        out = np.empty(nbytes // np.dtype(dtype).itemsize, dtype=dtype)
        self.stream.sync()
        check(_drv().cuMemcpyDtoH(out.ctypes.data, ptr, nbytes), "cuMemcpyDtoH")
        return out

    def _grid_for(self, n: int) -> tuple[int, int, int]:
        return (max(1, min(132 * 16, (n + 255) // 256)), 1, 1)

    def canary_bad(self, buf: DeviceBuffer, counter: DeviceBuffer) -> int:
        self.memset8(counter.ptr, 0, 8)
        for start in (buf.base, buf.ptr + buf.nbytes):
            self.launch(self.support, "kf_canary", self._grid_for(GUARD), (256, 1, 1), 0,
                        (np.uint64(start), np.int64(GUARD), np.uint8(CANARY), np.uint64(counter.ptr)))
        return int(self.to_host(counter.ptr, 8, np.uint64)[0])

    # ---- events and timing -------------------------------------------------------------------
    def _events(self, n: int) -> list:
        from cuda.core import EventOptions

        return [self.dev.create_event(options=EventOptions(timing_enabled=True)) for _ in range(n)]

    def time_samples(self, fns: list[Callable[[int], None]], n: int, flush: bool, per: int = 1) -> list[list[float]]:
        """n interleaved samples of each fn (alternating order), in microseconds per call."""
        out: list[list[float]] = [[] for _ in fns]
        evs = self._events(2 * len(fns))
        for i in range(n):
            order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
            for j in order:
                if flush:
                    self.flush_l2()
                self.stream.record(evs[2 * j])
                fns[j](i)
                self.stream.record(evs[2 * j + 1])
            self.stream.sync()
            for j in range(len(fns)):
                out[j].append((evs[2 * j + 1] - evs[2 * j]) * 1e3 / per)
        self.sync("timing")
        return out

    def _copy_ceiling(self) -> float:
        """Device-to-device copy bandwidth (bytes read + written), median of 20."""
        n = 2 << 30
        a = self.dev.allocate(n, stream=self.stream)
        b = self.dev.allocate(n, stream=self.stream)
        h = int(self.stream.handle)

        def copy(_: int) -> None:
            check(_drv().cuMemcpyDtoDAsync(int(b.handle), int(a.handle), n, h), "cuMemcpyDtoDAsync")

        self.memset8(int(a.handle), 1, n)
        (t,) = self.time_samples([copy], 20, flush=True)
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
        }
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
        try:
            obj = ObjectCode.from_cubin(job.cubin)
        except Exception as e:  # a cubin the driver rejects (wrong arch) is a launch error
            return JobResult(job.job_id, "launch", f"cubin rejected: {e}", fingerprint=self.fingerprint)
        dims = dict(job.dims)
        dtypes = dict(job.dtypes)
        bufs: dict[str, DeviceBuffer] = {}
        try:
            return self._run(job, mod, ref_obj, obj, dims, dtypes, bufs)
        except LaunchFault as e:
            return JobResult(job.job_id, "launch", str(e), fingerprint=self.fingerprint)
        finally:
            if not _sticky_error():
                for b in bufs.values():
                    b.close()

    def _run(self, job, mod, ref_obj, obj, dims, dtypes, bufs) -> JobResult:
        ins = [b for b in job.buffers if b.role == "in"]
        outs = [b for b in job.buffers if b.role == "out"]
        wss = [b for b in job.buffers if b.role == "ws"]
        in_bytes = sum(b.numel * NBYTES[b.dtype] for b in ins)
        scalars = dict(job.scalars)
        nsets = len(job.kinds)
        if job.timing is not None:
            nsets = max(nsets, min(32, math.ceil(ROTATE_BYTES / max(1, in_bytes))))
        kinds = [job.kinds[i] if i < len(job.kinds) else job.kinds[0] for i in range(nsets)]
        sets = []
        for s in range(nsets):
            one = {}
            for b in ins:
                one[b.name] = bufs[f"{b.name}#{s}"] = DeviceBuffer(self.dev, self.stream, b.numel * NBYTES[b.dtype])
            sets.append(one)
            self._fill(mod, kinds[s], dims, ins, one, job.seed * 1000 + s)
        for b in outs + wss:
            bufs[b.name] = DeviceBuffer(self.dev, self.stream, max(1, b.numel * NBYTES.get(b.dtype, 1)))
        for b in outs:
            bufs[f"ref:{b.name}"] = DeviceBuffer(self.dev, self.stream, b.numel * 8)
        bufs["stats"] = DeviceBuffer(self.dev, self.stream, 64)

        def bind(args: tuple, s: int) -> tuple:
            vals = []
            for kind, v in args:
                if kind == "buf":
                    b = sets[s].get(v) if v in sets[s] else bufs[v]
                    vals.append(np.uint64(b.ptr))
                else:
                    vals.append(NP_SCALAR[kind](v))
            return tuple(vals)

        bound = [[bind(lj.args, s) for lj in job.launches] for s in range(nsets)]

        last_set = [0]  # the input set the most recent candidate launch read

        def candidate(i: int) -> None:
            s = i % nsets
            last_set[0] = s
            for lj, args in zip(job.launches, bound[s]):
                self.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args)

        checks = []
        for s in range(len(job.kinds)):
            for b in outs:
                self.poison(bufs[b.name], b.dtype)
            candidate(s)
            self.sync("candidate")
            checks.append((s, self._check(job, mod, ref_obj, outs, bufs, sets, s, dims, dtypes, scalars, bind)))
        result = JobResult(job.job_id, checks=tuple(checks), fingerprint=self.fingerprint, ceiling_gbps=self.ceiling_gbps)
        if job.timing is None or any(_failed(c, job) for _, cs in checks for c in cs):
            return result
        return self._time(job, mod, candidate, last_set, nsets, outs, bufs, sets, dims, dtypes, scalars, bind, result,
                          ref_obj)

    def _fill(self, mod, kind, dims, ins, one, seed) -> None:
        spec = mod.fills(kind, dims)
        for i, b in enumerate(ins):
            mean, std, row_len, shift = spec[b.name]
            n = b.numel
            self.launch(self.support, f"kf_fill_{SHORT[b.dtype]}", self._grid_for(n), (256, 1, 1), 0,
                        (np.uint64(one[b.name].ptr), np.int64(n), np.uint64(seed * 7919 + i),
                         np.float32(mean), np.float32(std), np.int32(row_len), np.float32(shift)))

    def _check(self, job, mod, ref_obj, outs, bufs, sets, s, dims, dtypes, scalars, bind) -> tuple[CheckStats, ...]:
        for kernel, grid, block, args in mod.reference(dims, dtypes, scalars):
            self.launch(ref_obj, kernel, grid, block, 0, bind(args, s))
        stats = []
        tol = dict(job.tolerances)
        for b in outs:
            st = bufs["stats"]
            self.memset8(st.ptr, 0, 64)
            check(_drv().cuMemsetD32Async(st.ptr + 16 + 32, 0xFFFFFFFF, 2, int(self.stream.handle)), "memset")
            atol, rtol, _ = tol[b.name]
            row_len = b.shape[-1]
            self.launch(self.support, f"kf_compare_{SHORT[b.dtype]}", self._grid_for(b.numel), (256, 1, 1), 0,
                        (np.uint64(bufs[b.name].ptr), np.uint64(bufs[f"ref:{b.name}"].ptr), np.int64(b.numel),
                         np.int32(row_len), np.int32(mod.tail_width(dims)), np.float64(atol), np.float64(rtol),
                         np.uint64(st.ptr), np.uint64(st.ptr + 16)))
            d = self.to_host(st.ptr, 16, np.float64)
            u = self.to_host(st.ptr + 16, 48, np.uint64)
            canary = self.canary_bad(bufs[b.name], bufs["stats"])
            rel = math.sqrt(d[0] / d[1]) if d[1] > 0 else (0.0 if d[0] == 0 else math.inf)
            stats.append(CheckStats(b.name, b.numel, int(u[0]), int(u[1]), int(u[2]), int(u[3]),
                                    int(u[4]) if u[4] != np.uint64(2**64 - 1) else -1,
                                    float(np.array([u[5]], dtype=np.uint64).view(np.float64)[0]), rel, canary))
        return tuple(stats)

    def _time(self, job, mod, candidate, last_set, nsets, outs, bufs, sets, dims, dtypes, scalars, bind, result, ref_obj) -> JobResult:
        t = job.timing
        for i in range(t.warmup):
            candidate(i % nsets)
        self.sync("warmup")
        base_fn = self._baseline(mod, job, dims)
        probe = self.time_samples([candidate], 5, flush=True)[0]
        graph = float(np.median(probe)) < t.graph_below_us
        fns = [candidate] + ([base_fn] if base_fn else [])
        per = 1
        if graph:
            fns = [self._graph(candidate, nsets, t.graph_launches)] + (
                [self._torch_graph(t.graph_launches)] if base_fn else [])
            per = t.graph_launches
        samples = self.time_samples(fns, t.min_samples, flush=True, per=per)
        while len(samples[0]) < t.max_samples and _spread(samples[0]) > t.spread:
            more = self.time_samples(fns, 50, flush=True, per=per)
            samples = [a + b for a, b in zip(samples, more)]
        # The output of the last timed launch must match the reference of the set it read.
        # (in graph mode every replay ends with the set of the last captured launch)
        final = self._check(job, mod, ref_obj, outs, bufs, sets, last_set[0], dims, dtypes, scalars, bind)
        return JobResult(
            job.job_id, checks=result.checks + ((-1, final),), times_us=tuple(samples[0]),
            baseline_us=tuple(samples[1]) if base_fn else (), baseline_name=self._baseline_name if base_fn else "",
            graph=graph, fingerprint=self.fingerprint, ceiling_gbps=self.ceiling_gbps,
        )

    def _graph(self, candidate: Callable[[int], None], nsets: int, launches: int) -> Callable[[int], None]:
        """Capture `launches` candidate launches (rotating input sets) into one CUDA graph."""
        drv = _drv()
        h = int(self.stream.handle)
        check(drv.cuStreamBeginCapture(h, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")
        for i in range(launches):
            candidate(i % nsets)
        graph = check(drv.cuStreamEndCapture(h), "cuStreamEndCapture")
        exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        return lambda _i: check(drv.cuGraphLaunch(exe, h), "cuGraphLaunch")

    def _baseline(self, mod: Any, job: EvalJob, dims: dict) -> Callable[[int], None] | None:
        if not job.baseline or self.torch is None or not hasattr(mod, "baseline"):
            return None
        torch = self.torch
        name, fn = mod.baseline(torch)
        self._baseline_name = name
        tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
        ins = [b for b in job.buffers if b.role == "in"]
        nbytes = sum(b.numel * NBYTES[b.dtype] for b in ins)
        nsets = max(3, min(32, math.ceil(ROTATE_BYTES / max(1, nbytes))))
        sets = [{b.name: torch.randn(b.shape, device="cuda", dtype=tdt[b.dtype]) for b in ins} for _ in range(nsets)]
        scalars = dict(job.scalars)
        self._base_raw = lambda i: fn(sets[i % nsets], scalars)  # no stream switch: graph capture needs that

        def run(i: int) -> None:
            with torch.cuda.stream(self.torch_stream):
                self._base_raw(i)

        return run

    def _torch_graph(self, launches: int) -> Callable[[int], None]:
        torch = self.torch
        fn = self._base_raw
        self.stream.sync()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # captures on torch's own side stream
            for i in range(launches):
                fn(i)

        def replay(_i: int) -> None:
            with torch.cuda.stream(self.torch_stream):
                g.replay()

        return replay


def _failed(c: CheckStats, job: EvalJob) -> bool:
    rel = dict(job.tolerances)[c.output][2]
    return c.bad > 0 or c.nonfinite > 0 or c.canary_bad > 0 or not (c.rel_norm_err <= rel)


def _spread(xs: list[float]) -> float:
    p10, p50, p90 = np.percentile(xs, [10, 50, 90])
    return (p90 - p10) / p50 if p50 > 0 else math.inf


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
