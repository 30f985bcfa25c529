"""Operators: one folder per op with its spec, float64 reference, inputs and device hooks."""

from __future__ import annotations

import importlib

from ops.spec import OpSpec

KNOWN = ("rmsnorm", "kda")


class UnknownOpError(KeyError):
    """An op name that has no folder under ops/."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def get_op(name: str) -> OpSpec:
    """The spec of a known op; a clear error for an unknown one."""
    if name not in KNOWN:
        raise UnknownOpError(f"unknown op {name!r}; known ops: {', '.join(KNOWN)}")
    return importlib.import_module(f"ops.{name}").SPEC
