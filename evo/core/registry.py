"""The op registry: the sub-packages of ops/ that export a SPEC (an OpSpec). Adding an op means adding its
folder (and its templates and experiments), nothing in the engine.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from pathlib import Path

from evo.core.spec import OpSpec


def _root() -> Path:
    spec = importlib.util.find_spec("ops")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the ops package (the op folders) cannot be found")
    return Path(list(spec.submodule_search_locations)[0])


ROOT = _root()  # the folder the op folders are in


def _discover() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules([str(ROOT)]) if m.ispkg))


KNOWN = _discover()


class UnknownOpError(KeyError):
    """An op name with no op under ops/: no folder, or one that exposes no SPEC (an OpSpec)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def get_op(name: str) -> OpSpec:
    """The spec of a known op; a clear error for an unknown one."""
    known = f"known ops: {', '.join(n for n in KNOWN if n != name)}"
    expose = f"it must expose SPEC (an OpSpec), e.g. `from ops.{name}.spec import SPEC`"
    if name not in KNOWN:
        # a folder without __init__.py is no package, so discovery skips it: say so to whoever is adding an op
        if name.isidentifier() and (ROOT / name).is_dir() and not (ROOT / name / "__init__.py").exists():
            raise UnknownOpError(f"unknown op {name!r}: ops/{name}/ has no __init__.py; {expose}; {known}")
        raise UnknownOpError(f"unknown op {name!r}; {known}")
    spec = getattr(importlib.import_module(f"ops.{name}"), "SPEC", None)
    if not isinstance(spec, OpSpec):
        what = "no SPEC" if spec is None else f"a SPEC of type {type(spec).__name__}"
        raise UnknownOpError(f"unknown op {name!r}: ops/{name}/__init__.py has {what}; {expose}; {known}")
    if spec.name != name:
        raise UnknownOpError(f"ops/{name} exports a SPEC named {spec.name!r}")
    return spec
