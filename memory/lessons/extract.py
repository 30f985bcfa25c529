"""Extraction entry points: derive every lesson of op on arch from the store, and upsert them."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from memory import queries as q
from memory.lessons.champions import champion_lessons
from memory.lessons.effects import param_effect_lessons, template_effect_lessons
from memory.lessons.failures import failure_lessons
from memory.rows import LessonRow
from memory.store import Store


def extract_lessons(
    store: Store, op: str, arch: str, run_id: str, *, min_n: int = 3, edges: Mapping[str, tuple[int, int]] | None = None
) -> list[LessonRow]:
    """Every lesson the store supports for op on arch (or its suffixed variants); writes nothing."""
    ok = q.ok_evaluations(store, op, arch)
    return [
        *param_effect_lessons(ok, run_id, min_n=min_n, edges=edges),
        *template_effect_lessons(ok, run_id, edges=edges),
        *failure_lessons(q.outcomes(store, op, arch), run_id),
        *champion_lessons(ok, run_id, edges=edges),
    ]


def write_lessons(store: Store, rows: Iterable[LessonRow]) -> None:
    """Upsert lessons in one batch, keeping the usefulness they have earned (and, by the store, created_run)."""
    rows = list(rows)
    if not rows:
        return
    earned = store.sql(
        "SELECT lesson_id, usefulness FROM lessons WHERE list_contains(?::VARCHAR[], lesson_id)",
        [[r.lesson_id for r in rows]],
    )
    kept = dict(zip(earned.lesson_id, earned.usefulness.astype(float)))
    store.write(dataclasses.replace(r, usefulness=kept.get(r.lesson_id, r.usefulness)) for r in rows)


def refresh_lessons(store: Store, op: str, arch: str, run_id: str, **kw: Any) -> list[LessonRow]:
    """Re-derive and upsert every lesson of op on arch; call after a generation and at the end of a run."""
    rows = extract_lessons(store, op, arch, run_id, **kw)
    write_lessons(store, rows)
    return rows
