"""RMSNorm forward: signature, matrix, inputs, tolerances, bytes."""

from __future__ import annotations

import numpy as np

from ops.rmsnorm.reference import rmsnorm_fwd
from ops.spec import Cell, DType, OpSpec, Role, ScalarSpec, TensorSpec, Tolerance, quantize

DTYPES = (DType.BF16, DType.FP16, DType.FP32)
MATRIX_M = (4096, 32768)
MATRIX_N = (1024, 2048, 4096, 8192, 16384, 32768)
INPUT_KINDS = ("normal", "large")

TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-5, rtol=1e-5, rel_norm=1e-5),
    DType.FP16: Tolerance(atol=2e-3, rtol=2e-3, rel_norm=1e-3),
    DType.BF16: Tolerance(atol=1.6e-2, rtol=1.6e-2, rel_norm=8e-3),
}


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays already rounded to the cell's dtypes.

    normal: x ~ N(0, 1), w ~ 1 + 0.1 N(0, 1).
    large: |x| in the hundreds, so x^2 overflows fp16 (max 65504) unless accumulated in fp32.
    """
    m, n = cell.dim("M"), cell.dim("N")
    if kind == "normal":
        x = rng.standard_normal((m, n))
    elif kind == "large":
        x = rng.standard_normal((m, n)) * 300.0 + rng.choice([-1.0, 1.0], size=(m, 1)) * 200.0
    else:
        raise ValueError(f"rmsnorm has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    w = 1.0 + 0.1 * rng.standard_normal(n)
    return {"x": quantize(x, cell.dtype("x")), "w": quantize(w, cell.dtype("w"))}


def tolerance(cell: Cell, output: str) -> Tolerance:
    return TOLERANCES[cell.dtype("x")]


def bytes_moved(cell: Cell) -> int:
    """x read once, y written once, w read once."""
    m, n = cell.dim("M"), cell.dim("N")
    xb = cell.dtype("x").nbytes
    return 2 * m * n * xb + n * cell.dtype("w").nbytes


def cell(dtype: DType | str, m: int, n: int, wdtype: DType | str | None = None) -> Cell:
    """A cell; the weight takes the input's dtype unless given."""
    return Cell.make({"x": dtype, "w": wdtype or dtype}, {"M": m, "N": n})


def matrix() -> list[Cell]:
    """The benchmark matrix: M x N x dtype, weight of the input dtype."""
    return [cell(d, m, n) for d in DTYPES for m in MATRIX_M for n in MATRIX_N]


def edge_cells() -> list[Cell]:
    """Shapes that catch tail and bounds bugs: M=1, odd M, N off the vector width, fp32 weight."""
    cells = []
    for d in DTYPES:
        cells += [cell(d, 1, 1024), cell(d, 37, 1000), cell(d, 5, 4100), cell(d, 3, 33)]
    cells += [cell(DType.BF16, 19, 2048, DType.FP32), cell(DType.FP16, 19, 2056, DType.FP32)]
    return cells


SPEC = OpSpec(
    name="rmsnorm",
    tensors=(
        TensorSpec("x", ("M", "N"), "x"),
        TensorSpec("w", ("N",), "w"),
        TensorSpec("y", ("M", "N"), "x", role=Role.OUT),
    ),
    scalars=(ScalarSpec("eps", float, 1e-6),),
    dtype_roles=("x", "w"),
    reference=rmsnorm_fwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=tolerance,
    bytes_moved=bytes_moved,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=lambda c: 4 * c.dim("M") * c.dim("N"),
)
