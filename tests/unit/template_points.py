"""Helpers of the template tests: legal points drawn from a template's space, and a point's real NVRTC
build for sm_90a on a cell."""

from __future__ import annotations

import random
from typing import Any

from evo.build.nvrtc import compile_one, prepare
from evo.core.genome import Genome
from evo.templates.template import TemplateDef
from evo.core.spec import Cell


def legal_points(tdef: TemplateDef, cell: Cell, n: int, seed: int, **fixed: Any) -> list[dict]:
    """Up to n distinct legal points drawn at random from the template's space (with `fixed` values)."""
    rng = random.Random(seed)
    out: list[dict] = []
    for _ in range(3000):
        p = {k: rng.choice(vals) for k, vals in tdef.space} | fixed
        if p not in out and tdef.is_valid(p, 90, cell.dtypes_dict(), cell.dims_dict()):
            out.append(p)
            if len(out) == n:
                break
    return out


def build_point(tdef: TemplateDef, cell: Cell, params: dict) -> tuple[Any, Any]:
    """(the build input, its NVRTC result) of the template at `params` on `cell`, for sm_90a."""
    g = Genome.make(tdef.op, tdef.name, tdef.source_hash, params)
    bi = prepare(tdef, g, "sm_90a", cell.dtypes_dict(), cell.dims_dict())
    return bi, compile_one(bi)
