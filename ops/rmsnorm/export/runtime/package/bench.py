"""The package's benchmark: its public calls against every peer on every cell of the op's matrix, in one process,
on the same inputs (sides.compare: every side checked against float64 first, then timed in turn sample by sample,
the L2 flushed before each sample; kernel time with the host hidden, call time as a Python caller waits).

Tables: forward (`rmsnorm(x, w)`), residual (`rmsnorm_fwd(x, w, residual=r)`: y and residual_out), backward
(`rmsnorm_bwd(x, w, dout, rstd)`) and train (y = `rmsnorm(x, w)`, then dx and dw by autograd, on the forward cells).
Peers: torch eager, torch.compile (a graph per shape, never a silent fall-back to eager), Liger, QuACK with its
heuristic config and autotuned, FlashInfer, cuDNN frontend; each present or absent with the reason. Every row names
the path the package took (`explain()`) and whether the cell was searched. Forward and residual rows also time
`package.into`, the package's call writing into given tensors, and `package.cuda_core`, the package's call with
its direct launch made by cuda.core instead of libcuda (diagnostic sides, never peers).

    python -m <package>.bench [--out bench.json] [--tables forward,backward] [--cells REGEX] [--peers ...]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from typing import Any

import torch

from . import api, benchmark, peers, verify
from .benchmark import Measured
from .choose import explain
from .run import runtime
from .sides import PACKAGE_SIDE, Side, compare, side
from .table import Cell, tables

TABLES = ("forward", "residual", "backward", "train", "serving", "serving_residual")
# the serving tables: the serving matrices' cells (few rows), measured as forward and residual cells are
SERVING = {"serving": "forward", "serving_residual": "residual"}
EPS = 1e-6
# a diagnostic side of the forward and residual tables (never a peer: sides.verdict): the package's call writing
# into tensors it is given (out=, residual_out=), which allocates nothing
INTO = PACKAGE_SIDE + ".into"
# a diagnostic side of the forward and residual tables: the package's call with its direct launch made by cuda.core's
# `launch` instead of libcuda's cuLaunchKernel (the default), timed in the same process (which launch a call waits
# less for)
CUDA_CORE = PACKAGE_SIDE + ".cuda_core"
CHECK_ROWS = 256  # rows drawn at random, beside the first, middle and last ones, that every side's output is checked on
_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def kind(table: str) -> str:
    """How a table's cells are measured: forward, residual, backward or train."""
    return SERVING.get(table, table)


def table_cells(table: str) -> list[Cell]:
    """The op matrix's cells of one table (forward, train: the plain ones; residual: residual without bias or
    rstd; backward: the backward op's; serving, serving_residual: their named matrices' cells, which no other table
    takes)."""
    k = kind(table)
    op = "rmsnorm_bwd" if k == "backward" else "rmsnorm"
    if op not in tables() or (k == "train" and "rmsnorm_bwd" not in tables()):
        return []
    out = []
    for c in tables()[op].cells:
        if (c.matrix != table) if table in SERVING else (c.matrix in SERVING):
            continue
        dt, dims = dict(c.dtypes), dict(c.dims)
        extra = {d for d, v in dims.items() if d not in ("M", "N") and v}
        if k == "residual" and "residual" in dt and not extra:
            out.append(c)
        elif k != "residual" and "residual" not in dt and not extra:
            out.append(c)
    return out


