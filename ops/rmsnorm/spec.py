"""RMSNorm forward: signature, matrix, inputs, tolerances, bytes."""

from __future__ import annotations

import numpy as np

from ops.rmsnorm.reference import rmsnorm_fwd
from ops.spec import Cell, DType, FillSpec, OpSpec, Role, ScalarSpec, TensorSpec, Tolerance, quantize

DTYPES = (DType.BF16, DType.FP16, DType.FP32)
MATRIX_M = (4096, 32768)
MATRIX_N = (1024, 2048, 4096, 8192, 16384, 32768)

# The gate's input kinds: each exercises one part of the contract, so a kernel that skips part of
# the formula fails at least one of them on every cell (tests/unit/test_gate_kinds.py proves it).
_W = FillSpec(mean=1.0, std=0.1)
FILLS = {
    "normal": {"x": FillSpec(), "w": _W},
    # |x| in the hundreds: x^2 overflows fp16 (max 65504) unless accumulated in fp32; rms is not ~1.
    "large": {"x": FillSpec(std=300.0, row_shift=200.0), "w": _W},
    # half the rows all zero: y = 0 there, and 0 * rsqrt(0) is NaN for a kernel that drops eps.
    "zero_rows": {"x": FillSpec(zero_rows=0.5), "w": _W},
    # mean(x^2) ~ 1e-7, ten times below eps: eps decides the result.
    "tiny": {"x": FillSpec(std=3e-4), "w": _W},
    # one element per row at +-1000 dominates the mean square: a partial reduction misses it.
    "outlier": {"x": FillSpec(outlier=1000.0), "w": _W},
    # every element of a row equal: y = +-w; a kernel that centres the row (LayerNorm) writes 0.
    "constant": {"x": FillSpec(std=2.0, constant_rows=True), "w": _W},
}
INPUT_KINDS = tuple(FILLS)

TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-5, rtol=1e-5, rel_norm=1e-5),
    DType.FP16: Tolerance(atol=2e-3, rtol=2e-3, rel_norm=1e-3),
    DType.BF16: Tolerance(atol=1.6e-2, rtol=1.6e-2, rel_norm=8e-3),
}


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays of one input kind (FILLS), already rounded to the cell's dtypes."""
    if kind not in FILLS:
        raise ValueError(f"rmsnorm has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    m, n = cell.dim("M"), cell.dim("N")
    x = FILLS[kind]["x"].sample((m, n), rng)
    w = FILLS[kind]["w"].sample((n,), rng)
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


def gate_cells(c: Cell) -> list[Cell]:
    """Same dtypes and N with M = 1, a small odd M and an odd M past one wave of CTAs."""
    return [Cell.make(c.dtypes_dict(), {"M": m, "N": c.dim("N")}) for m in (1, 37, 1059) if m != c.dim("M")]


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
    fills=FILLS,
    timing_kinds=("normal", "large"),
    gate_cells=gate_cells,
    baselines=("torch.rms_norm", "torch.compile", "liger", "quack", "quack.autotuned"),
    bucket_edges={"M": (2048, 8192), "N": (2048, 8192)},
)
