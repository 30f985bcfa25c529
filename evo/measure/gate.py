"""The gate: how one candidate is checked and timed, so that it cannot tell a checked launch from a
timed one and cannot make a wrong answer look right.

- Nothing a kernel can read is constant: every buffer's guard zones (their sizes, so the data's offset in
  its allocation, and their byte pattern) and every fill's values are drawn from the job's secret
  (EvalJob.secret, drawn per job by the parent; never derivable from the repository), and the gate
  cells' shapes and scalars are drawn from it too (evo.measure.evaluators.gate_cells_for, make_job). The
  result records the secret, and a failure's outcome the cells checked, so a failure can be replayed.
- Every input set has its own outputs and workspaces. Before *every* launch (checked, warm-up or
  timed) its outputs and workspaces get a fresh random pattern; what a launch finds there never
  tells it anything, and an element it did not write is wrong.
- Inputs are copied to private buffers the candidate never sees, and checksummed with a key drawn
  per job; the reference reads the private copies. After every checked launch, and after timing,
  inputs and copies must still match their checksums, else INPUT_MODIFIED. The float64 reference (and
  its error scale) is computed once per set's contents and checksummed by every comparison: a reused
  reference whose checksum moved since its first comparison was overwritten (INPUT_MODIFIED).
- Round A checks every input kind of the op, then repeats one launch `stress_launches` times; then
  the gate cells (M = 1 and M drawn at residues of the template's tile, ...) run every kind with the same
  cubin, and a recurrent op's decode cell runs a decode loop (the one-token plan called 48 to 80 times, each
  call on the state the call before it wrote: an error below one call's tolerance adds up). Round B refills the sets
  with fresh values (same pointers: a cache keyed by pointer goes stale), checks every warm-up
  launch, times in an order drawn per job, checks the outputs of randomly chosen timed samples
  (chosen after the sample ran) and of the whole last batch. Round C moves a few input elements far
  and checks again (a cache keyed by pointer plus sampled elements goes stale).
- An element is wrong past atol + rtol |ref| (the op's tolerances), or atol x scale + rtol |ref| for an
  output whose reference gives an element-wise error scale (the op's SCALED outputs, 'scale:<output>'):
  a long sum rounds by the size of its terms, which round C's moved elements make large.
- The timing mode (CUDA graph or not) comes from the cell: its bytes at the copy ceiling measured in
  the same process, never from the candidate (nor from a noisy probe of any kernel, which would flip
  near the threshold from run to run). The baseline runs in the same mode, on the same input
  buffers, interleaved, with the L2 flushed and its persisting lines reset before each sample.
- A peer (baseline) is timed only if it computes the cell's op: after its first, untimed call, the
  outputs it returns for input set 0 (mapped to the op's outputs by the op hook `peer_outputs`) are
  compared with the same float64 reference the candidate is checked against, with the same metric
  at PEER_TOL_FACTOR x the op's tolerances (a library's rounding order may differ from a kernel's),
  in a dtype no coarser than the cell's. A peer that fails is absent ("wrong: ..."), never timed.

The device side is a small interface (`GateDevice`): the GPU worker implements it with cuda.core,
tests/unit/fake_device.py with numpy, so every rule here is tested without a GPU.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from evo.measure.jobs import BufferDecl, CheckStats, DecodeLoop, EvalJob, Guard, JobResult, LaunchJob

# In every GPU fingerprint: results of an older gate are never reused. "3": the peer check, the
# timing hold before each timed call when peers are timed, and rmsnorm_bwd's rstd no longer perturbed (the
# "2" gate rejected correct fp16/fp32 backward kernels: a store holding those rejections must not serve them).
# "4": an element-wise error scale for reduction outputs (rmsnorm_bwd's dw: atol in units of the
# rms of the column's terms); the "3" gate rejected correct fp32 dw sums on its perturbed "large" set.
# "5": the reference is recomputed before every comparison: "4" and earlier reused it across launches
# of the same set, so a kernel that overwrote it with its own answer passed those checks.
# "6": the reference is computed once per set again, and audited instead: each comparison also takes
# a keyed checksum of the reference (and its error scale); a reused reference whose checksum moved since the
# comparison right after its computation is a fault. Same verdicts as "5" for every kernel but the forger (now
# INPUT_MODIFIED, was WRONG_ANSWER), without "5"'s recomputations (+39% to +66% wall time per KDA prefill
# evaluation on an H100).
# "7": rmsnorm_bwd's dx gets an error scale too (max(1, |x| |rstd|^3 sum|dout w x| / N)): the "6" gate
# and earlier rejected right cluster kernels' fp32 dx where its two terms cancel on the perturbed "normal" set
# (two H100 rejections, max abs err 3.8e-5 against atol 1e-5).
# "8": a job's shapes and scalars drawn from a secret drawn per job (gate cells at M, T, head groupings
# and varlen lengths at residues of the template's tile, eps, scale and lower_bound from declared ranges), guard zones
# (sizes, offsets, bytes) and fills drawn from it too; a plan missing a tensor of its cell's variant INVALID; KDA's
# fp32 final state of a decode cell held to fp32's tolerance, and a decode loop of 48 to 80 calls chaining the state
# (the "7" gate's constants let a kernel recognise it and be right only there); in graph mode, a replay's launch far
# under the same kernel's launches outside the graph is SUSPECT (verify.GRAPH_FLOOR).
# "9": the launch beside another: one set's plan on a second stream beside another set's, both checked (state
# shared between concurrent calls, such as module-global counters or scratch, shows), and one beside a kernel that
# holds all but a few SMs: a plan that does not finish there waits for CTAs that cannot be resident (a grid-wide wait
# without a cooperative launch) and is INVALID; a causal op's outputs before a drawn position must not move when only
# later inputs change (bit for bit).
# "10": in graph mode, an untimed replay whose graph poisons each set's outputs and workspaces right before its
# launch, every set checked after it: a launch leaving its work to another launch of the replay fails there,
# whatever its time (the "9" gate caught it only through verify.GRAPH_FLOOR, by a replay's time far under direct).
# "11": the round beside a kernel holding most SMs launches the plan alone where it cannot crowd the GPU (a plan with
# a cluster launch, a GPU other work holds already) and checks it; the "10" gate skipped the launch there and then
# checked the poisoned outputs, so every plan with a cluster launch came back WRONG_ANSWER.
GATE_VERSION = "11"
ROTATE_BYTES = 192 << 20  # the timed sets' inputs together cover at least this much (> 3x the L2)
MAX_SETS = 32
CHECK_FRACTION = 0.1  # share of timed samples whose outputs are checked (decided after the sample ran)
SLOTS = 64  # comparisons read back together
PERTURB_EVERY = 61  # round C moves about one input element in this many
PERTURB_SETS = 2
DIRECT_SAMPLES = 10  # graph mode: launches of the candidate alone, its time outside a replay
NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "uint8": 1}
GUARD_BEFORE = (1, 32)  # a guard zone ahead of the data: 256 B times a count drawn in this range
GUARD_AFTER = (1, 512)  # one behind it: 16 B times a count drawn in this range


def draw_guard(rng: random.Random) -> Guard:
    """The guard zones of one buffer: 256 B to 8 KiB ahead, 16 B to 8 KiB behind, the seed of their pattern."""
    return Guard(256 * rng.randint(*GUARD_BEFORE), 16 * rng.randint(*GUARD_AFTER), rng.getrandbits(64))


def scale_key(key: int) -> int:
    """The checksum key of an error-scale buffer, apart from its reference's (a swap of the two is seen)."""
    return key ^ 0x9E3779B97F4A7C15


