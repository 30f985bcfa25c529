"""A launch's arguments from the names its template declares (numpy only: testable without torch or a GPU).

`bind_args` reads the names on every call; `ArgPlan` reads them once per choice (its dims then never change) and
a call fills in only the pointers and the scalars: a decode call is microseconds of GPU work, so the host's
share matters (the runtime's launcher keeps one ArgPlan per launch of a prepared choice).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

_SCALAR = {"ptr": np.uint64, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64,
           "u64": np.uint64}
_NULL = np.uint64(0)


def bind_args(names: Sequence[str], ptrs: Mapping[str, int], dims: Mapping[str, int],
              scalars: Mapping[str, float], kinds: Mapping[str, str], where: str) -> list[Any]:
    """A launch's arguments in order: a tensor's device pointer, a dim or a scalar in its declared type.
    An arg written "name?" is a tensor the call may leave out (a variant off): a null pointer then."""
    args: list[Any] = []
    for a in names:
        name, _, typ = a.partition(":")
        optional = name.endswith("?")
        name = name.removesuffix("?")
        if name in ptrs:
            args.append(np.uint64(ptrs[name]))
        elif optional:
            args.append(_NULL)
        elif name in dims:
            args.append(_SCALAR[typ or "i32"](dims[name]))
        elif name in scalars:
            args.append(_SCALAR[typ or kinds[name]](scalars[name]))
        else:
            raise KeyError(f"{where}: launch arg {name!r} is no tensor, dim or scalar")
    return args


@dataclass(frozen=True)
class ArgPlan:
    """A launch's arguments with its dims bound once: `fixed` holds them (None where a call fills in), `ptrs` the
    (position, tensor, optional) a call binds a pointer to, `scalars` the (position, name, numpy type) it binds a
    scalar to. `bind` gives what bind_args gives for the same tensors and scalars, but a pointer as a Python int
    (0 for a null one): cuda.core's launch passes a Python int as a pointer-sized value, and packs it faster
    than a numpy scalar."""

    fixed: tuple[Any, ...]
    ptrs: tuple[tuple[int, str, bool], ...]
    scalars: tuple[tuple[int, str, Any], ...]
    where: str

    def bind(self, ptrs: Mapping[str, int], scalars: Mapping[str, float]) -> list[Any]:
        args = list(self.fixed)
        for i, name, optional in self.ptrs:
            p = ptrs.get(name)
            if p is not None:
                args[i] = p
            elif optional:
                args[i] = 0
            else:
                raise KeyError(f"{self.where}: launch arg {name!r}: the call binds no such tensor")
        for i, name, cast in self.scalars:
            if name not in scalars:
                raise KeyError(f"{self.where}: launch arg {name!r}: the call passes no such scalar")
            args[i] = cast(scalars[name])
        return args


def plan_args(names: Sequence[str], tensors: Collection[str], dims: Mapping[str, int], kinds: Mapping[str, str],
              where: str) -> ArgPlan:
    """The ArgPlan of a launch whose calls bind pointers to `tensors` (the op's tensors and the plan's
    workspaces; a "name?" arg is a tensor too), with `dims` fixed and the op's scalar `kinds` (a typed "name:f32"
    arg is a scalar too). A name that is none of these is a KeyError here, before any call."""
    fixed: list[Any] = []
    ptrs: list[tuple[int, str, bool]] = []
    scalars: list[tuple[int, str, Any]] = []
    for i, a in enumerate(names):
        name, _, typ = a.partition(":")
        optional = name.endswith("?")
        name = name.removesuffix("?")
        if name in tensors or optional:
            ptrs.append((i, name, optional))
            fixed.append(None)
        elif name in dims:
            fixed.append(_SCALAR[typ or "i32"](dims[name]))
        elif name in kinds or typ:
            scalars.append((i, name, _SCALAR[typ or kinds[name]]))
            fixed.append(None)
        else:
            raise KeyError(f"{where}: launch arg {name!r} is no tensor, dim or scalar")
    return ArgPlan(tuple(fixed), tuple(ptrs), tuple(scalars), where)


def direct_args(plan: ArgPlan, tensors: tuple[str, ...], scalars: tuple[str, ...]
                ) -> tuple[tuple[Any, ...] | None, tuple[tuple[int, int, Any], ...]]:
    """A launch's args for calls passing `tensors`' pointers then `scalars`' values, positionally: the args with
    every dim and absent optional pointer (0) bound, and (arg position, value index, cast or None) of the rest;
    (None, ()) where the plan needs a tensor or scalar the calls do not pass."""
    fixed = list(plan.fixed)
    slots = []
    for i, name, optional in plan.ptrs:
        if name in tensors:
            slots.append((i, tensors.index(name), None))
        elif optional:
            fixed[i] = 0
        else:
            return None, ()
    for i, name, cast in plan.scalars:
        if name not in scalars:
            return None, ()
        slots.append((i, len(tensors) + scalars.index(name), cast))
    return tuple(fixed), tuple(slots)

