"""The operator abstraction: what an op computes, which inputs it takes, how it is checked.

An op is described by data (tensors with symbolic dims, scalars, dtype roles) plus a few pure
functions (float64 reference, input generators, tolerances, bytes moved). Several outputs, optional
inputs, variable-length batches and reductions over rows all fit the same shape, so RMSNorm forward,
RMSNorm backward and Kimi Delta Attention share it.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np


class DType(str, enum.Enum):
    """Element types a kernel may read or write."""

    FP32 = "float32"
    FP16 = "float16"
    BF16 = "bfloat16"
    INT32 = "int32"

    @property
    def nbytes(self) -> int:
        return {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4}[self.value]

    @property
    def ctype(self) -> str:
        """The CUDA C++ type name."""
        return {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "int32": "int"}[self.value]

    @property
    def short(self) -> str:
        return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32"}[self.value]

    @classmethod
    def parse(cls, text: str) -> "DType":
        """Accept 'bf16', 'bfloat16', 'fp16', 'float16', 'fp32', 'float32', 'int32'."""
        aliases = {"bf16": cls.BF16, "fp16": cls.FP16, "half": cls.FP16, "fp32": cls.FP32, "float": cls.FP32}
        if text in aliases:
            return aliases[text]
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown dtype {text!r}; expected one of bf16, fp16, fp32, int32") from None


class Role(str, enum.Enum):
    IN = "in"
    OUT = "out"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: symbolic dims, and the cell dtype role that gives its element type.

    `dtype` is either a fixed DType or the name of a dtype role of the cell ("x", "w", "state").
    """

    name: str
    dims: tuple[str, ...]
    dtype: DType | str
    role: Role = Role.IN
    optional: bool = False
    # The role used when a cell lacks `dtype`: a variant's dtype role (out_dtype) that defaults to another.
    fallback: str = ""
    # An optional tensor's use: the cells (of the op's variants) that use it. A template names it in a
    # launch arg as "name?" to bind it on those cells only, and pass a null pointer on the others.
    used_when: Callable[["Cell"], bool] | None = None

    def resolve_dtype(self, cell: "Cell") -> DType:
        if isinstance(self.dtype, DType):
            return self.dtype
        if self.fallback and self.dtype not in dict(cell.dtypes):
            return cell.dtype(self.fallback)
        return cell.dtype(self.dtype)

    def shape(self, cell: "Cell") -> tuple[int, ...]:
        return tuple(cell.dim(d) for d in self.dims)


ScalarDraw = Callable[["Cell", random.Random], float]


@dataclass(frozen=True)
class ScalarSpec:
    """One scalar argument; `default` may depend on the cell (e.g. scale = K^-1/2). `draw`: the values
    a caller may pass, as the gate draws them for its check cells (None: the default only)."""

    name: str
    kind: type  # float or int
    default: float | int | Callable[["Cell"], float | int]
    draw: ScalarDraw | None = None

    def value(self, cell: "Cell") -> float | int:
        return self.default(cell) if callable(self.default) else self.default

    def drawn(self, cell: "Cell", rng: random.Random) -> float | int:
        """A value from the declared range (the default where none is declared); a float one as an fp32 holds
        it, so the kernel's f32 argument and the reference's f64 are the same number."""
        if self.draw is None:
            return self.value(cell)
        v = self.draw(cell, rng)
        return float(np.float32(v)) if self.kind is float else int(v)


def log_uniform(lo: float, hi: float, unit: Callable[["Cell"], float] | None = None) -> ScalarDraw:
    """Draws log-uniform in [lo, hi], in units of unit(cell) where given (scale: K^-1/2)."""
    if not 0 < lo <= hi:
        raise ValueError(f"log_uniform needs 0 < lo <= hi, got {lo}, {hi}")

    def draw(cell: "Cell", rng: random.Random) -> float:
        v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        return v * unit(cell) if unit is not None else v

    return draw


