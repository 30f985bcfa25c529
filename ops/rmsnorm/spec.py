"""RMSNorm forward: signature, matrix, inputs, tolerances, bytes; and its variants (QuACK's rmsnorm_fwd).

Variants. QuACK's `rmsnorm_fwd(x, weight, bias=None, residual=None, out_dtype=None, residual_dtype=None,
eps, store_rstd=False)` computes h = x + residual in fp32, stores residual_out = h in residual_dtype
(prenorm), y = h * rstd * w + bias in out_dtype, and rstd (fp32, per row) when asked. A cell carries a
variant in parts that are present only when on, so every cell of the plain op (and its label, genome
keys and results) is unchanged:
    dtype role "residual"   the residual variant: residual (M, N) is added to x and residual_out (M, N)
                            = h is written, both in this dtype (QuACK's residual_dtype, which defaults
                            to the residual's own dtype; fp32 for a full-precision residual stream)
    dtype role "out"        y's dtype (QuACK's out_dtype), only where it differs from x's
    dim bias = 1            bias (N,), in w's dtype, is added after the weight
    dim store_rstd = 1      rstd (M,) fp32 is written
An fp32 weight with 16-bit x is the "w" role, as before. The residual variant is a dtype role, not a
dim, because a template renders with the cell's dtype roles but only the dims it specializes: a
template sees `residual_t` exactly on the variant's cells (cta_row_fused branches on it). The bias and
store_rstd dims are read by constraints ("bias == 0" holds where the dim is absent, as it should) and
may be specialized (rendered at 0 where the cell lacks them).

SPEC is the plain op the engine runs today; VARIANT_SPEC is the same op ("rmsnorm") with the variant
tensors declared optional: a template binds them by naming them in its launch args, always ("residual")
or on the cells whose variant uses them ("residual?": `used_when`, here from `variant_of`). The dims
bias and store_rstd default to 0 (`dim_defaults`): a template that specializes on them renders a cell
without them as the variant switched off.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ops.rmsnorm.reference import rmsnorm_fwd
from evo.core.spec import (Cell, DType, FillSpec, OpSpec, Role, ScalarSpec, TensorSpec, Tolerance, draw_lengths,
                           log_uniform, quantize)

DTYPES = (DType.BF16, DType.FP16, DType.FP32)
MATRIX_M = (4096, 32768)
MATRIX_N = (1024, 2048, 4096, 8192, 16384, 32768)
RESIDUAL_M = 32768  # the residual variant's rows
BIAS_RSTD_N = (1024, 4096, 16384)
VARIANT_DIMS = ("bias", "store_rstd")

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

# The variant inputs of each kind keep the kind's meaning for h = x + residual: large, tiny and
# constant rows stay so; a quarter of the rows of h are zero (both zero); x's outlier still dominates.
# The bias (std 0.5) is well above every tolerance, also as b * (w - 1): a kernel that drops it or
# adds it before the weight fails.
_B = FillSpec(std=0.5)
VARIANT_FILLS = {
    "normal": {"residual": FillSpec(), "bias": _B},
    "large": {"residual": FillSpec(std=300.0, row_shift=200.0), "bias": _B},
    "zero_rows": {"residual": FillSpec(zero_rows=0.5), "bias": _B},
    "tiny": {"residual": FillSpec(std=3e-4), "bias": _B},
    "outlier": {"residual": FillSpec(), "bias": _B},
    "constant": {"residual": FillSpec(std=2.0, constant_rows=True), "bias": _B},
}

TOLERANCES = {
    DType.FP32: Tolerance(atol=1e-5, rtol=1e-5, rel_norm=1e-5),
    DType.FP16: Tolerance(atol=2e-3, rtol=2e-3, rel_norm=1e-3),
    DType.BF16: Tolerance(atol=1.6e-2, rtol=1.6e-2, rel_norm=8e-3),
}
# rstd is stored in fp32 from an fp32 sum of squares and rsqrtf: ~1e-6 relative at N = 32768.
RSTD_TOLERANCE = Tolerance(atol=1e-6, rtol=1e-5, rel_norm=1e-5)


@dataclass(frozen=True)
class Variant:
    """The switches of a cell (all off: the plain op)."""

    residual: bool = False
    bias: bool = False
    store_rstd: bool = False

    def dims(self) -> dict[str, int]:
        """The cell dims that carry its bias and store_rstd: only those that are on."""
        return {d: 1 for d in VARIANT_DIMS if getattr(self, d)}


def variant_of(cell: Cell) -> Variant:
    """The variant a cell carries in its dims (absent: off)."""
    dims = cell.dims_dict()
    bad = {d: dims[d] for d in VARIANT_DIMS if dims.get(d, 0) not in (0, 1)}
    if bad:
        raise ValueError(f"rmsnorm cell {cell.label()}: variant dims must be 0 or 1, got {bad}")
    return Variant(residual="residual" in cell.dtypes_dict(), **{d: bool(dims.get(d, 0)) for d in VARIANT_DIMS})


def out_dtype(cell: Cell) -> DType:
    """y's dtype: the "out" role, else x's."""
    return VARIANT_SPEC.tensor("y").resolve_dtype(cell)


def residual_dtype(cell: Cell) -> DType:
    """residual's and residual_out's dtype: the cell's "residual" role (x's for a cell without one)."""
    return VARIANT_SPEC.tensor("residual").resolve_dtype(cell)


def make_inputs(cell: Cell, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float64 arrays of one input kind (FILLS, VARIANT_FILLS), already rounded to the cell's dtypes.
    x and w are drawn first, so a plain cell gets the same arrays as before the variants existed."""
    if kind not in FILLS:
        raise ValueError(f"rmsnorm has no input kind {kind!r}; expected one of {INPUT_KINDS}")
    m, n = cell.dim("M"), cell.dim("N")
    x = FILLS[kind]["x"].sample((m, n), rng)
    w = FILLS[kind]["w"].sample((n,), rng)
    out = {"x": quantize(x, cell.dtype("x")), "w": quantize(w, cell.dtype("w"))}
    var = variant_of(cell)
    if var.residual:
        out["residual"] = quantize(VARIANT_FILLS[kind]["residual"].sample((m, n), rng), residual_dtype(cell))
    if var.bias:
        out["bias"] = quantize(VARIANT_FILLS[kind]["bias"].sample((n,), rng), cell.dtype("w"))
    return out


