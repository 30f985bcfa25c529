"""A numpy GateDevice: the gate's rules run on the CPU against fake kernels written in Python.

Memory is a set of byte arrays at fake addresses, each inside guard zones laid out and patterned as the
gate draws them (evo.measure.jobs.Guard); a fake kernel gets
the bound launch args and reads or writes any buffer through `view(ptr, dtype, n)`, as a real
kernel may address any device memory. Time is a counter the kernels advance by what they declare,
so a kernel that skips work looks fast, as it would on the GPU.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from evo.measure.gate import Gate, scale_key
from evo.measure.jobs import BufferDecl, CheckStats, EvalJob, Guard, JobResult, LaunchJob, Timing
from ops.rmsnorm import device as rms_device
from ops.rmsnorm.spec import SPEC
from evo.core.spec import Cell, DType, from_device_bytes, to_device_bytes

DEFAULT_GUARD = Guard(256, 64, 0xA5)  # a buffer allocated without a guard of the gate's (a peer's view)
NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "uint8": np.uint8,
      "uint32": np.uint32, "int32": np.int32}
BANDWIDTH_GBPS = 3000.0  # what an honest fake kernel achieves; the fake copy ceiling is 4000
SYNC_US = 10.0  # what a host round trip (a sync, then the next launch queued) leaves the device idle


def guard_pattern(guard: Guard) -> np.ndarray:
    """The bytes of a buffer's guard zones, the one ahead then the one behind."""
    return np.random.default_rng(guard.seed).integers(0, 256, guard.before + guard.after, dtype=np.uint8)


@dataclass
class FakeBuf:
    ptr: int
    nbytes: int
    mem: np.ndarray = field(repr=False)  # the guard zone ahead, the data, the guard zone behind
    guard: Guard = DEFAULT_GUARD
    pattern: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8), repr=False)

    @property
    def base(self) -> int:
        return self.ptr - self.guard.before

    def guards(self) -> np.ndarray:
        """The guard zones' bytes as they are now, ahead then behind."""
        return np.concatenate([self.mem[:self.guard.before], self.mem[self.guard.before + self.nbytes:]])

    def restore_guards(self) -> None:
        self.mem[:self.guard.before] = self.pattern[:self.guard.before]
        self.mem[self.guard.before + self.nbytes:] = self.pattern[self.guard.before:]


Kernel = Callable[["FakeDevice", tuple], Any]  # returns None, or a generator: a kernel in steps (see concurrent)
CROWD_FREE_CTAS = 16  # what a crowded fake GPU can hold resident beside the kernel that holds the rest


class FakeHang(Exception):
    """A fake kernel waits for CTAs that cannot be resident (FakeDevice.grid_sync on a crowded device)."""


@dataclass(frozen=True)
class FakeTensor:
    """A peer's output in a dtype numpy lacks (bfloat16): its bit patterns and the dtype's name."""

    bits: np.ndarray
    dtype: str


@dataclass(frozen=True)
class FakePeer:
    """A fake peer: its cost in us per call, and what it returns for one input set's buffers (the op
    hook's peer_outputs maps it; default: RMSNorm's y, computed honestly)."""

    cost: float
    output: Callable[["FakeDevice", EvalJob, dict[str, Any]], Any] | None = None