def uniform(lo: float, hi: float) -> ScalarDraw:
    """Draws uniform in [lo, hi]."""
    if not lo <= hi:
        raise ValueError(f"uniform needs lo <= hi, got {lo}, {hi}")
    return lambda cell, rng: rng.uniform(lo, hi)


def draw_lengths(rng: random.Random, tile: int, spans: Sequence[tuple[int, int]]) -> list[int]:
    """One length per span [lo, hi], at residues mod `tile` that differ from one another: every residue
    when there are at least `tile` spans, else tile - 1 (a tile one short of full, in the widest span) and
    others drawn. A span too narrow for its residue gets any length in it; no length above 2 is a power
    of two where its span holds another of the same residue."""
    tile = max(1, int(tile))
    if not spans:
        return []
    if tile <= len(spans):
        drawn = rng.sample(range(tile), tile) + [rng.randrange(tile) for _ in range(len(spans) - tile)]
    else:
        drawn = [tile - 1, *rng.sample(range(tile - 1), len(spans) - 1)]
    widest_first = sorted(range(len(spans)), key=lambda i: -spans[i][1])
    residues = [0] * len(spans)
    for i, r in zip(widest_first, drawn):
        residues[i] = r
    out = []
    for (lo, hi), r in zip(spans, residues):
        lo = max(1, lo)
        hi = max(lo, hi)
        same = list(range(lo + (r - lo) % tile, hi + 1, tile)) or list(range(lo, hi + 1))
        plain = [v for v in same if v <= 2 or v & (v - 1)]
        out.append(rng.choice(plain or same))
    return out


@dataclass(frozen=True)
class Recurrence:
    """How an op's state carries over calls, for the gate's decode loop: `loop(cell, steps)` gives the
    one-token cell and the cell of `steps` tokens in one sequence (None where the cell is no decode step,
    or where the loop's float64 reference cannot stand for it); the loop runs the one-token plan `steps`
    times (drawn in `steps`), token t's slice of every tensor along `token`, `state_in` of each call the
    `state_out` of the call before it, inputs filled with `kind`."""

    token: str
    state_in: str
    state_out: str
    loop: Callable[["Cell", int], "tuple[Cell, Cell] | None"]
    steps: tuple[int, int] = (48, 80)
    kind: str = "normal"

    def __post_init__(self) -> None:
        if not 2 <= self.steps[0] <= self.steps[1]:
            raise ValueError(f"Recurrence.steps must be 2 <= lo <= hi, got {self.steps}")


# Transforms a FillSpec may apply to its draws (the index is the code the device fill takes).
TRANSFORMS = ("", "neg_exp", "sigmoid", "l2norm_rows")


@dataclass(frozen=True)
class Causal:
    """An op whose outputs at a position along `dim` depend on inputs at that position and before only (KDA: the
    token dim T). The gate launches a set, then the same inputs with everything from a drawn position on filled
    afresh, and requires every output before that position to come out bit for bit the same."""

    dim: str


