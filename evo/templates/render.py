"""Render a genome's template to CUDA C++ inside the bounded sandbox."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from jinja2 import TemplateError as JinjaTemplateError
from jinja2.exceptions import SecurityError

from evo.templates.sandbox import render_text
from evo.core.status import Status
from evo.templates.template import TemplateDef, TemplateError

# What a template can make a render raise: its own fault, so a RENDER_ERROR record (LimitError, the
# sandbox's time and size limits, is a SecurityError).
RENDER_ERRORS = (SecurityError, JinjaTemplateError, TemplateError, ArithmeticError, LookupError, TypeError,
                 ValueError, AttributeError, RecursionError, MemoryError)


@dataclass(frozen=True)
class RenderResult:
    status: Status
    source: str
    error: str = ""


def render(
    tdef: TemplateDef,
    params: Mapping[str, Any],
    arch: int,
    dtypes: Mapping[str, Any],
    consts: Mapping[str, int],
) -> RenderResult:
    """CUDA source for one (params, arch, dtypes, specialized dims); failures are RENDER_ERROR records."""
    try:
        ctx = tdef.context(params, arch, dtypes, consts)
        src = render_text(tdef.text, ctx)
    except RENDER_ERRORS as e:
        return RenderResult(Status.RENDER_ERROR, "", f"{type(e).__name__}: {e}")
    return RenderResult(Status.OK, src)
