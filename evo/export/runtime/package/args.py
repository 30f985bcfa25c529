"""A launch's arguments from the names its template declares (numpy only: testable without torch or a GPU)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_SCALAR = {"ptr": np.uint64, "i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64,
           "u64": np.uint64}


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
            args.append(np.uint64(0))
        elif name in dims:
            args.append(_SCALAR[typ or "i32"](dims[name]))
        elif name in scalars:
            args.append(_SCALAR[typ or kinds[name]](scalars[name]))
        else:
            raise KeyError(f"{where}: launch arg {name!r} is no tensor, dim or scalar")
    return args