@dataclass(frozen=True)
class FillSpec:
    """How the gate fills one input tensor for one input kind; the device fill and `sample` agree.

    Each row (the last dim) is: mean + std * N(0, 1) per element + row_shift * (+-1 per row); with
    `constant_rows` one N(0, 1) draw per row instead of per element; with `outlier` one element per
    row (at a random column) set to +-outlier; then `transform`: "neg_exp" -exp(v) (log-space decays),
    "sigmoid" 1 / (1 + exp(-v)) (values in (0, 1)), "l2norm_rows" each row divided by its L2 norm
    (unit rows); last, a `zero_rows` fraction of rows all zero.
    An int32 tensor takes an offsets fill instead: `offsets` names the dim its last value equals, and
    it holds n + 1 strictly increasing offsets 0 = c_0 < ... < c_n = that dim (uneven lengths, as
    cu_seqlens); `bind` sets `end` from a cell's dims before the device sees it.
    """

    mean: float = 0.0
    std: float = 1.0
    row_shift: float = 0.0
    zero_rows: float = 0.0
    constant_rows: bool = False
    outlier: float = 0.0
    transform: str = ""
    offsets: str = ""
    end: int = 0
    # Whether the gate's round C may move this input far (by 16 x magnitude()). False for an input
    # whose scale the op multiplies by itself, e.g. a stored per-row rstd (rmsnorm_bwd): the move
    # flips its sign and multiplies its row's terms by up to r^3 ~ 8000, an input no caller passes,
    # whose exact result leaves fp16's range and cancels far below fp32's element-wise atol.
    perturb: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.zero_rows <= 1.0:
            raise ValueError(f"FillSpec.zero_rows must be in [0, 1], got {self.zero_rows}")
        if self.std < 0:
            raise ValueError(f"FillSpec.std must be >= 0, got {self.std}")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"FillSpec.transform must be one of {TRANSFORMS[1:]} (or empty), got {self.transform!r}")
        if self.offsets and self.transform:
            raise ValueError("FillSpec: an offsets fill takes no transform")

    def bind(self, dims: Mapping[str, int]) -> "FillSpec":
        """The spec for one cell: an offsets fill gets its end from the cell's dims; others unchanged."""
        if not self.offsets:
            return self
        if self.offsets not in dims:
            raise KeyError(f"offsets fill ends at dim {self.offsets!r}, which the cell lacks (has {sorted(dims)})")
        return replace(self, end=int(dims[self.offsets]))

    def magnitude(self) -> float:
        """A typical |value|: how far the gate moves an element when it perturbs inputs."""
        if self.transform == "neg_exp":
            return math.exp(self.mean + self.std)
        if self.transform:
            return 1.0
        return max(abs(self.mean) + self.std + abs(self.row_shift), abs(self.outlier), 1e-3)

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Float64 values with this distribution (the numpy mirror of the device fill)."""
        if self.offsets:
            return self._offsets(shape, rng)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        n = shape[-1] if shape else 1
        if self.constant_rows:
            v = self.mean + self.std * np.repeat(rng.standard_normal((rows, 1)), n, axis=1)
        else:
            v = self.mean + self.std * rng.standard_normal((rows, n))
        sign = rng.choice([-1.0, 1.0], size=(rows, 1))
        v = v + sign * self.row_shift
        if self.outlier:
            v[np.arange(rows), rng.integers(0, n, size=rows)] = sign[:, 0] * self.outlier
        if self.transform == "neg_exp":
            v = -np.exp(v)
        elif self.transform == "sigmoid":
            v = 1.0 / (1.0 + np.exp(-v))
        elif self.transform == "l2norm_rows":
            norm = np.linalg.norm(v, axis=1, keepdims=True)
            v = np.divide(v, norm, out=np.zeros_like(v), where=norm > 0)
        if self.zero_rows:
            v[rng.random(rows) < self.zero_rows] = 0.0
        return v.reshape(shape)

    def _offsets(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """0 = c_0 < ... < c_n = end: c_i = i + floor((end - n) * W_i / W_n), W the running sum of
        squared exponential weights (a few long sequences and several short ones)."""
        n = int(np.prod(shape)) - 1
        if len(shape) != 1 or n < 1 or self.end < n:
            raise ValueError(f"offsets fill: shape {shape} needs (n + 1,) with 1 <= n <= end = {self.end}")
        w = rng.exponential(size=n) ** 2
        cum = np.concatenate([[0.0], np.cumsum(w)]) / w.sum()
        out = np.arange(n + 1) + np.floor((self.end - n) * cum[:n + 1])
        out[n] = self.end
        return out.astype(np.float64)


@dataclass(frozen=True)
class Tolerance:
    """Per-dtype acceptance: elementwise |a-b| <= atol + rtol*|b|, and ||a-b||/||b|| <= rel_norm."""

    atol: float
    rtol: float
    rel_norm: float


@dataclass(frozen=True, order=True)
class Cell:
    """One point of an op's matrix: dtype per role and a value per symbolic dim."""

    dtypes: tuple[tuple[str, DType], ...]
    dims: tuple[tuple[str, int], ...]

    @classmethod
    def make(cls, dtypes: Mapping[str, DType | str], dims: Mapping[str, int]) -> "Cell":
        dt = tuple(sorted((k, v if isinstance(v, DType) else DType.parse(v)) for k, v in dtypes.items()))
        dm = tuple(sorted((k, int(v)) for k, v in dims.items()))
        for k, v in dm:
            if v < 0:
                raise ValueError(f"dim {k}={v} is negative")
        return cls(dt, dm)

    def dtype(self, role: str) -> DType:
        for k, v in self.dtypes:
            if k == role:
                return v
        raise KeyError(f"cell has no dtype role {role!r} (has {[k for k, _ in self.dtypes]})")

    def dim(self, name: str) -> int:
        for k, v in self.dims:
            if k == name:
                return v
        raise KeyError(f"cell has no dim {name!r} (has {[k for k, _ in self.dims]})")

    def dims_dict(self) -> dict[str, int]:
        return dict(self.dims)

    def dtypes_dict(self) -> dict[str, str]:
        return {k: v.value for k, v in self.dtypes}

    def label(self) -> str:
        """Readable id, e.g. 'x=bf16,w=bf16 M4096-N1024'."""
        dt = ",".join(f"{k}={v.short}" for k, v in self.dtypes)
        return f"{dt} " + "-".join(f"{k}{v}" for k, v in self.dims)


