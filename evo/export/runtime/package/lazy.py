"""A package's torch API imported on first use, so that `import <package>` needs neither torch nor a GPU
(every family's __init__.py: `__getattr__ = on_first_use(__name__, "api", NAMES)`)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def on_first_use(package: str, module: str, names: Iterable[str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `package.module` when one of `names` is asked for
    and gives that attribute of it, kept in the package's namespace (a later `package.name` is a plain lookup, not
    another call of this function: a serving call's host time counts every microsecond); AttributeError for any
    other name."""
    lazy = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in lazy:
            value = getattr(importlib.import_module(f"{package}.{module}"), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