def inputs(c: Cell, seed: int = 0) -> dict[str, torch.Tensor]:
    dt, dims = dict(c.dtypes), dict(c.dims)
    m, n = dims["M"], dims["N"]
    g = torch.Generator(device="cuda").manual_seed(seed * 1_000_003 + m * 31 + n)
    t = {"x": torch.randn(m, n, device="cuda", generator=g).to(_TORCH[dt["x"]]),
         "w": (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(_TORCH[dt["w"]])}
    if "residual" in dt:
        t["residual"] = torch.randn(m, n, device="cuda", generator=g).to(_TORCH[dt["residual"]])
    return t


def cuda_core_side(call: Callable[[], Any], key: tuple) -> Side:
    """`call` (the package's, no autograd) with the runtime's direct launch of its signature `key` swapped, around each
    call, for a copy that launches by cuda.core (the swap's two dictionary stores are in its time); absent, with the
    reason, where the signature has no direct launch through libcuda (the routed path, or KF_RAW_LAUNCH=0)."""
    def make() -> Callable[[], Any]:
        call()  # the first call of a signature routes it and learns its direct launch; a second where that call
        call()  # only checked the kernel
        fast = runtime().fast
        raw = fast.get(key)
        if not raw or not raw.raw:
            raise NotImplementedError("the call has no direct launch through libcuda here")
        alt = copy.copy(raw)
        alt.use_cuda_core()

        def swapped() -> Any:
            fast[key] = alt
            try:
                return call()
            finally:
                fast[key] = raw
        return swapped

    return side(make)


def forward_cell(c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    t = inputs(c)
    x, w = t["x"], t["w"]
    y_into = torch.empty_like(x)

    def call() -> Any:
        return api.rmsnorm(x, w, eps=EPS)
    sides = {PACKAGE_SIDE: call, INTO: lambda: api.rmsnorm_fwd(x, w, eps=EPS, out=y_into)[0],
             CUDA_CORE: cuda_core_side(call, api._signature(x, w, None)), **peers.forward(x, w, EPS, names)}
    nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
    return compare(sides, lambda _, y: verify.check_forward(x, w, EPS, y, CHECK_ROWS), nbytes, samples, ceiling)


def residual_cell(c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    t = inputs(c)
    x, w, r = t["x"], t["w"], t["residual"]
    y_into, r_into = torch.empty_like(x), torch.empty_like(r)

    def call() -> Any:
        return api.rmsnorm_fwd(x, w, None, r, eps=EPS)[:2]
    sides = {PACKAGE_SIDE: call,
             INTO: lambda: api.rmsnorm_fwd(x, w, None, r, eps=EPS, out=y_into, residual_out=r_into)[:2],
             CUDA_CORE: cuda_core_side(call, api._signature(x, w, r)), **peers.residual(x, w, r, EPS, names)}

    def check(_: str, out: Any) -> str:
        return verify.check_variant(x, w, r, None, EPS, out[0], out[1], None, CHECK_ROWS)

    nbytes = 2 * x.numel() * x.element_size() + 2 * r.numel() * r.element_size() + w.numel() * w.element_size()
    return compare(sides, check, nbytes, samples, ceiling)


def backward_cell(c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    t = inputs(c)
    x, w = t["x"], t["w"]
    dout = torch.randn(x.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7)).to(x.dtype)
    rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
    sides = {PACKAGE_SIDE: lambda: api.rmsnorm_bwd(x, w, dout, rstd)[:2], **peers.backward(x, w, dout, rstd, names)}

    def check(_: str, out: Any) -> str:
        return verify.check_backward(x, w, dout, rstd, out[0], out[1], CHECK_ROWS)

    nbytes = 3 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size() + 4 * x.shape[0]
    return compare(sides, check, nbytes, samples, ceiling)


def train_cell(c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    t = inputs(c)
    x, w = t["x"].requires_grad_(True), t["w"].requires_grad_(True)
    dy = torch.randn(x.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(11)).to(x.dtype)
    sides = {PACKAGE_SIDE: lambda: torch.autograd.grad(api.rmsnorm(x, w, eps=EPS), (x, w), dy),
             **peers.train(x, w, dy, EPS, names)}

    def check(_: str, out: Any) -> str:
        with torch.no_grad():
            rstd = torch.rsqrt(x.float().square().mean(-1) + EPS)
            return verify.check_backward(x.detach(), w.detach(), dy, rstd, out[0], out[1], CHECK_ROWS)

    nbytes = 5 * x.numel() * x.element_size() + 3 * w.numel() * w.element_size()
    return compare(sides, check, nbytes, samples, ceiling)


_CELL: dict[str, Callable[..., dict[str, Any]]] = {"forward": forward_cell, "residual": residual_cell,
                                                    "backward": backward_cell, "train": train_cell}


def path(table: str, c: Cell) -> str:
    dt, dims = dict(c.dtypes), dict(c.dims)
    shape = (dims["M"], dims["N"])
    if table == "train":  # a step's forward stores rstd (where a kernel that does serves it), its backward reads it
        return "+".join((explain(shape, dt["x"], dt["w"], store_rstd=True).path,
                         explain(shape, dt["x"], dt["w"], op="rmsnorm_bwd").path))
    if table == "residual":
        return explain(shape, dt["x"], dt["w"], residual=dt["residual"]).path
    return explain(shape, dt["x"], dt["w"], op="rmsnorm_bwd" if table == "backward" else "rmsnorm").path


def row(table: str, c: Cell, names: tuple[str, ...], samples: int, ceiling: float | None) -> dict[str, Any]:
    k = kind(table)
    op = "rmsnorm_bwd" if k == "backward" else "rmsnorm"
    e = tables()[op].entry(c)
    out = {"table": table, "cell": c.label, "dtypes": dict(c.dtypes), "dims": dict(c.dims), "path": path(k, c),
           "searched": e is not None, "searched_median_us": e.median_us if e else None,
           **_CELL[k](c, names, samples, ceiling)}
    torch.cuda.empty_cache()
    return out


def measure(args: argparse.Namespace) -> Measured:
    return benchmark.measure_tables(args, table_cells, row)


def main(argv: list[str] | None = None) -> int:
    return benchmark.main(argv, __doc__.split("\n\n")[0], "the first cell of each table", measure, peers.DISTS,
                          TABLES, peers.FORWARD)


if __name__ == "__main__":
    sys.exit(main())