# A peer's outputs pass at this multiple of the op's atol, rtol and rel_norm: a library's reduction and
# rounding order differ from a kernel's, yet a peer computing something else (another eps, a missing
# term or row) stays far outside.
PEER_TOL_FACTOR = 2.0
# Launch by launch, with peers: before each timed call the stream is held busy this long (a spin
# kernel), so the host's work to launch it (a Python peer's dispatch: torch.compile's guards, a DSL's
# call path, up to ~150 us) is done while the GPU spins and falls outside the timed interval. The L2
# flush before it covers ~60 us; an H200 peers bench timed QuACK at 47 us on a cell
# where it runs 14 us.
HOLD_US = 300.0
PRECISION = {"bfloat16": 8, "float16": 11, "float32": 24}  # significand bits: a peer's output may be finer, not coarser


class GateDevice(Protocol):
    """What the gate needs from a device; buffers are opaque objects with `.ptr` and `.nbytes`."""

    def alloc(self, nbytes: int, guard: Guard | None = None) -> Any:
        """A buffer inside guard zones laid out and patterned as `guard` says (None: the device's own)."""
    def free(self, buf: Any) -> None: ...
    def fill(self, buf: Any, dtype: str, numel: int, row_len: int, spec: Any, seed: int) -> None: ...
    def perturb(self, buf: Any, dtype: str, numel: int, every: int, amount: float, seed: int) -> None: ...
    def poison(self, buf: Any, seed: int) -> None:
        """A fresh random pattern over the data, and the buffer's own guard pattern over its guard zones."""
    def copy(self, dst: Any, src: Any) -> None: ...
    def copy_range(self, dst: Any, dst_off: int, src: Any, src_off: int, nbytes: int) -> None:
        """nbytes from src's data at src_off to dst's at dst_off, in stream order."""
    def audit(self, bufs: Sequence[Any], key: int) -> list[tuple[int, int]]:
        """(keyed checksum, guard-zone bytes hit) of each buffer, with one read-back."""
    def launch(self, obj: Any, kernel: str, grid: tuple, block: tuple, smem: int, args: tuple,
               side: bool = False, pdl: bool = False) -> None:
        """Launch on the device's stream, or with side=True on its side stream (launch_plan); pdl: as a
        programmatic dependent launch of the stream's launch before it (LaunchDecl.pdl)."""
    def mark(self) -> Any:
        """A point on the device's stream: what its work so far has reached (an event)."""
    def fork(self, mark: Any) -> None:
        """The side stream waits for a mark of the device's stream."""
    def join(self) -> None:
        """The device's stream waits for everything queued on the side stream."""
    def compare(self, out: Any, ref: Any, dtype: str, numel: int, row_len: int, tail: int, atol: float,
                rtol: float, slot: int, scale: Any = None, key: int = 0) -> None:
        """Enqueue the comparison of `out` (and its guard zones) with a float64 reference into a slot; an element
        is bad past atol * scale[i] + rtol * |ref[i]|, scale (float64, per element) 1 where None. A nonzero key:
        the slot's ref_sum is a checksum of the reference's numel float64s under that key, plus the scale's under
        scale_key(key)."""
    def collect(self, n: int) -> list[CheckStats]:
        """The stats of slots 0..n-1, with one read-back."""
    def sync(self, what: str) -> None: ...
    def reset_l2(self) -> None: ...
    def hold(self, us: float) -> None:
        """Keep the stream busy for `us` microseconds (work queued after it starts when it ends)."""
    def time(self, fns: Sequence[Callable[[int], None]], preps: Sequence[Callable[[int], None]], n: int,
             per: int, after: Callable[[int], None]) -> list[list[float]]: ...
    def capture(self, fn: Callable[[], None]) -> Callable[[int], None]: ...
    def baselines(self, job: EvalJob, sets: Sequence[dict[str, Any]], check_peer: Callable[[str, Any], str]
                  ) -> tuple[list[tuple[str, Callable[[int], None]]], dict[str, str]]:
        """The baselines asked for, each reading input set i when called with i; and why others are absent.
        After a baseline's first call, check_peer(name, its result for set 0) is '' or why it is wrong (absent)."""
    def peer_view(self, tensor: Any) -> tuple[Any, str]:
        """A peer's output tensor as a buffer `compare` reads (`.ptr`, `.nbytes`), and its dtype name."""
    def capture_baseline(self, fn: Callable[[int], None], order: Sequence[int]) -> Callable[[int], None]: ...
    def concurrent(self, first: Callable[[], None], second: Callable[[], None]) -> None:
        """first()'s launches on the device's stream and second()'s on another stream, both after the work queued
        before and free to run at the same time; the device's stream then waits for the other."""
    def crowded(self, fn: Callable[[], None], obj: Any, kernels: Sequence[str]) -> str:
        """fn()'s launches (of `kernels` in `obj`) beside a kernel holding all but a few of the GPU's SMs (nothing
        else fits beside it on them): '' when they finish within the device's wait, else what was held (the holder
        is then let go, so the launches finish and the device is left clean). fn() is called exactly once, whatever
        happens: a plan with a cluster launch is launched alone ('' then: whether a cluster finds room beside other
        work depends on which SMs are free), and so is one on a GPU that other work holds already."""


