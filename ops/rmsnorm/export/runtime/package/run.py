"""One call of the op: choose the path, launch the kernel (checking an unverified one on first use), or
fall back to torch, and count which path ran (`stats()`).

A kernel that fails to compile or fails its first-use check is not used again in this process; a
warning says why, once, and its calls take the torch path. A kernel the factory's gate never ran is
not used inside CUDA graph capture before its check has run (the check reads results back).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from functools import lru_cache

import torch
from torch import Tensor

from . import reference, verify
from .choose import Choice, choose
from .expr import dtype_name
from .launch import Launcher
from .loader import PACKAGE, CompileError, PlanError

SELFCHECK_ENV = f"{PACKAGE.upper()}_SELFCHECK"  # "0" turns the first-use check off
_ALIGN = 16  # bytes: the kernels use 16-byte vector loads and stores


class Runtime:
    """Per-process state: loaded kernels, kernels found bad, kernels checked, path counts."""

    def __init__(self) -> None:
        self.launcher = Launcher()
        self.bad: dict[tuple, str] = {}
        self.checked: set[tuple] = set()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def choice(self, op: str, x: Tensor, weight: Tensor) -> Choice:
        m, n = x.shape
        dims = (("M", m), ("N", n))
        try:
            dtypes = (("w", dtype_name(weight.dtype)), ("x", dtype_name(x.dtype)))
        except ValueError as e:  # float64, say: no kernel reads it
            return Choice(op, "torch", dims, (), 0, str(e))
        if not x.is_cuda:
            return Choice(op, "torch", dims, dtypes, 0, "a CPU tensor")
        return choose(op, dims, dtypes, _arch(x.device))

    def count(self, op: str, path: str) -> None:
        with self._lock:
            self.counts[(op, path)] += 1

    def _count(self, c: Choice, path: str) -> None:
        self.count(c.op, path)

    def launch(self, c: Choice, tensors: Mapping[str, Tensor], scalars: Mapping[str, float],
               check: Callable[[], str]) -> bool:
        """Run the choice's kernel; False when the caller must take the torch path instead."""
        key = (c.op, c.template, c.params, c.dtypes, c.consts, c.arch, c.build)
        if key in self.bad:
            self._count(c, "torch")
            return False
        must_check = (not c.checked_by_factory and key not in self.checked
                      and os.environ.get(SELFCHECK_ENV, "1") != "0")
        if must_check and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self._count(c, "torch")
            return False
        try:
            self.launcher.run(c, tensors, scalars)
        except (CompileError, PlanError) as e:
            self._disable(key, c, str(e))
            return False
        if must_check:
            problem = check()
            if problem:
                self._disable(key, c, problem)
                return False
            with self._lock:
                self.checked.add(key)
        self._count(c, c.path)
        return True

    def _disable(self, key: tuple, c: Choice, why: str) -> None:
        with self._lock:
            self.bad[key] = why
            self.counts[(c.op, "torch")] += 1
        warnings.warn(f"{PACKAGE}: {c} -- not used ({why}); this shape takes the torch fp32 path", RuntimeWarning,
                      stacklevel=4)

    def forward(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """RMSNorm of a (M, N) tensor with a (N,) weight, output in x's dtype."""
        if x.shape[0] == 0 or x.shape[1] == 0:
            return reference.forward_2d(x, weight, eps)
        c = self.choice("rmsnorm", x, weight)
        if c.kernel:
            x, weight = _aligned(x), _aligned(weight)
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
            x, weight, dout, r = _aligned(x), _aligned(weight), _aligned(dout), _aligned(r.float())
            dx, dw = torch.empty_like(x), torch.empty_like(weight)
            if self.launch(c, {"x": x, "w": weight, "dout": dout, "rstd": r, "dx": dx, "dw": dw}, {},
                           lambda: verify.check_backward(x, weight, dout, r, dx, dw)):
                return dx, dw
        else:
            self._count(c, "torch")
        return reference.backward_2d(x, weight, dout, r)


def _aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a view at an odd offset is copied)."""
    t = t.contiguous()
    return t if t.data_ptr() % _ALIGN == 0 else t.clone()


@lru_cache(maxsize=16)
def _arch_of(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


def _arch(device: torch.device) -> int:
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=1)
def runtime() -> Runtime:
    return Runtime()
