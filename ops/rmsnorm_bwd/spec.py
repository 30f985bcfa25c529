"""RMSNorm backward: signature, matrix, input kinds, tolerances, bytes.

Inputs x and dout (M, N) in the x dtype, w (N,) in the w dtype, rstd (M,) fp32 as the forward stores
it; outputs dx (M, N) in the x dtype and dw (N,) in the w dtype (a sum over M rows: kernels
accumulate it in fp32 partials and reduce). rstd is an input, not recomputed: the reference uses it
as given, so a kernel that recomputes it from x is wrong on every kind where they differ.
"""

from __future__ import annotations

import math

import numpy as np

from ops.rmsnorm.spec import MATRIX_M as FORWARD_M
from ops.rmsnorm.spec import MATRIX_N as FORWARD_N
from ops.rmsnorm.spec import TOLERANCES, row_shapes
from ops.rmsnorm_bwd.reference import rmsnorm_bwd
from evo.core.spec import Cell, DType, FillSpec, OpSpec, Role, TensorSpec, Tolerance, quantize

DTYPES = (DType.BF16, DType.FP16, DType.FP32)
MATRIX = [(32768, n) for n in (4096, 8192, 16384, 32768, 65536)] + [(16384, 131072), (8192, 262144)]

_W = FillSpec(mean=1.0, std=0.1)
# rstd of unit-rms rows, give or take. The gate's round C never moves rstd far (perturb=False): rstd is
# drawn apart from x, so xhat = x * rstd stays near unit rms only while rstd stays near 1 / rms(x). A
# far move (-r +- 16 x 1.2, so |r| ~ 18-20) makes the row's term rstd * xhat * mean(g * xhat) grow as
# r^3 ~ 8000: the exact dx reaches 1.6e5 (past fp16's 65504: a right fp16 kernel writes inf) and its
# two terms cancel at ~1e5, where fp32's rounding (~6e-8 x the terms, ~1e-2) is 20x the element-wise
# atol + rtol * |dx| at small |dx|. Moving x, w and dout still makes a cached result stale.
_R = FillSpec(mean=1.0, std=0.2, perturb=False)
_DY = FillSpec()
FILLS = {
    "normal": {"x": FillSpec(), "w": _W, "dout": _DY, "rstd": _R},
    # x in the hundreds with a small rstd, as a forward of such rows stores it
    "large": {"x": FillSpec(std=300.0, row_shift=200.0), "w": _W, "dout": _DY,
              "rstd": FillSpec(mean=3e-3, std=5e-4, perturb=False)},
    # half the rows of x zero (xhat = 0: dx = rstd * dout * w there)
    "zero_rows": {"x": FillSpec(zero_rows=0.5), "w": _W, "dout": _DY, "rstd": _R},
    # one outlier per row of dout: the row mean of g * xhat is dominated by it
    "outlier": {"x": FillSpec(), "w": _W, "dout": FillSpec(outlier=300.0), "rstd": _R},
    # constant rows of x: xhat constant per row
    "constant": {"x": FillSpec(std=2.0, constant_rows=True), "w": _W, "dout": _DY, "rstd": _R},
}
INPUT_KINDS = tuple(FILLS)

# dx as the forward's y (TOLERANCES of ops/rmsnorm); dw sums M terms of size ~1 with random signs:
# its absolute error grows like sqrt(M) ulps of fp32 partials, so its atol is scaled (tolerance()). On the
# device the gate multiplies that atol element-wise by the rms of the column's terms (at least 1; 'scale:dw'
# of ops/rmsnorm_bwd/device.py): terms far from 1 (a perturbed set's) round by their own size. dx's atol is
# multiplied by max(1, |x| |rstd|^3 sum|dout w x| / N) ('scale:dx'): where dx's two terms cancel, its rounding
# is that of the term a x, not of its value.


