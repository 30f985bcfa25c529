"""The QuACK-compatible API: rmsnorm (autograd), rmsnorm_fwd, rmsnorm_bwd, and an RMSNorm module.

The searched kernels compute y = x * rstd * w in x's dtype, and, where the export holds cells of the
variant (a run of cta_row_fused, say), QuACK's variants in one pass: a residual add (prenorm: h = x +
residual, residual_out = h in the residual's dtype, y = rmsnorm(h)), a bias, a stored rstd. A call of a
variant the export has no cell of (or of another residual dtype), another out_dtype or a CPU tensor is
computed by the torch fallback (`reference.rmsnorm_fwd`, float32), which `explain(...)` names;
weight=None uses a weight of ones (exact). The backward of a variant call is the plain backward
(`rmsnorm_bwd`, on h) with dresidual = dh + dresidual_out and db = the column sum of dout.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from . import reference
from .choose import forward_choice
from .expr import DTYPES, dtype_name, short
from .guard import tensor_arch
from .ops import backward as _backward
from .ops import forward as _forward
from .ops import variant as _variant_op
from .run import runtime

PLAIN, VARIANT, TORCH = "plain", "variant", "torch"


@lru_cache(maxsize=64)
def _ones(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return torch.ones(n, dtype=dtype, device=device)


def _name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _route(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
           out_dtype: torch.dtype | None, store_rstd: bool = False) -> tuple[str, str]:
    """(PLAIN, '') when the plain op computes the call (searched kernels, or its own torch path per shape),
    (VARIANT, '') when a variant kernel does (the variant op), else (TORCH, why)."""
    if _name(x) not in DTYPES:
        return TORCH, f"dtype {x.dtype}"
    if weight is not None and (_name(weight) not in DTYPES or weight.shape != (x.shape[-1],)
                               or weight.device != x.device):
        return TORCH, "weight is not a (N,) tensor of a kernel dtype on x's device"
    dt = dtype_name(x.dtype)
    if out_dtype is not None and dtype_name(out_dtype) != dt:
        return TORCH, f"out_dtype {dtype_name(out_dtype)}: the searched kernels write the input's dtype ({dt})"
    if bias is None and residual is None and not store_rstd:
        return PLAIN, ""
    wdt = _name(weight) if weight is not None else dt
    if bias is not None and (_name(bias) != wdt or bias.shape != (x.shape[-1],) or bias.device != x.device):
        return TORCH, f"bias is not a (N,) tensor in the weight's dtype ({short(wdt)}) on x's device"
    if residual is not None and (_name(residual) not in DTYPES or residual.shape != x.shape
                                 or residual.device != x.device):
        return TORCH, "residual is not a tensor of x's shape, of a kernel dtype, on x's device"
    if not x.is_cuda:
        return (PLAIN, "") if bias is None and residual is None else (TORCH, "a CPU tensor")
    c = forward_choice(x.shape, dt, wdt, tensor_arch(x.device), residual=_name(residual) if residual is not None
                       else "", bias=bias is not None, store_rstd=store_rstd)
    if not c.kernel:  # store_rstd alone: the plain op, rstd by torch, as the plain op always did
        return (PLAIN, "") if bias is None and residual is None else (TORCH, c.reason)
    return (VARIANT, "") if dict(c.dims).keys() - {"M", "N"} or len(c.dtypes) > 2 else (PLAIN, "")


def _variant(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None, eps: float,
             store_rstd: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """(out, residual_out, rstd) by the variant op (autograd through it); residual_out is x without a residual."""
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out, res_out, r = _variant_op(x.reshape(-1, n), w, None if residual is None else residual.reshape(-1, n), bias,
                                  float(eps), bool(store_rstd))
    return out.reshape(x.shape), (res_out.reshape(x.shape) if residual is not None else x), \
        (r if store_rstd else None)


def rmsnorm_fwd(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, residual: Tensor | None = None,
                out_dtype: torch.dtype | None = None, residual_dtype: torch.dtype | None = None, eps: float = 1e-6,
                store_rstd: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(out, residual_out, rstd) for a (M, N) x, as QuACK's rmsnorm_fwd: residual_out is x (+ residual),
    rstd (M,) float32 when store_rstd (by the variant kernel where the export has one, else by torch)."""
    route, _ = _route(x, weight, bias, residual, out_dtype, store_rstd)
    if route == TORCH:
        runtime().count("rmsnorm", "torch")
        return reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd)
    if route == VARIANT:
        out, residual_out, r = _variant(x, weight, bias, residual, eps, store_rstd)
        if residual is None and residual_dtype is not None and residual_dtype != x.dtype:
            residual_out = x.to(residual_dtype)
        return out, residual_out, r
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _forward(x2, w, float(eps)).reshape(x.shape)
    residual_out = x.to(residual_dtype) if residual_dtype is not None and residual_dtype != x.dtype else x
    return out, residual_out, (reference.rstd(x2, eps) if store_rstd else None)


def rmsnorm_bwd(x: Tensor, weight: Tensor | None, dout: Tensor, rstd: Tensor, dresidual_out: Tensor | None = None,
                has_bias: bool = False, has_residual: bool = False
                ) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """(dx, dw, db, dresidual) for (M, N) x and dout, as QuACK's rmsnorm_bwd: dresidual_out is added to dx,
    db is the column sum of dout (torch), dresidual is dx (in dresidual_out's dtype if it differs)."""
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    dx, dw = _backward(x.reshape(-1, n), w, dout.reshape(-1, n), rstd.reshape(-1))
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
    route, _ = _route(x, weight, bias, residual, out_dtype)
    if route == TORCH:
        runtime().count("rmsnorm", "torch")
        out, residual_out, _ = reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps,
                                                     False)
        return (out, residual_out) if prenorm else out
    if route == VARIANT:
        out, residual_out, _ = _variant(x, weight, bias, residual, eps, False)
        return (out, residual_out) if prenorm else out
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _forward(x.reshape(-1, n), w, float(eps)).reshape(x.shape)
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
