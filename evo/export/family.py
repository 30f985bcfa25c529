"""The op family an export serves: the plug-in that lives with the op, `ops/<op>/export/`.

A plug-in module declares:

    OPS: dict[str, str]   the ops its package serves and their roles, e.g. {"softmax": "forward"}
    NAME: str             the package name when none is given
    DESCRIPTION: str      the package's pyproject description; "{runs}" becomes the exported run ids
    RUNTIME: Path         a folder with package/ (the family's runtime modules, beside the engine's
                          generic ones in evo/export/runtime/package/) and tests/ (cpu_tests.py and
                          gpu_tests.py, written to the package as tests/test_cpu.py and test_gpu.py)
    def readme(name, runs, cell_kernel, provenance, parts) -> str    the package's README.md (parts: the
                          common README parts, evo/export/readme.Parts; a plug-in imports nothing from evo/export)
and may declare:
    MERGE: tuple[str, ...]  ops of which several runs may be exported at once, their tables merged into
                          one (no cell in two of them: e.g. a plain run and a run of the op's variants)

Discovery: the exporter of op X is the plug-in of an op folder whose OPS lists X; `ops/X/export/` is
tried first, then the other op folders that have one, so a backward op is served by its forward's
family without declaring anything. An op no plug-in lists cannot be exported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args

from evo.core.registry import ROOT as OPS_ROOT
from evo.export.errors import ExportError

Role = Literal["forward", "backward"]


@dataclass(frozen=True)
class Family:
    """One op family's exporter: what its package serves, is called, says, and ships beside the engine's runtime."""

    module: str
    ops: tuple[tuple[str, Role], ...]  # (op, role), as the plug-in declares them
    name: str
    description: str
    runtime: Path
    readme: Callable[[str, Sequence[Any], dict[str, dict[str, str]], dict[str, Any], Any], str]
    merge: tuple[str, ...] = ()  # ops whose runs may be merged into one table (MERGE)

    def __post_init__(self) -> None:
        roles = get_args(Role)
        for op, role in self.ops:
            if role not in roles:
                raise ExportError(f"{self.module}: op {op} has role {role!r}, not one of {', '.join(roles)}")
        for sub in ("package", "tests"):
            if not (self.runtime / sub).is_dir():
                raise ExportError(f"{self.module}: RUNTIME {self.runtime} has no {sub}/ folder")


def _family(mod: ModuleType) -> Family:
    missing = [k for k in ("OPS", "NAME", "DESCRIPTION", "RUNTIME", "readme") if not hasattr(mod, k)]
    if missing:
        raise ExportError(f"{mod.__name__} declares no {', '.join(missing)}")
    return Family(mod.__name__, tuple(dict(mod.OPS).items()), mod.NAME, mod.DESCRIPTION, Path(mod.RUNTIME),
                  mod.readme, tuple(getattr(mod, "MERGE", ())))


def _plugins(first: str) -> list[str]:
    """Op folders with an export/ plug-in, `first` first."""
    have = sorted(d.name for d in OPS_ROOT.iterdir() if (d / "export" / "__init__.py").is_file())
    return sorted(have, key=lambda d: d != first)


def find_family(op: str) -> Family:
    """The plug-in that exports `op`; ExportError (one line) when none lists it."""
    for folder in _plugins(op):
        mod = importlib.import_module(f"ops.{folder}.export")
        if op in dict(getattr(mod, "OPS", {})):
            return _family(mod)
    raise ExportError(f"op {op} has no exporter (no ops/<op>/export/ plug-in lists it in its OPS)")


def family_of(run_ops: Sequence[str]) -> Family:
    """The one family that exports every op of `run_ops`; ExportError when they need two."""
    found = {op: find_family(op) for op in dict.fromkeys(run_ops)}
    if not found:
        raise ExportError("no run given")
    modules = {f.module for f in found.values()}
    if len(modules) > 1:
        by = ", ".join(f"{op} ({f.module})" for op, f in found.items())
        raise ExportError(f"the runs' ops belong to different exporters: {by}; export each family on its own")
    return next(iter(found.values()))
