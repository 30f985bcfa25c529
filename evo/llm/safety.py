"""Static checks on LLM-written templates: no Jinja escape attempts, device code only.

The sandbox already refuses attribute access to Python internals when rendering, and generated code
is only ever compiled by NVRTC, never run on the host. These checks reject an answer before it gets
that far, so an injection attempt is an LLM_ERROR with a reason instead of a RENDER_ERROR (or a
header file's contents in a compile log that is later fed back into a prompt).
"""

from __future__ import annotations

import re
from typing import Iterable

from jinja2 import TemplateSyntaxError, nodes

from evo.sandbox import sandbox_env
from evo.template import TemplateDef

# Names that only appear in attempts to climb from a Jinja value to the interpreter.
PY_INTERNALS = (
    "__class__",
    "__globals__",
    "__subclasses__",
    "__builtins__",
    "__import__",
    "__mro__",
    "__base__",
    "__bases__",
    "__init__",
    "__dict__",
    "__getattribute__",
    "__code__",
    "__func__",
    "__self__",
    "__module__",
    "__reduce__",
    "__reduce_ex__",
    "__loader__",
    "__spec__",
    "importlib",
)
# Jinja globals used as stepping stones in known template-injection payloads.
ESCAPE_GLOBALS = frozenset({"cycler", "joiner", "lipsum", "self"})
MACRO_PATH = re.compile(r"_macros/[A-Za-z0-9_][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")

CUDA_HEADERS = frozenset({"cuda_fp16.h", "cuda_bf16.h", "cuda_runtime.h", "cuda_runtime_api.h"})
CUDA_STD_HEADER = re.compile(r"cuda/std/[A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)*(?:\.h)?")
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b[ \t]*(?P<arg>.*)$", re.MULTILINE)
_INCLUDE_ARG = re.compile(r'[<"](?P<name>[^>"]+)[>"][ \t]*(?://.*)?')
HOST_CODE = (
    (re.compile(r"^[ \t]*#[ \t]*embed\b", re.MULTILINE), "#embed"),
    (re.compile(r"\bsystem\s*\("), "system("),
    (re.compile(r"\bpopen\b"), "popen"),
    (re.compile(r"\bfopen\b"), "fopen"),
    (re.compile(r"\bdlopen\b"), "dlopen"),
    (re.compile(r"\bexec[lv]p?e?\s*\("), "exec*("),
    (re.compile(r"\bfork\s*\("), "fork("),
    (re.compile(r"\bsyscall\b"), "syscall"),
    (re.compile(r"\b__host__\b"), "__host__"),
    (re.compile(r"\bmain\s*\("), "main("),
)
_COMMENT = re.compile(r"\{#.*?#\}", re.DOTALL)
_EXPR = re.compile(r"\{\{.*?\}\}", re.DOTALL)
_STMT = re.compile(r"\{%.*?%\}", re.DOTALL)


def _ast_problems(tree: nodes.Node) -> list[str]:
    bad: list[str] = []
    for n in tree.find_all(nodes.Getattr):
        if n.attr.startswith("_"):
            bad.append(f"Jinja attribute access to {n.attr!r}")
    for n in tree.find_all(nodes.Getitem):
        if isinstance(n.arg, nodes.Const) and isinstance(n.arg.value, str) and n.arg.value.startswith("_"):
            bad.append(f"Jinja item access to {n.arg.value!r}")
    for n in tree.find_all(nodes.Filter):
        if n.name == "attr":
            bad.append("Jinja 'attr' filter (attribute access by name)")
    for n in tree.find_all(nodes.Name):
        if n.name in ESCAPE_GLOBALS:
            bad.append(f"Jinja global {n.name!r}")
    for n in tree.find_all((nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)):
        tag = type(n).__name__.lower().replace("fromimport", "from-import")
        target = n.template
        if not (isinstance(target, nodes.Const) and isinstance(target.value, str)):
            bad.append(f"{{% {tag} %}} of a computed name (only literal '_macros/...' paths)")
        elif not MACRO_PATH.fullmatch(target.value) or ".." in target.value.split("/"):
            bad.append(f"{{% {tag} {target.value!r} %}} (only '_macros/...' may be included)")
    return bad


def jinja_problems(text: str) -> list[str]:
    """Why a template's Jinja could reach Python internals or files outside `_macros/` ([] if none)."""
    bad = [f"reaches Python internals: {name}" for name in PY_INTERNALS if name in text]
    try:
        tree = sandbox_env().parse(text)
    except TemplateSyntaxError as e:
        return bad + [f"Jinja syntax error at line {e.lineno}: {e.message}"]
    return bad + _ast_problems(tree)


def expression_problems(exprs: Iterable[str], what: str = "header expression") -> list[str]:
    """The same checks for Jinja expressions: header ones live inside the header comment, unseen above."""
    bad: list[str] = []
    for text in exprs:
        try:
            tree = sandbox_env().parse("{{ " + text + " }}")
        except TemplateSyntaxError as e:
            bad.append(f"{what} {text!r}: {e.message}")
            continue
        bad += [f"{what} {text!r}: {why}" for why in _ast_problems(tree)]
    return bad


def _header_exprs(tdef: TemplateDef) -> list[str]:
    out = [e.text for _, e in tdef.constraints] + [e.text for _, e in tdef.workspaces]
    for d in tdef.launches:
        out += [e.text for e in d.grid + d.block] + [d.smem.text]
    return out


def cuda_problems(source: str) -> list[str]:
    """Why CUDA text is more than device code: disallowed #include, host calls, syscalls ([] if none)."""
    code = _COMMENT.sub("", source)
    bad: list[str] = []
    for m in _INCLUDE.finditer(code):
        arg = m.group("arg").strip()
        am = _INCLUDE_ARG.fullmatch(arg)
        name = am.group("name") if am else ""
        if not (name in CUDA_HEADERS or (CUDA_STD_HEADER.fullmatch(name) and ".." not in name)):
            bad.append(f"#include {arg} (allowed: {sorted(CUDA_HEADERS)} and <cuda/std/...>)")
    for pattern, what in HOST_CODE:
        if pattern.search(code):
            bad.append(f"host-side code: {what}")
    return bad


def undefined_kernels(tdef: TemplateDef) -> list[str]:
    """Kernels named by [[launch]] that the template body never defines as a __global__ function."""
    body = _STMT.sub("", _EXPR.sub("0", _COMMENT.sub("", tdef.text)))
    return [
        k
        for k in tdef.kernel_names()
        if not re.search(r"__global__\b[^;{}]*?\b" + re.escape(k) + r"\s*\(", body)
    ]


def template_problems(text: str) -> list[str]:
    """Every reason to refuse a template's text before it is parsed (Jinja and CUDA checks)."""
    return jinja_problems(text) + cuda_problems(text)


def declaration_problems(tdef: TemplateDef) -> list[str]:
    """Every reason to refuse a parsed template's declarations (header expressions, launched kernels)."""
    bad = expression_problems(_header_exprs(tdef))
    missing = undefined_kernels(tdef)
    if missing:
        bad.append(f"[[launch]] names kernels the template does not define: {missing}")
    return bad
