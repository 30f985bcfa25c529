"""Kernel Factory lesson store: every source, candidate, build, evaluation, lesson and LLM call, in DuckDB."""

from memory.rows import (
    BuildRow,
    CandidateRow,
    EvaluationRow,
    LessonRow,
    LessonUseRow,
    LLMCallRow,
    Row,
    RunRow,
    SourceRow,
    canonical_json,
    source_hash,
)
from memory.schema import SCHEMA_VERSION
from memory.store import Batch, SchemaVersionError, Store, StoreError

__all__ = [
    "SCHEMA_VERSION",
    "Batch",
    "BuildRow",
    "CandidateRow",
    "EvaluationRow",
    "LLMCallRow",
    "LessonRow",
    "LessonUseRow",
    "Row",
    "RunRow",
    "SchemaVersionError",
    "SourceRow",
    "Store",
    "StoreError",
    "canonical_json",
    "source_hash",
]
