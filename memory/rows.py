"""One frozen record per lesson-store table; its fields, in order, are the table's columns (memory.schema derives
the tables from them: a field's Python type gives its SQL type)."""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, Literal

# Timestamps are naive UTC (DuckDB TIMESTAMP has no zone); None means "filled by the store".
# JSON columns hold canonical_json(...) text so equal objects compare equal in SQL.


def canonical_json(obj: Any) -> str:
    """Canonical JSON text of obj: sorted keys, so equal values give equal text."""
    return json.dumps(obj, sort_keys=True)


def source_hash(text: str) -> str:
    """Content address of a template source: sha256 hex digest of its UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _status_name(status: str | Enum) -> str:
    """A Status member's name ('OK'), so callers may pass the enum without memory importing evo."""
    return status.name if isinstance(status, Enum) else status


@dataclass(frozen=True, kw_only=True)
class RunRow:
    """One search run: its config, seed and outcome."""

    TABLE: ClassVar[str] = "runs"
    run_id: str
    op: str
    arch: str
    config_toml: str
    config_hash: str
    seed: int = field(metadata={"sql": "BIGINT"})
    status: str
    created_at: datetime | None = None
    finished_at: datetime | None = None
    message: str | None = None
    elapsed_s: float | None = None  # search time spent so far, over every resume (the max_seconds budget)
    config_path: str | None = None  # absolute path of the config file; its paths are relative to it


@dataclass(frozen=True, kw_only=True)
class SourceRow:
    """A template's text, addressed by its sha256; build with SourceRow.of(text, ...)."""

    TABLE: ClassVar[str] = "sources"
    source_hash: str
    op: str
    template: str
    text: str
    origin: str
    parent_hash: str | None = None
    llm_call_id: str | None = None
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        # A wrong hash would make "same text twice is a no-op" silently false.
        if self.source_hash != source_hash(self.text):
            raise ValueError(f"source_hash {self.source_hash!r} is not the sha256 of the text")

    @classmethod
    def of(
        cls,
        text: str,
        *,
        op: str,
        template: str,
        origin: str,
        parent_hash: str | None = None,
        llm_call_id: str | None = None,
    ) -> "SourceRow":
        """A SourceRow whose source_hash is computed from text."""
        return cls(
            source_hash=source_hash(text),
            op=op,
            template=template,
            text=text,
            origin=origin,
            parent_hash=parent_hash,
            llm_call_id=llm_call_id,
        )


@dataclass(frozen=True, kw_only=True)
class CandidateRow:
    """A genome: template, params (JSON) and lineage (parents_json is a JSON list of genome keys)."""

    TABLE: ClassVar[str] = "candidates"
    genome_key: str
    op: str
    template: str
    source_hash: str | None
    params_json: str
    origin: str
    parents_json: str
    run_id: str
    generation: int
    created_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class BuildRow:
    """One NVRTC compile of a genome for an arch, with ptxas resource usage and the cubin."""

    TABLE: ClassVar[str] = "builds"
    build_key: str
    genome_key: str
    run_id: str
    arch: str
    dtypes_json: str
    consts_json: str
    status: str  # a Status name; a Status member is stored by name
    regs: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    smem_bytes: int | None = None
    stack_bytes: int | None = None
    compile_ms: float | None = None
    compiler: str | None = None
    log: str | None = None
    error: str | None = None
    cubin: bytes | None = None
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status_name(self.status))


@dataclass(frozen=True, kw_only=True)
class EvaluationRow:
    """One verify-and-time result of a build on one cell (op, dtypes, shape)."""

    TABLE: ClassVar[str] = "evaluations"
    eval_id: str
    run_id: str
    genome_key: str
    build_key: str | None
    cell: str
    dtypes_json: str
    dims_json: str
    status: str  # a Status name; a Status member is stored by name
    median_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    samples: int | None = None
    gbps: float | None = None
    ceiling_gbps: float | None = None
    baseline: str | None = None
    baseline_us: float | None = None
    speedup: float | None = None
    max_abs_err: float | None = None
    rel_norm_err: float | None = None
    error: str | None = None
    fingerprint_json: str | None = None
    fingerprint_class: str | None = None
    generation: int | None = None
    source: Literal["gpu", "replay"] = "gpu"
    created_at: datetime | None = None
    reused_from: str | None = None  # the run that measured it, when copied from another run's result

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _status_name(self.status))
        # Replayed numbers must never pass for fresh GPU measurements.
        if self.source not in ("gpu", "replay"):
            raise ValueError(f"source must be 'gpu' or 'replay', got {self.source!r}")


@dataclass(frozen=True, kw_only=True)
class LessonRow:
    """A lesson learned from past runs, with its scope, provenance and earned usefulness."""

    TABLE: ClassVar[str] = "lessons"
    lesson_id: str
    kind: str
    op: str
    arch: str
    scope_json: str
    text: str
    structured_json: str
    provenance_json: str
    created_run: str
    confirmed_run: str | None = None
    usefulness: float = 0.0
    support: int = 0
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class LessonUseRow:
    """A lesson applied to a genome, and what happened (effect)."""

    TABLE: ClassVar[str] = "lesson_uses"
    genome_key: str
    lesson_id: str
    run_id: str
    effect: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class LLMCallRow:
    """One LLM request and response, its tokens, cost and outcome (never the API key)."""

    TABLE: ClassVar[str] = "llm_calls"
    call_id: str
    run_id: str
    role: str
    model: str
    prompt_hash: str
    prompt_template_hash: str | None
    prompt: str
    response: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    latency_s: float | None = None
    outcome: str | None = None
    error: str | None = None
    created_at: datetime | None = None


Row = RunRow | SourceRow | CandidateRow | BuildRow | EvaluationRow | LessonRow | LessonUseRow | LLMCallRow
ROW_TYPES: tuple[type, ...] = (
    RunRow,
    SourceRow,
    CandidateRow,
    BuildRow,
    EvaluationRow,
    LessonRow,
    LessonUseRow,
    LLMCallRow,
)