def launch_plan(dev: GateDevice, obj: Any, bound: Sequence[tuple[LaunchJob, tuple]]) -> None:
    """A plan's launches with their bound args, issued in declared order: a main launch on the device's stream
    (marked when a side launch forks after it), a side launch on the side stream once the main stream reaches
    the mark of its fork_after, and the device's stream joined to the side stream at the end; a pdl launch as a
    programmatic dependent launch of the main launch before it (the plan never starts with one). Host order is the
    declared order, so where kernels run one at a time (CUDA_LAUNCH_BLOCKING, a profiler's replay) a side launch
    still runs after every launch declared before it."""
    forks = {lj.fork_after for lj, _ in bound if lj.stream == "side"}
    marks: dict[str, Any] = {}
    side = False
    for lj, args in bound:
        if lj.stream == "side":
            if lj.fork_after not in marks:
                raise ValueError(f"side launch {lj.kernel} forks after {lj.fork_after!r}, which no main launch "
                                 "before it ran")
            dev.fork(marks[lj.fork_after])
            dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args, side=True)
            side = True
        else:
            dev.launch(obj, lj.kernel, lj.grid, lj.block, lj.smem, args, pdl=lj.pdl)
            if lj.kernel in forks:
                marks[lj.kernel] = dev.mark()
    if side:
        dev.join()


@dataclass
class InputSet:
    """One set of buffers for one geometry: inputs, their private copies, outputs, workspaces."""

    ins: dict[str, Any]
    priv: dict[str, Any]
    outs: dict[str, Any]
    ws: dict[str, Any]
    sums: dict[str, int] = field(default_factory=dict)
    version: int = 0  # bumped by every snapshot, so the reference is recomputed only when inputs change


@dataclass(frozen=True)
class _Null:
    """A buffer that is not there: a null device pointer."""

    ptr: int = 0
    nbytes: int = 0


NULL = _Null()


class Failed(Exception):
    """A check failed: stop and report what was seen so far."""


class Geometry:
    """The buffers, launches and reference of one cell (the job's own or a gate cell)."""

    def __init__(self, label: str, dims: dict[str, int], buffers: Sequence[BufferDecl],
                 launches: Sequence[LaunchJob], scalars: dict[str, float]) -> None:
        self.label, self.dims, self.launches, self.scalars = label, dims, tuple(launches), scalars
        self.ins = [b for b in buffers if b.role == "in"]
        self.outs = [b for b in buffers if b.role == "out"]
        self.ws = [b for b in buffers if b.role == "ws"]
        self.in_bytes = sum(_nbytes(b) for b in self.ins)
        # 'ref:<output>' -> float64 buffer of this geometry; 'scale:<output>' too for the outputs the op's
        # reference gives an element-wise error scale (its SCALED outputs)
        self.refs: dict[str, Any] = {}
        self.ref_of: tuple[int, int] = (-1, -1)  # (set id, version) the refs were computed from
        self.ref_gen = 0  # how many times the refs were computed
        # output -> keyed checksum of its reference (and scale) as compared right after this computation: a
        # later comparison reusing the reference must find the same (Gate._check)
        self.ref_sums: dict[str, int] = {}


def _nbytes(b: BufferDecl) -> int:
    return max(1, b.numel * NBYTES[b.dtype])


