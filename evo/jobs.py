"""Records exchanged with the GPU worker process. Plain data; imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# An argument binding: ("buf", name) for a device pointer, ("i32"|"i64"|"f32", value) for a scalar.
ArgBind = tuple[str, Any]


@dataclass(frozen=True)
class LaunchJob:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[ArgBind, ...]


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
    graph_below_us: float = 10.0  # replay a CUDA graph for launches shorter than this
    graph_launches: int = 20


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
    kinds: tuple[str, ...]  # input kind of each check set, at least 3
    tolerances: tuple[tuple[str, tuple[float, float, float]], ...]  # output -> (atol, rtol, rel_norm)
    seed: int
    timing: Timing | None = None
    baseline: bool = False
    stress_launches: int = 0  # extra back-to-back launches before the last check, to expose races


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


@dataclass(frozen=True)
class JobResult:
    """What the worker measured; the parent turns it into a Status."""

    job_id: str
    error_kind: str = ""  # "", "launch" (refused launch), "crash" (sticky fault), or the parent's "timeout"
    error: str = ""
    checks: tuple[tuple[int, tuple[CheckStats, ...]], ...] = ()  # (set index or -1 for last timed, stats)
    times_us: tuple[float, ...] = ()
    baseline_us: tuple[float, ...] = ()
    baseline_name: str = ""
    graph: bool = False
    fingerprint: tuple[tuple[str, str], ...] = ()
    ceiling_gbps: float = 0.0
