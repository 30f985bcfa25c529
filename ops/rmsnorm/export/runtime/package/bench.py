"""Torch eager against the exported kernels on every searched cell, in one process, on the same inputs.

Each launch is timed with CUDA events after a 256 MiB read that flushes the L2 (clean lines only); the
two sides take turns (both orders), and the median of all samples is kept. Outputs are checked against a float64
reference before timing. Forward: torch.nn.functional.rms_norm against `rmsnorm`; backward (when a
backward run was exported): torch's autograd backward of rms_norm against `rmsnorm_bwd`; a training step
(rmsnorm_train, every plain forward cell): forward and backward through autograd, dx and dw from dy, host work
included, as a training loop pays it (the backward's rstd recomputed from x: the forward kernels do not store it).

    python -m <package>.bench [--out bench.json] [--samples 100] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from . import api, benchmark, verify
from .benchmark import Measured, geomean
from .choose import explain
from .table import Entry, provenance, tables
from .timing import samples_us

_TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _inputs(dtype: str, wdtype: str, m: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(m * 31 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(_TORCH[dtype])
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(_TORCH[wdtype])
    return x, w


def _forward_cell(e: Entry, samples: int, eps: float) -> dict:
    dt, dims = dict(e.dtypes), dict(e.dims)
    m, n = dims["M"], dims["N"]
    x, w = _inputs(dt["x"], dt["w"], m, n)
    problem = verify.check_forward(x, w, eps, api.rmsnorm(x, w, eps=eps))
    t_torch, t_ours = samples_us([lambda: torch.nn.functional.rms_norm(x, (n,), w, eps),
                                  lambda: api.rmsnorm(x, w, eps=eps)], samples)
    nbytes = 2 * m * n * x.element_size() + n * w.element_size()
    return _row("rmsnorm", e.cell, dt, m, n, t_torch, t_ours, nbytes, e.median_us, problem)


def _variant_cell(e: Entry, samples: int, eps: float) -> dict:
    """A variant cell (residual, bias, store_rstd): the package's one call against torch eager's ops."""
    dt, dims = dict(e.dtypes), dict(e.dims)
    m, n = dims["M"], dims["N"]
    x, w = _inputs(dt["x"], dt["w"], m, n)
    g = torch.Generator(device="cuda").manual_seed(m + n)
    res = torch.randn(m, n, device="cuda", generator=g).to(_TORCH[dt["residual"]]) if "residual" in dt else None
    b = torch.randn(n, device="cuda", generator=g).to(w.dtype) if dims.get("bias") else None
    store = bool(dims.get("store_rstd"))
    out, res_out, r = api.rmsnorm_fwd(x, w, b, res, eps=eps, store_rstd=store)
    problem = verify.check_variant(x, w, res, b, eps, out, res_out if res is not None else None, r)

    def eager():
        h = x.float() + res.float() if res is not None else x.float()
        y = torch.nn.functional.rms_norm(h, (n,), w.float(), eps)
        y = (y + b.float() if b is not None else y).to(x.dtype)
        return y, (h.to(res.dtype) if res is not None else x), (torch.rsqrt(h.square().mean(-1) + eps) if store else None)

    t_torch, t_ours = samples_us([eager, lambda: api.rmsnorm_fwd(x, w, b, res, eps=eps, store_rstd=store)], samples)
    nbytes = 2 * m * n * x.element_size() + n * w.element_size()
    nbytes += 2 * m * n * res.element_size() if res is not None else 0
    nbytes += n * w.element_size() if b is not None else 0
    nbytes += 4 * m if store else 0
    return _row("rmsnorm", e.cell, dt, m, n, t_torch, t_ours, nbytes, e.median_us, problem,
                explain((m, n), dt["x"], dt["w"], residual=dt.get("residual", False), bias=b is not None,
                        store_rstd=store).path)


def _is_variant(e: Entry) -> bool:
    return len(e.dtypes) > 2 or bool(dict(e.dims).keys() - {"M", "N"})


def _backward_cell(e: Entry, samples: int, eps: float) -> dict:
    dt, dims = dict(e.dtypes), dict(e.dims)
    m, n = dims["M"], dims["N"]
    x, w = _inputs(dt["x"], dt["w"], m, n)
    dout = torch.randn_like(x)
    r = torch.rsqrt(x.float().square().mean(-1) + eps)
    dx, dw, _, _ = api.rmsnorm_bwd(x, w, dout, r)
    problem = verify.check_backward(x, w, dout, r, dx, dw)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    y = torch.nn.functional.rms_norm(xr, (n,), wr, eps)
    t_torch, t_ours = samples_us([lambda: torch.autograd.grad(y, (xr, wr), dout, retain_graph=True),
                                  lambda: api.rmsnorm_bwd(x, w, dout, r)], samples)
    nbytes = 3 * m * n * x.element_size() + 2 * n * w.element_size() + 4 * m
    return _row("rmsnorm_bwd", e.cell, dt, m, n, t_torch, t_ours, nbytes, e.median_us, problem)


def _train_cell(e: Entry, samples: int, eps: float) -> dict:
    """A training step on a plain forward cell: y = rmsnorm(x, w), then dx and dw from dy by autograd, the
    package against torch eager's rms_norm; dx and dw checked against float64 first."""
    dt, dims = dict(e.dtypes), dict(e.dims)
    m, n = dims["M"], dims["N"]
    x, w = _inputs(dt["x"], dt["w"], m, n)
    x.requires_grad_(True)
    w.requires_grad_(True)
    dy = torch.randn(m, n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(n)).to(x.dtype)

    def step(forward):
        return lambda: torch.autograd.grad(forward(), (x, w), dy)

    ours = step(lambda: api.rmsnorm(x, w, eps=eps))
    dx, dw = ours()
    with torch.no_grad():
        problem = verify.check_backward(x, w, dy, torch.rsqrt(x.float().square().mean(-1) + eps), dx, dw)
    t_torch, t_ours = samples_us([step(lambda: torch.nn.functional.rms_norm(x, (n,), w, eps)), ours], samples)
    nbytes = 5 * m * n * x.element_size() + 3 * n * w.element_size()  # forward: x, y; backward: x, dy, dx; w, dw
    paths = "+".join(explain((m, n), dt["x"], dt["w"], op=op).path for op in ("rmsnorm", "rmsnorm_bwd"))
    return _row("rmsnorm_train", e.cell, dt, m, n, t_torch, t_ours, nbytes, searched_step_us(e), problem, paths)