@dataclass(frozen=True)
class OpSpec:
    """Everything the factory knows about one operator."""

    name: str
    tensors: tuple[TensorSpec, ...]
    scalars: tuple[ScalarSpec, ...]
    dtype_roles: tuple[str, ...]
    reference: Callable[[Mapping[str, np.ndarray], Mapping[str, float | int]], dict[str, np.ndarray]]
    make_inputs: Callable[["Cell", str, np.random.Generator], dict[str, np.ndarray]]
    input_kinds: tuple[str, ...]
    tolerance: Callable[["Cell", str], Tolerance]
    bytes_moved: Callable[["Cell"], int]
    matrix: Callable[[], list["Cell"]]
    edge_cells: Callable[[], list["Cell"]]
    flops: Callable[["Cell"], int] = field(default=lambda cell: 0)
    # The gate: kind -> tensor -> FillSpec for every input kind the device fills (checked in order),
    # the kinds timed sets are filled with, and the cells derived from a cell that a genome entering
    # a dispatch table must also pass (M = 1, odd M, ...).
    fills: Mapping[str, Mapping[str, FillSpec]] = field(default_factory=dict)
    timing_kinds: tuple[str, ...] = ("normal",)
    gate_cells: Callable[["Cell"], list["Cell"]] = field(default=lambda cell: [])
    # Baselines by name, timed beside every candidate (the first one the device hooks provide), and
    # the shape-bucket edges per dim lessons are grouped by (small <= lo < medium <= hi < large).
    baselines: tuple[str, ...] = ()
    bucket_edges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # More matrices by name, e.g. a variant's cells ("residual"): an experiment picks one with
    # cells.matrix = "<name>"; `matrix` stays the op's default.
    matrices: Mapping[str, Callable[[], list["Cell"]]] = field(default_factory=dict)
    # Dims a cell may lack (a variant's switch), at the value they take where it does: a template
    # specializing on one renders with it.
    dim_defaults: Mapping[str, int] = field(default_factory=dict)
    # The gate's check cells drawn per job (used in place of gate_cells where given): the cell, the job's
    # secret randomness, and the tile the template's plan implies along a dim (rows a CTA, tokens a chunk;
    # evo.measure.evaluate.implied_tile). Their scalars are drawn apart (drawn_scalars).
    gate_shapes: Callable[["Cell", random.Random, Callable[[str], int]], list["Cell"]] | None = None
    # A recurrent op's state carried from call to call (a decode loop): the gate runs the one-token plan
    # that many times, each call reading the state the one before it wrote (Recurrence).
    recurrence: "Recurrence | None" = None
    # A causal op's dim (Causal): outputs before a drawn position must not move when only later inputs change
    causal: "Causal | None" = None

    def all_cells(self) -> list["Cell"]:
        """Every cell the op names: its matrix, its edge cells and its named matrices (no duplicates)."""
        cells = [*self.matrix(), *self.edge_cells(), *(c for f in self.matrices.values() for c in f())]
        return list(dict.fromkeys(cells))

    def gate_kinds(self) -> tuple[str, ...]:
        """The input kinds every checked candidate sees, in order."""
        return tuple(self.fills)

    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role is Role.IN)

    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(t for t in self.tensors if t.role is Role.OUT)

    def tensor(self, name: str) -> TensorSpec:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"op {self.name} has no tensor {name!r}")

    def uses(self, cell: Cell, name: str) -> bool:
        """Whether `cell` uses tensor `name`: a required one always, an optional one as its used_when says."""
        t = self.tensor(name)
        if not t.optional:
            return True
        if t.used_when is None:
            raise ValueError(f"op {self.name}: optional tensor {name!r} declares no used_when, so a launch arg "
                             f"{name + '?'!r} cannot tell the cells that use it")
        return bool(t.used_when(cell))

    def dim_value(self, cell: "Cell | Mapping[str, int]", name: str) -> int:
        """A cell's dim, or the op's default for it where the cell lacks it (bias and store_rstd: 0)."""
        dims = cell.dims_dict() if isinstance(cell, Cell) else cell
        if name in dims:
            return int(dims[name])
        if name in self.dim_defaults:
            return int(self.dim_defaults[name])
        raise KeyError(f"cell has no dim {name!r} (has {sorted(dims)}) and op {self.name} declares no default for it")

    def drawn_scalars(self, cell: Cell, rng: random.Random) -> dict[str, float | int]:
        """Every scalar, those with a declared range drawn from it (the gate's check cells)."""
        return {s.name: s.drawn(cell, rng) for s in self.scalars}

    def scalar_values(self, cell: Cell, overrides: Mapping[str, float | int] | None = None) -> dict[str, float | int]:
        vals = {s.name: s.value(cell) for s in self.scalars}
        for k, v in (overrides or {}).items():
            if k not in vals:
                raise KeyError(f"op {self.name} has no scalar {k!r}")
            vals[k] = v
        return vals


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 and math.isfinite(seconds) else 0.0


