"""A lesson's stable id, shared by extraction and by the LLM roles that write lessons."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from memory.rows import canonical_json


def lesson_id(kind: str, op: str, arch: str, scope: Mapping[str, Any]) -> str:
    """Stable id of a lesson: a hash of its kind and scope."""
    return hashlib.sha256(canonical_json([kind, op, arch, dict(scope)]).encode()).hexdigest()[:24]
