"""A template's legal parameter space: sampling, repair, neighbours, enumeration.

Legality comes from the template's own constraints (`TemplateDef`), evaluated over the dtype sets
of a run: a point is legal when, for at least one dtype set, every static constraint holds and,
when cells are given, every constraint holds on the dims of at least one cell (a bf16-only point
such as vec=8 is legal in a run that has bf16 cells; it is simply not run on the fp32 ones). A genome
is dtype- and shape-independent, so it has to build for all dtypes and run on some shape.

`Space` memoizes constraint results by the values each constraint reads (a constraint such as
`vec * x_bytes <= 16` sees a handful of distinct inputs over the whole space), which makes
exhaustive enumeration and repair cheap. It gives the same answers as `TemplateDef.is_valid`.
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Collection, Iterable, Iterator, Mapping, Sequence

from evo.templates.sandbox import sandbox_env
from evo.templates.template import Expr, TemplateDef, TemplateError
from evo.core.spec import Cell


def index_of(values: Sequence[Any], value: Any) -> int | None:
    """Position of `value` in a declared list, type-aware (True is not 1); None if absent."""
    for i, v in enumerate(values):
        if type(v) is type(value) and v == value:
            return i
    return None


def neighbours(tdef: TemplateDef, param: str, value: Any) -> list[Any]:
    """The values next to `value` in the param's declared list (one or two of them)."""
    values = tdef.values(param)
    i = index_of(values, value)
    if i is None:
        raise ValueError(f"{tdef.name}: {param}={value!r} is not in the declared space {list(values)}")
    return [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)]


def _typed(values: Iterable[Any]) -> tuple[tuple[type, Any], ...]:
    # memo keys carry the type so that True and 1 (equal, same hash) never share an entry
    return tuple((type(v), v) for v in values)


class _Check:
    """One constraint, split by what it reads: params, dtype/arch facts, cell dims."""

    def __init__(self, expr: Expr, params: Collection[str], facts: Collection[str], reserved: Collection[str],
                 where: str = ""):
        names = sorted(expr.names)
        self.expr = expr
        self.where = where  # "template T: constraint C", for errors
        self.params = [n for n in names if n in params]
        self.facts = [n for n in names if n in facts and n not in params]
        self.dims = [n for n in names if n not in params and n not in facts and n not in reserved]

    def holds(self, ctx: Mapping[str, Any]) -> bool:
        try:
            return bool(self.expr.eval(ctx))
        except TemplateError as e:
            raise TemplateError(f"{self.where}: {e}") from None


