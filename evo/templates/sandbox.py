"""The Jinja sandbox every template and header expression goes through, with time and size limits.

Templates may come from an LLM, so they render in a `SandboxedEnvironment` (no attribute access to
Python internals) with `StrictUndefined` (a misspelt name is an error, not an empty string). The
loader only sees the templates folder, so `{% import "_macros/ptx.j2" %}` works and nothing else on
disk is reachable.

The sandbox is also bounded, so that no template can hang the run or fill its memory:
- `range()` gives at most MAX_RANGE items;
- a string or list a template builds (`*`, `+`, `~`, `%`, a filter, a method such as `ljust`,
  `replace` or `join`, a macro's output, a `{% set %}` block) holds at most MAX_OUTPUT items, checked
  before the allocation wherever the size is known in advance, and so does a rendered template;
- integers a template computes stay below MAX_INT_BITS bits (`**` and `*` are checked first);
- inside `time_limit(s)` (render and every header expression use one), every loop iteration, call,
  filter and operator checks the clock.
Going over a limit raises LimitError (a jinja2 SecurityError), which the callers turn into
RENDER_ERROR or a TemplateError naming the expression.
"""

from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache, wraps
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from jinja2 import FileSystemLoader, StrictUndefined, Template, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

TEMPLATES_ROOT = Path(__file__).resolve().parents[2] / "templates"

MAX_RANGE = 10_000  # items of one range()
MAX_OUTPUT = 1 << 20  # characters of any string (items of any list) a template builds, and of its output
MAX_INT_BITS = 4096
RENDER_TIMEOUT_S = 2.0  # wall clock of one render
EXPR_TIMEOUT_S = 1.0  # wall clock of one header expression

# (deadline, the limit in seconds) of the innermost time_limit block; a ContextVar so that threads
# and nested limits each see their own.
_DEADLINE: ContextVar[tuple[float, float]] = ContextVar("kfactory_sandbox_deadline", default=(math.inf, math.inf))
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?|\{[^{}]*:[^{}]*?(\d+)[^{}]*\}")
_WIDTH_FILTERS = frozenset({"center", "indent", "wordwrap", "truncate", "slice", "batch"})


class LimitError(SecurityError):
    """A template went over a time or size limit of the sandbox."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Everything a template does inside the block must finish within `seconds` (nested: the earlier wins)."""
    outer = _DEADLINE.get()
    mine = (time.monotonic() + seconds, seconds)
    token = _DEADLINE.set(min(outer, mine))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _tick() -> None:
    deadline, seconds = _DEADLINE.get()
    if time.monotonic() > deadline:
        raise LimitError(f"template ran longer than the sandbox time limit of {seconds:g} s")


def _size(x: Any) -> int:
    return len(x) if isinstance(x, (str, list, tuple, dict, set)) else 0


def _check_size(n: int, what: str) -> None:
    if n > MAX_OUTPUT:
        raise LimitError(f"{what} of {n} characters/items exceeds the sandbox limit of {MAX_OUTPUT}")


def _check_int(v: Any) -> Any:
    if isinstance(v, int) and v.bit_length() > MAX_INT_BITS:
        raise LimitError(f"an integer of {v.bit_length()} bits exceeds the sandbox limit of {MAX_INT_BITS} bits")
    return v


def _check_format(fmt: str) -> None:
    """Refuse format strings whose field widths alone would exceed the output limit (or come from args)."""
    for m in _FORMAT_WIDTH.finditer(fmt):
        for g in m.groups():
            if g == "*":
                raise LimitError("'*' field widths are not allowed in the sandbox")
            if g and int(g) > MAX_OUTPUT:
                raise LimitError(f"a format width of {g} exceeds the sandbox limit of {MAX_OUTPUT}")


def bounded_range(*args: int) -> range:
    """range(), at most MAX_RANGE items."""
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise LimitError(f"range() of {len(r)} items exceeds the sandbox limit of {MAX_RANGE}")
    return r


class _BoundedList(list):
    """An output buffer (macro body, {% set %} block, filter block) that stops growing at MAX_OUTPUT."""

    __slots__ = ("_chars",)

    def __init__(self) -> None:
        super().__init__()
        self._chars = 0

    def append(self, x: Any) -> None:
        self._chars += _size(x)
        _check_size(self._chars, "template output")
        _tick()
        super().append(x)

    def extend(self, xs: Iterable[Any]) -> None:
        for x in xs:
            self.append(x)