def tolerance(cell: Cell, output: str) -> Tolerance:
    """y by its dtype (x's unless out_dtype), residual_out by the residual dtype, rstd as fp32 math."""
    if output == "y":
        return TOLERANCES[out_dtype(cell)]
    if output == "residual_out":
        return TOLERANCES[residual_dtype(cell)]
    if output == "rstd":
        return RSTD_TOLERANCE
    raise KeyError(f"rmsnorm has no output {output!r}")


def bytes_moved(cell: Cell) -> int:
    """x read once, y written once, w read once; and what the variant adds: residual read and
    residual_out written, bias read, rstd written."""
    m, n = cell.dim("M"), cell.dim("N")
    var = variant_of(cell)
    wb = cell.dtype("w").nbytes
    total = m * n * (cell.dtype("x").nbytes + out_dtype(cell).nbytes) + n * wb
    if var.residual:
        total += 2 * m * n * residual_dtype(cell).nbytes
    if var.bias:
        total += n * wb
    if var.store_rstd:
        total += m * DType.FP32.nbytes
    return total


def flops(cell: Cell) -> int:
    """Square, sum, scale by rstd and by w per element; the residual add and the bias one more each."""
    var = variant_of(cell)
    return (4 + int(var.residual) + int(var.bias)) * cell.dim("M") * cell.dim("N")


def _dtype(d: DType | str) -> DType:
    return d if isinstance(d, DType) else DType.parse(d)


def cell(dtype: DType | str, m: int, n: int, wdtype: DType | str | None = None, *,
         residual: DType | str | bool | None = None, bias: bool = False, store_rstd: bool = False,
         out: DType | str | None = None) -> Cell:
    """A cell; the weight takes the input's dtype unless given. Variants: `residual` True (in x's dtype)
    or its dtype, `bias`, `store_rstd`, `out` (y's dtype; left out when it is x's, so each variant has
    one label)."""
    x = _dtype(dtype)
    dtypes: dict[str, DType] = {"x": x, "w": _dtype(wdtype or x)}
    if residual is not None and residual is not False:
        dtypes["residual"] = x if residual is True else _dtype(residual)
    if out is not None and _dtype(out) != x:
        dtypes["out"] = _dtype(out)
    return Cell.make(dtypes, {"M": m, "N": n} | Variant(bias=bias, store_rstd=store_rstd).dims())


def matrix() -> list[Cell]:
    """The benchmark matrix: M x N x dtype, weight of the input dtype."""
    return [cell(d, m, n) for d in DTYPES for m in MATRIX_M for n in MATRIX_N]


