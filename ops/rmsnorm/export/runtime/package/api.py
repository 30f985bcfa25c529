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

import warnings
from functools import lru_cache
from typing import Any

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
# The serving path: a call signature (shapes, dtypes, devices, the residual's dtype) whose kernel is one trusted
# launch (checked on first use) maps to its Direct launch after its first call (the runtime's `fast`), and its later
# calls that need no autograd go straight to it: no routing, no autograd Function, no lookups (a few-row call is
# mostly host time). False: the signature takes another path (torch, or a plan of several launches).
_FAST_MAX = 4096
_PLAIN_TENSORS, _RESIDUAL_TENSORS, _SCALARS = ("x", "w", "y"), ("x", "w", "y", "residual", "residual_out"), ("eps",)


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


def _signature(x: Tensor, weight: Tensor, residual: Tensor | None) -> tuple:
    return (x.shape, weight.shape, x.dtype, weight.dtype, None if residual is None else residual.dtype,
            x.get_device(), weight.get_device())


def _fast(x: Tensor, weight: Tensor, residual: Tensor | None, eps: float, out: Tensor | None = None,
          res_into: Tensor | None = None) -> tuple[Tensor, Tensor | None] | None:
    """(y, residual_out) by the signature's Direct launch, written into `out` / `res_into` where given (checked by
    _check_into: nothing allocated), or None: not learned yet, autograd needed, torch.compile tracing, or operands
    not contiguous and 16-byte aligned (the slow path copies those)."""
    if torch.compiler.is_compiling():  # first: torch.compile traces the custom op, nothing of this path
        return None
    d = runtime().fast.get(_signature(x, weight, residual))
    if not d:
        return None
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (residual is not None and residual.requires_grad)):
        return None
    if not (x.is_contiguous() and weight.is_contiguous()) or (x.data_ptr() | weight.data_ptr()) & 15:
        return None
    if out is not None and out.data_ptr() & 15:
        return None
    if residual is None:
        y = torch.empty_like(x) if out is None else out
        d(x.data_ptr(), weight.data_ptr(), y.data_ptr(), eps)
        return y, None
    if (residual.shape != x.shape or not residual.is_contiguous() or residual.data_ptr() & 15
            or residual.get_device() != x.get_device() or (res_into is not None and res_into.data_ptr() & 15)):
        return None
    y = torch.empty_like(x) if out is None else out
    res_out = torch.empty_like(residual) if res_into is None else res_into
    d(x.data_ptr(), weight.data_ptr(), y.data_ptr(), residual.data_ptr(), res_out.data_ptr(), eps)
    return y, res_out


def _span(t: Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _check_into(t: Tensor, name: str, x: Tensor, dtype: torch.dtype, inputs: tuple[Tensor | None, ...]) -> None:
    """ValueError, one line, unless `t` can take the call's output: x's shape, `dtype`, x's device, contiguous, and
    sharing no memory with the call's inputs (a kernel may read an input after another thread wrote its output)."""
    if not isinstance(t, Tensor):
        raise ValueError(f"{name}: a tensor to write into, got {type(t).__name__}")
    if t.shape != x.shape or t.dtype != dtype or t.device != x.device or not t.is_contiguous():
        raise ValueError(f"{name}: needs a contiguous {tuple(x.shape)} {dtype} tensor on {x.device}, got "
                         f"{tuple(t.shape)} {t.dtype} on {t.device}{'' if t.is_contiguous() else ' (not contiguous)'}")
    lo, hi = _span(t)
    for i in inputs:
        if i is None or i.device != t.device or not i.numel():
            continue
        ilo, ihi = _span(i)
        if lo < ihi and ilo < hi:
            raise ValueError(f"{name}: shares memory with an input of the call; give it a buffer of its own")


def _agrees(d: Any, x: Tensor, weight: Tensor, residual: Tensor | None, eps: float,
            want: tuple[Tensor, Tensor | None]) -> bool:
    """The Direct launch's outputs on this call's inputs are the routed call's bit for bit (the same kernel, so
    the same bits: NaN included)."""
    calls, y = d.calls, torch.empty_like(x)  # the check's launch is no call of the caller's (stats)
    if residual is None:
        d(x.data_ptr(), weight.data_ptr(), y.data_ptr(), eps)
        pairs = [(y, want[0])]
    else:
        r = torch.empty_like(residual)
        d(x.data_ptr(), weight.data_ptr(), y.data_ptr(), residual.data_ptr(), r.data_ptr(), eps)
        pairs = [(y, want[0]), (r, want[1])]
    d.calls = calls
    return all(b is not None and a.shape == b.shape and a.dtype == b.dtype
               and torch.equal(a.reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))
               for a, b in pairs)


def _checked(d: Any, x: Tensor, weight: Tensor, residual: Tensor | None, eps: float,
             want: tuple[Tensor, Tensor | None]) -> Any:
    """d where its outputs on this call's inputs are `want`; a raw driver launch that disagrees is switched to
    cuda.core's launch and checked again; None (with a warning) where the launch still disagrees."""
    if _agrees(d, x, weight, residual, eps, want):
        return d
    if d.raw:
        d.use_cuda_core()
        if _agrees(d, x, weight, residual, eps, want):
            return d
    warnings.warn(f"rmsnorm: the direct launch of {tuple(x.shape)} {_name(x)} disagreed with the routed call; such "
                  "calls stay on the routed path", RuntimeWarning, stacklevel=4)
    return None


