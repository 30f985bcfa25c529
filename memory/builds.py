"""Builds read back: those a later run may load instead of compiling, and those an export checks its rebuild
against."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from memory.store import Store

# A stored failure is reused only when it is the source's fault every time: NVRTC's own error (it
# leaves a log) or a resource check. A compile that timed out or whose process died is tried again.
_REUSED_BUILDS_SQL = """
SELECT build_key, status, log, error, cubin, compile_ms, compiler FROM builds
WHERE list_contains(?::VARCHAR[], build_key)
  AND (status IN ('OK', 'RESOURCE_ERROR') OR (status = 'COMPILE_ERROR' AND coalesce(log, '') <> ''))
"""


def reusable_builds(store: Store, build_keys: Sequence[str]) -> pd.DataFrame:
    """The stored builds of these keys that stand for a new compile: OK, RESOURCE_ERROR, COMPILE_ERROR with a log."""
    return store.sql(_REUSED_BUILDS_SQL, [list(build_keys)])


def builds_of(store: Store, build_keys: Sequence[str]) -> pd.DataFrame:
    """These builds' genome, status, cubin, compiler, registers and spill stores."""
    return store.sql("SELECT build_key, genome_key, status, cubin, compiler, regs, spill_stores FROM builds "
                     "WHERE list_contains(?::VARCHAR[], build_key)", [list(build_keys)])
