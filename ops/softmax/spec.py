"""Row-wise softmax forward: signature, matrix, input kinds, tolerances, bytes."""

from __future__ import annotations

import numpy as np

from ops.softmax.reference import softmax_fwd
from evo.core.spec import Cell, DType, FillSpec, OpSpec, Role, TensorSpec, Tolerance, quantize

DTYPES = (DType.BF16, DType.FP16, DType.FP32)
MATRIX_M = (4096,)
MATRIX_N = (1024, 4096, 16384)

# Each kind tests one part of the contract; outputs are probabilities, so atol is small.
FILLS = {
    "normal": {"x": FillSpec()},
    # logits in the hundreds: exp overflows unless the row max is subtracted first
    "large": {"x": FillSpec(std=30.0, row_shift=100.0)},
    # equal logits: exactly 1/N everywhere
    "constant": {"x": FillSpec(std=3.0, constant_rows=True)},
    # one logit 20 above the rest: nearly one-hot; a kernel that reads part of the row misses it
    "outlier": {"x": FillSpec(outlier=20.0)},
    # all-zero rows: 1/N, and a kernel that divides by a max of 0 fails here
    "zero_rows": {"x": FillSpec(zero_rows=0.5)},
}
INPUT_KINDS = tuple(FILLS)

TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-7, rtol=1e-5, rel_norm=1e-5),
    DType.FP16: Tolerance(atol=1e-6, rtol=2e-3, rel_norm=1e-3),
    DType.BF16: Tolerance(atol=1e-6, rtol=1.6e-2, rel_norm=8e-3),
}


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 logits of one input kind, rounded to the cell's dtype."""
    if kind not in FILLS:
        raise ValueError(f"softmax has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    return {"x": quantize(FILLS[kind]["x"].sample((cell.dim("M"), cell.dim("N")), rng), cell.dtype("x"))}


def cell(dtype: DType | str, m: int, n: int) -> Cell:
    return Cell.make({"x": dtype}, {"M": m, "N": n})


def matrix() -> list[Cell]:
    return [cell(d, m, n) for d in DTYPES for m in MATRIX_M for n in MATRIX_N]


def edge_cells() -> list[Cell]:
    """M = 1, odd M, N off any vector width."""
    return [c for d in DTYPES for c in (cell(d, 1, 1024), cell(d, 37, 1000), cell(d, 3, 33))]


def gate_cells(c: Cell) -> list[Cell]:
    return [cell(c.dtype("x"), m, c.dim("N")) for m in (1, 37) if m != c.dim("M")]


SPEC = OpSpec(
    name="softmax",
    tensors=(
        TensorSpec("x", ("M", "N"), "x"),
        TensorSpec("y", ("M", "N"), "x", role=Role.OUT),
    ),
    scalars=(),
    dtype_roles=("x",),
    reference=softmax_fwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=lambda c, output: TOLERANCES[c.dtype("x")],
    bytes_moved=lambda c: 2 * c.dim("M") * c.dim("N") * c.dtype("x").nbytes,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=lambda c: 5 * c.dim("M") * c.dim("N"),
    fills=FILLS,
    timing_kinds=("normal", "large"),
    gate_cells=gate_cells,
    baselines=("torch.softmax", "torch.compile"),
)
