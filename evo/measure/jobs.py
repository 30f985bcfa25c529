"""Records exchanged with the GPU worker process. Plain data; imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evo.core.spec import FillSpec

# An argument binding: ("buf", name) for a device pointer, ("ptr", 0) for a null one (an optional
# tensor the cell does not use), ("i32"|"i64"|"f32", value) for a scalar.
ArgBind = tuple[str, Any]


@dataclass(frozen=True)
class LaunchJob:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[ArgBind, ...]
    stream: str = "main"  # "side": beside the main stream, after its launch of fork_after (evo.measure.gate.launch_plan)
    fork_after: str = ""
    pdl: bool = False  # a programmatic dependent launch (evo.templates.template.LaunchDecl)


@dataclass(frozen=True)
class BufferDecl:
    """A device tensor: dtype name ('bfloat16', ...), shape, and role ('in', 'out', 'ws')."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Timing:
    min_samples: int = 100
    max_samples: int = 400
    warmup: int = 10
    spread: float = 0.05  # keep sampling while (p90 - p10) / median exceeds this
    # Replay a CUDA graph when the cell's bytes at the copy ceiling take less than this: decided by the
    # cell alone, the same for every candidate and the baseline, run after run (a probe of a kernel
    # near the threshold would flip the mode between runs, and a candidate could steer it).
    graph_below_us: float = 5.0
    graph_launches: int = 20


@dataclass(frozen=True)
class Guard:
    """The guard zones of one buffer, drawn per job: `before` bytes ahead of the data (its offset in the
    allocation, a multiple of 256 so alignment stays an allocation's) and `after` bytes behind it, each
    byte of a pattern drawn from `seed`: no constant a kernel could read to tell it runs in the gate."""

    before: int
    after: int
    seed: int

    def __post_init__(self) -> None:
        if self.before <= 0 or self.before % 256 or self.after <= 0:
            raise ValueError(f"Guard: before must be a positive multiple of 256 and after positive, got {self}")


@dataclass(frozen=True)
class GateCell:
    """Another cell the same cubin must also be right on (M = 1, odd M, N off the vector width)."""

    label: str
    dims: tuple[tuple[str, int], ...]
    launches: tuple[LaunchJob, ...]
    buffers: tuple[BufferDecl, ...]
    scalars: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class DecodeLoop:
    """A recurrent op's decode loop (ops.spec.Recurrence): the candidate's one-token plan (`step`) called
    `steps` times along one sequence (`seq`, whose buffers hold the whole sequence), call t reading token t
    of every `sliced` tensor ((name, bytes a token): token-major) and, after the first, as `state_in` the
    `state_out` the call before it wrote; the calls' outputs gathered in seq's and checked against its float64
    reference, inputs filled with `kind`."""

    label: str
    step: GateCell
    seq: GateCell
    steps: int
    sliced: tuple[tuple[str, int], ...]
    state_in: str
    state_out: str
    kind: str


# kind -> ((tensor, FillSpec), ...): how the gate fills every input for one input kind.
Fills = tuple[tuple[str, tuple[tuple[str, FillSpec], ...]], ...]


@dataclass(frozen=True)
class EvalJob:
    """Verify (and optionally time) one compiled candidate on one cell."""

    job_id: str
    op: str
    dims: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]  # dtype role -> dtype name
    cubin: bytes = field(repr=False)
    launches: tuple[LaunchJob, ...]
    buffers: tuple[BufferDecl, ...]
    scalars: tuple[tuple[str, float], ...]
    kinds: tuple[str, ...]  # the input kinds checked before timing, in order (every kind in `fills`)
    tolerances: tuple[tuple[str, tuple[float, float, float]], ...]  # output -> (atol, rtol, rel_norm)
    seed: int
    timing: Timing | None = None
    baseline: bool = False
    stress_launches: int = 4  # repeats of a checked launch, each poisoned and compared, to expose races
    fills: Fills = ()
    timing_kinds: tuple[str, ...] = ("normal",)  # fresh values of these kinds fill the timed sets
    bytes_moved: int = 0  # the op's bytes for the cell: a time implying more than the copy ceiling is SUSPECT
    gate: tuple[GateCell, ...] = ()
    baselines: tuple[str, ...] = ()  # names to time beside the candidate ('' = the op hooks' first one)
    left_out: tuple[str, ...] = ()  # optional tensors this variant does not use: no buffer, null in the reference
    # What the job's draws come from (gate cells' shapes and scalars, guards, fill values): drawn per job by
    # evo.measure.draws.new_secret, recorded in the result so a failure can be replayed; 0: the gate
    # draws one from its own randomness.
    secret: int = 0
    loop: tuple[DecodeLoop, ...] = ()  # decode loops, run after the gate cells
    # A causal op (OpSpec.causal): (buffer, axis) of every input and output along its causal dim
    causal: tuple[tuple[str, int], ...] = ()

    def fill_of(self, kind: str) -> dict[str, FillSpec]:
        for k, specs in self.fills:
            if k == kind:
                return dict(specs)
        raise KeyError(f"job {self.job_id}: no fill for input kind {kind!r} (has {[k for k, _ in self.fills]})")


@dataclass(frozen=True)
class CheckStats:
    """Device-side comparison of one output against its float64 reference."""

    output: str
    numel: int
    nonfinite: int
    bad: int
    bad_last_row: int
    bad_tail_cols: int
    first_bad: int
    max_abs_err: float
    rel_norm_err: float
    canary_bad: int
    ref_sum: int = 0  # keyed checksum of the float64 reference (and its error scale) compared against; 0 unasked


@dataclass(frozen=True)
class JobResult:
    """What the worker measured; the parent turns it into a Status."""

    job_id: str
    error_kind: str = ""  # "", "launch" (refused launch), "crash" (sticky fault), or the parent's "timeout"
    error: str = ""
    checks: tuple[tuple[str, tuple[CheckStats, ...]], ...] = ()  # (which launch, e.g. "kind tiny", stats)
    input_faults: tuple[str, ...] = ()  # inputs (or their private copies) a launch changed
    invalid: str = ""  # why the plan is outside what a kernel may assume (it only works on an idle, whole GPU)
    wrong: str = ""  # a wrong answer no element-wise comparison shows (outputs that read later tokens)
    times_us: tuple[float, ...] = ()
    baseline_us: tuple[float, ...] = ()  # the first baseline timed (the one the store records)
    baseline_name: str = ""
    peers: tuple[tuple[str, tuple[float, ...]], ...] = ()  # every baseline timed: (name, samples)
    absent: tuple[tuple[str, str], ...] = ()  # baselines asked for that could not be had: (name, why)
    peers_checked: tuple[tuple[str, str], ...] = ()  # timed baselines whose outputs matched the reference: (name, how)
    graph: bool = False
    direct_us: tuple[float, ...] = ()  # graph mode: the candidate's launches outside the graph, one set each
    fingerprint: tuple[tuple[str, str], ...] = ()
    ceiling_gbps: float = 0.0
    bytes_moved: int = 0
    secret: int = 0  # the job's secret draw, as used (EvalJob.secret): the job it made is replayed from it
