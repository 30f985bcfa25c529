"""A template's declaration: parameter space, constraints and launch plan, read from its header.

Every `.cu.j2` file starts with a Jinja comment holding TOML:

    {#- kfactory
    [template]
    op = "rmsnorm"
    name = "warp_row"
    specialize = []            # cell dims baked into the code (rendered as Jinja variables)
    [space]                    # every legal value of every parameter
    threads = [64, 128, 256]
    [defaults]
    threads = 128
    [constraints]              # name = Jinja expression that must be true
    warp_multiple = "threads % 32 == 0"
    [[launch]]                 # in order; grid/block are 1-3 expressions, smem one
    kernel = "rmsnorm_warp_row"
    grid = ["ceil_div(M, threads // 32)"]
    block = ["threads"]
    smem = "0"
    args = ["x", "w", "y", "M", "N", "eps"]   # "bias?": an optional tensor, null where the cell's variant lacks it
    -#}

Expressions are evaluated in the same Jinja sandbox that renders the code, over the parameters,
`arch` (e.g. 90), `<role>_bytes` and `<role>_dtype` for each dtype role of the cell, and the cell's
dims. A constraint that names a dim applies per cell; the others decide whether a genome is legal at
all. A specialized dim the cell lacks (a variant's switch that is off) renders at the op's default.
This one declaration serves sampling, repair, the build and the tests.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from jinja2 import TemplateError as JinjaTemplateError
from jinja2 import meta
from jinja2.exceptions import SecurityError

from evo.templates.sandbox import EXPR_TIMEOUT_S, TEMPLATES_ROOT, compile_expression, eval_expression, sandbox_env

HEADER = re.compile(r"\A\s*\{#-?\s*kfactory[ \t]*\n(?P<toml>.*?)\n\s*-?#\}", re.DOTALL)
ARG_TYPES = ("ptr", "i32", "i64", "f32")


class TemplateError(ValueError):
    """A template's header is missing or malformed, or one of its expressions fails."""


# What evaluating a header expression can raise: the template's fault (LimitError is a SecurityError).
EXPR_ERRORS = (SecurityError, JinjaTemplateError, ArithmeticError, LookupError, TypeError, ValueError,
               AttributeError, RecursionError, MemoryError)


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Expr:
    """A Jinja expression from a header, with the names it reads."""

    text: str

    @cached_property
    def names(self) -> frozenset[str]:
        try:
            tree = sandbox_env().parse("{{ " + self.text + " }}")
        except JinjaTemplateError as e:
            raise TemplateError(f"expression {self.text!r} does not parse: {e}") from None
        return frozenset(meta.find_undeclared_variables(tree))

    def eval(self, ctx: Mapping[str, Any]) -> Any:
        """The value over ctx, within the sandbox's limits; any failure is a TemplateError naming the expression."""
        missing = self.names - set(ctx) - set(sandbox_env().globals)
        if missing:
            raise TemplateError(f"expression {self.text!r} reads unknown names {sorted(missing)}")
        try:
            return eval_expression(self.text, ctx)
        except EXPR_ERRORS as e:
            raise TemplateError(f"expression {self.text!r} failed: {type(e).__name__}: {e}") from None


def eval_together(exprs: tuple[Expr, ...], ctx: Mapping[str, Any]) -> list[Any] | None:
    """The values of several expressions over one ctx from one sandbox call (a header's constraints are checked
    together at every point a search or a sweep looks at: one call instead of one each), within the sum of their
    time limits; None where that cannot stand for evaluating each alone (one of them does not compile as an
    expression on its own, or any of them fails): the caller then evaluates them one by one, for the error."""
    text = _together(tuple(e.text for e in exprs)) if len(exprs) > 1 else None
    if text is None:
        return None
    try:
        vals = eval_expression(text, ctx, seconds=EXPR_TIMEOUT_S * len(exprs))
    except EXPR_ERRORS:
        return None
    return vals if isinstance(vals, list) and len(vals) == len(exprs) else None


@lru_cache(maxsize=256)
def _together(texts: tuple[str, ...]) -> str | None:
    """One list expression of `texts`, or None where one of them does not compile as an expression on its own
    (each a whole expression, so "(text)" means what text means alone). Built once per set of constraints."""
    try:
        for t in texts:
            compile_expression(t)
    except EXPR_ERRORS:
        return None
    return "[" + ", ".join(f"({t})" for t in texts) + "]"


