"""The torch fallback: RMSNorm forward and backward in float32 torch operations (correct, not searched).

Every variant the searched kernels do not compute (bias, residual, another out_dtype, a CPU tensor, a
shape no template admits) goes through these functions; they are differentiable by torch itself.
"""

from __future__ import annotations

import torch
from torch import Tensor


def rstd(x: Tensor, eps: float) -> Tensor:
    """1 / sqrt(mean(x^2) + eps) per row of a (M, N) tensor, in float32 (float64 for float64 x).

    One reduction, the 2-norm accumulated in float32 (torch widens 16-bit CUDA input inside the reduction, with no
    float32 copy of x), in place of a float32 copy of x squared and then averaged (three passes over M x N floats):
    autograd's backward pays this for the rstd the searched forward kernels do not store."""
    acc = torch.promote_types(x.dtype, torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, dtype=acc)
    return torch.rsqrt(norm.square() / x.shape[-1] + eps)


def forward_2d(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y = x * rstd * w for (M, N) x, computed in float32 (float64 for float64 x), returned in x's dtype."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    return (xf * rstd(xf, eps).unsqueeze(-1) * weight.to(acc)).to(x.dtype)


def backward_2d(x: Tensor, weight: Tensor, dout: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """dx = r * (g - xhat * mean(g * xhat)) with g = dout * w, xhat = x * r; dw = sum_rows(dout * xhat)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xhat = x.to(acc) * r.to(acc).unsqueeze(-1)
    g = dout.to(acc) * weight.to(acc)
    dx = r.to(acc).unsqueeze(-1) * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    return dx.to(x.dtype), (dout.to(acc) * xhat).sum(dim=0).to(weight.dtype)


def rmsnorm_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
                out_dtype: torch.dtype | None, residual_dtype: torch.dtype | None, eps: float,
                store_rstd: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """Every variant of the API: h = x (+ residual) in float32, out = h * rstd * w (+ bias).

    residual_out: with a residual, h in the residual's dtype (as QuACK); without one, x itself, or x
    cast to residual_dtype when that differs."""
    acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for float64 input
    h = x.to(acc)
    if residual is not None:
        h = h + residual.to(acc)
    r = torch.rsqrt(h.square().mean(dim=-1) + eps)
    y = h * r.unsqueeze(-1)
    if weight is not None:
        y = y * weight.to(acc)
    if bias is not None:
        y = y + bias.to(acc)
    out = y.to(out_dtype or x.dtype)
    if residual is not None:
        residual_out = h.to(residual.dtype)
    elif residual_dtype is not None and residual_dtype != x.dtype:
        residual_out = x.to(residual_dtype)
    else:
        residual_out = x
    return out, residual_out, (r if store_rstd else None)
