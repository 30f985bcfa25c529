"""The first-use check of a kernel the factory's gate never ran (re-rendered, repaired, or compiled for
another arch): its output on the call's own data against a float64 torch reference, once per kernel.

Rows checked: the first and last four and the middle one (tails and the first row are where an
indexing bug shows); dw (a sum over all rows) in full. Tolerances are the factory's per dtype.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# elementwise |a - b| <= atol + rtol * |b|, as ops/rmsnorm/spec.py in the factory
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
_CHUNK = 1024  # rows of dw's float64 reference at a time


def rows(m: int, sample: int = 0) -> Tensor:
    """The first and last four rows and the middle one, and `sample` more drawn at random (the benchmark's check)."""
    picks = {i for i in (0, 1, 2, 3, m // 2, m - 4, m - 3, m - 2, m - 1) if 0 <= i < m}
    if sample:
        picks |= set(torch.randperm(m)[:sample].tolist())
    return torch.tensor(sorted(picks), dtype=torch.long)


def compare(name: str, got: Tensor, ref: Tensor, dtype: torch.dtype, atol_scale: float = 1.0) -> str:
    """'' when every element is within tolerance (NaN never is), else what is wrong."""
    atol, rtol = TOLERANCE[dtype]
    err = (got.double() - ref).abs()
    ok = err <= atol * atol_scale + rtol * ref.abs()
    bad = int((~ok).sum())
    if not bad:
        return ""
    worst = float(torch.nan_to_num(err, nan=math.inf).max())
    return f"{name}: {bad} of {got.numel()} checked elements off the float64 reference (max |err| {worst:.3g})"


def check_forward(x: Tensor, weight: Tensor, eps: float, y: Tensor, sample: int = 0) -> str:
    idx = rows(x.shape[0], sample).to(x.device)
    xs = x.index_select(0, idx).double()
    ref = xs * torch.rsqrt(xs.square().mean(dim=-1, keepdim=True) + eps) * weight.double()
    return compare("y", y.index_select(0, idx), ref, x.dtype)


def check_backward(x: Tensor, weight: Tensor, dout: Tensor, r: Tensor, dx: Tensor, dw: Tensor, sample: int = 0) -> str:
    idx = rows(x.shape[0], sample).to(x.device)
    rs = r.index_select(0, idx).double().unsqueeze(-1)
    xhat = x.index_select(0, idx).double() * rs
    g = dout.index_select(0, idx).double() * weight.double()
    ref = rs * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    problem = compare("dx", dx.index_select(0, idx), ref, x.dtype)
    if problem:
        return problem
    dw_ref = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for start in range(0, x.shape[0], _CHUNK):
        sl = slice(start, start + _CHUNK)
        dw_ref += (dout[sl].double() * x[sl].double() * r[sl].double().unsqueeze(-1)).sum(dim=0)
    return compare("dw", dw, dw_ref, weight.dtype, atol_scale=math.sqrt(x.shape[0]))


# rstd is fp32 math: the factory's rstd tolerance (ops/rmsnorm/spec.py RSTD_TOLERANCE)
_RSTD = (1e-6, 1e-5)


def check_variant(x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float, y: Tensor,
                  residual_out: Tensor | None, rstd: Tensor | None, sample: int = 0) -> str:
    """A variant kernel's y, residual_out (h = x + residual in the residual's dtype) and rstd on the call's
    data, the same rows, against float64."""
    idx = rows(x.shape[0], sample).to(x.device)
    h = x.index_select(0, idx).double()
    if residual is not None:
        h = h + residual.index_select(0, idx).double()
    r = torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + eps)
    ref = h * r * weight.double() + (bias.double() if bias is not None else 0)
    problem = compare("y", y.index_select(0, idx), ref, x.dtype)
    if not problem and residual_out is not None:
        problem = compare("residual_out", residual_out.index_select(0, idx), h, residual.dtype)
    if not problem and rstd is not None:
        got, want = rstd.index_select(0, idx).double(), r.squeeze(-1)
        err = (got - want).abs()
        bad = int((~(err <= _RSTD[0] + _RSTD[1] * want.abs())).sum())
        if bad:
            problem = f"rstd: {bad} of {got.numel()} checked rows off the float64 reference"
    return problem
