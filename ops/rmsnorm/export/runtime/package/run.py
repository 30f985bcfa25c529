"""One call of the op: choose the path, launch the kernel (checking an unverified one on first use), or
fall back to torch, and count which path ran (`stats()`).

A kernel that fails to compile or fails its first-use check is not used again in this process; a
warning says why, once, and its calls take the torch path. A kernel the factory's gate never ran is
not used inside CUDA graph capture before its check has run (the check reads results back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache

import torch
from torch import Tensor

from . import reference, verify
from .choose import Choice, choose
from .expr import dtype_name
from .guard import Guarded, aligned, tensor_arch



class Runtime(Guarded):
    """RMSNorm's calls (forward, backward) on the shared launch guard; paths counted by op."""

    NOUN = "shape"

    def choice(self, op: str, x: Tensor, weight: Tensor) -> Choice:
        m, n = x.shape
        dims = (("M", m), ("N", n))
        try:
            dtypes = (("w", dtype_name(weight.dtype)), ("x", dtype_name(x.dtype)))
        except ValueError as e:  # float64, say: no kernel reads it
            return Choice(op, "torch", dims, (), 0, str(e))
        if not x.is_cuda:
            return Choice(op, "torch", dims, dtypes, 0, "a CPU tensor")
        return choose(op, dims, dtypes, tensor_arch(x.device))

    def _count(self, c: Choice, path: str) -> None:
        self.count(c.op, path)

    def launch(self, c: Choice, tensors: Mapping[str, Tensor], scalars: Mapping[str, float],
               check: Callable[[], str]) -> bool:
        """Run the choice's kernel; False when the caller must take the torch path instead."""
        return self.run_kernel(c, c.op, tensors, scalars, check)

    def forward(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm of a (M, N) tensor with a (N,) weight, output in x's dtype."""
        if x.shape[0] == 0 or x.shape[1] == 0:
            return reference.forward_2d(x, weight, eps)
        c = self.choice("rmsnorm", x, weight)
        if c.kernel:
            x, weight = aligned(x), aligned(weight)
            y = torch.empty_like(x)
            if self.launch(c, {"x": x, "w": weight, "y": y}, {"eps": eps},
                           lambda: verify.check_forward(x, weight, eps, y)):
                return y
        else:
            self._count(c, "torch")
        return reference.forward_2d(x, weight, eps)

    def backward(self, x: Tensor, weight: Tensor, dout: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
        """dx (M, N) in x's dtype and dw (N,) in the weight's dtype, from the rstd the forward used."""
        if x.shape[0] == 0 or x.shape[1] == 0:
            return reference.backward_2d(x, weight, dout, r)
        c = self.choice("rmsnorm_bwd", x, weight)
        if c.kernel and dout.dtype == x.dtype:  # the kernels read dout as x's dtype
            x, weight, dout, r = aligned(x), aligned(weight), aligned(dout), aligned(r.float())
            dx, dw = torch.empty_like(x), torch.empty_like(weight)
            if self.launch(c, {"x": x, "w": weight, "dout": dout, "rstd": r, "dx": dx, "dw": dw}, {},
                           lambda: verify.check_backward(x, weight, dout, r, dx, dw)):
                return dx, dw
        else:
            self._count(c, "torch")
        return reference.backward_2d(x, weight, dout, r)


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    return Runtime()