class FakeDevice:
    """Implements evo.measure.gate.GateDevice with numpy."""

    def __init__(self, kernels: dict[str, Kernel], baseline_us: float | None = 10.0, ceiling_gbps: float = 4000.0,
                 seed: int = 0, peers: dict[str, float | str | FakePeer] | None = None) -> None:
        self.kernels = kernels
        self.bufs: dict[int, FakeBuf] = {}
        self.next_ptr = 1 << 20
        self.clock = 0.0  # microseconds
        self.baseline_us = baseline_us
        self.peers = dict(peers or {})  # more baselines: name -> cost in us (or a FakePeer), or why it is absent
        self.peer_calls: dict[str, int] = {}
        self.ceiling_gbps = ceiling_gbps
        self.launches = 0  # candidate launches
        self.pdl_kernels: list[str] = []  # the kernels launched as programmatic dependent launches, in order
        self.baseline_calls = 0
        self.resets = 0
        self.holds: list[float] = []  # hold(us) calls: the stream held busy before a timed call
        self.state: dict[str, Any] = {}  # a fake kernel's "__device__" globals, kept across launches
        self._capturing: list | None = None
        self.slots: dict[int, CheckStats] = {}
        self.readbacks = 0
        self.rng = np.random.default_rng(seed)
        self._queue: list[list[tuple]] | None = None  # concurrent(): the launches of each stream, run interleaved
        self._stream = 0
        self.crowding = False  # crowded(): at most CROWD_FREE_CTAS CTAs resident
        self.concurrent_pairs = 0

    # ---- memory --------------------------------------------------------------------------------
    def alloc(self, nbytes: int, guard: Guard | None = None) -> FakeBuf:
        guard = guard or DEFAULT_GUARD
        mem = np.empty(guard.before + nbytes + guard.after, dtype=np.uint8)
        mem[guard.before:guard.before + nbytes] = self.rng.integers(0, 256, nbytes, dtype=np.uint8)
        b = FakeBuf(self.next_ptr + guard.before, nbytes, mem, guard, guard_pattern(guard))
        b.restore_guards()
        self.bufs[b.ptr] = b
        self.next_ptr += -(-mem.size // 256) * 256 + 4096  # allocations 256-aligned, apart
        return b

    def free(self, buf: FakeBuf) -> None:
        self.bufs.pop(buf.ptr, None)

    def find(self, ptr: int) -> tuple[FakeBuf, int]:
        for b in self.bufs.values():
            if b.base <= ptr < b.ptr + b.nbytes + b.guard.after:
                return b, ptr - b.base
        raise IndexError(f"fake illegal address {ptr:#x}")

    def view(self, ptr: int, dtype: str, n: int) -> np.ndarray:
        """A writable view of n elements at ptr (guards included in what may be addressed)."""
        b, off = self.find(ptr)
        size = np.dtype(NP[dtype]).itemsize
        return b.mem[off:off + n * size].view(NP[dtype])

    def data(self, b: FakeBuf) -> np.ndarray:
        return b.mem[b.guard.before:b.guard.before + b.nbytes]

    # ---- the gate's interface ------------------------------------------------------------------
    def fill(self, buf: FakeBuf, dtype: str, numel: int, row_len: int, spec: Any, seed: int) -> None:
        rng = np.random.default_rng(seed)
        if spec.offsets:  # int32 offsets ending at spec.end, as the worker's kf_offsets_i32
            v = spec.sample((numel,), rng)
        else:
            rows = numel // max(1, row_len)
            v = spec.sample((rows, row_len), rng)
        self.data(buf)[:] = to_device_bytes(v.reshape(-1), DType(dtype)).view(np.uint8)

    def perturb(self, buf: FakeBuf, dtype: str, numel: int, every: int, amount: float, seed: int) -> None:
        idx = np.random.default_rng(seed).random(numel) < 1.0 / every
        if dtype == "bfloat16":  # numpy has no bf16: through the bit patterns
            a = self.data(buf).view(np.uint16)
            a[idx] = to_device_bytes(-from_device_bytes(a[idx], DType.BF16) + amount, DType.BF16)
            return
        a = self.data(buf).view(NP[dtype])
        a[idx] = (-a[idx].astype(np.float64) + amount).astype(NP[dtype])

    def poison(self, buf: FakeBuf, seed: int) -> None:
        if self._capturing is not None:  # a graph's poison node: its replay poisons again, with the same seed
            self._capturing.append(lambda: self.poison(buf, seed))
            return
        self.data(buf)[:] = np.random.default_rng(seed % (1 << 63)).integers(0, 256, buf.nbytes, dtype=np.uint8)
        buf.restore_guards()
        self.clock += 0.5  # device work: outside the timed events, but a kernel reading a clock sees it

    def copy(self, dst: FakeBuf, src: FakeBuf) -> None:
        self.data(dst)[:] = self.data(src)

    def copy_range(self, dst: FakeBuf, dst_off: int, src: FakeBuf, src_off: int, nbytes: int) -> None:
        if dst_off < 0 or src_off < 0 or dst_off + nbytes > dst.nbytes or src_off + nbytes > src.nbytes:
            raise ValueError(f"copy_range: {nbytes} bytes at {src_off} -> {dst_off} leave a buffer")
        self.data(dst)[dst_off:dst_off + nbytes] = self.data(src)[src_off:src_off + nbytes]

    def audit(self, bufs: Sequence[FakeBuf], key: int) -> list[tuple[int, int]]:
        self.readbacks += 1
        self.clock += SYNC_US  # a read-back waits for the device
        return [(self._keyed(buf, buf.nbytes, key), self._guard_hits(buf)) for buf in bufs]

    def _keyed(self, buf: FakeBuf, nbytes: int, key: int) -> int:
        h = hashlib.blake2b(self.data(buf)[:nbytes].tobytes(), key=key.to_bytes(8, "little"), digest_size=8)
        return int.from_bytes(h.digest(), "little")

    def _guard_hits(self, buf: FakeBuf) -> int:
        return int(np.count_nonzero(buf.guards() != buf.pattern))

    def mark(self) -> None:  # one stream here: a plan's side launches run in its declared order
        return None

    def fork(self, mark: Any) -> None:
        pass

    def join(self) -> None:
        pass

    def launch(self, obj: Any, kernel: str, grid: tuple, block: tuple, smem: int, args: tuple,
               side: bool = False, pdl: bool = False) -> None:
        if self._capturing is not None:  # a graph keeps each launch's attributes: its replay launches them again
            self._capturing.append((obj, kernel, grid, block, smem, args, side, pdl))
            return
        if pdl:  # one stream, run in order: a programmatic dependent launch is the launch after the one before it
            self.pdl_kernels.append(kernel)
        if obj == "ref":
            _reference(self, kernel, args)
            return
        if self._queue is not None:
            self._queue[self._stream].append((kernel, args, grid))
            return
        self.launches += 1
        self.state["grid"] = grid  # the launch's grid, visible to fake kernels
        steps = self.kernels[kernel](self, args)
        for _ in steps if steps is not None else ():  # a kernel in steps runs them all, alone
            pass

    def concurrent(self, first: Callable[[], None], second: Callable[[], None]) -> None:
        """Both plans' launches queued per stream, then run interleaved: a kernel written as a generator runs one
        step of one stream's launch, then one of the other's, so state two calls share (a fake kernel's globals
        in `state`) is seen mid-call by the other, as on two streams of a GPU."""
        self.concurrent_pairs += 1
        self._queue = [[], []]
        try:
            self._stream = 0
            first()
            self._stream = 1
            second()
        finally:
            queues, self._queue, self._stream = self._queue, None, 0
        running: list[Any] = [None, None]
        while any(queues) or any(r is not None for r in running):
            for i in (0, 1):
                if running[i] is None and queues[i]:
                    kernel, args, grid = queues[i].pop(0)
                    self.launches += 1
                    self.state["grid"] = grid
                    gen = self.kernels[kernel](self, args)
                    if gen is None:  # not in steps: ran whole
                        continue
                    running[i] = (gen, grid)
                if running[i] is not None:
                    self.state["grid"] = running[i][1]
                    if next(running[i][0], StopIteration) is StopIteration:
                        running[i] = None

    def crowded(self, fn: Callable[[], None], obj: Any = None, kernels: Sequence[str] = ()) -> str:
        """fn() with at most CROWD_FREE_CTAS CTAs resident; a kernel whose grid_sync cannot be met hangs: what was
        held is returned."""
        self.crowding = True
        try:
            fn()
        except FakeHang:
            return f"all but {CROWD_FREE_CTAS} CTA slots of the fake GPU"
        finally:
            self.crowding = False
        return ""

    def grid_sync(self, grid: tuple) -> None:
        """A grid-wide wait inside a fake kernel: every CTA of `grid` must be resident at once."""
        if self.crowding and grid[0] * grid[1] * grid[2] > CROWD_FREE_CTAS:
            raise FakeHang

    def collect(self, n: int) -> list[CheckStats]:
        self.readbacks += 1
        self.clock += SYNC_US  # a read-back waits for the device
        return [self.slots[i] for i in range(n)]

    def compare(self, out: FakeBuf, ref: FakeBuf, dtype: str, numel: int, row_len: int, tail: int, atol: float,
                rtol: float, slot: int, scale: FakeBuf | None = None, key: int = 0) -> None:
        self.slots[slot] = self._compare(out, ref, dtype, numel, row_len, tail, atol, rtol, scale)
        if key:  # the reference's keyed checksum, plus its scale's under scale_key (the worker's sum of two)
            total = self._keyed(ref, numel * 8, key) + (0 if scale is None else self._keyed(scale, numel * 8,
                                                                                             scale_key(key)))
            self.slots[slot] = replace(self.slots[slot], ref_sum=total % 2**64)

    def _compare(self, out: FakeBuf, ref: FakeBuf, dtype: str, numel: int, row_len: int, tail: int, atol: float,
                 rtol: float, scale: FakeBuf | None = None) -> CheckStats:
        if dtype == "bfloat16":  # numpy has no bf16: the bit patterns, widened
            a = from_device_bytes(self.data(out).view(np.uint16)[:numel], DType.BF16)
        else:
            a = self.data(out).view(NP[dtype])[:numel].astype(np.float64)
        b = self.data(ref).view(np.float64)[:numel]
        unit = 1.0 if scale is None else self.data(scale).view(np.float64)[:numel]
        with np.errstate(invalid="ignore", over="ignore"):
            d = np.abs(a - b)
            fin = np.isfinite(a)
            bad = ~fin | (d > atol * unit + rtol * np.abs(b))
        idx = np.flatnonzero(bad)
        last = idx >= numel - row_len
        tailm = (idx % row_len) >= row_len - tail
        dd = np.where(fin, d, 0.0)
        sref = float(np.sum(b * b))
        sdiff = float(np.sum(dd * dd))
        rel = math.sqrt(sdiff / sref) if sref > 0 else (0.0 if sdiff == 0 else math.inf)
        return CheckStats("", numel, int(np.count_nonzero(~fin)), int(idx.size), int(last.sum()), int(tailm.sum()),
                          int(idx[0]) if idx.size else -1, float(dd.max()) if numel else 0.0, rel,
                          self._guard_hits(out))

    def sync(self, what: str) -> None:
        self.clock += SYNC_US  # the host waits, then reads back and queues the next work: the device idles

    def hold(self, us: float) -> None:
        self.holds.append(us)  # host-side launch latency is not modelled: the clock does not move

    def reset_l2(self) -> None:
        self.resets += 1
        self.clock += 50.0

    def time(self, fns: Sequence[Callable[[int], None]], preps: Sequence[Callable[[int], None]], n: int, per: int,
             after: Callable[[int], None]) -> list[list[float]]:
        out: list[list[float]] = [[] for _ in fns]
        for i in range(n):
            order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
            for j in order:
                preps[j](i)
                t0 = self.clock
                fns[j](i)
                out[j].append((self.clock - t0) / per)
            after(i)
        return out

    def capture(self, fn: Callable[[], None]) -> Callable[[int], None]:
        self._capturing = []
        fn()
        recorded, self._capturing = self._capturing, None
        self.state["graph_launches"] = sum(not callable(rec) for rec in recorded)

        def replay(_i: int) -> None:
            for rec in recorded:
                rec() if callable(rec) else self.launch(*rec)

        return replay

    def baselines(self, job: EvalJob, sets: Sequence[dict[str, Any]], check_peer: Callable[[str, Any], str]
                  ) -> tuple[list[tuple[str, Callable[[int], None]]], dict[str, str]]:
        names = job.baselines or ("fake.baseline",)
        if self.baseline_us is None:
            return [], {n: "torch with CUDA is not importable" for n in names}
        ptrs = [s["x"].ptr for s in sets]
        self.state["baseline_sets"] = ptrs
        costs = {"fake.baseline": self.baseline_us, **self.peers}
        present, absent = [], {}
        for name in names:
            peer = costs.get(name, f"no baseline named {name!r}")
            if isinstance(peer, str):
                absent[name] = peer
                continue
            peer = peer if isinstance(peer, FakePeer) else FakePeer(peer)
            wrong = check_peer(name, (peer.output or honest_rms_peer)(self, job, sets[0]))  # as the worker: set 0
            if wrong:
                absent[name] = wrong
                continue
            cost = peer.cost

            def run(i: int, name: str = name, cost: float = cost) -> None:
                self.find(ptrs[i])  # the set must exist, as on the GPU
                self.baseline_calls += 1
                self.peer_calls[name] = self.peer_calls.get(name, 0) + 1
                self.clock += cost

            present.append((name, run))
        return present, absent

    def peer_view(self, tensor: Any) -> tuple[FakeBuf, str]:
        """A peer's output copied into a fresh buffer, and its dtype name."""
        if isinstance(tensor, FakeTensor):
            raw, dtype = np.ascontiguousarray(tensor.bits), tensor.dtype
        else:
            raw = np.ascontiguousarray(tensor)
            dtype = raw.dtype.name
        buf = self.alloc(raw.nbytes)
        self.data(buf)[:] = raw.reshape(-1).view(np.uint8)
        return buf, dtype

    def capture_baseline(self, fn: Callable[[int], None], order: Sequence[int]) -> Callable[[int], None]:
        return lambda _i: [fn(j) for j in order]


def read(dev: FakeDevice, buf: FakeBuf, dtype: str, numel: int) -> np.ndarray:
    """A buffer's first numel elements as float64 (bfloat16 through its bit patterns)."""
    if dtype == "bfloat16":
        return from_device_bytes(dev.data(buf).view(np.uint16)[:numel], DType.BF16)
    return dev.data(buf).view(NP[dtype])[:numel].astype(np.float64)


def as_dtype(a: np.ndarray, dtype: str) -> Any:
    """A float array stored as a peer would return it in `dtype` (bfloat16 as a FakeTensor)."""
    if dtype == "bfloat16":
        return FakeTensor(to_device_bytes(a.reshape(-1), DType.BF16).reshape(a.shape), dtype)
    return a.astype(NP[dtype])


def honest_rms_peer(dev: FakeDevice, job: EvalJob, ins: dict[str, Any], eps: float | None = None) -> Any:
    """RMSNorm's y for one input set, as a library computes it (fp32 math, y in the cell's dtype)."""
    decl = {b.name: b for b in job.buffers}
    m, n = decl["x"].shape
    x = read(dev, ins["x"], decl["x"].dtype, m * n).reshape(m, n)
    w = read(dev, ins["w"], decl["w"].dtype, n)
    y = honest_rows(x.astype(np.float32), w.astype(np.float32), dict(job.scalars)["eps"] if eps is None else eps)
    return as_dtype(y, decl["y"].dtype)


def _reference(dev: FakeDevice, kernel: str, args: tuple) -> None:
    """The float64 reference the op's device hooks name, computed with numpy from the bound buffers."""
    (_, px), (_, pw), (_, py), (_, m), (_, n), (_, eps) = args
    dts = kernel.split("_")[2:]
    name = {"f32": "float32", "f16": "float16"}
    x = dev.view(px, name[dts[0]], m * n).astype(np.float64).reshape(m, n)
    w = dev.view(pw, name[dts[1]], n).astype(np.float64)
    dev.view(py, "float64", m * n)[:] = (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + eps) * w).reshape(-1)


