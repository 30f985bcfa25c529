"""The record of the path one call takes (`Choice`), and the arch of the current GPU, shared by every
op family's `choose.py`. The loader and the launcher read a Choice; a family that needs more (KDA: the
entry point) subclasses it and says itself in `head()`. Torch-free: `import` of the package and
`explain` need no torch (`device_arch` imports it when it can).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import expr
from .ladder import Step

KERNEL_PATHS = ("table", "table-build", "rerender", "repaired")  # the paths that launch a kernel


@dataclass(frozen=True)
class Choice:
    """The path one (op, shape, dtypes, arch) takes; `str()` says it in one line."""

    op: str
    path: str
    dims: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]
    arch: int
    reason: str
    template: str = ""  # template id (name-sourcehash) of the kernel, "" for torch
    params: tuple[tuple[str, Any], ...] = ()
    consts: tuple[tuple[str, int], ...] = ()  # the dims the kernel is compiled for
    build: str = ""  # the prebuilt kernel used as it is, if any
    source_cell: str = ""  # the searched cell whose genome this is
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def of_step(cls, op: str, step: Step, dims: tuple[tuple[str, int], ...], dtypes: tuple[tuple[str, str], ...],
                arch: int, **extra: Any) -> Choice:
        """The choice of a kernel path the ladder found (`extra`: a subclass's own fields)."""
        return cls(op, step.path, dims, dtypes, arch, step.reason, step.template, step.params, step.consts,
                   step.build, step.source_cell, step.notes, **extra)

    @property
    def kernel(self) -> bool:
        return self.path in KERNEL_PATHS

    @property
    def checked_by_factory(self) -> bool:
        """True when the factory's gate ran this very cubin (on this cell, or on its gate cells)."""
        return self.path in ("table", "table-build")

    def with_notes(self, extra: Iterable[str]) -> Choice:
        """This choice with `extra` notes added (itself when there are none)."""
        extra = tuple(extra)
        return dataclasses.replace(self, notes=self.notes + extra) if extra else self

    def head(self) -> str:
        """Who calls with what: op, dtypes and dims ('rmsnorm x=bf16,w=bf16 M=4096 N=8192')."""
        dims = " ".join(f"{k}={v}" for k, v in self.dims)
        dts = ",".join(f"{k}={expr.short(v)}" for k, v in self.dtypes)
        return f"{self.op} {dts} {dims}"

    def what(self) -> str:
        """The kernel and its params, or what runs instead."""
        if self.kernel:
            return f"{self.template}({', '.join(f'{k}={v}' for k, v in self.params)})"
        return "torch fp32" if self.path == "torch" else "no kernel"

    def __str__(self) -> str:
        extra = "".join(f"; {n}" for n in self.notes)
        return f"{self.head()} sm_{self.arch}: {self.path}: {self.what()}: {self.reason}{extra}"


def device_arch() -> int | None:
    """The arch of the current CUDA device (90 for an H100/H200), or None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor
