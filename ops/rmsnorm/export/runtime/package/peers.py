"""The peers the package's benchmark times beside it, each a zero-argument callable on the cell's tensors, or a
one-line reason why it is absent (not installed, failed to load, no such variant). Imported lazily: a missing peer
never stops the benchmark. Every peer returns what the package's call returns for the same table (y; (y,
residual_out); (dx, dw); (dx, dw) of a training step)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .sides import side
from .torch_compile import compiled as _compiled

FORWARD = ("torch.eager", "torch.compile", "liger", "quack", "quack.autotuned", "flashinfer", "cudnn")
# the distributions whose versions a benchmark file records
DISTS = ("liger-kernel", "quack-kernels", "nvidia-cutlass-dsl", "flashinfer-python", "nvidia-cudnn-frontend")
def _quack() -> Any:
    return importlib.import_module("quack.rmsnorm")  # the module: quack/__init__.py binds quack.rmsnorm to a function


def _eager_fwd(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps)


def _eager_residual(x: Tensor, w: Tensor, res: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    h = x.float() + res.float()
    return torch.nn.functional.rms_norm(h, (x.shape[-1],), w.float(), eps).to(x.dtype), h.to(res.dtype)


def _eager_bwd(x: Tensor, w: Tensor, dout: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor]:
    xhat = x.float() * rstd.unsqueeze(-1)
    g = dout.float() * w.float()
    dx = rstd.unsqueeze(-1) * (g - xhat * (g * xhat).mean(dim=-1, keepdim=True))
    return dx.to(x.dtype), (dout.float() * xhat).sum(dim=0).to(w.dtype)


def forward(x: Tensor, w: Tensor, eps: float, names: tuple[str, ...]) -> dict[str, Callable[[], Any] | str]:
    def liger():
        from liger_kernel.ops.rms_norm import rms_norm_forward  # the kernel behind LigerRMSNormFunction

        return lambda: rms_norm_forward(x, w, eps, 0.0, "llama", None)[0]

    def quack(tuned: bool):
        q = _quack()
        if not tuned:
            return lambda: q.rmsnorm_fwd(x, w, eps=eps)[0]
        out = torch.empty_like(x)

        def run():  # autotunes every config on its first call per (shape, dtype); the check's call does that
            q.rmsnorm_fwd_tuned(x, w, out, eps=eps)
            return out
        return run

    def flashinfer():
        from flashinfer.norm import rmsnorm as fi

        return lambda: fi(x, w, eps)

    def cudnn():
        from cudnn.ops.norm.rmsnorm import rms_norm as cd

        return lambda: cd(x, w, eps=eps)

    fn = _compiled(torch, _eager_fwd)
    makers = {"torch.eager": lambda: (lambda: _eager_fwd(x, w, eps)), "torch.compile": lambda: (lambda: fn(x, w, eps)),
              "liger": liger, "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True),
              "flashinfer": flashinfer, "cudnn": cudnn}
    return {n: side(makers[n]) for n in names}


def residual(x: Tensor, w: Tensor, res: Tensor, eps: float, names: tuple[str, ...]
             ) -> dict[str, Callable[[], Any] | str]:
    """y = rmsnorm(x + residual) and residual_out = x + residual, as the package's rmsnorm_fwd(..., residual=)."""
    def quack(tuned: bool):
        q = _quack()
        if not tuned:
            return lambda: q.rmsnorm_fwd(x, w, residual=res, eps=eps)[:2]
        out, res_out = torch.empty_like(x), torch.empty_like(res)

        def run():
            q.rmsnorm_fwd_tuned(x, w, out, residual=res, residual_out=res_out, eps=eps)
            return out, res_out
        return run

    def flashinfer():
        from flashinfer.norm import fused_add_rmsnorm

        # in place (x <- y, residual <- x + residual): on copies, refreshed from the cell's tensors each call
        xi, ri = x.clone(), res.clone()

        def run():
            xi.copy_(x)
            ri.copy_(res)
            fused_add_rmsnorm(xi, ri, w, eps)
            return xi, ri
        return run

    def liger():
        raise NotImplementedError("liger's rms_norm_forward takes no residual")

    def cudnn():
        raise NotImplementedError("cuDNN frontend's rms_norm takes no residual")

    fn = _compiled(torch, _eager_residual)
    makers = {"torch.eager": lambda: (lambda: _eager_residual(x, w, res, eps)),
              "torch.compile": lambda: (lambda: fn(x, w, res, eps)), "liger": liger,
              "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True), "flashinfer": flashinfer,
              "cudnn": cudnn}
    return {n: side(makers[n]) for n in names}


