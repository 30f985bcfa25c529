"""Which kernel a shape gets, and why: the dispatch table, a re-rendered or repaired genome, or torch.

Paths, best first:
- table: the cell was searched; the kernel the search measured there (its prebuilt cubin).
- table-build: a prebuilt cubin of the table fits (same genome, dtypes and specialized dims; only the
  launch plan changes, e.g. another M); the factory's gate ran that cubin at M = 1 and 37 too (forward: 1059).
  A fitting prebuilt cubin is taken before a nearer cell's genome that would need compiling.
- rerender: the nearest searched genome (same dtypes first, then nearest dims) whose template admits
  the shape, rendered for it and compiled with NVRTC at first use (cached in memory and on disk).
- repaired: no searched genome is legal as it is; the nearest one with the fewest parameters changed
  so that its template's constraints hold, rendered and compiled as above.
- torch: float32 torch operations, correct but not searched (a variant no exported cell has, no
  template admits the shape, a CPU tensor, or a kernel that failed to compile or check).
Every kernel, on every path, is checked against float64 the first time it runs in a shape class (firstuse.py).

Variants. A call is keyed as the factory keys a cell: dtypes x, w and, for a residual add (prenorm:
h = x + residual, residual_out = h), "residual" (the residual's dtype, residual_out's too); dims M, N
and, when on, bias = 1 and store_rstd = 1. A variant call is served only by the exported cells of the
same variant (same switches, same x and residual dtypes; the weight's dtype may differ, as for the
plain op): their genomes walk the same ladder (table, table-build, rerender, repaired), rendered with
the variant's switches compiled in. A variant no exported cell has takes torch, and says so; a plain
call takes the plain cells' genomes (those of a template that serves the plain op too where the export
has no plain cell). store_rstd alone without such cells takes the plain cells' genomes whose template stores rstd
when asked (rendered with the switch on), else keeps the plain kernel, rstd by torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from . import expr
from .choice import KERNEL_PATHS, Choice, device_arch
from .firstuse import reduced
from .ladder import nearest_first, refusal, walk
from .table import OpTable, tables

PATHS = (*KERNEL_PATHS, "torch")
VARIANT_DIMS = ("bias", "store_rstd")  # a cell's switches, present (= 1) only when on
VARIANT_TENSORS = ("residual", "residual_out", "bias", "rstd")  # what the variants bind beyond x, w, y
PLAIN = ("", "", 0, 0)


def _torch(op: str, dims: Mapping[str, int], dtypes: Mapping[str, str], arch: int, reason: str) -> Choice:
    return Choice(op, "torch", tuple(sorted(dims.items())), tuple(sorted(dtypes.items())), arch, reason)


def variant_key(dtypes: Mapping[str, str], dims: Mapping[str, int]) -> tuple[str, str, int, int]:
    """What a cell (or call) computes beyond y = x * rstd * w: (residual dtype, out dtype, bias, store_rstd),
    '' and 0 where off; PLAIN for the plain op."""
    return (dtypes.get("residual", ""), dtypes.get("out", ""), int(dims.get("bias", 0)),
            int(dims.get("store_rstd", 0)))


def describe(key: tuple[str, str, int, int]) -> str:
    """'residual bf16 + bias + store_rstd' ('plain' for the plain op)."""
    residual, out, bias, store_rstd = key
    parts = ([f"residual {expr.short(residual)}"] if residual else []) + ([f"out {expr.short(out)}"] if out else [])
    parts += ["bias"] * bias + ["store_rstd"] * store_rstd
    return " + ".join(parts) or "plain"


def _serves_plain(table: OpTable, template: str) -> bool:
    """Whether a template computes the plain op too: every variant tensor it binds is optional ("name?")."""
    return all(a.partition(":")[0].endswith("?") for ln in table.templates[template].launches for a in ln.args
               if a.partition(":")[0].removesuffix("?") in VARIANT_TENSORS)


def _stores_rstd(table: OpTable, template: str) -> bool:
    """Whether a plain template also stores rstd when a call asks: it specializes on store_rstd and binds rstd."""
    t = table.templates[template]
    return "store_rstd" in t.specialize and any(a.partition(":")[0].removesuffix("?") == "rstd"
                                                for ln in t.launches for a in ln.args)


def _pool(table: OpTable, want_dims: Mapping[str, int], want_dt: Mapping[str, str]) -> tuple[list[Any], str]:
    """The entries whose genomes may serve a call, or why none may. A store_rstd call no exported store_rstd cell
    serves takes the plain cells' genomes whose template stores rstd when asked (rendered with the switch on)."""
    want = variant_key(want_dt, want_dims)
    if want == PLAIN:
        plain = [e for e in table.entries if variant_key(dict(e.dtypes), dict(e.dims)) == PLAIN]
        if plain:
            return plain, ""
        pool = [e for e in table.entries if _serves_plain(table, e.template)]
        return pool, ("" if pool else "no exported cell is of the plain op, and no exported template serves it")
    same = [e for e in table.entries if variant_key(dict(e.dtypes), dict(e.dims))[1:] == want[1:]
            and bool(dict(e.dtypes).get("residual")) == bool(want[0])]
    have = sorted({describe(variant_key(dict(e.dtypes), dict(e.dims))) for e in table.entries} - {"plain"})
    if not same and want == ("", "", 0, 1):
        same = [e for e in table.entries if variant_key(dict(e.dtypes), dict(e.dims)) == PLAIN
                and _stores_rstd(table, e.template)]
    if not same:
        return [], (f"{describe(want)}: no exported cell has this variant (the export's variants: "
                    f"{', '.join(have) or 'none'})")
    pool = [e for e in same if all(dict(e.dtypes).get(r) == want_dt.get(r) for r in ("x", "residual"))]
    if not pool:
        pairs = sorted({"/".join(expr.short(dict(e.dtypes)[r]) for r in ("x", "residual") if r in dict(e.dtypes))
                        for e in same})
        got = "/".join(expr.short(want_dt[r]) for r in ("x", "residual") if r in want_dt)
        return [], (f"{describe(want)} with x/residual {got}: the exported cells of this variant are "
                    f"{', '.join(pairs)} only")
    return pool, ""