STREAMS = ("main", "side")
LAUNCH_KEYS = frozenset({"kernel", "grid", "block", "smem", "args", "when", "stream", "fork_after", "pdl"})


@dataclass(frozen=True)
class LaunchDecl:
    """One kernel launch of a plan; args name tensors, dims, scalars or workspaces (`name:type`), or an
    optional tensor conditionally (`name?`: bound on the cells the op says use it, else a null pointer).

    `when` (an expression over params, arch, dtypes and the specialized dims): the launch is in the plan only
    where it holds. `stream = "side"`: the launch runs on a second stream beside the main one, after the main
    stream's launch of kernel `fork_after` (declared before it; its work only, not what the main stream queues
    after it), and the main stream waits for the side stream at the plan's end. The plan is issued in its
    declared order on the host, so run one kernel at a time it is the plan in order.

    `pdl` (an expression; where it holds): a programmatic dependent launch. The launch may begin while the plan's
    launch before it on the main stream is still running (cudaLaunchAttributeProgrammaticStreamSerialization), once
    every CTA of that launch has run `griddepcontrol.launch_dependents` or exited; its kernel runs
    `griddepcontrol.wait` (which returns once the earlier launch has completed and its writes are visible) before it
    reads or writes anything an earlier launch touches. Only on the main stream and never on a plan's first launch,
    so a call never overlaps the work queued before it (an L2 flush, a poison, a timer's event). Without the
    attribute (a runtime that cannot set it) the wait returns at once and the plan is the same plan in order."""

    kernel: str
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    smem: Expr
    args: tuple[str, ...]
    when: Expr | None = None
    stream: str = "main"
    fork_after: str = ""
    pdl: Expr | None = None


