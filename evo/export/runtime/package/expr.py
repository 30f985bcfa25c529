"""Template text and header expressions, evaluated the way Kernel Factory evaluates them.

The factory renders templates in a Jinja sandbox with StrictUndefined, trimmed blocks and the helpers
ceil_div, min, max and is_pow2; this module does the same over the templates shipped in data/, so a
template rendered here for a searched cell gives the very source the factory built (the exporter's
tests compare them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import FileSystemLoader, StrictUndefined, Template
from jinja2.sandbox import SandboxedEnvironment

DATA = Path(__file__).with_name("data")

# dtype name -> (bytes, CUDA C++ type)
DTYPES = {"float32": (4, "float"), "float16": (2, "__half"), "bfloat16": (2, "__nv_bfloat16")}
_ALIASES = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def dtype_name(dtype: Any) -> str:
    """'bfloat16' for torch.bfloat16, 'bf16' or 'bfloat16'; ValueError for a dtype no kernel reads."""
    text = str(dtype).removeprefix("torch.")
    text = _ALIASES.get(text, text)
    if text not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return text


def short(dtype: str) -> str:
    return _SHORT[dtype]


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@lru_cache(maxsize=1)
def env() -> SandboxedEnvironment:
    e = SandboxedEnvironment(loader=FileSystemLoader(str(DATA / "templates")), undefined=StrictUndefined,
                             autoescape=False, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    e.globals.update(ceil_div=ceil_div, min=min, max=max, is_pow2=is_pow2)
    return e


@lru_cache(maxsize=256)
def _expression(text: str) -> Callable[..., Any]:
    return env().compile_expression(text, undefined_to_none=False)


@lru_cache(maxsize=32)
def _template(text: str) -> Template:
    return env().from_string(text)


def evaluate(text: str, ctx: Mapping[str, Any]) -> Any:
    """The value of one header expression (a constraint, a grid size, ...) over ctx."""
    return _expression(text)(**ctx)


def render(text: str, ctx: Mapping[str, Any]) -> str:
    return _template(text).render(**ctx)


def context(params: Mapping[str, Any], arch: int, dtypes: Mapping[str, str],
            dims: Mapping[str, int] | None) -> dict[str, Any]:
    """The names a template and its header expressions read: params, arch, <role>_bytes/_dtype/_t, dims."""
    ctx: dict[str, Any] = dict(params)
    ctx["arch"] = arch
    for role, dt in dtypes.items():
        nbytes, ctype = DTYPES[dt]
        ctx[f"{role}_bytes"] = nbytes
        ctx[f"{role}_dtype"] = dt
        ctx[f"{role}_t"] = ctype
    if dims:
        ctx.update(dims)
    return ctx