@lru_cache(maxsize=4096)
def choose(op: str, dims: tuple[tuple[str, int], ...], dtypes: tuple[tuple[str, str], ...], arch: int) -> Choice:
    """The path for one shape, dtype assignment and variant (a cell's dtypes and dims: "residual",
    bias, store_rstd) on a GPU of arch `arch` (e.g. 90)."""
    want_dims, want_dt = dict(dims), dict(dtypes)
    table: OpTable | None = tables().get(op)
    if table is None:
        return _torch(op, want_dims, want_dt, arch, f"no {op} run was exported")
    if any(d not in expr.DTYPES for d in want_dt.values()):
        return _torch(op, want_dims, want_dt, arch, f"dtypes {want_dt} are not all kernel dtypes")
    pool, why = _pool(table, want_dims, want_dt)
    if why:
        return _torch(op, want_dims, want_dt, arch, why)
    genomes = nearest_first(pool, want_dims, want_dt)
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


def probe_dims(c: Choice) -> tuple[tuple[str, int], ...]:
    """The shape standing for a call's shape class in the first-use check (firstuse.py): M by its class
    (firstuse.reduced); N and the variant's switches as the call's."""
    return tuple((k, reduced(v) if k == "M" else v) for k, v in c.dims)


def variant_call(shape: Sequence[int], dtype: str, weight_dtype: str, *, residual: str = "", bias: bool = False,
                 store_rstd: bool = False) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]:
    """A forward call as the cell the factory would key it by: (dims, dtypes), sorted."""
    dims = shape_dims(shape) | ({"bias": 1} if bias else {}) | ({"store_rstd": 1} if store_rstd else {})
    dtypes = {"x": dtype, "w": weight_dtype} | ({"residual": residual} if residual else {})
    return tuple(sorted(dims.items())), tuple(sorted(dtypes.items()))


