"""The op's input kinds and tolerances leave no room for a shortcut: a kernel that drops any part of
the RMSNorm formula fails at least one gate kind on every cell, and an honest fp32 kernel passes all.

Simulated in numpy: inputs from the op's own FillSpecs, outputs rounded to the cell's dtype the way a
kernel stores them, judged with the op's tolerances as the device compare does.
"""

from __future__ import annotations

import numpy as np
import pytest

from ops.rmsnorm.spec import SPEC
from evo.core.spec import Cell, DType, quantize
from tests.unit.rms_shortcuts import (
    SHORTCUTS,
    clamped_instead_of_eps,
    fp16_accumulation,
    honest,
    no_eps,
    quarter_reduction,
)
from tests.unit.verdict import outside

ROWS = 8  # the formula is per row: more rows add chances to fail, so few rows is the hard case


def cells() -> list[Cell]:
    """Every (dtypes, N) of the matrix at ROWS rows, plus the edge cells as they are."""
    seen, out = set(), []
    for c in SPEC.matrix():
        key = (c.dtypes, c.dim("N"))
        if key not in seen:
            seen.add(key)
            out.append(Cell.make(c.dtypes_dict(), {"M": ROWS, "N": c.dim("N")}))
    return out + SPEC.edge_cells()


def f32(a):
    return np.asarray(a, dtype=np.float32)


def fails(c: Cell, inputs: dict, y: np.ndarray) -> bool:
    """What the device compare decides: any non-finite, any element out of atol/rtol, or the norm bound."""
    return outside(y, SPEC.reference(inputs, SPEC.scalar_values(c))["y"], SPEC.tolerance(c, "y"))


def run(c: Cell, kind: str, fn, seed: int) -> bool:
    inputs = SPEC.make_inputs(c, kind, np.random.default_rng(seed))
    with np.errstate(all="ignore"):
        y = fn(f32(inputs["x"]), f32(inputs["w"]), np.float32(SPEC.scalar_values(c)["eps"]))
    return fails(c, inputs, quantize(np.asarray(y, dtype=np.float64), c.dtype("x")))


CELLS = cells()


@pytest.mark.parametrize("c", CELLS, ids=lambda c: c.label().replace(" ", "-"))
def test_honest_fp32_kernel_passes_every_kind(c):
    for kind in SPEC.gate_kinds():
        for seed in (0, 1):
            assert not run(c, kind, honest, seed), (kind, seed)


@pytest.mark.parametrize("fn", SHORTCUTS, ids=lambda f: f.__name__)
def test_every_shortcut_fails_some_kind_on_every_cell(fn):
    if fn is fp16_accumulation:
        cs = [c for c in CELLS if c.dtype("x") is not DType.FP32]  # fp32 x does not round its squares to fp16
    else:
        cs = CELLS
    escaped = [c.label() for c in cs if not any(run(c, kind, fn, 0) for kind in SPEC.gate_kinds())]
    assert not escaped, f"{fn.__name__} passes every gate kind on {escaped}"


def test_the_old_kinds_alone_let_shortcuts_through():
    """Why the new kinds exist: with only 'normal' and 'large', some shortcut passes some cell."""
    escaped = [(fn.__name__, c.label()) for fn in (no_eps, quarter_reduction, clamped_instead_of_eps) for c in CELLS
               if not any(run(c, kind, fn, 0) for kind in ("normal", "large"))]
    assert escaped
