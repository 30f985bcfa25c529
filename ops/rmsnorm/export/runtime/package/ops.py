"""The torch.library custom ops, <package>::rmsnorm_fwd, <package>::rmsnorm_fwd_variant and
<package>::rmsnorm_bwd, with autograd.

rmsnorm_fwd(x (M, N), weight (N,), eps) -> y; its backward recomputes rstd from x in float32 torch and calls
rmsnorm_bwd, which runs the exported backward kernels when a backward run was exported, else float32 torch. Outside
torch.compile, a call that needs gradients takes a forward kernel that also stores rstd where one serves the call
(a store_rstd cell, or a plain winner whose template stores rstd when asked), and its backward reads that rstd.
rmsnorm_fwd_variant(x, weight, residual?, bias?, eps, store_rstd) -> (y, residual_out, rstd): the
variant kernels (h = x + residual, residual_out = h in the residual's dtype, y = rmsnorm(h) (+ bias),
rstd stored); residual_out and rstd are empty (0,) tensors for a call without them. Its backward is
rmsnorm_bwd on h (residual_out; x without a residual) with rstd recomputed from h, then dresidual =
dx = dh + dresidual_out, db = the column sum of dy. Fake (meta) implementations let torch.compile trace
through all three. Outside torch.compile the plain op and the variant op run as autograd.Functions (`forward`,
`variant`, `backward`) over the same runtime: the custom op's dispatch (forward and backward) is host time a training
step pays, and on the GPU that step's host time ran at twice and more torch eager's.
"""

import torch
from torch import Tensor

from . import reference
from .run import runtime

NAMESPACE = __name__.split(".")[0]


@torch.library.custom_op(f"{NAMESPACE}::rmsnorm_fwd", mutates_args=(),
                         schema="(Tensor x, Tensor weight, float eps) -> Tensor")
