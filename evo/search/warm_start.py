"""Warm start: a new run's first genomes are the champions the store holds for the same op and arch, on the
cells nearest its own (same dtype first, then log-distance of the dims)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evo.search.lessons import MIN_USEFULNESS, CellLike, applicable, cell_facts
from memory.queries import CHAMPION, dtype_key
from memory.store import Store


def dims_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance of log2 dims; a dim only one side has counts as 10 doublings."""
    d2 = 0.0
    for k in set(a) | set(b):
        if k in a and k in b:
            d2 += (math.log2(max(a[k], 1)) - math.log2(max(b[k], 1))) ** 2
        else:
            d2 += 100.0
    return math.sqrt(d2)


@dataclass(frozen=True)
class Seed:
    """A warm-start genome: a past champion, the lesson that holds it and how near its cell is."""

    template: str
    params: Mapping[str, Any]
    genome_key: str
    source_hash: str | None
    lesson_id: str
    cell: str
    same_dtype: bool
    distance: float
    dtype: str = ""  # the champion's cell: dtype key and dims
    dims: Mapping[str, int] = field(default_factory=dict)


def warm_start(
    store: Store, op: str, arch: str, cells: Sequence[CellLike], k: int, min_usefulness: float = MIN_USEFULNESS
) -> list[Seed]:
    """Up to k distinct champions of the stored cells nearest the target cells (same dtype first, then log-distance)."""
    df = applicable(store, op, arch, CHAMPION, min_usefulness)
    stored = []
    for r in df.itertuples(index=False):
        s = json.loads(r.structured_json)
        if s.get("level") == "cell" and s.get("top"):
            stored.append((r.lesson_id, r.usefulness, s))
    ranked: list[list[tuple[tuple[Any, ...], Seed]]] = []
    for cell in cells:
        dtypes, dims = cell_facts(cell)
        key = dtype_key(dtypes)
        options = []
        for lesson_id, usefulness, s in stored:
            same, dist = s["dtype"] == key, dims_distance(dims, s["dims"])
            for rank, g in enumerate(s["top"]):
                seed = Seed(
                    g["template"], g["params"], g["genome_key"], g.get("source_hash"), lesson_id, s["cell"], same, dist,
                    s["dtype"], s["dims"],
                )
                options.append(((not same, round(dist, 9), rank, -usefulness, g["genome_key"]), seed))
        ranked.append([seed for seed in sorted(options, key=lambda o: o[0])])
    out: list[Seed] = []
    seen: set[str] = set()
    # Round-robin over the target cells so that every cell gets its nearest champion before any gets a second.
    for pos in range(max((len(r) for r in ranked), default=0)):
        for options in ranked:
            if pos < len(options) and len(out) < k:
                _, seed = options[pos]
                if seed.genome_key not in seen:
                    seen.add(seed.genome_key)
                    out.append(seed)
    return out


def warm_start_seeds(
    store: Store, op: str, arch: str, cells: Sequence[CellLike], k: int
) -> list[tuple[str, dict[str, Any]]]:
    """(template, params) of up to k champions of the nearest stored shapes and dtypes, for the same op and arch."""
    return [(s.template, dict(s.params)) for s in warm_start(store, op, arch, cells, k)]
