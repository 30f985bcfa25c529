"""The kernel paths an exported package tries for a call, best first, shared by every op family's
`choose` (each builds its own Choice from the step this returns):

- table: the call is a searched cell; the kernel the search measured there (its prebuilt cubin).
- table-build: a prebuilt cubin of the table fits (same genome, dtypes and specialized dims; only the
  launch plan changes), taken before a nearer cell's genome that would need compiling.
- rerender: the nearest searched genome whose template admits the call, rendered for it.
- repaired: the nearest few genomes, each moved to the nearest legal point of its template.
None: no exported template admits the call (the family's generic path then).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .table import OpTable


@dataclass(frozen=True)
class Step:
    """A kernel path for one call: which genome, compiled for which dims, from which prebuilt build."""

    path: str
    reason: str
    template: str
    params: tuple[tuple[str, Any], ...]
    consts: tuple[tuple[str, int], ...]
    build: str  # the prebuilt kernel used as it is ("" when compiled for the call)
    source_cell: str
    notes: tuple[str, ...]


def dims_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance of log2 dims (as the factory's warm start ranks cells)."""
    return math.sqrt(sum((math.log2(max(a[k], 1)) - math.log2(max(b.get(k, 1), 1))) ** 2 for k in a))


def repair(t: Any, params: Mapping[str, Any], arch: int, dtypes: Mapping[str, str],
           dims: Mapping[str, int]) -> dict[str, Any] | None:
    """The nearest legal point: fewest params changed, then smallest total step in the declared lists."""
    space = dict(t.space)
    free = [p for p, vals in t.space if len(vals) > 1]
    at = {p: space[p].index(params[p]) if params.get(p) in space[p] else 0 for p in space}
    base = {p: space[p][at[p]] for p in space}
    if not t.violations(base, arch, dtypes, dims):
        return base
    for k in range(1, len(free) + 1):
        options = []
        for subset in itertools.combinations(free, k):
            others = [[j for j in range(len(space[p])) if j != at[p]] for p in subset]
            for pick in itertools.product(*others):
                options.append((sum(abs(j - at[p]) for p, j in zip(subset, pick)), subset, pick))
        options.sort(key=lambda o: o[0])  # stable: ties keep the declared order
        for _, subset, pick in options:
            point = dict(base)
            point.update({p: space[p][j] for p, j in zip(subset, pick)})
            if not t.violations(point, arch, dtypes, dims):
                return point
    return None


def distinct_genomes(ranked: Iterable[Any]) -> list[Any]:
    """Each (template, params) once, at its first (nearest) entry."""
    seen, out = set(), []
    for e in ranked:
        if (e.template, e.params) not in seen:
            seen.add((e.template, e.params))
            out.append(e)
    return out


def nearest_first(entries: Iterable[Any], want_dims: Mapping[str, int], want_dt: Mapping[str, str],
                  differs: Callable[[Any], bool] | None = None) -> list[Any]:
    """Each genome of `entries` once, at its nearest entry: same dtypes first, then (where a family ranks
    more) entries for which `differs` is False, then nearest dims, then by cell."""
    return distinct_genomes(sorted(entries, key=lambda e: (
        dict(e.dtypes) != want_dt, bool(differs(e)) if differs else False,
        round(dims_distance(want_dims, dict(e.dims)), 9), e.cell)))


def refusal(table: OpTable, nearest: Any, arch: int, want_dims: Mapping[str, int], want_dt: Mapping[str, str],
            kind: str = "") -> str:
    """Why no exported template (of `kind`, e.g. "prefill") admits a call: what its nearest genome breaks."""
    broken = table.templates[nearest.template].violations(dict(nearest.params), arch, want_dt, want_dims)
    return (f"no exported {kind + ' ' if kind else ''}template admits it (nearest genome, of {nearest.cell}, "
            f"breaks {', '.join(broken)})")


def walk(table: OpTable, genomes: list[Any], arch: int, want_dims: Mapping[str, int], want_dt: Mapping[str, str],
         noun: str = "shape") -> Step | None:
    """The first kernel path, over `genomes` nearest first (entries of `table`), for a call of these dims
    and dtypes on a GPU of `arch`; `noun` names the call in the reasons ("shape", "call")."""
    same_arch = arch == table.arch_number
    notes = () if same_arch else (f"the prebuilt cubins are {table.arch}, this GPU is sm_{arch}: compiled for it",)

    def consts(t: Any) -> tuple[tuple[str, int], ...]:  # a dim the call lacks at the op's default
        return t.consts(want_dims)

    for e in genomes if same_arch else ():  # a prebuilt cubin first (measured, gate-checked, no NVRTC)
        t = table.templates[e.template]
        params = dict(e.params)
        build = table.find_build(e.template, params, want_dt, dict(consts(t)))
        if build is None or t.violations(params, arch, want_dt, want_dims):
            continue
        exact = dict(e.dims) == dict(want_dims) and dict(e.dtypes) == dict(want_dt)
        path, why = ("table", f"searched cell {e.cell}") if exact else (
            "table-build", f"prebuilt {build.id} (the genome of {e.cell}, same build; launch plan for this {noun})")
        return Step(path, why, e.template, e.params, consts(t), build.id, e.cell, notes)
    for e in genomes:
        t = table.templates[e.template]
        if not t.violations(dict(e.params), arch, want_dt, want_dims):
            return Step("rerender", f"the genome of {e.cell} rendered for this {noun}", e.template, e.params,
                        consts(t), "", e.cell, notes)
    for e in genomes[:4]:  # the nearest few, repaired
        t = table.templates[e.template]
        fixed = repair(t, dict(e.params), arch, want_dt, want_dims)
        if fixed is None:
            continue
        changed = ", ".join(f"{k} {dict(e.params)[k]}->{v}" for k, v in sorted(fixed.items()) if dict(e.params)[k] != v)
        return Step("repaired", f"the genome of {e.cell} with {changed}", e.template, tuple(sorted(fixed.items())),
                    consts(t), "", e.cell, notes)
    return None