class _BoundedCodeGenerator(CodeGenerator):
    """Loops check the clock every iteration; buffers, `~` and output are size-checked."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        inner = node.iter  # iterated as environment.kf_iter(inner), which checks the clock per item
        node.iter = nodes.Call(nodes.EnvironmentAttribute("kf_iter"), [inner], [], None, None, lineno=inner.lineno)
        try:
            super().visit_For(node, frame)
        finally:
            node.iter = inner

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.kf_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.kf_buffer()")


def _bounded_filter(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(f)  # keeps jinja's pass_context/pass_environment marks
    def filtered(*args: Any, **kwargs: Any) -> Any:
        _tick()
        if name in _WIDTH_FILTERS:
            for v in (*args[1:], *kwargs.values()):
                if isinstance(v, int) and v > MAX_OUTPUT:
                    raise LimitError(f"|{name}({v}) exceeds the sandbox limit of {MAX_OUTPUT}")
        if name == "format" and args and isinstance(args[0], str):
            _check_format(args[0])
        out = f(*args, **kwargs)
        _check_size(_size(out), f"the result of |{name}")
        return out

    return filtered


def _precheck_method(target: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Refuse str methods whose result would exceed MAX_OUTPUT, before they allocate it."""
    owner = getattr(target, "__self__", None)
    if not isinstance(owner, str):
        return args
    name = getattr(target, "__name__", "")
    n = len(owner)
    if name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _check_size(args[0], f"str.{name}()")
    elif name == "expandtabs":
        _check_size(n + owner.count("\t") * int(args[0] if args else 8), "str.expandtabs()")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        hits = owner.count(args[0]) if args[0] else n + 1
        _check_size(n + hits * len(args[1]), "str.replace()")
    elif name == "join" and args:
        items = list(args[0])
        _check_size(len(items), "the items of str.join()")
        _check_size(n * max(len(items) - 1, 0) + sum(_size(i) for i in items), "str.join()")
        return (items, *args[1:])
    elif name in ("format", "format_map"):
        _check_format(owner)
    return args


class BoundedSandbox(SandboxedEnvironment):
    """The Jinja sandbox with the limits described in this module's docstring."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.globals["range"] = bounded_range
        self.filters = {k: _bounded_filter(k, f) for k, f in self.filters.items()}
        self.concat = self.kf_concat  # type: ignore[method-assign]

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if type(left) is int and type(right) is int:  # the common case in headers: only * and ** can grow
            if operator == "*" and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise LimitError(f"a product of {left.bit_length() + right.bit_length()} bits exceeds the sandbox "
                                 f"limit of {MAX_INT_BITS} bits")
            if operator == "**" and abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > MAX_INT_BITS:
                raise LimitError(f"{left} ** {right} exceeds the sandbox limit of {MAX_INT_BITS} bits")
            return self.binop_table[operator](left, right)
        _tick()
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(n, int) and _size(seq):
                _check_size(len(seq) * max(n, 0), "a repeated string or list")
        elif operator == "+" and _size(left) and _size(right):
            _check_size(len(left) + len(right), "a concatenated string or list")
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        out = _check_int(self.binop_table[operator](left, right))
        _check_size(_size(out), f"the result of {operator!r}")
        return out

    def call(__self, __context: Any, __obj: Any, /, *args: Any, **kwargs: Any) -> Any:  # jinja's hook signature
        _tick()
        target = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        args = _precheck_method(target, args)
        out = super().call(__context, __obj, *args, **kwargs)
        owner = getattr(target, "__self__", None)
        if isinstance(owner, (list, dict, set)):  # append, extend, update, ...
            _check_size(len(owner), "a list, dict or set")
        _check_size(_size(out), "the result of a call")
        return _check_int(out)

    def kf_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for x in iterable:
            _tick()
            yield x

    def kf_concat(self, parts: Iterable[Any]) -> str:
        out, n = [], 0
        for p in parts:
            s = p if isinstance(p, str) else str(p)
            n += len(s)
            _check_size(n, "a joined string")
            out.append(s)
        return "".join(out)

    def kf_buffer(self) -> list:
        return _BoundedList()


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@lru_cache(maxsize=4)
def sandbox_env(root: str = str(TEMPLATES_ROOT)) -> BoundedSandbox:
    """The shared sandbox (built once; Jinja environments are safe to share once configured)."""
    env = BoundedSandbox(
        loader=FileSystemLoader(root),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals.update(ceil_div=ceil_div, min=min, max=max, is_pow2=_is_pow2)
    return env


@lru_cache(maxsize=64)
def compile_template(text: str) -> Template:
    """A template compiled in the sandbox (cached by text: a search renders one text thousands of times)."""
    return sandbox_env().from_string(text)


def render_text(text: str, ctx: dict[str, Any], seconds: float = RENDER_TIMEOUT_S) -> str:
    """Render template text within the time and output limits (LimitError past either)."""
    with time_limit(seconds):
        tmpl = compile_template(text)
        out, n = [], 0
        for chunk in tmpl.generate(**ctx):
            n += len(chunk)
            _check_size(n, "template output")
            out.append(chunk)
        return "".join(out)


@lru_cache(maxsize=1024)
def compile_expression(text: str) -> Callable[..., Any]:
    """A header expression compiled in the sandbox (cached: headers are evaluated very often)."""
    return sandbox_env().compile_expression(text, undefined_to_none=False)


def eval_expression(text: str, ctx: Mapping[str, Any], seconds: float = EXPR_TIMEOUT_S) -> Any:
    """A header expression's value, within the time limit (LimitError past it, or past a size limit)."""
    f = compile_expression(text)
    # time_limit() inlined: this runs for every constraint check, thousands of times per generation
    token = _DEADLINE.set(min(_DEADLINE.get(), (time.monotonic() + seconds, seconds)))
    try:
        return f(**ctx)
    finally:
        _DEADLINE.reset(token)