def rmsnorm_fwd(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return runtime().forward(x, weight, eps)


@rmsnorm_fwd.register_fake
def _fwd_fake(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::rmsnorm_bwd", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor dout, Tensor rstd) -> (Tensor, Tensor)")
def rmsnorm_bwd(x: Tensor, weight: Tensor, dout: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    return runtime().backward(x, weight, dout, rstd)


@rmsnorm_bwd.register_fake
def _bwd_fake(x: Tensor, weight: Tensor, dout: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _setup(ctx, inputs, output) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _backward(ctx, dy: Tensor):
    x, weight = ctx.saved_tensors
    dx, dw = rmsnorm_bwd(x, weight, dy.contiguous(), reference.rstd(x, ctx.eps))
    return dx, (dw if ctx.needs_input_grad[1] else None), None


rmsnorm_fwd.register_autograd(_backward, setup_context=_setup)


def _variant_outputs(x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
                     store_rstd: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The runtime's (y, residual_out, rstd), the two last as empty (0,) tensors for a call without them."""
    y, res_out, r = runtime().forward_variant(x, weight, residual, bias, eps, store_rstd)
    return (y, res_out if res_out is not None else x.new_empty((0,)),
            r if r is not None else x.new_empty((0,), dtype=torch.float32))


@torch.library.custom_op(f"{NAMESPACE}::rmsnorm_fwd_variant", mutates_args=(),
                         schema="(Tensor x, Tensor weight, Tensor? residual, Tensor? bias, float eps, bool store_rstd)"
                                " -> (Tensor, Tensor, Tensor)")
def rmsnorm_fwd_variant(x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
                        store_rstd: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _variant_outputs(x, weight, residual, bias, eps, store_rstd)


@rmsnorm_fwd_variant.register_fake
def _variant_fake(x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
                  store_rstd: bool) -> tuple[Tensor, Tensor, Tensor]:
    return (torch.empty_like(x), torch.empty_like(residual) if residual is not None else x.new_empty((0,)),
            x.new_empty((x.shape[0] if store_rstd else 0,), dtype=torch.float32))


def _variant_setup(ctx, inputs, output) -> None:
    x, weight, residual, bias, eps, _ = inputs
    ctx.save_for_backward(output[1] if residual is not None else x, weight)
    ctx.eps = eps
    ctx.x_dtype = x.dtype
    ctx.residual_dtype = residual.dtype if residual is not None else None
    ctx.bias_dtype = bias.dtype if bias is not None else None


def _variant_grads(ctx, bwd, dy: Tensor | None, dres_out: Tensor | None) -> tuple:
    """(dx, dw, dresidual, db, None, None) of a variant call from ctx (_variant_setup's) by the backward `bwd` (the
    rmsnorm_bwd custom op, or the runtime's): dh, dw on h, dresidual = dx = dh + dresidual_out, db = dy's column sum.
    dy None (y unused): zeros; dres_out None or empty: no residual_out gradient."""
    h, weight = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros(h.shape, dtype=ctx.x_dtype, device=h.device)
    dh, dw = bwd(h, weight, dy.contiguous(), reference.rstd(h, ctx.eps))
    dx = dres = None
    if ctx.residual_dtype is not None:
        total = dh.float() + dres_out.float() if dres_out is not None and dres_out.numel() else dh.float()
        dx = total.to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
        dres = total.to(ctx.residual_dtype) if ctx.needs_input_grad[2] else None
    elif ctx.needs_input_grad[0]:
        dx = dh
    db = dy.float().sum(dim=0).to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[3] else None
    return dx, (dw if ctx.needs_input_grad[1] else None), dres, db, None, None


def _variant_backward(ctx, dy: Tensor, dres_out: Tensor, _drstd: Tensor):
    return _variant_grads(ctx, rmsnorm_bwd, dy, dres_out)


rmsnorm_fwd_variant.register_autograd(_variant_backward, setup_context=_variant_setup)


class _Forward(torch.autograd.Function):
    """rmsnorm_fwd outside torch.compile: the same runtime forward and backward as the custom op, through an
    autograd.Function, whose call costs the host a fraction of a torch.library custom op's dispatch."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, grad_mode: bool) -> Tensor:
        ctx.eps = eps
        rt = runtime()
        c = rt.variant_choice(x, weight, None, None, True) if grad_mode and any(ctx.needs_input_grad[:2]) \
            and x.numel() else None
        if c is not None and c.kernel:
            # a training step: the forward kernel stores each row's rstd, and the backward reads it
            y, _, r = rt.forward_variant(x, weight, None, None, eps, True, c)
            ctx.save_for_backward(x, weight, r)
            return y
        ctx.save_for_backward(x, weight, None)
        return rt.forward(x, weight, eps)

    @staticmethod
    def backward(ctx, dy: Tensor):
        # the custom op's _backward calls the rmsnorm_bwd custom op, which AOTAutograd can trace with fake tensors;
        # this one runs eagerly only (forward() takes the custom op while compiling), so it calls the runtime
        x, weight, r = ctx.saved_tensors
        if r is None:
            r = reference.rstd(x, ctx.eps)
        dx, dw = runtime().backward(x, weight, dy.contiguous(), r)
        return dx, (dw if ctx.needs_input_grad[1] else None), None, None


def forward(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y of a (M, N) x with autograd: the custom op while torch.compile traces (it sees one op), else _Forward."""
    if torch.compiler.is_compiling():
        return rmsnorm_fwd(x, weight, eps)
    return _Forward.apply(x, weight, eps, torch.is_grad_enabled())  # (inside forward() grad mode is always off)


class _Variant(torch.autograd.Function):
    """rmsnorm_fwd_variant outside torch.compile: the same runtime forward and backward through an
    autograd.Function. Gradients are not materialized: an unused residual_out costs no zeros."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
                store_rstd: bool) -> tuple[Tensor, Tensor, Tensor]:
        out = _variant_outputs(x, weight, residual, bias, eps, store_rstd)
        _variant_setup(ctx, (x, weight, residual, bias, eps, store_rstd), out)
        ctx.mark_non_differentiable(out[2])
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, dy: Tensor | None, dres_out: Tensor | None, _drstd: Tensor | None):
        return _variant_grads(ctx, runtime().backward, dy, dres_out)


def variant(x: Tensor, weight: Tensor, residual: Tensor | None, bias: Tensor | None, eps: float,
            store_rstd: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(y, residual_out, rstd) of a (M, N) x with autograd, the two last empty (0,) when off: the custom op while
    torch.compile traces, else _Variant."""
    if torch.compiler.is_compiling():
        return rmsnorm_fwd_variant(x, weight, residual, bias, eps, store_rstd)
    return _Variant.apply(x, weight, residual, bias, eps, store_rstd)


def backward(x: Tensor, weight: Tensor, dout: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    """(dx, dw): the custom op while torch.compile traces, else the runtime directly."""
    if torch.compiler.is_compiling():
        return rmsnorm_bwd(x, weight, dout, rstd)
    return runtime().backward(x, weight, dout, rstd)