class Space:
    """The legal points of one template for one arch, a set of dtype sets and (optionally) cells."""

    def __init__(
        self,
        tdef: TemplateDef,
        arch: int,
        dtype_sets: Sequence[Mapping[str, str]],
        cells: Sequence[Mapping[str, int]] | None = None,
    ):
        if not dtype_sets:
            raise ValueError("need at least one dtype set (e.g. {'x': 'bfloat16', 'w': 'bfloat16'})")
        self.tdef = tdef
        self.arch = arch
        self.names = tdef.param_names
        self._values = {p: tdef.values(p) for p in self.names}
        facts = [tdef.context({}, arch, d, None) for d in dtype_sets]
        fact_names = set().union(*facts)
        reserved = set(sandbox_env().globals)
        checks = [_Check(e, self.names, fact_names, reserved, f"template {tdef.name}: constraint {name}")
                  for name, e in tdef.constraints]
        # A point is legal when SOME dtype set admits it (vec=8 is legal for bf16 cells even though
        # fp32 cells forbid it): per dtype set, the fact tuple each check reads (None: role absent).
        self._static = [(c, [_fact_tuple(c, f) for f in facts]) for c in checks if not c.dims]
        self._per_cell = [(c, [_fact_tuple(c, f) for f in facts]) for c in checks if c.dims]
        self._nsets = len(facts)
        self._cells: list[dict[str, int]] | None = None
        if cells is not None:
            used = {n for c, _ in self._per_cell for n in c.dims}
            self._cells = _distinct([{k: v for k, v in dict(d).items() if k in used} for d in cells])
        self._memo: dict[tuple, bool] = {}
        self._legal: dict[tuple, bool] = {}

    def values(self, param: str) -> tuple[Any, ...]:
        return self._values[param]

    def _eval(self, i: int, check: _Check, params: Mapping[str, Any], facts: tuple, dims: Mapping[str, int]) -> bool:
        pv = tuple(params[n] for n in check.params)
        dv = tuple(dims[n] for n in check.dims)
        key = (i, _typed(pv), _typed(facts), dv)
        hit = self._memo.get(key)
        if hit is None:
            ctx = dict(zip(check.params, pv)) | dict(zip(check.facts, facts)) | dict(zip(check.dims, dv))
            hit = self._memo[key] = check.holds(ctx)
        return hit

    def _well_formed(self, params: Mapping[str, Any]) -> bool:
        return len(params) == len(self.names) and all(
            p in params and index_of(self._values[p], params[p]) is not None for p in self.names
        )

    def _static_for(self, params: Mapping[str, Any], k: int) -> bool:
        return all(fs[k] is None or self._eval(i, c, params, fs[k], {}) for i, (c, fs) in enumerate(self._static))

    def _cell_for(self, params: Mapping[str, Any], dims: Mapping[str, int], k: int) -> bool:
        base = len(self._static)
        for i, (c, fs) in enumerate(self._per_cell):
            if fs[k] is None or not all(n in dims for n in c.dims):
                continue  # the cell lacks this dim or role: same rule as TemplateDef.violations
            if not self._eval(base + i, c, params, fs[k], dims):
                return False
        return True

    def static_ok(self, params: Mapping[str, Any]) -> bool:
        """Every constraint that reads no dims holds for at least one dtype set."""
        return self._well_formed(params) and any(self._static_for(params, k) for k in range(self._nsets))

    def cell_ok(self, params: Mapping[str, Any], dims: Mapping[str, int]) -> bool:
        """Legal on one cell's dims for at least one dtype set (static constraints included)."""
        return self._well_formed(params) and any(
            self._static_for(params, k) and self._cell_for(params, dims, k) for k in range(self._nsets)
        )

    def is_legal(self, params: Mapping[str, Any]) -> bool:
        """Statically legal and, when cells were given, legal on at least one of them."""
        key = _typed(params.get(p) for p in self.names) + (len(params),)
        hit = self._legal.get(key)
        if hit is None:
            if self._cells is None:
                hit = self.static_ok(params)
            else:
                hit = any(self.cell_ok(params, d) for d in self._cells)
            self._legal[key] = hit
        return hit

    def sample(
        self, rng: random.Random, tries: int = 1000, weights: Mapping[str, Mapping[Any, float]] | None = None
    ) -> dict[str, Any] | None:
        """A draw from the declared space, redrawn until legal; None after `tries` draws.

        Uniform, or per param by `weights` (param -> value -> weight, as from a learned prior; a value
        the weights do not name keeps weight 1, so every value stays reachable).
        """
        for _ in range(tries):
            params = {p: weighted_choice(rng, self._values[p], (weights or {}).get(p)) for p in self.names}
            if self.is_legal(params):
                return params
        return None

    def normalize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Drop unknown params, give missing ones their default, snap values outside the space.

        A number outside its list snaps to the nearest declared number; anything else to the default.
        """
        defaults = self.tdef.default_params()
        out = {}
        for p in self.names:
            vals = self._values[p]
            if p not in params:
                out[p] = defaults[p]
                continue
            v = params[p]
            i = index_of(vals, v)
            if i is not None:
                out[p] = vals[i]
            elif _is_number(v) and any(_is_number(x) for x in vals):
                out[p] = min((x for x in vals if _is_number(x)), key=lambda x: abs(x - v))
            else:
                out[p] = defaults[p]
        return out

    def repair(
        self, params: Mapping[str, Any], rng: random.Random, fixed: Collection[str] = ()
    ) -> dict[str, Any] | None:
        """The nearest legal point: fewest params changed, then smallest total step in list order.

        Params named in `fixed` keep their values. Ties are broken by `rng`; None if no legal point
        is reachable.
        """
        base = self.normalize(params)
        if self.is_legal(base):
            return base
        free = [p for p in self.names if p not in fixed and len(self._values[p]) > 1]
        at = {p: index_of(self._values[p], base[p]) for p in self.names}
        for k in range(1, len(free) + 1):
            candidates = []
            for subset in itertools.combinations(free, k):
                others = [[j for j in range(len(self._values[p])) if j != at[p]] for p in subset]
                for choice in itertools.product(*others):
                    dist = sum(abs(j - at[p]) for p, j in zip(subset, choice))
                    candidates.append((dist, subset, choice))
            candidates.sort(key=lambda c: c[0])  # stable: ties keep enumeration order
            for _, group in itertools.groupby(candidates, key=lambda c: c[0]):
                legal = []
                for _, subset, choice in group:
                    point = dict(base)
                    point.update({p: self._values[p][j] for p, j in zip(subset, choice)})
                    if self.is_legal(point):
                        legal.append(point)
                if legal:
                    return legal[0] if len(legal) == 1 else rng.choice(legal)
        return None

    def enumerate(self) -> Iterator[dict[str, Any]]:
        """Every legal point, in declared order (product of the lists, first param slowest)."""
        for combo in itertools.product(*(self._values[p] for p in self.names)):
            params = dict(zip(self.names, combo))
            if self.is_legal(params):
                yield params


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fact_tuple(check: _Check, facts: Mapping[str, Any]) -> tuple | None:
    # a dtype set lacking a role the check reads skips the check, as TemplateDef.violations does
    return tuple(facts[n] for n in check.facts) if all(n in facts for n in check.facts) else None


def _distinct(items: list) -> list:
    out: list = []
    for x in items:
        if x not in out:
            out.append(x)
    return out


def weighted_choice(rng: random.Random, options: Sequence[Any], weights: Mapping[Any, float] | None) -> Any:
    """One of options, by weights (option -> weight; unnamed options weigh 1, none less than 1e-3).

    Without weights, or when they weigh every option the same (an empty store's neutral prior), this
    is rng.choice, so a run without evidence draws exactly as a run without priors.
    """
    w = [max(1e-3, float(weights.get(v, 1.0))) for v in options] if weights else []
    if not w or max(w) == min(w):
        return rng.choice(options)
    return rng.choices(options, weights=w)[0]


def sample(
    tdef: TemplateDef,
    rng: random.Random,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
    tries: int = 1000,
) -> dict[str, Any] | None:
    """A uniformly drawn legal point (see `Space.is_legal`), or None after `tries` draws."""
    return Space(tdef, arch, dtype_sets, cells).sample(rng, tries)


def repair(
    tdef: TemplateDef,
    params: Mapping[str, Any],
    rng: random.Random,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
    fixed: Collection[str] = (),
) -> dict[str, Any] | None:
    """The nearest legal point to `params` (see `Space.repair`), or None."""
    return Space(tdef, arch, dtype_sets, cells).repair(params, rng, fixed)


def legal_cells(tdef: TemplateDef, params: Mapping[str, Any], arch: int, cells: Sequence[Cell]) -> list[Cell]:
    """The cells (with their own dtypes and dims) on which `params` is legal."""
    return [c for c in cells if tdef.is_valid(params, arch, c.dtypes_dict(), c.dims_dict())]


def enumerate_space(
    tdef: TemplateDef,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every statically legal point (for exhaustive sweeps), in declared order."""
    return Space(tdef, arch, dtype_sets, cells).enumerate()