def backward(x: Tensor, w: Tensor, dout: Tensor, rstd: Tensor, names: tuple[str, ...]
             ) -> dict[str, Callable[[], Any] | str]:
    """(dx, dw) from x, w, dout and the forward's rstd, as the package's rmsnorm_bwd."""
    def liger():
        from liger_kernel.ops.rms_norm import rms_norm_backward
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(x.shape[-1])  # raises past Triton's largest block
        return lambda: rms_norm_backward(dout, x, w, rstd, 0.0, "llama", block, warps, False, None)

    def quack(tuned: bool):
        q = _quack()
        if not tuned:
            return lambda: q.rmsnorm_bwd(x, w, dout, rstd)[:2]
        from quack.rmsnorm_config import get_sm_count

        sm = get_sm_count(x.shape[-1], x.device)
        dx = torch.empty_like(x)
        part = torch.empty((sm, x.shape[-1]), device=x.device, dtype=torch.float32)

        def run():
            q.rmsnorm_bwd_tuned(x, w, dout, rstd, dx, part, sm_count=sm, has_dw_partial=True)
            return dx, part.sum(dim=0).to(w.dtype)
        return run

    def flashinfer():
        raise NotImplementedError("FlashInfer has no RMSNorm backward")

    def cudnn():
        importlib.import_module("cudnn.ops.norm.rmsnorm")  # registers torch.ops.cudnn.rmsnorm_bwd
        n = x.shape[-1]
        x4, w4, r4 = x.reshape(-1, n, 1, 1), w.reshape(1, n, 1, 1), rstd.reshape(-1, 1, 1, 1)

        def run():
            dx, dw, _ = torch.ops.cudnn.rmsnorm_bwd(dout.reshape(-1, n, 1, 1), x4, w4, r4, False)
            return dx.reshape(x.shape), dw.reshape(-1)
        return run

    fn = _compiled(torch, _eager_bwd)
    makers = {"torch.eager": lambda: (lambda: _eager_bwd(x, w, dout, rstd)),
              "torch.compile": lambda: (lambda: fn(x, w, dout, rstd)), "liger": liger,
              "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True), "flashinfer": flashinfer,
              "cudnn": cudnn}
    return {n: side(makers[n]) for n in names}


def train(x: Tensor, w: Tensor, dy: Tensor, eps: float, names: tuple[str, ...]) -> dict[str, Callable[[], Any] | str]:
    """A training step through autograd, as a model calls it: y = norm(x, w), then (dx, dw) from dy. x and w
    require grad."""
    def step(fwd: Callable[[], Tensor]) -> Callable[[], Any]:
        return lambda: torch.autograd.grad(fwd(), (x, w), dy)

    def liger():
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        # (X, W, eps, offset, casting_mode, in_place): in_place=False, or its backward overwrites dy with dx
        return step(lambda: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False))

    def quack(tuned: bool):
        if tuned:
            raise NotImplementedError("QuACK's autotuned kernels have no autograd entry point")
        q = _quack()
        return step(lambda: q.rmsnorm(x, w, eps=eps))

    def flashinfer():
        raise NotImplementedError("FlashInfer has no RMSNorm backward")

    def cudnn():
        from cudnn.ops.norm.rmsnorm import rms_norm as cd

        return step(lambda: cd(x, w, eps=eps))

    fn = _compiled(torch, _eager_fwd)
    makers = {"torch.eager": lambda: step(lambda: _eager_fwd(x, w, eps)),
              "torch.compile": lambda: step(lambda: fn(x, w, eps)), "liger": liger,
              "quack": lambda: quack(False), "quack.autotuned": lambda: quack(True), "flashinfer": flashinfer,
              "cudnn": cudnn}
    return {n: side(makers[n]) for n in names}