def make_inputs(c: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays of one input kind, rounded to the cell's dtypes (rstd to fp32)."""
    if kind not in FILLS:
        raise ValueError(f"rmsnorm_bwd has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    m, n = c.dim("M"), c.dim("N")
    f = FILLS[kind]
    return {"x": quantize(f["x"].sample((m, n), rng), c.dtype("x")),
            "w": quantize(f["w"].sample((n,), rng), c.dtype("w")),
            "dout": quantize(f["dout"].sample((m, n), rng), c.dtype("x")),
            "rstd": quantize(f["rstd"].sample((m,), rng), DType.FP32)}


def tolerance(c: Cell, output: str) -> Tolerance:
    t = TOLERANCES[c.dtype("x") if output == "dx" else c.dtype("w")]
    if output == "dw":  # a sum over M rows: absolute error grows like sqrt(M)
        return Tolerance(atol=t.atol * math.sqrt(c.dim("M")), rtol=t.rtol, rel_norm=t.rel_norm)
    return t


def bytes_moved(c: Cell) -> int:
    """x and dout read, dx written, w read and dw written once, rstd read."""
    m, n = c.dim("M"), c.dim("N")
    return 3 * m * n * c.dtype("x").nbytes + 2 * n * c.dtype("w").nbytes + 4 * m


def cell(dtype: DType | str, m: int, n: int, wdtype: DType | str | None = None) -> Cell:
    return Cell.make({"x": dtype, "w": wdtype or dtype}, {"M": m, "N": n})


# fp32 stops below 2^31 elements: there one tensor is 8.6 GB, and the gate's two input sets (inputs,
# their private copies, outputs), the float64 reference and every peer's kept outputs pass the
# H200's 141 GB.
FP32_MAX_ELEMENTS = 1 << 30


def matrix() -> list[Cell]:
    return [cell(d, m, n) for d in DTYPES for m, n in MATRIX if d is not DType.FP32 or m * n <= FP32_MAX_ELEMENTS]


def matrix_train() -> list[Cell]:
    """The training step's backward shapes the matrix lacks: the forward matrix's (M {4096, 32768} x N 1024-32768,
    every dtype) less the backward matrix's, so the package's training step is served from searched entries."""
    have = set(MATRIX)
    return [cell(d, m, n) for d in DTYPES for m in FORWARD_M for n in FORWARD_N if (m, n) not in have]


def edge_cells() -> list[Cell]:
    cells = [c for d in DTYPES for c in (cell(d, 1, 1024), cell(d, 37, 1000), cell(d, 3, 33))]
    return cells + [cell(DType.BF16, 19, 2048, DType.FP32)]


def gate_cells(c: Cell) -> list[Cell]:
    return [Cell.make(c.dtypes_dict(), {"M": m, "N": c.dim("N")}) for m in (1, 37) if m != c.dim("M")]


SPEC = OpSpec(
    name="rmsnorm_bwd",
    tensors=(
        TensorSpec("x", ("M", "N"), "x"),
        TensorSpec("w", ("N",), "w"),
        TensorSpec("dout", ("M", "N"), "x"),
        TensorSpec("rstd", ("M",), DType.FP32),
        TensorSpec("dx", ("M", "N"), "x", role=Role.OUT),
        TensorSpec("dw", ("N",), "w", role=Role.OUT),
    ),
    scalars=(),
    dtype_roles=("x", "w"),
    reference=rmsnorm_bwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=tolerance,
    bytes_moved=bytes_moved,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=lambda c: 8 * c.dim("M") * c.dim("N"),
    fills=FILLS,
    timing_kinds=("normal", "large"),
    gate_cells=gate_cells,
    gate_shapes=row_shapes,
    matrices={"train": matrix_train},
    baselines=("torch.eager", "torch.autograd(rms_norm)", "liger", "quack", "quack.autotuned"),
    bucket_edges={"M": (2048, 16384), "N": (8192, 65536)},
)