def matrix_residual() -> list[Cell]:
    """The residual variant (prenorm: residual in, residual_out out, as QuACK's benchmark times
    rmsnorm_fwd(x, w, residual=...)) at M = 32768: every N of the matrix in bf16 and fp16 with the
    residual in x's dtype, and bf16 with an fp32 residual stream (residual_dtype=torch.float32)."""
    cells = [cell(d, RESIDUAL_M, n, residual=True) for d in (DType.BF16, DType.FP16) for n in MATRIX_N]
    return cells + [cell(DType.BF16, RESIDUAL_M, 4096, residual=DType.FP32)]


def matrix_bias_rstd() -> list[Cell]:
    """The other switches at M = 32768 in bf16, a few N: bias alone, store_rstd alone, and both
    with the residual (QuACK's rmsnorm_fwd(x, w, bias, residual, store_rstd=True))."""
    return [cell(DType.BF16, RESIDUAL_M, n, **kw) for kw in ({"bias": True}, {"store_rstd": True},
                                                            {"residual": True, "bias": True, "store_rstd": True})
            for n in BIAS_RSTD_N]


def matrix_train() -> list[Cell]:
    """The forward matrix's cells as a training step's forward calls them: store_rstd, so the backward reads each
    row's rstd instead of recomputing it (the package serves a call needing gradients from these cells)."""
    return [cell(d, m, n, store_rstd=True) for d in DTYPES for m in MATRIX_M for n in MATRIX_N]


SERVING_M = (1, 8, 64, 140, 512, 2048)  # a decode step's tokens to a prefill chunk's
SERVING_N = (2048, 4096, 8192)


def matrix_serving() -> list[Cell]:
    """Serving shapes (few rows, the host's share large): bf16 and fp16, the weight in x's dtype."""
    return [cell(d, m, n) for d in (DType.BF16, DType.FP16) for m in SERVING_M for n in SERVING_N]


def matrix_serving_residual() -> list[Cell]:
    """The serving shapes with the fused residual add (prenorm), the residual in x's dtype."""
    return [cell(d, m, n, residual=True) for d in (DType.BF16, DType.FP16) for m in SERVING_M for n in SERVING_N]


def edge_cells() -> list[Cell]:
    """Shapes that catch tail and bounds bugs: M=1, odd M, N off the vector width, fp32 weight."""
    cells = []
    for d in DTYPES:
        cells += [cell(d, 1, 1024), cell(d, 37, 1000), cell(d, 5, 4100), cell(d, 3, 33)]
    cells += [cell(DType.BF16, 19, 2048, DType.FP32), cell(DType.FP16, 19, 2056, DType.FP32)]
    return cells


def edge_cells_residual() -> list[Cell]:
    """The residual variant's edge cells: M = 1, odd M, N off the vector width, every dtype, an fp32
    residual stream with 16-bit x, an fp32 weight, and y in another dtype."""
    bf, fp, f32 = DType.BF16, DType.FP16, DType.FP32
    return [cell(bf, 1, 1024, residual=True), cell(fp, 37, 1000, residual=True), cell(f32, 5, 4100, residual=True),
            cell(bf, 3, 33, residual=True), cell(bf, 5, 4100, residual=f32), cell(fp, 7, 2056, residual=f32),
            cell(bf, 19, 2048, f32, residual=True), cell(fp, 9, 1024, residual=True, out=f32),
            cell(f32, 11, 2048, residual=True, out=bf)]


def variant_edge_cells() -> list[Cell]:
    """Small cells of every variant (what the reference and the device reference must handle): the
    residual ones, and bias, store_rstd and out_dtype alone and together."""
    bf, fp, f32 = DType.BF16, DType.FP16, DType.FP32
    return edge_cells_residual() + [
        cell(bf, 5, 1000, bias=True), cell(fp, 3, 33, store_rstd=True), cell(bf, 4, 1024, out=f32),
        cell(fp, 6, 2048, f32, bias=True, store_rstd=True, out=f32),
        cell(bf, 7, 4100, residual=f32, bias=True, store_rstd=True),
    ]


def uses_residual(c: Cell) -> bool:
    return variant_of(c).residual


def uses_bias(c: Cell) -> bool:
    return variant_of(c).bias


def stores_rstd(c: Cell) -> bool:
    return variant_of(c).store_rstd


def gate_cells(c: Cell) -> list[Cell]:
    """Same dtypes, N and variant with M = 1, a small odd M and an odd M past one wave of CTAs."""
    return [Cell.make(c.dtypes_dict(), c.dims_dict() | {"M": m}) for m in (1, 37, 1059) if m != c.dim("M")]


