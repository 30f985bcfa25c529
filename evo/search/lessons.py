"""The stored lessons the search applies: those of op on arch that have not done more harm than good, and the
target cells they are matched against."""

from __future__ import annotations

from typing import Any

import pandas as pd

from memory.queries import lessons
from memory.store import Store

# A lesson that did more harm than good (usefulness below this) is no longer applied.
MIN_USEFULNESS = -0.5

CellLike = Any  # an evo.core.spec.Cell (dtypes_dict(), dims_dict()) or a (dtypes, dims) pair of mappings


def cell_facts(cell: CellLike) -> tuple[dict[str, str], dict[str, int]]:
    """A cell's dtypes and dims as plain dicts."""
    if hasattr(cell, "dtypes_dict"):
        return dict(cell.dtypes_dict()), dict(cell.dims_dict())
    dtypes, dims = cell
    return dict(dtypes), dict(dims)


def applicable(store: Store, op: str, arch: str, kind: str, min_usefulness: float) -> pd.DataFrame:
    """Stored lessons of one kind for op on arch whose usefulness reaches min_usefulness."""
    df = lessons(store, op, arch, kind)
    return df[df.usefulness >= min_usefulness]