def _learn(x: Tensor, weight: Tensor, residual: Tensor | None, eps: float,
           want: tuple[Tensor, Tensor | None]) -> None:
    """After a call of this signature took the kernel path and gave `want` (its outputs): its Direct launch, where
    its kernel is trusted now and the launch gives the same outputs on this call's inputs (checked once: a raw
    driver launch that disagrees falls back to cuda.core's, and a launch that still disagrees is not kept)."""
    if not x.is_cuda or torch.compiler.is_compiling() or x.numel() == 0 or torch.cuda.is_current_stream_capturing():
        return
    key, rt, n = _signature(x, weight, residual), runtime(), x.shape[-1]
    if key in rt.fast:
        return
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, residual)):
        return  # such a call may take a kernel that stores rstd too: a call without autograd learns the plain one
    aligned = [t for t in (x, weight, residual) if t is not None]
    if not all(t.is_contiguous() and t.data_ptr() & 15 == 0 for t in aligned):
        return  # a later call whose operands the direct launch can take learns it
    x2, r2 = x.reshape(-1, n), (residual.reshape(-1, n) if residual is not None else None)
    c = rt.choice("rmsnorm", x2, weight) if r2 is None else rt.variant_choice(x2, weight, r2, None, False)
    if not c.kernel:
        rt.fast[key] = False
        return
    if not rt.trusted(c):  # not checked yet (a call inside graph capture took torch): learn on a later call
        return
    d = rt.direct(c, "rmsnorm", x.device, _PLAIN_TENSORS if r2 is None else _RESIDUAL_TENSORS, _SCALARS)
    if d is not None:
        d = _checked(d, x, weight, residual, eps, want)
    if len(rt.fast) >= _FAST_MAX:
        rt.fast.clear()
    rt.fast[key] = d if d is not None else False


def rmsnorm_fwd(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, residual: Tensor | None = None,
                out_dtype: torch.dtype | None = None, residual_dtype: torch.dtype | None = None, eps: float = 1e-6,
                store_rstd: bool = False, *, out: Tensor | None = None, residual_out: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor | None]:
    """(out, residual_out, rstd) for a (M, N) x, as QuACK's rmsnorm_fwd: residual_out is x (+ residual),
    rstd (M,) float32 when store_rstd (by the variant kernel where the export has one, else by torch).

    `out` (and, with a residual, `residual_out`): contiguous tensors of x's shape in the outputs' dtypes (out_dtype,
    else x's; the residual's) on x's device, sharing no memory with the inputs, that the call writes and returns
    instead of allocating: with them a repeated call allocates nothing (a CUDA graph of it holds no allocation).
    Anything else is a ValueError that says what it needs."""
    if out is not None:
        _check_into(out, "out", x, out_dtype or x.dtype, (x, weight, bias, residual, residual_out))
    if residual_out is not None:
        if residual is None:
            raise ValueError("residual_out: a call without a residual writes none (its residual_out is x)")
        _check_into(residual_out, "residual_out", x, residual.dtype, (x, weight, bias, residual))
    plain_call = weight is not None and bias is None and out_dtype is None and residual_dtype is None and not store_rstd
    if plain_call:
        got = _fast(x, weight, residual, eps, out, residual_out)
        if got is not None:
            return got[0], (got[1] if residual is not None else x), None
    y, res, r = _rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd, plain_call)
    if out is not None:
        y = out.copy_(y)
    if residual_out is not None:
        res = residual_out.copy_(res)
    return y, res, r


def _rmsnorm_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None,
                 out_dtype: torch.dtype | None, residual_dtype: torch.dtype | None, eps: float, store_rstd: bool,
                 plain_call: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """rmsnorm_fwd's routed path: the torch fallback, the variant op or the plain op (learning the signature's direct
    launch after a plain call that took a kernel)."""
    route, _ = _route(x, weight, bias, residual, out_dtype, store_rstd)
    if route == TORCH:
        runtime().count("rmsnorm", "torch")
        return reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps, store_rstd)
    if route == VARIANT:
        out, residual_out, r = _variant(x, weight, bias, residual, eps, store_rstd)
        if residual is None and residual_dtype is not None and residual_dtype != x.dtype:
            residual_out = x.to(residual_dtype)
        if plain_call:
            _learn(x, weight, residual, eps, (out, residual_out))
        return out, residual_out, r
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _forward(x2, w, float(eps)).reshape(x.shape)
    residual_out = x.to(residual_dtype) if residual_dtype is not None and residual_dtype != x.dtype else x
    if plain_call and residual is None:
        _learn(x, weight, None, eps, (out, None))
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
    plain_call = weight is not None and bias is None and out_dtype is None and residual_dtype is None
    if plain_call:
        got = _fast(x, weight, residual, eps)
        if got is not None:
            return (got[0], got[1] if residual is not None else x) if prenorm else got[0]
    route, _ = _route(x, weight, bias, residual, out_dtype)
    if route == TORCH:
        runtime().count("rmsnorm", "torch")
        out, residual_out, _ = reference.rmsnorm_fwd(x, weight, bias, residual, out_dtype, residual_dtype, eps,
                                                     False)
        return (out, residual_out) if prenorm else out
    if route == VARIANT:
        out, residual_out, _ = _variant(x, weight, bias, residual, eps, False)
        if plain_call:
            _learn(x, weight, residual, eps, (out, residual_out))
        return (out, residual_out) if prenorm else out
    n = x.shape[-1]
    w = weight if weight is not None else _ones(n, x.dtype, x.device)
    out = _forward(x.reshape(-1, n), w, float(eps)).reshape(x.shape)
    if plain_call and residual is None:
        _learn(x, weight, None, eps, (out, None))
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