@dataclass(frozen=True)
class Launch:
    """A launch with every expression evaluated for one cell (`stream`, `fork_after`, `pdl`: LaunchDecl's)."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    args: tuple[str, ...]
    stream: str = "main"
    fork_after: str = ""
    pdl: bool = False

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class TemplateDef:
    """A parsed template: its text plus the declarations in its header.

    `trusted`: read from template files by load_templates (written by people). Every other template
    (LLM-written, read back from the store, built in code) has its rendered CUDA checked at build time.
    """

    op: str
    name: str
    description: str
    text: str
    space: tuple[tuple[str, tuple[Any, ...]], ...]
    defaults: tuple[tuple[str, Any], ...]
    constraints: tuple[tuple[str, Expr], ...]
    launches: tuple[LaunchDecl, ...]
    workspaces: tuple[tuple[str, Expr], ...]
    specialize: tuple[str, ...]
    trusted: bool = field(default=False, compare=False)

    @property
    def source_hash(self) -> str:
        return source_hash(self.text)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.space)

    def values(self, param: str) -> tuple[Any, ...]:
        return dict(self.space)[param]

    def default_params(self) -> dict[str, Any]:
        return dict(self.defaults)

    def complete(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A point recorded before some params existed, made whole: the params it lacks at their defaults (a
        param is added with a default that renders the code as it was), a ValueError naming any it has that
        the template no longer declares."""
        gone = sorted(set(params) - set(self.param_names))
        if gone:
            raise ValueError(f"{self.op}/{self.name} no longer has param(s) {', '.join(map(repr, gone))}")
        return self.default_params() | dict(params)

    def kernel_names(self, ctx: Mapping[str, Any] | None = None) -> tuple[str, ...]:
        """The kernels the plan launches: all it declares, or with `ctx` (a build's context) those whose
        `when` holds there."""
        return tuple(dict.fromkeys(d.kernel for d in self.launches if ctx is None or _launched(d, ctx)))

    def expressions(self) -> tuple[tuple[str, Expr], ...]:
        """Every expression of the header, with where it is declared (`[constraints].fits`, `[[launch]] #0.grid`)."""
        out = [(f"[constraints].{k}", e) for k, e in self.constraints]
        for i, d in enumerate(self.launches):
            at = f"[[launch]] #{i}"
            out += [(f"{at}.grid", e) for e in d.grid] + [(f"{at}.block", e) for e in d.block]
            out.append((f"{at}.smem", d.smem))
            out += [(f"{at}.{k}", e) for k, e in (("when", d.when), ("pdl", d.pdl)) if e is not None]
        out += [(f"[workspace].{k}", e) for k, e in self.workspaces]
        return tuple(out)

    def restrict(self, space: Mapping[str, Any]) -> "TemplateDef":
        """The same template with some params limited to a subset of their declared values.

        Keys and code are unchanged (same text), so restricted and full searches share results.
        The default of a restricted param moves to the first allowed value if it was cut out.
        """
        declared = dict(self.space)
        for k, vals in space.items():
            if k not in declared:
                raise TemplateError(f"{self.name}: cannot restrict unknown param {k!r} (params: {sorted(declared)})")
            bad = [v for v in vals if v not in declared[k]]
            if bad or not vals:
                raise TemplateError(f"{self.name}: restricted values {bad or '[]'} for {k!r} are not in {list(declared[k])}")
        new_space = tuple((k, tuple(space[k]) if k in space else v) for k, v in self.space)
        nd = dict(new_space)
        defaults = tuple(sorted((k, v if v in nd[k] else nd[k][0]) for k, v in self.defaults))
        return replace(self, space=new_space, defaults=defaults)

    def context(
        self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, Any], dims: Mapping[str, int] | None
    ) -> dict[str, Any]:
        """The names expressions and the template body may read."""
        from evo.core.spec import DType  # ops is a sibling package; import here keeps evo.templates.template light

        ctx: dict[str, Any] = dict(params)
        ctx["arch"] = arch
        for role, dt in dtypes.items():
            d = dt if isinstance(dt, DType) else DType.parse(dt)
            ctx[f"{role}_bytes"] = d.nbytes
            ctx[f"{role}_dtype"] = d.value
            ctx[f"{role}_t"] = d.ctype
        if dims:
            ctx.update(dims)
        return ctx

    def consts(self, dims: Mapping[str, int]) -> dict[str, int]:
        """The dims this template specializes on, for one cell: a dim the cell lacks (a variant's switch
        that is off) at its op's declared default."""
        if all(d in dims for d in self.specialize):  # every cell of a plain op: no registry look-up
            return {d: int(dims[d]) for d in self.specialize}
        from evo.core.registry import get_op  # a sibling package, as in context()

        op = get_op(self.op)
        return {d: op.dim_value(dims, d) for d in self.specialize}

    def violations(
        self,
        params: Mapping[str, Any],
        arch: int,
        dtypes: Mapping[str, Any],
        dims: Mapping[str, int] | None = None,
    ) -> list[str]:
        """Names of the constraints `params` break (with dims: the per-cell ones too)."""
        bad = [f"unknown param {k!r}" for k in params if k not in dict(self.space)]
        bad += [f"missing param {k!r}" for k in self.param_names if k not in params]
        bad += [
            f"{k}={params[k]!r} not in space"
            for k, vals in self.space
            if k in params and params[k] not in vals
        ]
        if bad:
            return bad
        ctx = self.context(params, arch, dtypes, dims)
        known = set(ctx) | set(sandbox_env().globals)
        # a constraint that reads a dim is skipped where no cell was given
        return self._broken([(name, e) for name, e in self.constraints if e.names <= known], ctx)

    def _broken(self, named: list[tuple[str, Expr]], ctx: Mapping[str, Any]) -> list[str]:
        """The names of the constraints in `named` that do not hold over ctx. They are evaluated together, in one
        sandbox call; where that fails, one by one in order, so the error names the constraint that raised."""
        vals = eval_together(tuple(e for _, e in named), ctx)
        if vals is not None:
            return [name for (name, _), v in zip(named, vals) if not v]
        bad = []
        for name, e in named:
            try:
                holds = e.eval(ctx)
            except TemplateError as err:
                raise TemplateError(f"template {self.name}: constraint {name}: {err}") from None
            if not holds:
                bad.append(name)
        return bad

    def is_valid(
        self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, Any], dims: Mapping[str, int] | None = None
    ) -> bool:
        return not self.violations(params, arch, dtypes, dims)

    def legal_points(
        self, arch: int, dtypes: Mapping[str, Any], dims: Mapping[str, int] | None = None,
        fixed: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Every point of the space (the params in `fixed` pinned to those values) that no constraint
        refuses: the points of the full product `is_valid` accepts, in the product's order, found by
        backtracking. Each constraint is checked as soon as every param it reads has a value, so a refused
        prefix is never extended (and a constraint that cannot be evaluated raises only where no earlier
        one refused the point)."""
        fixed = dict(fixed or {})
        unknown = sorted(set(fixed) - set(self.param_names))
        if unknown:
            raise TemplateError(f"{self.name}: cannot pin unknown params {unknown}")
        outside = {k: v for k, v in fixed.items() if v not in self.values(k)}
        if outside:
            raise TemplateError(f"{self.name}: pinned values outside the space: {outside}")
        names = self.param_names
        base = self.context({}, arch, dtypes, dims)
        known = set(base) | set(sandbox_env().globals)
        pnames = set(names)
        checks: list[list[tuple[str, Expr, tuple[str, ...]]]] = [[] for _ in names]
        for cname, e in self.constraints:
            reads = e.names & pnames
            if not e.names - pnames <= known:
                continue  # reads a dim and no cell was given (violations skips it too)
            last = max((names.index(n) for n in reads), default=0)
            checks[last].append((cname, e, tuple(sorted(reads))))
        choices = [(fixed[n],) if n in fixed else self.values(n) for n in names]
        out: list[dict[str, Any]] = []
        ctx = dict(base)

        # An expression's value is a function of the names it reads: each constraint is evaluated once per
        # combination of the params it reads (a handful), not once per node of the walk (hundreds of thousands).
        seen: dict[tuple, bool] = {}

        def holds(depth: int) -> bool:
            for cname, e, reads in checks[depth]:
                key = (cname,) + tuple((type(ctx[n]), ctx[n]) for n in reads)
                ok = seen.get(key)
                if ok is None:
                    try:
                        ok = seen[key] = bool(e.eval(ctx))
                    except TemplateError as err:
                        raise TemplateError(f"template {self.name}: constraint {cname}: {err}") from None
                if not ok:
                    return False
            return True

        def walk(depth: int) -> None:
            if depth == len(names):
                out.append({n: ctx[n] for n in names})
                return
            for v in choices[depth]:
                ctx[names[depth]] = v
                if holds(depth):
                    walk(depth + 1)
            del ctx[names[depth]]

        walk(0)  # parse_template refuses a space without params: names is never empty
        return out

    def plan(
        self, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, Any], dims: Mapping[str, int]
    ) -> tuple[tuple[Launch, ...], dict[str, int]]:
        """The launches and workspace sizes (bytes) for one cell."""
        ctx = self.context(params, arch, dtypes, dims)

        def dim3(exprs: tuple[Expr, ...]) -> tuple[int, int, int]:
            vals = [int(e.eval(ctx)) for e in exprs] + [1, 1]
            return (vals[0], vals[1], vals[2])

        launches = tuple(
            Launch(d.kernel, dim3(d.grid), dim3(d.block), int(d.smem.eval(ctx)), d.args, d.stream, d.fork_after,
                   d.pdl is not None and bool(d.pdl.eval(ctx)))
            for d in self.launches if _launched(d, ctx)
        )
        main: set[str] = set()
        for ln in launches:
            if ln.stream == "side" and ln.fork_after not in main:
                raise TemplateError(f"{self.name}: side launch {ln.kernel} forks after {ln.fork_after!r}, which no "
                                    f"main launch before it in this plan runs (launches: {[x.kernel for x in launches]})")
            if ln.pdl and not main:
                raise TemplateError(f"{self.name}: {ln.kernel} is a programmatic dependent launch (pdl) and the "
                                    f"plan's first launch: it would overlap what the caller queued before the plan "
                                    f"(launches: {[x.kernel for x in launches]})")
            if ln.stream == "main":
                main.add(ln.kernel)
        return launches, {name: int(e.eval(ctx)) for name, e in self.workspaces}


def _launched(d: LaunchDecl, ctx: Mapping[str, Any]) -> bool:
    """Whether a declared launch is in the plan over ctx (no `when`: always)."""
    return d.when is None or bool(d.when.eval(ctx))


def _exprs(value: Any, where: str) -> tuple[Expr, ...]:
    items = value if isinstance(value, list) else [value]
    if not 1 <= len(items) <= 3:
        raise TemplateError(f"{where} needs 1 to 3 expressions, got {len(items)}")
    return tuple(Expr(str(v)) for v in items)


def parse_template(text: str, origin: str = "<string>", trusted: bool = False) -> TemplateDef:
    """Parse a template's header; errors name the origin and the key."""
    m = HEADER.match(text)
    if not m:
        raise TemplateError(f"{origin}: no '{{#- kfactory ... -#}}' header at the top of the template")
    try:
        doc = tomllib.loads(m.group("toml"))
    except tomllib.TOMLDecodeError as e:
        raise TemplateError(f"{origin}: header is not valid TOML: {e}") from None
    unknown = set(doc) - {"template", "space", "defaults", "constraints", "launch", "workspace"}
    if unknown:
        raise TemplateError(f"{origin}: unknown header section(s) {sorted(unknown)}")
    head = doc.get("template", {})
    for key in ("op", "name"):
        if not isinstance(head.get(key), str):
            raise TemplateError(f"{origin}: [template].{key} must be a string")
    space = doc.get("space", {})
    if not space:
        raise TemplateError(f"{origin}: [space] declares no parameters")
    for k, vals in space.items():
        if not isinstance(vals, list) or not vals:
            raise TemplateError(f"{origin}: [space].{k} must be a non-empty list of values")
    defaults = doc.get("defaults", {})
    for k in space:
        if k not in defaults:
            raise TemplateError(f"{origin}: [defaults].{k} is missing")
        if defaults[k] not in space[k]:
            raise TemplateError(f"{origin}: [defaults].{k}={defaults[k]!r} is not in [space].{k}")
    extra = set(defaults) - set(space)
    if extra:
        raise TemplateError(f"{origin}: [defaults] has keys not in [space]: {sorted(extra)}")
    launches = []
    for i, ld in enumerate(doc.get("launch", [])):
        where = f"{origin}: [[launch]] #{i}"
        for key in ("kernel", "grid", "block", "args"):
            if key not in ld:
                raise TemplateError(f"{where} is missing {key!r}")
        unknown_keys = sorted(set(ld) - LAUNCH_KEYS)
        if unknown_keys:
            raise TemplateError(f"{where}: unknown key(s) {unknown_keys} (known: {sorted(LAUNCH_KEYS)})")
        for a in ld["args"]:
            if ":" in a and a.split(":", 1)[1] not in ARG_TYPES:
                raise TemplateError(f"{where}: arg {a!r} has a type not in {ARG_TYPES}")
        stream, fork_after = ld.get("stream", "main"), ld.get("fork_after", "")
        if stream not in STREAMS:
            raise TemplateError(f"{where}: stream {stream!r} is not one of {STREAMS}")
        if (stream == "side") != bool(fork_after):
            raise TemplateError(f"{where}: a side launch names the main launch it forks after (fork_after), and "
                                "only a side launch does")
        if fork_after and fork_after not in {d.kernel for d in launches if d.stream == "main"}:
            raise TemplateError(f"{where}: fork_after {fork_after!r} is not a main launch declared before it")
        if "pdl" in ld and stream != "main":
            raise TemplateError(f"{where}: pdl (a programmatic dependent launch) is for main-stream launches only")
        launches.append(
            LaunchDecl(
                kernel=ld["kernel"],
                grid=_exprs(ld["grid"], f"{where}.grid"),
                block=_exprs(ld["block"], f"{where}.block"),
                smem=Expr(str(ld.get("smem", "0"))),
                args=tuple(ld["args"]),
                when=Expr(str(ld["when"])) if "when" in ld else None,
                stream=stream,
                fork_after=fork_after,
                pdl=Expr(str(ld["pdl"])) if "pdl" in ld else None,
            )
        )
    if not launches:
        raise TemplateError(f"{origin}: no [[launch]] declared")
    return TemplateDef(
        op=head["op"],
        name=head["name"],
        description=head.get("description", ""),
        text=text,
        space=tuple((k, tuple(v)) for k, v in space.items()),
        defaults=tuple(sorted(defaults.items())),
        constraints=tuple((k, Expr(str(v))) for k, v in doc.get("constraints", {}).items()),
        launches=tuple(launches),
        workspaces=tuple((k, Expr(str(v))) for k, v in doc.get("workspace", {}).items()),
        specialize=tuple(head.get("specialize", [])),
        trusted=trusted,
    )


def header_names(op: Any) -> tuple[frozenset[str], frozenset[str]]:
    """The dims and the dtype roles an OpSpec's templates may read in a header expression: every dim its
    tensors, its dim defaults and its cells name (a variant's switch dims included), every dtype role its
    tensors and cells use (each read as `<role>_bytes`, `<role>_dtype` and `<role>_t`)."""
    from evo.core.spec import DType  # a sibling package, as in context()

    cells = op.all_cells()
    dims = {d for t in op.tensors for d in t.dims} | set(op.dim_defaults) | {k for c in cells for k, _ in c.dims}
    roles = {*op.dtype_roles, *(t.dtype for t in op.tensors if not isinstance(t.dtype, DType)),
             *(t.fallback for t in op.tensors if t.fallback), *(k for c in cells for k, _ in c.dtypes)}
    return frozenset(dims), frozenset(roles)


def check_names(t: TemplateDef, op: Any, origin: str) -> None:
    """A TemplateError naming `origin` and the name where an expression of t reads a name no context has:
    neither a param, `arch`, a dtype name or a dim of the op, nor a sandbox global (violations skips a
    constraint whose names the context lacks, so a misspelt name would make it silently true)."""
    dims, roles = header_names(op)
    known = {*t.param_names, "arch", *dims, *sandbox_env().globals}
    known |= {f"{r}_{x}" for r in roles for x in ("bytes", "dtype", "t")}
    for where, e in t.expressions():
        unknown = sorted(e.names - known)
        if unknown:
            raise TemplateError(
                f"{origin}: {where} = {e.text!r} reads {', '.join(map(repr, unknown))}: not a param of template "
                f"{t.name}, arch, a dtype name (<role>_bytes, _dtype, _t of roles {', '.join(sorted(roles))}), a "
                f"dim of op {op.name} ({', '.join(sorted(dims))}) nor a sandbox global")


def load_templates(op: str, root: Path = TEMPLATES_ROOT, use: Sequence[str] | None = None,
                   warn: Callable[[str], None] | None = None) -> dict[str, TemplateDef]:
    """Every usable template of an op, by name.

    A broken file (a header that does not parse, an expression that reads an unknown name, a name another file
    declares too) is a TemplateError naming it where the caller needs it: every file when `use` is None, else
    a file whose template `use` names (a header that cannot be read goes by its file name). Any other is left
    out and `warn` gets one line saying why (without `warn`, every broken file is an error)."""
    from evo.core.registry import get_op  # a sibling package, as in context()

    folder = root / op
    if not folder.is_dir():
        raise TemplateError(f"no template folder for op {op!r} at {folder}")
    spec = get_op(op)
    paths = sorted(folder.glob("*.cu.j2"))
    if not paths:
        raise TemplateError(f"no templates (*.cu.j2) under {folder}")
    defs: dict[str, TemplateDef] = {}
    files: dict[str, list[Path]] = {}
    broken: list[tuple[str, str]] = []  # (the template name it goes by, why it is broken)
    for path in paths:
        name = path.name.removesuffix(".cu.j2")
        try:
            t = parse_template(path.read_text(), str(path), trusted=True)
            name = t.name
            if t.op != op:
                raise TemplateError(f"{path}: declares op {t.op!r}, but lives under {op!r}")
            check_names(t, spec, str(path))
        except TemplateError as e:
            broken.append((name, str(e)))
            continue
        defs[t.name] = t
        files.setdefault(t.name, []).append(path)
    for name, where in files.items():
        if len(where) > 1:  # neither may silently shadow the other
            del defs[name]
            broken.append((name, f"{' and '.join(map(str, where))} both declare template {name!r} of op {op}; "
                                 "give each its own [template].name"))
    for name, why in broken:
        if warn is None or use is None or name in use:
            raise TemplateError(why)
        warn(why)
    return defs