def searched_step_us(e: Entry) -> float | None:
    """The searched kernels of a step on a forward cell: the forward's median plus the backward's on the same cell
    (dims and dtypes) where the export has that backward cell, else None (the step's rstd and host work excluded)."""
    bwd = tables().get("rmsnorm_bwd")
    same = next((b for b in bwd.entries if b.dims == e.dims and b.dtypes == e.dtypes), None) if bwd else None
    return e.median_us + same.median_us if same is not None else None


def train(samples: int, quick: bool, eps: float = 1e-6) -> list[dict]:
    """One training-step row per plain searched forward cell (with --quick, the first of each dtype)."""
    if "rmsnorm" not in tables():
        return []
    rows, seen = [], set()
    for e in tables()["rmsnorm"].entries:
        if _is_variant(e) or (quick and e.dtypes in seen):
            continue
        seen.add(e.dtypes)
        rows.append(_train_cell(e, samples, eps))
        torch.cuda.empty_cache()
    return rows


def bench(op: str, samples: int, quick: bool, eps: float = 1e-6) -> list[dict]:
    """One row per searched cell of `op` (with --quick, the first cell of each dtype)."""
    if op not in tables():
        return []
    rows, seen = [], set()
    for e in tables()[op].entries:
        key = (e.dtypes, tuple(k for k in dict(e.dims) if k not in ("M", "N")))
        if quick and key in seen:
            continue
        seen.add(key)
        cell = _backward_cell if op == "rmsnorm_bwd" else _variant_cell if _is_variant(e) else _forward_cell
        rows.append(cell(e, samples, eps))
        torch.cuda.empty_cache()
    return rows


def _row(op: str, cell: str, dt: dict, m: int, n: int, t_torch: list[float], t_ours: list[float], nbytes: int,
         searched_us: float | None, problem: str, path: str = "") -> dict:
    a, b = statistics.median(t_torch), statistics.median(t_ours)
    return {"op": op, "cell": cell, "dtypes": dt, "M": m, "N": n,
            "path": path or explain((m, n), dt["x"], dt["w"], op=op).path,
            "torch_us": a, "exported_us": b, "speedup": a / b, "torch_gbps": nbytes / a / 1e3,
            "exported_gbps": nbytes / b / 1e3, "searched_median_us": searched_us, "samples": len(t_ours),
            "torch_p10_p90_us": _spread(t_torch), "exported_p10_p90_us": _spread(t_ours),
            "correct": not problem, "error": problem}


def _spread(v: list[float]) -> list[float]:
    q = statistics.quantiles(v, n=10)
    return [q[0], q[-1]]


def measure(args: argparse.Namespace) -> Measured:
    """Both ops' rows and the training steps', the searched fingerprints and the geomean speedup per op."""
    rows = bench("rmsnorm", args.samples, args.quick) + bench("rmsnorm_bwd", args.samples, args.quick)
    rows += train(args.samples, args.quick)
    prov = provenance()
    gm = {op: geomean(r["speedup"] for r in rows if r["op"] == op) for op in ("rmsnorm", "rmsnorm_bwd", "rmsnorm_train")}
    fields = {"searched_fingerprints": {op: d["fingerprints"] for op, d in prov["ops"].items()},
              "geomean_speedup": gm}
    return rows, fields, f"geomean speedup over torch eager: {gm}"


def main(argv: list[str] | None = None) -> int:
    return benchmark.main(argv, __doc__.split("\n\n")[0], "one cell per dtype", measure)


if __name__ == "__main__":
    sys.exit(main())
