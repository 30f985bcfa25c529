"""What a gate job draws from its secret: the secret itself, the randomness its check cells' shapes and scalars
come from, and the tile a template's plan implies along a dim (the residues drawn shapes cover)."""

from __future__ import annotations

import random
import secrets
from typing import Mapping

from evo.templates.template import TemplateDef, TemplateError
from evo.core.spec import Cell, OpSpec

TILE_PROBE = 1 << 16  # where a plan's tile along a dim is read: a multiple of every power-of-two tile below it


def new_secret() -> int:
    """A job's secret draw (EvalJob.secret): from the OS, never from a seed the repository or a config holds."""
    return secrets.randbits(63) | 1


def shape_rng(secret: int) -> random.Random:
    """The randomness a job's gate cells' shapes are drawn from (evo.measure.evaluators.gate_cells_for)."""
    return random.Random(f"shapes:{secret}")


def scalar_rng(secret: int) -> random.Random:
    """The randomness a job's gate cells' scalars and its decode loop's length are drawn from (make_job)."""
    return random.Random(f"scalars:{secret}")


def implied_tile(tdef: TemplateDef, params: Mapping[str, object], arch: int, cell: Cell, dim: str) -> int:
    """The tile a plan implies along `dim` on `cell`: the rows (tokens) a CTA takes where a launch's grid grows
    with the dim (its size at TILE_PROBE and twice that), the CTAs a persistent grid deals rows out to where it
    stops growing; the largest over the plan's launches, 1 where no grid reads the dim."""
    def grids(v: int) -> list[tuple[int, int, int]]:
        launches, _ = tdef.plan(params, arch, cell.dtypes_dict(), cell.dims_dict() | {dim: v})
        return [ln.grid for ln in launches]

    try:
        at, twice, one = grids(TILE_PROBE), grids(2 * TILE_PROBE), grids(1)
    except (TemplateError, ArithmeticError):
        return 1
    tile = 1
    for ga, gb, g1 in zip(at, twice, one):
        for a, b, o in zip(ga, gb, g1):
            if b > a:
                tile = max(tile, round(TILE_PROBE / a))
            elif a != o:
                tile = max(tile, a)
    return tile


def scalar_note(op: OpSpec, scalars: Mapping[str, float | int] | None) -> str:
    """' eps=3.1e-05': the drawn scalars (those with a declared range), for a gate cell's label."""
    if not scalars:
        return ""
    return "".join(f" {s.name}={scalars[s.name]:.4g}" for s in op.scalars if s.draw is not None)