GATE_ELEMENTS = 1 << 25  # a drawn gate cell's M x N at most (its buffers, private copies and float64 reference)
PAST_WAVE = 1057  # rows past one wave of one-row CTAs on 132 SMs at 8 CTAs an SM


def row_shapes(c: Cell, rng: random.Random, tile: Callable[[str], int]) -> list[Cell]:
    """The gate's check cells drawn per job: same dtypes, N and variant with M = 1, a small M (< 128) and an M
    past one wave of CTAs (PAST_WAVE to 2100, fewer where GATE_ELEMENTS stops it), at residues mod the
    template's rows a CTA (or CTAs of a persistent grid, tile("M")) that differ, none a power of two; and a
    small M at an N of 8 x an odd number from c's N / 2 to N (kept only for a template not specialized on N)."""
    top = max(2, min(2100, GATE_ELEMENTS // c.dim("N")))
    spans = [(2, min(127, top)), (max(2, min(PAST_WAVE, top // 2 + 1)), top)]
    ms = dict.fromkeys([1, *draw_lengths(rng, tile("M"), spans)])
    cells = [Cell.make(c.dtypes_dict(), c.dims_dict() | {"M": m}) for m in ms]
    half = c.dim("N") // 16  # N = 8 x odd from N / 2 to N: a row of whole 16-byte vectors, no power of two
    n = 8 * rng.randrange(max(5, half) | 1, max(6, 2 * half), 2)
    cells.append(Cell.make(c.dtypes_dict(), c.dims_dict() | {"M": rng.randint(2, 9), "N": n}))
    return [g for g in cells if g != c]


SPEC = OpSpec(
    name="rmsnorm",
    tensors=(
        TensorSpec("x", ("M", "N"), "x"),
        TensorSpec("w", ("N",), "w"),
        TensorSpec("y", ("M", "N"), "x", role=Role.OUT),
    ),
    scalars=(ScalarSpec("eps", float, 1e-6, draw=log_uniform(1e-7, 1e-3)),),
    dtype_roles=("x", "w"),
    reference=rmsnorm_fwd,
    make_inputs=make_inputs,
    input_kinds=INPUT_KINDS,
    tolerance=tolerance,
    bytes_moved=bytes_moved,
    matrix=matrix,
    edge_cells=edge_cells,
    flops=flops,
    fills=FILLS,
    timing_kinds=("normal", "large"),
    gate_cells=gate_cells,
    gate_shapes=row_shapes,
    baselines=("torch.rms_norm", "torch.compile", "liger", "quack", "quack.autotuned"),
    bucket_edges={"M": (2048, 8192), "N": (2048, 8192)},
)

# The same op with the variants' tensors, optional: a template that names them in its launch args is
# the variant that uses them (no buffer, fill or check for the others); one that names them "name?"
# serves several variants, each tensor bound on the cells whose variant uses it (used_when). y's dtype
# is the "out" role, x's where the cell lacks it. The residual stream's is the "residual" role, which
# only the variant's cells carry; a template that binds it (unconditionally) on another cell gets x's
# dtype, and the device reference, told the cell has no residual, fails it. dtype_roles stay x and w: an experiment's cells.dims product
# gives every role the same dtype, and must keep giving plain cells.
VARIANT_SPEC = OpSpec(**{
    **SPEC.__dict__,
    "tensors": (
        TensorSpec("x", ("M", "N"), "x"),
        TensorSpec("w", ("N",), "w"),
        TensorSpec("y", ("M", "N"), "out", role=Role.OUT, fallback="x"),
        TensorSpec("residual", ("M", "N"), "residual", optional=True, fallback="x", used_when=uses_residual),
        TensorSpec("bias", ("N",), "w", optional=True, used_when=uses_bias),
        TensorSpec("residual_out", ("M", "N"), "residual", role=Role.OUT, optional=True, fallback="x",
                   used_when=uses_residual),
        TensorSpec("rstd", ("M",), DType.FP32, role=Role.OUT, optional=True, used_when=stores_rstd),
    ),
    "fills": {k: {**FILLS[k], **VARIANT_FILLS[k]} for k in FILLS},
    "matrices": {"residual": matrix_residual, "bias_rstd": matrix_bias_rstd, "serving": matrix_serving,
                 "serving_residual": matrix_serving_residual, "train": matrix_train},
    "dim_defaults": {d: 0 for d in VARIANT_DIMS},
})
