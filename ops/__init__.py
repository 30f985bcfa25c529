"""Operators: one folder per op with its spec, float64 reference, input kinds and device hooks.

The registry is the set of sub-packages of ops/ that export a SPEC: adding an op means adding its
folder (and its templates and experiments), nothing in the engine.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from ops.spec import OpSpec


def _discover() -> tuple[str, ...]:
    here = Path(__file__).parent
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.ispkg))


KNOWN = _discover()


class UnknownOpError(KeyError):
    """An op name that has no folder under ops/."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def get_op(name: str) -> OpSpec:
    """The spec of a known op; a clear error for an unknown one."""
    if name not in KNOWN:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(KNOWN)}")
    spec = importlib.import_module(f"ops.{name}").SPEC
    if spec.name != name:
        raise UnknownOpError(f"ops/{name} exports a SPEC named {spec.name!r}")
    return spec