# ---- an RMSNorm job and fake kernels ------------------------------------------------------------

def rms_job(cell: Cell, timing: Timing | None = Timing(min_samples=20, max_samples=20, warmup=3), ws_bytes: int = 0,
            gate: tuple = (), kernel: str = "cand", baseline: bool = True, stress: int = 4,
            baselines: tuple[str, ...] = ()) -> EvalJob:
    """An EvalJob for an RMSNorm cell, its launch args as the gallery binds them."""
    m, n = cell.dim("M"), cell.dim("N")
    bufs = [BufferDecl(t.name, t.resolve_dtype(cell).value, t.shape(cell), t.role.value) for t in SPEC.tensors]
    args: tuple = (("buf", "x"), ("buf", "w"), ("buf", "y"), ("i32", m), ("i32", n), ("f32", 1e-6))
    if ws_bytes:
        bufs.append(BufferDecl("ws", "uint8", (ws_bytes,), "ws"))
        args = args + (("buf", "ws"),)
    tol = SPEC.tolerance(cell, "y")
    return EvalJob("fake-job", "rmsnorm", tuple(sorted(cell.dims_dict().items())),
                   tuple(sorted(cell.dtypes_dict().items())), b"", (LaunchJob(kernel, (m, 1, 1), (256, 1, 1), 0, args),),
                   tuple(bufs), (("eps", 1e-6),), SPEC.gate_kinds(), (("y", (tol.atol, tol.rtol, tol.rel_norm)),), 7,
                   timing, baseline, stress,
                   tuple((k, tuple(sorted(v.items()))) for k, v in SPEC.fills.items()), SPEC.timing_kinds,
                   SPEC.bytes_moved(cell), gate, baselines)


def run_gate(dev: FakeDevice, job: EvalJob, seed: int = 0, gate: type[Gate] = Gate) -> JobResult:
    """The real Gate (or a variant of it) over the fake device (rng seeded: the tests are deterministic)."""
    return gate(dev, job, "cand", "ref", rms_device, random.Random(seed), (("gpu", "fake"),), dev.ceiling_gbps).run()


def unpack(dev: FakeDevice, args: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, float]:
    (_, px), (_, pw), (_, py), (_, m), (_, n), (_, eps) = args[:6]
    dt = dev.state.get("dtype", "float16")
    return (dev.view(px, dt, m * n).reshape(m, n), dev.view(pw, dt, n), dev.view(py, dt, m * n).reshape(m, n), m, n,
            eps)


def honest_rows(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    xf = x.astype(np.float32)
    r = 1.0 / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True, dtype=np.float32) + np.float32(eps))
    return xf * r * w.astype(np.float32)


def honest_rms(dev: FakeDevice, args: tuple) -> None:
    """An honest RMSNorm kernel: y from the bound x, w and eps in fp32, at the honest kernel's bandwidth."""
    x, w, y, m, n, eps = unpack(dev, args)
    y[:] = honest_rows(x, w, eps).astype(y.dtype)
    cost_us(dev, m, n)


def cost_us(dev: FakeDevice, m: int, n: int, fraction: float = 1.0) -> None:
    """Advance the clock as an honest kernel moving `fraction` of the cell's bytes would."""
    nbytes = 2 * m * n * np.dtype(NP[dev.state.get("dtype", "float16")]).itemsize
    dev.clock += fraction * nbytes / (BANDWIDTH_GBPS * 1e3)


class FakeRunner:
    """A runner (evo.measure.run's `run(jobs)`) that runs the real Gate for each job on a fresh numpy device
    with `kernels`; the jobs it was given are kept."""

    fingerprint = {"gpu": "fake"}
    ceiling_gbps = 4000.0

    def __init__(self, kernels: dict[str, Kernel], ref_mod: Any = rms_device) -> None:
        self.kernels, self.ref_mod = kernels, ref_mod
        self.jobs: list[EvalJob] = []

    def run(self, jobs: Sequence[EvalJob]) -> list[JobResult]:
        self.jobs += jobs
        return [Gate(FakeDevice(self.kernels), j, "cand", "ref", self.ref_mod, random.Random(0), (("gpu", "fake"),),
                     self.ceiling_gbps).run() for j in jobs]
