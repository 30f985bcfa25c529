"""The torch.library custom ops, <package>::rmsnorm_fwd and <package>::rmsnorm_bwd, with autograd.

rmsnorm_fwd(x (M, N), weight (N,), eps) -> y; its backward recomputes rstd from x in float32 torch
(the searched forward kernels do not store it) and calls rmsnorm_bwd, which runs the exported backward
kernels when a backward run was exported, else float32 torch. Fake (meta) implementations let
torch.compile trace through both.
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
