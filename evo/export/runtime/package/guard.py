"""What every family's runtime does around a kernel launch (torch): the first-use check of every kernel per shape
class (firstuse.py says the rules), the kernels found bad (not used again in this process, with one warning), the
path counts (`stats()`), 16-byte aligned operands and the arch of a tensor's device."""

from __future__ import annotations

import dataclasses
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor

from .firstuse import Step, first_use, selfcheck_on
from .launch import Launcher
from .loader import PACKAGE, CompileError, PlanError
from .table import tables

_MAX_BY_ID = 4096  # choices whose keys are kept by id (cleared past it)
_ALIGN = 16  # bytes: the kernels use 16-byte vector loads and stores


def probe_generator(device: torch.device) -> torch.Generator:
    """A generator on `device` seeded from the OS's entropy: a probe's inputs differ in every process."""
    g = torch.Generator(device=device)
    g.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return g


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
        self._keys: dict[int, tuple[Any, tuple, tuple | None, tuple]] = {}  # id(choice) -> (it, key, shape, mark)
        self.selfcheck = selfcheck_on(PACKAGE)  # read once, not from the environment on every call
        self._direct: list[tuple[str, str, Any]] = []  # (name, path, Direct launch): their calls count in stats()
        # a family's serving path: call signature -> its Direct launch (False: another path); emptied whenever a
        # kernel is found bad, so no direct launch outlives its kernel's trust
        self.fast: dict[tuple, Any] = {}

    def count(self, name: str, path: str) -> None:
        with self._lock:
            self.counts[(name, path)] += 1

    def trusted(self, c: Any) -> bool:
        """Whether the choice's kernel may run with no check before it: not found bad, and its shape class checked
        in this process (or the first-use check turned off)."""
        key, _shape, mark = self._keys_of(c)
        return key not in self.bad and (not self.selfcheck or mark in self.checked)

    def direct(self, c: Any, name: str, device: torch.device, tensors: tuple[str, ...],
               scalars: tuple[str, ...]) -> Any:
        """A trusted choice's Direct launch (launch.Launcher.direct), its calls counted under `name`, or None (not
        trusted, not one launch, or it fails to load)."""
        if not getattr(c, "kernel", False) or not self.trusted(c):
            return None
        try:
            d = self.launcher.direct(c, device.index if device.index is not None else torch.cuda.current_device(),
                                     tensors, scalars)
        except (CompileError, PlanError):
            return None
        if d is not None:
            with self._lock:
                self._direct.append((name, c.path, d))
        return d

    def stats(self) -> dict[str, dict[str, int]]:
        """Calls per name and path in this process ({'rmsnorm': {'table': 3, 'torch': 1}, ...})."""
        counts = Counter(self.counts)
        for name, path, d in self._direct:
            counts[(name, path)] += d.calls
        out: dict[str, dict[str, int]] = {}
        for (name, path), n in sorted(counts.items()):
            out.setdefault(name, {})[path] = n
        return out

    def probe_dims(self, c: Any) -> tuple[tuple[str, int], ...] | None:
        """The small shape standing for the call's shape class (the family's rule, firstuse.reduced); None: the
        call's shape is its own class, checked on its own data."""
        return None

    def probe(self, c: Any, device: torch.device) -> str:
        """Launch the kernel of `c` (at its probe shape) on `device` on fresh random inputs and compare every output
        with the float64 reference: '' when right, else what is wrong. Families with probe_dims implement it."""
        raise NotImplementedError

    def _probe_shape(self, c: Any) -> tuple[tuple[str, int], ...] | None:
        """probe_dims where the template admits that shape (its constraints read the dims), else None."""
        dims = self.probe_dims(c)
        if dims is None:
            return None
        t = tables()[c.op].templates.get(c.template)
        return dims if t is not None and not t.violations(dict(c.params), c.arch, dict(c.dtypes), dict(dims)) else None

    def _keys_of(self, c: Any) -> tuple[tuple, tuple | None, tuple]:
        """The kernel's key, its probe shape and its shape class's mark, kept by the choice's id (a choice is made
        once per call signature and reused: a decode step's host time is most of it)."""
        held = self._keys.get(id(c))
        if held is not None and held[0] is c:
            return held[1], held[2], held[3]
        key = (c.op, c.template, c.params, c.dtypes, c.consts, c.arch, c.build)
        shape = self._probe_shape(c)
        mark = (key, shape if shape is not None else c.dims)
        with self._lock:
            if len(self._keys) >= _MAX_BY_ID:
                self._keys.clear()
            self._keys[id(c)] = (c, key, shape, mark)  # c held: its id is no other choice's while kept
        return key, shape, mark

    def run_kernel(self, c: Any, name: str, tensors: Mapping[str, Tensor], scalars: Mapping[str, float],
                   check: Callable[[], str]) -> bool:
        """Run the choice's kernel, counted under `name`; False when the caller must take the torch path."""
        key, shape, mark = self._keys_of(c)
        if key in self.bad:
            self.count(name, "torch")
            return False
        selfcheck = self.selfcheck
        checked = mark in self.checked
        capturing = (selfcheck and not checked and torch.cuda.is_available()
                     and torch.cuda.is_current_stream_capturing())
        step = first_use(selfcheck, checked, capturing, shape is not None)
        if step is Step.TORCH:
            self.count(name, "torch")
            return False
        if step is Step.PROBE:
            try:
                problem = self.probe(dataclasses.replace(c, dims=shape), next(iter(tensors.values())).device)
            except (CompileError, PlanError) as e:
                problem = str(e)
            if problem:
                self._disable(key, c, name, f"its first-use check at {dict(shape)}: {problem}")
                return False
            with self._lock:
                self.checked.add(mark)
        try:
            self.launcher.run(c, tensors, scalars)
        except (CompileError, PlanError) as e:
            self._disable(key, c, name, str(e))
            return False
        if step is Step.CHECK_CALL:
            problem = check()
            if problem:
                self._disable(key, c, name, problem)
                return False
            with self._lock:
                self.checked.add(mark)
        self.count(name, c.path)
        return True

    def _disable(self, key: tuple, c: Any, name: str, why: str) -> None:
        with self._lock:
            self.bad[key] = why
            self.counts[(name, "torch")] += 1
            self.fast.clear()
        warnings.warn(f"{PACKAGE}: {c} -- not used ({why}); this {self.NOUN} takes the torch fp32 path",
                      RuntimeWarning, stacklevel=self.STACKLEVEL + 1)
