"""What every family's runtime does around a kernel launch (torch): the first-use check of a kernel the
factory's gate never ran, the kernels found bad (not used again in this process, with one warning), the
path counts (`stats()`), 16-byte aligned operands and the arch of a tensor's device."""

from __future__ import annotations

import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from .launch import Launcher
from .loader import PACKAGE, CompileError, PlanError

SELFCHECK_ENV = f"{PACKAGE.upper()}_SELFCHECK"  # "0" turns the first-use check off
_ALIGN = 16  # bytes: the kernels use 16-byte vector loads and stores


def aligned(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned (a view at an odd offset is copied)."""
    t = t.contiguous()
    return t if t.data_ptr() % _ALIGN == 0 else t.clone()


@lru_cache(maxsize=16)
def _arch_of(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


def tensor_arch(device: torch.device) -> int:
    """The arch of a CUDA tensor's device (90 for an H100/H200)."""
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


class Guarded:
    """Per-process state: loaded kernels, kernels found bad, kernels checked, path counts by (name, path).
    A family's runtime subclasses it; NOUN names a call in the warning, STACKLEVEL points it at the caller."""

    NOUN = "call"
    STACKLEVEL = 4

    def __init__(self) -> None:
        self.launcher = Launcher()
        self.bad: dict[tuple, str] = {}
        self.checked: set[tuple] = set()
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def count(self, name: str, path: str) -> None:
        with self._lock:
            self.counts[(name, path)] += 1

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls per name and path in this process ({'rmsnorm': {'table': 3, 'torch': 1}, ...})."""
        out: dict[str, dict[str, int]] = {}
        for (name, path), n in sorted(self.counts.items()):
            out.setdefault(name, {})[path] = n
        return out

    def run_kernel(self, c: Any, name: str, tensors: Mapping[str, Tensor], scalars: Mapping[str, float],
                   check: Callable[[], str]) -> bool:
        """Run the choice's kernel, counted under `name`; False when the caller must take the torch path."""
        key = (c.op, c.template, c.params, c.dtypes, c.consts, c.arch, c.build)
        if key in self.bad:
            self.count(name, "torch")
            return False
        must_check = (not c.checked_by_factory and key not in self.checked
                      and os.environ.get(SELFCHECK_ENV, "1") != "0")
        if must_check and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            self.count(name, "torch")
            return False
        try:
            self.launcher.run(c, tensors, scalars)
        except (CompileError, PlanError) as e:
            self._disable(key, c, name, str(e))
            return False
        if must_check:
            problem = check()
            if problem:
                self._disable(key, c, name, problem)
                return False
            with self._lock:
                self.checked.add(key)
        self.count(name, c.path)
        return True

    def _disable(self, key: tuple, c: Any, name: str, why: str) -> None:
        with self._lock:
            self.bad[key] = why
            self.counts[(name, "torch")] += 1
        warnings.warn(f"{PACKAGE}: {c} -- not used ({why}); this {self.NOUN} takes the torch fp32 path",
                      RuntimeWarning, stacklevel=self.STACKLEVEL + 1)