def forward_choice(shape: Sequence[int], dtype: str, weight_dtype: str, arch: int, *, residual: str = "",
                   bias: bool = False, store_rstd: bool = False) -> Choice:
    """The forward's path for a call with these variants. store_rstd alone, where no exported store_rstd
    kernel serves it, keeps the plain path (rstd computed by torch), as the plain op always did."""
    dims, dtypes = variant_call(shape, dtype, weight_dtype, residual=residual, bias=bias, store_rstd=store_rstd)
    c = choose("rmsnorm", dims, dtypes, arch)
    if c.path == "torch" and store_rstd and not residual and not bias:
        dims, dtypes = variant_call(shape, dtype, weight_dtype)
        return choose("rmsnorm", dims, dtypes, arch).with_notes([f"rstd computed by torch ({c.reason})"])
    return c


def explain(shape: Sequence[int], dtype: Any = "bfloat16", weight_dtype: Any = None, *, op: str = "rmsnorm",
            weight: bool = True, bias: bool = False, residual: Any = False, out_dtype: Any = None,
            residual_dtype: Any = None, dout_dtype: Any = None, store_rstd: bool = False,
            arch: int | None = None) -> Choice:
    """Which path `rmsnorm` (op='rmsnorm') or its backward (op='rmsnorm_bwd', dout in `dout_dtype`, by
    default x's) takes for a CUDA tensor of `shape` and `dtype` with these variants; arch defaults to
    the current GPU's, else the export's. `residual`: True (in x's dtype) or the residual's dtype
    (residual_out's too, as QuACK's); `residual_dtype` is residual_out's dtype for a call without one."""
    dt = expr.dtype_name(dtype)
    wdt = expr.dtype_name(weight_dtype) if weight_dtype is not None else dt
    dims = shape_dims(shape)
    if arch is None:
        arch = device_arch()
    if arch is None:
        t = tables().get(op) or next(iter(tables().values()))  # an export may hold one op only
        arch = t.arch_number
    extra = []
    if not weight:
        extra.append("weight=None: a weight of ones (exact)")
    if op == "rmsnorm":
        rdt = "" if residual is False or residual is None else (dt if residual is True else expr.dtype_name(residual))
        if out_dtype is not None and expr.dtype_name(out_dtype) != dt:
            why = f"out_dtype {expr.dtype_name(out_dtype)}: the searched kernels write the input's dtype ({dt})"
            return _torch(op, dims, {"x": dt, "w": wdt}, arch, why)
        if not rdt and residual_dtype is not None and expr.dtype_name(residual_dtype) != dt:
            extra.append("residual_out cast by torch")
        c = forward_choice(shape, dt, wdt, arch, residual=rdt, bias=bias, store_rstd=store_rstd)
        return c.with_notes(extra)
    variant = unsupported(dt, bias=bias, residual=bool(residual), out_dtype=out_dtype)
    if not variant and dout_dtype is not None and expr.dtype_name(dout_dtype) != dt:
        variant = f"dout {expr.dtype_name(dout_dtype)}: the backward kernels read dout in x's dtype ({dt})"
    if variant:
        return _torch(op, dims, {"x": dt, "w": wdt}, arch, variant)
    c = choose(op, tuple(sorted(dims.items())), tuple(sorted({"x": dt, "w": wdt}.items())), arch)
    if residual_dtype is not None and expr.dtype_name(residual_dtype) != dt:
        extra.append("residual_out cast by torch")
    return c.with_notes(extra)


def unsupported(dtype: str, *, bias: bool, residual: bool, out_dtype: Any) -> str:
    """Why the backward's kernels cannot compute this variant ('' when they can)."""
    if bias:
        return "bias: the searched kernels add no bias"
    if residual:
        return "residual: the searched kernels do no residual add"
    if out_dtype is not None and expr.dtype_name(out_dtype) != dtype:
        return f"out_dtype {expr.dtype_name(out_dtype)}: the searched kernels write the input's dtype ({dtype})"
    return ""