# numpy has no bfloat16: inputs are drawn in float32 and rounded to bf16 (round-to-nearest-even),
# kept as float32 values that are exactly representable in bf16 plus a uint16 view for the device.
def round_to_bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bf16 (ties to even); returns float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) & np.uint32(0xFFFF0000)
    nan = np.isnan(a)
    out = rounded.view(np.float32).copy()
    out[nan] = np.nan
    return out


def to_device_bytes(a: np.ndarray, dtype: DType) -> np.ndarray:
    """The array as the device stores it (bf16 as uint16 bit patterns)."""
    if dtype is DType.BF16:
        return (round_to_bf16(a).view(np.uint32) >> 16).astype(np.uint16)
    if dtype is DType.FP16:
        return np.ascontiguousarray(a, dtype=np.float16)
    if dtype is DType.FP32:
        return np.ascontiguousarray(a, dtype=np.float32)
    if dtype is DType.INT32:
        return np.ascontiguousarray(a, dtype=np.int32)
    raise ValueError(f"no device layout for {dtype}")


def from_device_bytes(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Device storage back to float64 (or int64) values."""
    if dtype is DType.BF16:
        return (raw.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype in (DType.FP16, DType.FP32):
        return raw.astype(np.float64)
    return raw.astype(np.int64)


def quantize(a: np.ndarray, dtype: DType) -> np.ndarray:
    """Values as the device will see them, in float64."""
    return from_device_bytes(to_device_bytes(a, dtype), dtype)
