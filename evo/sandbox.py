"""The Jinja sandbox every template and header expression goes through.

Templates may come from an LLM, so they render in a `SandboxedEnvironment` (no attribute access to
Python internals) with `StrictUndefined` (a misspelt name is an error, not an empty string). The
loader only sees the templates folder, so `{% import "_macros/ptx.j2" %}` works and nothing else on
disk is reachable.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from jinja2 import FileSystemLoader, StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

TEMPLATES_ROOT = Path(__file__).resolve().parent.parent / "templates"


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@lru_cache(maxsize=4)
def sandbox_env(root: str = str(TEMPLATES_ROOT)) -> SandboxedEnvironment:
    """The shared sandbox (built once; Jinja environments are safe to share once configured)."""
    env = SandboxedEnvironment(
        loader=FileSystemLoader(root),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(ceil_div=ceil_div, min=min, max=max, is_pow2=_is_pow2)
    return env


@lru_cache(maxsize=1024)
def compile_expression(text: str) -> Callable[..., Any]:
    """A header expression compiled in the sandbox (cached: headers are evaluated very often)."""
    return sandbox_env().compile_expression(text, undefined_to_none=False)
