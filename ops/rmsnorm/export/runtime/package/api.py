"""The QuACK-compatible API: rmsnorm (autograd), rmsnorm_fwd, rmsnorm_bwd, and an RMSNorm module.

The searched kernels compute y = x * rstd * w in x's dtype. Everything else (bias, residual add,
another out_dtype, CPU tensors) is computed by the torch fallback (`reference.rmsnorm_fwd`, float32),
which `explain(...)` names; weight=None uses a weight of ones (exact).
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from . import reference
from .choose import unsupported
from .expr import DTYPES, dtype_name
from .ops import NAMESPACE
from .run import runtime

_OPS = getattr(torch.ops, NAMESPACE)


@lru_cache(maxsize=64)
def _ones(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.ones(n, dtype=dtype, device=device)


def _kernel_reason(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
                   out_dtype: torch.dtype | None) -> str:
    """'' when the custom op (searched kernels, or its own torch path per shape) computes this call."""
    if str(x.dtype).removeprefix("torch.") not in DTYPES:
        return f"dtype {x.dtype}"
    if weight is not None and (str(weight.dtype).removeprefix("torch.") not in DTYPES
                               or weight.shape != (x.shape[-1],) or weight.device != x.device):
        return "weight is not a (N,) tensor of a kernel dtype on x's device"
    return unsupported(dtype_name(x.dtype), bias=bias is not None, residual=residual is not None,
                       out_dtype=out_dtype)


def rmsnorm_fwd(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, residual: Tensor | None = None,
                out_dtype: torch.dtype | None = None, residual_dtype: torch.dtype | None = None, eps: float = 1e-6,
                store_rstd: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(out, residual_out, rstd) for a (M, N) x, as QuACK's rmsnorm_fwd: residual_out is x (+ residual),
    rstd (M,) float32 when store_rstd (computed by torch: the searched kernels do not store it)."""
    if _kernel_reason(x, weight, bias, residual, out_dtype):
        runtime().count("rmsnorm", "torch")
        return reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _OPS.rmsnorm_fwd(x2, w, float(eps)).reshape(x.shape)
    residual_out = x.to(residual_dtype) if residual_dtype is not None and residual_dtype != x.dtype else x
    return out, residual_out, (reference.rstd(x2, eps) if store_rstd else None)


def rmsnorm_bwd(x: Tensor, weight: Tensor | None, dout: Tensor, rstd: Tensor, dresidual_out: Tensor | None = None,
                has_bias: bool = False, has_residual: bool = False
                ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dw, db, dresidual) for (M, N) x and dout, as QuACK's rmsnorm_bwd: dresidual_out is added to dx,
    db is the column sum of dout (torch), dresidual is dx (in dresidual_out's dtype if it differs)."""
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    dx, dw = _OPS.rmsnorm_bwd(x.reshape(-1, n), w, dout.reshape(-1, n), rstd.reshape(-1))
    dx = dx.reshape(x.shape)
    if dresidual_out is not None:
        dx = (dx.float() + dresidual_out.float()).to(x.dtype)
    db = dout.reshape(-1, n).float().sum(dim=0).to(w.dtype) if has_bias else None
    dresidual = None
    if has_residual:
        dresidual = dx.to(dresidual_out.dtype) if dresidual_out is not None else dx
    return dx, (dw if weight is not None else None), db, dresidual


def rmsnorm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, residual: Tensor | None = None,
            out_dtype: torch.dtype | None = None, residual_dtype: torch.dtype | None = None, eps: float = 1e-6,
            prenorm: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """RMSNorm over the last dim with autograd; with prenorm, (out, residual_out) as QuACK's rmsnorm."""
    if _kernel_reason(x, weight, bias, residual, out_dtype):
        runtime().count("rmsnorm", "torch")
        out, residual_out, _ = reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps,
                                                     False)
        return (out, residual_out) if prenorm else out
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _OPS.rmsnorm_fwd(x.reshape(-1, n), w, float(eps)).reshape(x.shape)
    if not prenorm:
        return out
    return out, (x.to(residual_dtype) if residual_dtype is not None and residual_dtype != x.dtype else x)


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm over the last dim, computed by `rmsnorm`."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True, device: torch.device | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(dim, eps, elementwise_affine, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return rmsnorm(x, self.weight, eps=self.eps)


def stats() -> dict[str, dict[str, int]]:
    """Calls per op and path in this process ({'rmsnorm': {'table': 3, 'torch': 1}, ...})."""
    return runtime().stats()
