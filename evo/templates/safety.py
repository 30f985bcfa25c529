"""Static checks on untrusted (LLM-written) templates: no Jinja escape attempts, device code only.

The sandbox already refuses attribute access to Python internals when rendering, and generated code
is only ever compiled by NVRTC, never run on the host. These checks reject an answer before it gets
that far, so an injection attempt is an LLM_ERROR with a reason instead of a RENDER_ERROR (or a
header file's contents in a compile log that is later fed back into a prompt). The CUDA checks read
the text as NVRTC's preprocessor does (normalize_cuda), and the build runs them again on every
rendered point of a template that did not come from this repository's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from jinja2 import TemplateSyntaxError, nodes

from evo.templates.sandbox import sandbox_env
from evo.templates.template import TemplateDef

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
_INCLUDE_ARG = re.compile(r'<(?P<a>[^<>"]+)>|"(?P<q>[^<>"]+)"')
# Directives device code needs; anything else (#include_next, #embed, #import, #line, `# 1 "file"`...)
# is refused: an allow-list cannot miss a directive some preprocessor grows later.
DIRECTIVES = frozenset({"define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif", "include", "pragma",
                        "error", "warning"})
# The only pragmas the templates use. `#pragma unroll`'s argument is a constant expression: no strings,
# so no file names (`#pragma GCC dependency "..."`, `#pragma message(...)` writes into the log).
_PRAGMA_OK = re.compile(r"(?:no)?unroll(?![\w$])[\w$ \t\f\v()+\-*/%<>=!&|^~?:.,]*")
# Identifiers that make the preprocessor probe files or run a pragma from inside an expression.
PREPROCESSOR_OPERATORS = ("__has_include", "__has_include_next", "__has_embed", "_Pragma", "__pragma")
HOST_NAMES = ("system", "popen", "fopen", "freopen", "dlopen", "dlsym", "execl", "execlp", "execle", "execv",
              "execvp", "execvpe", "execve", "fork", "vfork", "syscall", "__host__", "main")
_NAMES = re.compile(r"(?<![\w$])(?:" + "|".join(PREPROCESSOR_OPERATORS + HOST_NAMES) + r")(?![\w$])")
# `extern "C" int system(const char*);` or inside `extern "C" { ... }` (read with literals emptied).
_EXTERN_HOST = re.compile(r'(?<![\w$])extern(?![\w$])\s*(?:""\s*\{[^}]*?|[^;{}]*?)(?<![\w$])(?P<name>'
                          + "|".join(HOST_NAMES) + r")(?![\w$])")

# C translation phases 1-3 as NVRTC runs them, so checks see what the preprocessor sees.
TRIGRAPHS = {"??=": "#", "??/": "\\", "??'": "^", "??(": "[", "??)": "]", "??!": "|", "??<": "{", "??>": "}",
             "??-": "~"}
DIGRAPHS = {"%:%:": "##", "%:": "#", "<:": "[", ":>": "]", "<%": "{", "%>": "}"}
_TRIGRAPH = re.compile(r"\?\?[=/'()!<>-]")
_SPLICE = re.compile(r"\\\n")
_BAD_SPLICE = re.compile(r"\\[ \t\f\v]+\n")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]|\r(?!\n)")
# Stands in for a comment that spans lines: NVRTC takes a `#` right after one as a directive
# (`int a; /*\n*/ #include "f"` includes f), while `#/*\n*/include "f"` is one directive too.
_LINE_START = "\x1e"
_TOKEN = re.compile(
    r"(?P<lc>//[^\n]*)"
    r"|(?P<bc>/\*.*?(?:\*/|\Z))"
    r"|(?P<raw>(?:u8|[uUL])?R\")"
    r"|(?P<lit>(?:u8|[uUL])?(?P<q>[\"'])(?:(?!(?P=q))[^\\\n]|\\.)*(?P<close>(?P=q))?)"
    r"|(?P<num>\.?[0-9](?:[eEpP][+-]|'[0-9A-Za-z_]|[0-9A-Za-z_.])*)"  # pp-number: 1'000 has no char literal
    r"|(?P<id>[A-Za-z_$][0-9A-Za-z_$]*)"
    r"|(?P<dig>%:%:|%:|<:(?!:[^:>])|:>|<%|%>)"  # `<::x` is `<` `::x` (C++11), not `[:x`
    r"|(?P<bs>\\)",
    re.DOTALL,
)
_DIRECTIVE = re.compile(r"[ \t\f\v\x1e]*(?P<hash>#)[ \t\f\v\x1e]*(?P<name>[A-Za-z_$][\w$]*)?(?P<rest>[^\n]*)")
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
        out += [e.text for e in d.grid + d.block] + [d.smem.text] + ([d.when.text] if d.when else [])
    return out


@dataclass(frozen=True)
class _Scan:
    text: str  # comments gone (a space, or _LINE_START for one that spans lines), digraphs spelled out
    code: str  # the same with every string and character literal emptied
    problems: tuple[str, ...]  # what makes the text mean different things to different readers


def _scan(source: str) -> _Scan:
    """Phases 1-3: CRLF, trigraphs, line splices, then comments and digraphs outside literals."""
    text = _SPLICE.sub("", _TRIGRAPH.sub(lambda m: TRIGRAPHS[m.group()], source.replace("\r\n", "\n")))
    out: list[str] = []
    code: list[str] = []
    bad: list[str] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        gap = text[pos:m.start()]
        out.append(gap)
        code.append(gap)
        pos = m.end()
        kind, tok = m.lastgroup, m.group()
        if kind == "lc":
            tok = " "
        elif kind == "bc":
            if len(tok) < 4 or not tok.endswith("*/"):
                bad.append("unterminated /* comment")
            tok = _LINE_START if "\n" in tok else " "
        elif kind == "raw":
            bad.append("raw string literal")  # its own splice and comment rules; kernels do not need one
        elif kind == "lit":
            if m.group("close") is None:
                bad.append(f"unterminated literal {tok[:20]!r}")
            out.append(tok)
            code.append(tok[: tok.index(m.group("q"))] + m.group("q") * 2)
            continue
        elif kind == "dig":
            tok = DIGRAPHS[tok]
        elif kind == "bs":
            bad.append("backslash outside a literal (a universal character name can spell any identifier)")
        out.append(tok)
        code.append(tok)
    out.append(text[pos:])
    code.append(text[pos:])
    return _Scan("".join(out), "".join(code), tuple(bad))


def normalize_cuda(source: str) -> str:
    """CUDA text as the preprocessor sees it: trigraphs and digraphs spelled out, splices joined, comments a space."""
    return _scan(source).text.replace(_LINE_START, " ")


def _directive_problems(text: str) -> list[str]:
    bad: list[str] = []
    seen: set[int] = set()
    # A directive starts a line, or follows a comment that spans lines; each may be checked from
    # several starts (`\x1e\x1e#`), so each `#` is judged once.
    starts = [0] + [m.end() for m in re.finditer("[\n\x1e]", text)]
    for p in starts:
        m = _DIRECTIVE.match(text, p)
        if m is None or m.start("hash") in seen:
            continue
        seen.add(m.start("hash"))
        name, rest = m.group("name"), " ".join(m.group("rest").replace(_LINE_START, " ").split())
        if name is None:
            if rest:
                bad.append(f"preprocessor directive '# {rest[:40]}'")
        elif name not in DIRECTIVES:
            bad.append(f"preprocessor directive #{name} {rest[:60]}".rstrip())
        elif name == "include":
            am = _INCLUDE_ARG.fullmatch(rest)
            header = (am.group("a") or am.group("q")) if am else ""
            if not (header in CUDA_HEADERS or (CUDA_STD_HEADER.fullmatch(header) and ".." not in header)):
                bad.append(f"#include {rest} (allowed: {sorted(CUDA_HEADERS)} and <cuda/std/...>)")
        elif name == "pragma" and not _PRAGMA_OK.fullmatch(rest):
            bad.append(f"#pragma {rest[:40]} (allowed: unroll, nounroll)")
    return bad


def cuda_problems(source: str) -> list[str]:
    """Why CUDA text is more than device code: disallowed directives, file probes, host calls ([] if none).

    The checks read the text as the preprocessor does (normalize_cuda), so comments, line splices,
    trigraphs and digraphs cannot hide a directive or split a name.
    """
    code = _COMMENT.sub("", source)
    bad = [f"trigraph {t}" for t in dict.fromkeys(_TRIGRAPH.findall(code))]
    bad += [f"control character {c!r}" for c in dict.fromkeys(_CONTROL.findall(code))]
    if _BAD_SPLICE.search(code):
        bad.append("backslash followed by spaces at a line end")
    scan = _scan(code)
    bad += list(dict.fromkeys(scan.problems))
    bad += _directive_problems(scan.text)
    # No `##` at all: pasting is the one way to build a refused name (`CAT(sys, tem)`) from
    # harmless pieces, and no template needs it.
    if "##" in scan.code:
        bad.append("token pasting ## (build names without the preprocessor)")
    for name in dict.fromkeys(_NAMES.findall(scan.text)):
        bad.append(f"{'preprocessor operator' if name in PREPROCESSOR_OPERATORS else 'host-side code:'} {name}")
    for name in dict.fromkeys(m.group("name") for m in _EXTERN_HOST.finditer(scan.code)):
        bad.append(f"extern declaration of host function {name}")
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