class Gate:
    """Checks (and times) one job on a GateDevice; `run` returns what was measured."""

    def __init__(self, dev: GateDevice, job: EvalJob, obj: Any, ref_obj: Any, ref_mod: Any,
                 rng: random.Random, fingerprint: tuple = (), ceiling_gbps: float = 0.0) -> None:
        self.dev, self.job, self.obj, self.ref_obj, self.ref_mod = dev, job, obj, ref_obj, ref_mod
        self.rng = rng  # host-side randomness (order, poison, which samples are checked): unknown to kernels
        self.key = rng.getrandbits(64)  # checksum key
        # The job's secret (the gate's own draw where the job has none): guards and fill values come from it
        self.secret = job.secret or rng.getrandbits(63) | 1
        self._draws = random.Random(f"gate:{self.secret}")
        self.fingerprint, self.ceiling_gbps = fingerprint, ceiling_gbps
        self.dtypes = dict(job.dtypes)
        self.tol = dict(job.tolerances)
        # outputs whose float64 reference comes with an element-wise error scale ('scale:<output>', written by
        # the reference kernels beside 'ref:<output>'): the op's atol is in units of it
        self._scaled = frozenset(getattr(ref_mod, "SCALED", ()))
        self.checks: list[tuple[str, tuple[CheckStats, ...]]] = []
        self.faults: list[str] = []
        self.peers_checked: dict[str, str] = {}  # peer -> what its check of set 0 found (the passing ones)
        self._bufs: list[Any] = []
        self._seed = self._draws.getrandbits(40)
        self.invalid = ""  # why the plan is outside what a kernel may assume (it needs an idle, whole GPU)
        self.wrong = ""  # a wrong answer no element-wise comparison shows (outputs that read later inputs)

    # ---- public --------------------------------------------------------------------------------
    def run(self) -> JobResult:
        job = self.job
        if not job.kinds or not job.fills:
            raise ValueError(f"job {job.job_id}: op {job.op} declares no input kinds to check (OpSpec.fills)")
        main = Geometry("", dict(job.dims), job.buffers, job.launches, dict(job.scalars))
        try:
            try:
                sets = [self._new_set(main) for _ in range(2)]
                self._round_a(main, sets)
                self._round_shared(main, sets)
                self._causality(main, sets[0], sets[1])
                for gc in job.gate:
                    self._gate_cell(gc)
                for lp in job.loop:
                    self._decode_loop(lp)
                if job.timing is None:
                    return self._result()
                times, peers, absent, graph, direct = self._round_b(main, sets)
                self._round_c(main, sets)
            except Failed:
                return self._result()
            first = peers[0] if peers else ("", ())
            return self._result(times_us=tuple(times), baseline_us=tuple(first[1]), baseline_name=first[0],
                                peers=tuple((n, tuple(t)) for n, t in peers), absent=tuple(sorted(absent.items())),
                                graph=graph, direct_us=tuple(direct))
        finally:
            self.close()

    def close(self) -> None:
        for b in self._bufs:
            self.dev.free(b)
        self._bufs.clear()

    # ---- rounds --------------------------------------------------------------------------------
    def _round_a(self, g: Geometry, sets: list[InputSet]) -> None:
        """Every input kind, then one launch repeated to expose races."""
        for k, kind in enumerate(self.job.kinds):
            s = sets[k % len(sets)]
            self._fill(g, s, kind)
            self._launch_and_check(g, s, f"kind {kind}")
        s = sets[0]
        n = self.job.stress_launches
        for r in range(n):
            self._launch_and_check(g, s, f"stress {r + 1}/{n}")

    def _pair(self, g: Geometry, a: InputSet, b: InputSet) -> None:
        """b's plan on a second stream beside a's, both checked: state that concurrent calls share (module-global
        counters or scratch) shows where both grids are resident together (a gate cell's small grid: always)."""
        self._poison(a)
        self._poison(b)
        self.dev.concurrent(lambda: self._launch(g, a), lambda: self._launch(g, b))
        self.dev.sync("beside a second stream")
        self._integrity(g, [a, b], "beside a second stream")
        self._check(g, [(a, "set 0 beside set 1's launch on a second stream"),
                        (b, "set 1 on a second stream beside set 0's")])

    def _round_shared(self, g: Geometry, sets: list[InputSet]) -> None:
        """The pair of launches on two streams; then set 0's beside a kernel holding all but a few SMs: a plan that
        does not finish there waits for CTAs that cannot be resident, and is INVALID."""
        a = sets[0]
        self._pair(g, a, sets[1])
        self._poison(a)
        held = self.dev.crowded(lambda: self._launch(g, a), self.obj, tuple(lj.kernel for lj in g.launches))
        if held:
            self.invalid = (f"did not finish beside a kernel holding {held}: its CTAs wait for others that cannot be "
                            "resident (a grid-wide wait needs a cooperative launch)")
            raise Failed
        self.dev.sync("beside a kernel holding most SMs")
        self._integrity(g, [a], "beside a kernel holding most SMs")
        self._check(g, [(a, "set 0 beside a kernel holding most SMs")])

    def _causality(self, g: Geometry, a: InputSet, b: InputSet) -> None:
        """A causal op's outputs before a drawn position do not move when only later inputs change: set a launched
        and checked; set b given a's inputs, every input along the causal dim then filled afresh from the position
        on, launched and checked; each output's part before the position must be a's bit for bit (compared by
        keyed checksums). A kernel whose run-to-run results differ fails here too."""
        axes = dict(self.job.causal)
        ins, outs = [x for x in g.ins if x.name in axes], [x for x in g.outs if x.name in axes]
        if not ins or not outs:
            return
        n = ins[0].shape[axes[ins[0].name]]
        if n < 2:
            return
        t = self.rng.randrange(1, n)
        kind = self.job.timing_kinds[0]
        self._fill(g, a, kind)
        self._launch_and_check(g, a, f"set 0 before the causal check at position {t} of {n}")
        self._fill(g, b, kind)  # fresh values, of which b keeps those from position t on
        for x in g.ins:
            if x.name not in axes:
                self.dev.copy(b.ins[x.name], a.ins[x.name])
                continue
            for at, nbytes in self._spans(x, axes[x.name], n, t):
                self.dev.copy_range(b.ins[x.name], at, a.ins[x.name], at, nbytes)
        self._snapshot(g, b)
        self._launch_and_check(g, b, f"set 0's inputs before position {t} of {n}, fresh ones from it on")
        heads = [self._gathered(s.outs[x.name], self._spans(x, axes[x.name], n, t)) for x in outs for s in (a, b)]
        sums = [c for c, _ in self.dev.audit(heads, self.key)]
        moved = [x.name for i, x in enumerate(outs) if sums[2 * i] != sums[2 * i + 1]]
        if moved:
            self.wrong = (f"{', '.join(moved)} before position {t} of {n} changed when only inputs from it on changed "
                          "(outputs read later inputs, or differ from run to run)")
            raise Failed

    def _gathered(self, src: Any, spans: list[tuple[int, int]]) -> Any:
        """A new buffer holding src's byte spans one after another."""
        out = self.dev.alloc(sum(nb for _, nb in spans), draw_guard(self._draws))
        self._bufs.append(out)
        done = 0
        for at, nbytes in spans:
            self.dev.copy_range(out, done, src, at, nbytes)
            done += nbytes
        return out

    @staticmethod
    def _spans(x: BufferDecl, axis: int, n: int, t: int) -> list[tuple[int, int]]:
        """(byte offset, bytes) of each run of buffer x before position t along `axis` (of length n)."""
        inner = math.prod(x.shape[axis + 1:]) * NBYTES[x.dtype]
        return [(i * n * inner, t * inner) for i in range(math.prod(x.shape[:axis]))]

    def _gate_cell(self, gc: Any) -> None:
        g = Geometry(gc.label, dict(gc.dims), gc.buffers, gc.launches, dict(gc.scalars))
        s, other = self._new_set(g), self._new_set(g)
        for kind in self.job.kinds:
            self._fill(g, s, kind)
            self._launch_and_check(g, s, f"gate cell {gc.label} kind {kind}")
        self._fill(g, other, self.job.kinds[0])
        self._pair(g, s, other)

    def _decode_loop(self, lp: DecodeLoop) -> None:
        """The one-token plan called lp.steps times along one sequence, call t on token t and the state the
        call before it wrote; the calls' outputs, gathered, checked against the whole sequence's reference."""
        step = Geometry(f"{lp.label}, one call", dict(lp.step.dims), lp.step.buffers, lp.step.launches,
                        dict(lp.step.scalars))
        seq = Geometry(lp.label, dict(lp.seq.dims), lp.seq.buffers, (), dict(lp.seq.scalars))
        s, full = self._new_set(step), self._new_set(seq)
        self._fill(seq, full, lp.kind)
        self._poison(full)
        per = dict(lp.sliced)
        for t in range(lp.steps):
            for b in step.ins:
                if b.name in per:
                    self.dev.copy_range(s.ins[b.name], 0, full.ins[b.name], t * per[b.name], per[b.name])
                elif b.name == lp.state_in and t:
                    self.dev.copy(s.ins[b.name], s.outs[lp.state_out])
                elif not t:
                    self.dev.copy(s.ins[b.name], full.ins[b.name])
            self._poison(s)
            self._launch(step, s)
            for b in step.outs:
                if b.name in per:
                    self.dev.copy_range(full.outs[b.name], t * per[b.name], s.outs[b.name], 0, per[b.name])
        self.dev.copy(full.outs[lp.state_out], s.outs[lp.state_out])
        self.dev.sync(lp.label)
        self._integrity(seq, [full], lp.label)
        self._check(seq, [(full, lp.label)])

    def _round_b(self, g: Geometry, sets: list[InputSet]
                 ) -> tuple[list[float], list[tuple[str, list[float]]], dict[str, str], bool, list[float]]:
        """Fresh values, checked warm-up, timing beside the baseline, checked samples and last batch; in graph
        mode, a few launches of the candidate alone too (what one launch costs outside a replay)."""
        t = self.job.timing
        assert t is not None
        nsets = max(2, min(MAX_SETS, math.ceil(ROTATE_BYTES / max(1, g.in_bytes))))
        graph = self._graph_mode()
        if graph:
            nsets = max(nsets, t.graph_launches)
        while len(sets) < nsets:
            sets.append(self._new_set(g))
        kinds = self.job.timing_kinds
        for i, s in enumerate(sets):
            self._fill(g, s, kinds[i % len(kinds)])

        def check_peer(name: str, result: Any) -> str:
            return self._check_peer(g, sets[0], name, result)

        # the baselines read the same input buffers as the candidate; each is checked on set 0
        base, absent = (self.dev.baselines(self.job, [s.ins for s in sets], check_peer) if self.job.baseline
                        else ([], {}))
        for i in range(t.warmup):
            j = self.rng.randrange(nsets)
            self._launch_and_check(g, sets[j], f"warm-up {i + 1}")
        timed: set[int] = set()
        direct: list[float] = []
        if graph:
            times, btimes = self._time_graph(g, sets, base, timed)
            direct = self._time_alone(g, sets)
            self._refreshed_replay(g, sets)
        else:
            times, btimes = self._time_direct(g, sets, base, timed)
        self._integrity(g, sets, "after timing")
        # every timed set's output holds its last timed launch
        self._check(g, [(s, f"last timed launch of set {j}") for j, s in enumerate(sets) if j in timed])
        return times, [(name, t) for (name, _), t in zip(base, btimes)], absent, graph, direct

    def _round_c(self, g: Geometry, sets: list[InputSet]) -> None:
        """Launch a set, move a few of its input elements far (same pointers), launch and check again:
        a cache keyed by the pointer and a few sampled elements, just refreshed, now goes stale."""
        for j in range(min(PERTURB_SETS, len(sets))):
            s = sets[j]
            self._launch_and_check(g, s, f"set {j} before perturbing")
            kind = self.job.timing_kinds[j % len(self.job.timing_kinds)]
            specs = self.job.fill_of(kind)
            for b in g.ins:
                # a transformed fill keeps its values in a range (unit rows, (0, 1), negative decays) that
                # a far move would leave: the op would be asked something its inputs never are; so does a
                # fill the op marks perturb=False (a stored per-row statistic such as rmsnorm_bwd's rstd)
                spec = specs[b.name]
                if b.dtype in ("float32", "float16", "bfloat16") and not spec.transform and spec.perturb:
                    self.dev.perturb(s.ins[b.name], b.dtype, b.numel, PERTURB_EVERY, 16.0 * spec.magnitude(),
                                     self._next_seed())
            self._snapshot(g, s)
            self._launch_and_check(g, s, f"perturbed set {j}")

    # ---- timing --------------------------------------------------------------------------------
    def _graph_mode(self) -> bool:
        """Graph timing when the cell's bytes at the copy ceiling take less than graph_below_us."""
        t = self.job.timing
        assert t is not None
        est = self.job.bytes_moved / (self.ceiling_gbps * 1e3) if self.ceiling_gbps > 0 else math.inf
        return est < t.graph_below_us

    def _sample_loop(self, fns: list, preps: list, per: int, after: Callable[[int], None]) -> list[list[float]]:
        """min_samples, then 50 more at a time while the spread is wide; sample indices keep counting."""
        t = self.job.timing
        assert t is not None
        offset = [0]

        def shift(f: Callable[[int], None]) -> Callable[[int], None]:
            return lambda i: f(offset[0] + i)

        sfns, spreps, safter = [shift(f) for f in fns], [shift(p) for p in preps], shift(after)
        samples = self.dev.time(sfns, spreps, t.min_samples, per, safter)
        offset[0] += t.min_samples
        while len(samples[0]) < t.max_samples and _spread(samples[0]) > t.spread:
            samples = [a + b for a, b in zip(samples, self.dev.time(sfns, spreps, 50, per, safter))]
            offset[0] += 50
        return samples

    def _time_direct(self, g: Geometry, sets: list[InputSet], base: list, timed: set[int]
                     ) -> tuple[list[float], list[list[float]]]:
        """One launch per sample; the set of each sample comes from a fresh permutation per round."""
        order: list[int] = []
        n = len(sets)

        def set_of(i: int) -> int:
            while len(order) <= i:
                perm = list(range(n))
                self.rng.shuffle(perm)
                order.extend(perm)
            return order[i]

        def prep(i: int) -> None:
            self._poison(sets[set_of(i)])
            self.dev.reset_l2()

        def cand(i: int) -> None:
            timed.add(set_of(i))
            self._launch(g, sets[set_of(i)])

        def after(i: int) -> None:
            if self.rng.random() < CHECK_FRACTION:
                j = set_of(i)
                self._check(g, [(sets[j], f"timed sample {i} (set {j})")])

        fns: list = [cand] + [(lambda f: lambda i: f(set_of(i)))(fn) for _, fn in base]
        preps: list = [prep] + [lambda i: self.dev.reset_l2()] * len(base)
        if base:  # every timed call of the job behind a hold, ours too (the same mode for all)
            preps = [(lambda p: lambda i: (p(i), self.dev.hold(HOLD_US)))(p) for p in preps]
        samples = self._sample_loop(fns, preps, 1, after)
        return samples[0], samples[1:]

    def _time_graph(self, g: Geometry, sets: list[InputSet], base: list, timed: set[int]
                    ) -> tuple[list[float], list[list[float]]]:
        """A CUDA graph of one launch per set, in an order drawn per job; every output checked per batch."""
        order = list(range(len(sets)))
        self.rng.shuffle(order)
        timed.update(order)
        graph = self.dev.capture(lambda: [self._launch(g, sets[j]) for j in order])

        def prep(i: int) -> None:
            for s in sets:
                self._poison(s)
            self.dev.reset_l2()

        def after(i: int) -> None:
            if self.rng.random() < CHECK_FRACTION:  # one set of the replay, drawn after it ran
                j = self.rng.choice(order)
                self._check(g, [(sets[j], f"timed graph replay {i} (set {j})")])

        fns: list = [graph] + [self.dev.capture_baseline(fn, order) for _, fn in base]
        preps: list = [prep] + [lambda i: self.dev.reset_l2()] * len(base)
        samples = self._sample_loop(fns, preps, len(order), after)
        return samples[0], samples[1:]

    def _refreshed_replay(self, g: Geometry, sets: list[InputSet]) -> None:
        """A replay (untimed) whose graph poisons each set's outputs and workspaces right before that set's launch,
        every set checked after it: a launch that leaves its set's work to another launch of the replay (the
        first doing every set's work, the rest returning) leaves the poison, however fast or slow it batches."""
        order = list(range(len(sets)))
        self.rng.shuffle(order)

        def each() -> None:
            for j in order:
                self._poison(sets[j])
                self._launch(g, sets[j])

        where = "graph replay with each set's outputs refreshed before its launch"
        replay = self.dev.capture(each)
        replay(0)
        self.dev.sync(where)
        self._check(g, [(sets[j], f"{where} (set {j})") for j in order])

    def _time_alone(self, g: Geometry, sets: list[InputSet]) -> list[float]:
        """DIRECT_SAMPLES launches of the candidate, one set each (its outputs poisoned, the L2 flushed, the
        stream held so host time is not timed), each checked: a replay's launches must cost about as much (a
        first launch doing every set's work lets the others return, verify.judge's GRAPH_FLOOR)."""
        order = list(range(len(sets)))
        self.rng.shuffle(order)

        def prep(i: int) -> None:
            self._poison(sets[order[i % len(order)]])
            self.dev.reset_l2()
            self.dev.hold(HOLD_US)

        def cand(i: int) -> None:
            self._launch(g, sets[order[i % len(order)]])

        def after(i: int) -> None:
            j = order[i % len(order)]
            self._check(g, [(sets[j], f"launch {i} outside the graph (set {j})")])

        return self.dev.time([cand], [prep], DIRECT_SAMPLES, 1, after)[0]

    # ---- one launch ----------------------------------------------------------------------------
    def _new_set(self, g: Geometry) -> InputSet:
        def alloc(b: BufferDecl) -> Any:
            buf = self.dev.alloc(_nbytes(b), draw_guard(self._draws))
            self._bufs.append(buf)
            return buf

        return InputSet(ins={b.name: alloc(b) for b in g.ins}, priv={b.name: alloc(b) for b in g.ins},
                        outs={b.name: alloc(b) for b in g.outs}, ws={b.name: alloc(b) for b in g.ws})

    def _next_seed(self) -> int:
        self._seed += 1
        return self._seed

    def _fill(self, g: Geometry, s: InputSet, kind: str) -> None:
        specs = self.job.fill_of(kind)
        for b in g.ins:
            if b.name not in specs:
                raise KeyError(f"input kind {kind!r} has no fill for tensor {b.name!r}")
            self.dev.fill(s.ins[b.name], b.dtype, b.numel, b.shape[-1] if b.shape else 1, specs[b.name].bind(g.dims),
                          self._next_seed())
        self._snapshot(g, s)

    def _snapshot(self, g: Geometry, s: InputSet) -> None:
        """Private copies the reference reads, and checksums taken before the candidate runs."""
        for b in g.ins:
            self.dev.copy(s.priv[b.name], s.ins[b.name])
        sums = self.dev.audit([s.ins[b.name] for b in g.ins], self.key)
        s.sums = {b.name: c for b, (c, _) in zip(g.ins, sums)}
        s.version += 1

    def _poison(self, s: InputSet) -> None:
        for buf in (*s.outs.values(), *s.ws.values()):
            self.dev.poison(buf, self.rng.getrandbits(64))

    def _bind(self, args: tuple, bufs: dict[str, Any]) -> tuple:
        out = []
        for kind, v in args:
            out.append(("ptr", bufs[v].ptr) if kind == "buf" else (kind, v))
        return tuple(out)

    def _launch(self, g: Geometry, s: InputSet) -> None:
        bufs = {**s.ins, **s.outs, **s.ws}
        launch_plan(self.dev, self.obj, [(lj, self._bind(lj.args, bufs)) for lj in g.launches])

    def _launch_and_check(self, g: Geometry, s: InputSet, where: str) -> None:
        self._poison(s)
        self._launch(g, s)
        self.dev.sync(where)
        self._integrity(g, [s], where)
        self._check(g, [(s, where)])

    def _integrity(self, g: Geometry, sets: Sequence[InputSet], where: str) -> None:
        """Inputs and their private copies still hold what was filled; no guard zone was touched."""
        items = [(s, b.name, what, buf) for s in sets for b in g.ins
                 for what, buf in (("input", s.ins[b.name]), ("private copy of input", s.priv[b.name]))]
        on = f" on {g.label}" if g.label else ""
        for (s, name, what, _), (csum, hits) in zip(items, self.dev.audit([it[3] for it in items], self.key)):
            if csum != s.sums[name]:
                self.faults.append(f"{what} {name} changed ({where}{on})")
            elif hits:
                self.faults.append(f"guard zone of {what} {name} overwritten ({where}{on})")
        if self.faults:
            raise Failed

    def _reference(self, g: Geometry, s: InputSet, fresh: bool = False) -> dict[str, Any]:
        """Float64 references of a set, computed from the private copies (recomputed when they change, and
        always when `fresh`)."""
        if fresh:
            g.ref_of = (-1, -1)
        if not g.refs:
            for b in g.outs:
                for key in ("ref", "scale") if b.name in self._scaled else ("ref",):
                    g.refs[f"{key}:{b.name}"] = buf = self.dev.alloc(b.numel * 8, draw_guard(self._draws))
                    self._bufs.append(buf)
        if g.ref_of != (id(s), s.version):
            # an optional tensor the variant leaves out reaches the reference as a null pointer
            nulls = {n: NULL for t in self.job.left_out for n in (t, f"ref:{t}", f"scale:{t}")}
            bufs = {**nulls, **s.priv, **g.refs}
            for kernel, grid, block, args in self.ref_mod.reference(g.dims, self.dtypes, g.scalars):
                self.dev.launch(self.ref_obj, kernel, grid, block, 0, self._bind(args, bufs))
            g.ref_of = (id(s), s.version)
            g.ref_gen += 1
            g.ref_sums = {}
        return g.refs

    def _check(self, g: Geometry, todo: Sequence[tuple[InputSet, str]]) -> None:
        """Compare the outputs of each (set, label) with its reference; read back SLOTS at a time."""
        for start in range(0, len(todo), SLOTS):
            chunk = todo[start:start + SLOTS]
            labels = []
            for s, where in chunk:
                # A kernel that finds the reference buffers in memory could overwrite them with its own answer
                # (forge_reference in tests/unit/test_gate.py). A reference computed here, after the launch it
                # checks (stream order), is trusted: its comparison's checksum is recorded. A reused one (computed
                # for an earlier launch of the same set, its checksums recorded) must show the same checksums.
                if self._reusable(g, s):
                    refs, expect = g.refs, dict(g.ref_sums)
                else:
                    refs, expect = self._reference(g, s, fresh=True), None
                for b in g.outs:
                    atol, rtol, _ = self.tol[b.name]
                    self.dev.compare(s.outs[b.name], refs[f"ref:{b.name}"], b.dtype, b.numel, b.shape[-1],
                                     self.ref_mod.tail_width(g.dims), atol, rtol, len(labels),
                                     refs.get(f"scale:{b.name}"), self.key)
                    labels.append((where, b.name, g.ref_gen, None if expect is None else expect[b.name]))
            stats = self.dev.collect(len(labels))
            by_where: dict[str, list[CheckStats]] = {}
            for (where, name, gen, expect), c in zip(labels, stats):
                if expect is None:
                    if gen == g.ref_gen:
                        g.ref_sums[name] = c.ref_sum
                elif c.ref_sum != expect:
                    on = f" on {g.label}" if g.label and g.label not in where else ""
                    self.faults.append(f"reference of {name} changed after it was computed ({where}{on}): "
                                       "the candidate wrote to the gate's memory")
                by_where.setdefault(where, []).append(replace(c, output=name))
            bad = False
            for where, cs in by_where.items():
                label = f"{where}{' on ' + g.label if g.label and g.label not in where else ''}"
                self.checks.append((label, tuple(cs)))
                bad = bad or any(failed(c, self.tol[c.output][2]) for c in cs)
            if bad or self.faults:
                raise Failed

    def _reusable(self, g: Geometry, s: InputSet) -> bool:
        """The refs hold set s's current contents and every output's checksum was recorded after computing them."""
        return g.ref_of == (id(s), s.version) and set(g.ref_sums) >= {b.name for b in g.outs}

    def _check_peer(self, g: Geometry, s: InputSet, name: str, result: Any) -> str:
        """'' when the peer's outputs for set s match the reference (recorded in peers_checked), else why not."""
        outs = self._peer_outputs(g, name, result)
        # computed here (round B's refill just changed set s, so no earlier reference of it could stand anyway):
        # a peer is judged against a reference no candidate launch has followed, whatever the order of the rounds
        refs = self._reference(g, s, fresh=True)
        todo, views = [], []
        for b in g.outs:
            if b.name not in outs:
                continue
            view, dtype = self.dev.peer_view(outs[b.name])
            views.append(view)  # alive until the comparisons are read back
            if dtype not in PRECISION:
                return f"wrong: {b.name} comes as {dtype}, not a float dtype"
            if PRECISION[dtype] < PRECISION.get(b.dtype, 0):
                return f"wrong: {b.name} comes as {dtype}, coarser than the cell's {b.dtype}"
            numel = view.nbytes // NBYTES[dtype]
            if numel != b.numel:
                return f"wrong: {b.name} has {numel} elements, the cell's has {b.numel}"
            atol, rtol, rel = (PEER_TOL_FACTOR * t for t in self.tol[b.name])
            self.dev.compare(view, refs[f"ref:{b.name}"], dtype, numel, b.shape[-1], self.ref_mod.tail_width(g.dims),
                             atol, rtol, len(todo), refs.get(f"scale:{b.name}"))
            todo.append((b.name, atol, rtol, rel))
        found = []
        for (out, atol, rtol, rel), c in zip(todo, self.dev.collect(len(todo))):
            if c.nonfinite:
                return f"wrong: {out} {c.nonfinite} of {c.numel} elements non-finite"
            if c.bad:
                return (f"wrong: {out} {c.bad} of {c.numel} elements outside atol {atol:.3g} + rtol {rtol:.3g}"
                        f" (max abs err {c.max_abs_err:.3g}, rel norm err {c.rel_norm_err:.3g}, bound {rel:.3g})")
            if not c.rel_norm_err <= rel:
                return f"wrong: {out} rel norm err {c.rel_norm_err:.3g} > {rel:.3g}"
            found.append(f"{out} rel norm err {c.rel_norm_err:.3g} <= {rel:.3g}")
        missing = [b.name for b in g.outs if b.name not in outs]
        self.peers_checked[name] = "; ".join(
            [f"ok at {PEER_TOL_FACTOR:g} x tolerance: " + ", ".join(found)] + [f"{m} not returned" for m in missing])
        return ""

    def _peer_outputs(self, g: Geometry, name: str, result: Any) -> dict[str, Any]:
        """The op hook's map of a peer's result to the cell's outputs; a map it cannot make is an error."""
        op = self.job.op
        hook = getattr(self.ref_mod, "peer_outputs", None)
        if hook is None:
            raise NotImplementedError(f"op {op}: its device hooks (ops/{op}/device.py) have no peer_outputs(name, "
                                      f"result), so what peer {name!r} returns cannot be checked")
        outs = hook(name, result)
        cell_outs = [b.name for b in g.outs]
        unknown = sorted(set(outs) - set(cell_outs) - set(self.job.left_out))
        if unknown or not set(outs) & set(cell_outs):
            raise ValueError(f"op {op}: peer_outputs({name!r}) maps its result to {sorted(outs)}; the cell's outputs "
                             f"are {cell_outs}" + (f" ({unknown} are not outputs of the op)" if unknown else ""))
        return outs

    def _result(self, **kw: Any) -> JobResult:
        return JobResult(self.job.job_id, checks=tuple(self.checks), input_faults=tuple(self.faults),
                         peers_checked=tuple(sorted(self.peers_checked.items())), invalid=self.invalid,
                         wrong=self.wrong,
                         fingerprint=self.fingerprint, ceiling_gbps=self.ceiling_gbps,
                         bytes_moved=self.job.bytes_moved, secret=self.secret, **kw)


def failed(c: CheckStats, rel_norm: float) -> bool:
    """NaN/Inf never passes; neither does any element outside atol/rtol, a canary hit, or the norm bound."""
    return c.nonfinite > 0 or c.bad > 0 or c.canary_bad > 0 or not (c.rel_norm_err <= rel_norm)


def _spread(xs: list[float]) -> float:
    p10, p50, p90 = np.percentile(xs, [10, 50, 90])
    return (p90 - p10) / p50 if p50 > 0 else math.inf
