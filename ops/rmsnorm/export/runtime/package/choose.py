"""Which kernel a shape gets, and why: the dispatch table, a re-rendered or repaired genome, or torch.

Paths, best first:
- table: the cell was searched; the kernel the search measured there (its prebuilt cubin).
- table-build: a prebuilt cubin of the table fits (same genome, dtypes and specialized dims; only the
  launch plan changes, e.g. another M); the factory's gate ran that cubin at M = 1 and 37 too (forward: 1059).
  A fitting prebuilt cubin is taken before a nearer cell's genome that would need compiling.
- rerender: the nearest searched genome (same dtypes first, then nearest dims) whose template admits
  the shape, rendered for it and compiled with NVRTC at first use (cached in memory and on disk);
  its first call is checked against torch.
- repaired: no searched genome is legal as it is; the nearest one with the fewest parameters changed
  so that its template's constraints hold, rendered and compiled as above, checked on its first call.
- torch: float32 torch operations, correct but not searched (a variant the kernels do not compute,
  no template admits the shape, a CPU tensor, or a kernel that failed to compile or check).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from . import expr
from .choice import KERNEL_PATHS, Choice, device_arch
from .ladder import nearest_first, refusal, walk
from .table import OpTable, tables

PATHS = (*KERNEL_PATHS, "torch")


def _torch(op: str, dims: Mapping[str, int], dtypes: Mapping[str, str], arch: int, reason: str) -> Choice:
    return Choice(op, "torch", tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), arch, reason)


@lru_cache(maxsize=4096)
def choose(op: str, dims: tuple[tuple[str, int], ...], dtypes: tuple[tuple[str, str], ...], arch: int) -> Choice:
    """The path for one shape and dtype assignment on a GPU of arch `arch` (e.g. 90)."""
    want_dims, want_dt = dict(dims), dict(dtypes)
    table: OpTable | None = tables().get(op)
    if table is None:
        return _torch(op, want_dims, want_dt, arch, f"no {op} run was exported")
    if any(d not in expr.DTYPES for d in want_dt.values()):
        return _torch(op, want_dims, want_dt, arch, f"dtypes {want_dt} are not all kernel dtypes")
    genomes = nearest_first(table.entries, want_dims, want_dt)
    step = walk(table, genomes, arch, want_dims, want_dt, "shape")
    if step is not None:
        return Choice.of_step(op, step, dims, dtypes, arch)
    why = refusal(table, genomes[0], arch, want_dims, want_dt) if genomes else "no entries"
    return _torch(op, want_dims, want_dt, arch, why)


def shape_dims(shape: Sequence[int]) -> dict[str, int]:
    """(..., N) as the kernels see it: M rows of N."""
    if len(shape) < 1:
        raise ValueError("rmsnorm needs at least one dim (the normalized one)")
    return {"M": math.prod(shape[:-1]), "N": int(shape[-1])}


def explain(shape: Sequence[int], dtype: Any = "bfloat16", weight_dtype: Any = None, *, op: str = "rmsnorm",
            weight: bool = True, bias: bool = False, residual: bool = False, out_dtype: Any = None,
            residual_dtype: Any = None, dout_dtype: Any = None, arch: int | None = None) -> Choice:
    """Which path `rmsnorm` (op='rmsnorm') or its backward (op='rmsnorm_bwd', dout in `dout_dtype`, by
    default x's) takes for a CUDA tensor of `shape` and `dtype` with these variants; arch defaults to
    the current GPU's, else the export's."""
    dt = expr.dtype_name(dtype)
    wdt = expr.dtype_name(weight_dtype) if weight_dtype is not None else dt
    dims = shape_dims(shape)
    if arch is None:
        arch = device_arch()
    if arch is None:
        t = tables().get(op) or next(iter(tables().values()))  # an export may hold one op only
        arch = t.arch_number
    variant = unsupported(dt, bias=bias, residual=residual, out_dtype=out_dtype)
    if not variant and op == "rmsnorm_bwd" and dout_dtype is not None and expr.dtype_name(dout_dtype) != dt:
        variant = f"dout {expr.dtype_name(dout_dtype)}: the backward kernels read dout in x's dtype ({dt})"
    if variant:
        return _torch(op, dims, {"x": dt, "w": wdt}, arch, variant)
    c = choose(op, tuple(sorted(dims.items())), tuple(sorted({"x": dt, "w": wdt}.items())), arch)
    extra = []
    if not weight:
        extra.append("weight=None: a weight of ones (exact)")
    if residual_dtype is not None and expr.dtype_name(residual_dtype) != dt:
        extra.append("residual_out cast by torch")
    return c.with_notes(extra)


def unsupported(dtype: str, *, bias: bool, residual: bool, out_dtype: Any) -> str:
    """Why the searched kernels cannot compute this variant ('' when they can)."""
    if bias:
        return "bias: the searched kernels add no bias"
    if residual:
        return "residual: the searched kernels do no residual add"
    if out_dtype is not None and expr.dtype_name(out_dtype) != dtype:
        return f"out_dtype {expr.dtype_name(out_dtype)}: the searched kernels write the input's dtype ({dtype})"
    return ""
