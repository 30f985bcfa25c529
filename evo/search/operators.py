"""Tiling operators: pure functions of a genome, a template and an explicit `random.Random`.

Each returns a new legal Genome, or its (first) parent unchanged when no legal point can be found;
the caller dedups by `Genome.key()`. Legality is `evo.search.space.Space.is_legal` for the run's arch,
dtype sets and (optionally) cell dims.
"""

from __future__ import annotations

import random
from typing import Any, Mapping, Sequence

from evo.core.genome import Genome
from evo.search.space import Space, index_of, neighbours
from evo.templates.template import TemplateDef

STEP_TRIES = 8  # random multi-param steps tried before falling back to every single step


def _check_template(g: Genome, tdef: TemplateDef) -> None:
    if g.template != tdef.name or g.source_hash != tdef.source_hash:
        raise ValueError(f"genome {g.short()} is not of template {tdef.name} ({tdef.source_hash[:12]})")


def _movable(tdef: TemplateDef) -> list[str]:
    return [p for p in tdef.param_names if len(tdef.values(p)) > 1]


# param -> value -> weight; a learned prior biases which neighbour a mutation steps to
Priors = Mapping[str, Mapping[Any, float]]


def step(
    params: Mapping[str, Any], tdef: TemplateDef, rng: random.Random, n_params: int = 1,
    priors: Priors | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Move 1..n_params random params to a neighbouring value in their declared list (no repair).

    Returns the new params and the names that moved. `params` must lie in the declared space.
    """
    movable = _movable(tdef)
    if not movable or n_params < 1:
        return dict(params), ()
    k = rng.randint(1, min(n_params, len(movable)))
    moved = tuple(sorted(rng.sample(movable, k), key=tdef.param_names.index))
    out = dict(params)
    for p in moved:
        options = neighbours(tdef, p, params[p])
        weights = priors.get(p) if priors else None
        if weights:
            # unknown values keep weight 1 (exploration); the prior only reorders the odds
            out[p] = rng.choices(options, weights=[max(1e-3, float(weights.get(v, 1.0))) for v in options])[0]
        else:
            out[p] = rng.choice(options)
    return out, moved


def mutate_tile(
    g: Genome,
    tdef: TemplateDef,
    rng: random.Random,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
    n_params: int = 1,
    priors: Priors | None = None,
) -> Genome:
    """Step 1..n_params params to a neighbouring value (biased by `priors`), then repair the others."""
    _check_template(g, tdef)
    space = Space(tdef, arch, dtype_sets, cells)
    parent = space.normalize(g.params_dict())
    for _ in range(STEP_TRIES):
        stepped, moved = step(parent, tdef, rng, n_params, priors)
        child = space.repair(stepped, rng, fixed=moved)  # the moved params keep their new values
        if child is not None and child != parent:
            return Genome.make(g.op, g.template, g.source_hash, child, g.text)
    # a cramped corner of the space: try every single step before giving up
    singles = [(p, v) for p in _movable(tdef) for v in neighbours(tdef, p, parent[p])]
    rng.shuffle(singles)
    for p, v in singles:
        child = space.repair({**parent, p: v}, rng, fixed=(p,))
        if child is not None and child != parent:
            return Genome.make(g.op, g.template, g.source_hash, child, g.text)
    return g


def crossover(
    a: Genome,
    b: Genome,
    tdef: TemplateDef,
    rng: random.Random,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
) -> Genome:
    """Uniform crossover of two genomes of the same template, repaired; `a` if nothing is legal."""
    if a.template != b.template or a.source_hash != b.source_hash:
        raise ValueError(f"crossover needs one template, got {a.template} and {b.template}")
    _check_template(a, tdef)
    space = Space(tdef, arch, dtype_sets, cells)
    pa, pb = space.normalize(a.params_dict()), space.normalize(b.params_dict())
    child = {p: pa[p] if rng.random() < 0.5 else pb[p] for p in tdef.param_names}
    differ = [p for p in tdef.param_names if pa[p] != pb[p]]
    if len(differ) >= 2 and child in (pa, pb):
        # a clone of a parent wastes the draw when a real mix exists: take one param from the other
        p = rng.choice(differ)
        child[p] = pb[p] if child[p] == pa[p] else pa[p]
    fixed = space.repair(child, rng)
    return a if fixed is None else Genome.make(a.op, a.template, a.source_hash, fixed, a.text)


def switch_template(
    g: Genome,
    tdefs: Mapping[str, TemplateDef],
    rng: random.Random,
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None = None,
) -> Genome:
    """Move to another template: params of the same name carry over where legal, the rest are drawn."""
    others = sorted(name for name in tdefs if name != g.template)
    if not others:
        return g
    target = tdefs[rng.choice(others)]
    space = Space(target, arch, dtype_sets, cells)
    old = g.params_dict()
    carried = [p for p in target.param_names if p in old and index_of(target.values(p), old[p]) is not None]
    start = {p: old[p] if p in carried else rng.choice(target.values(p)) for p in target.param_names}
    params = space.repair(start, rng, fixed=carried)
    if params is None:
        params = space.repair(start, rng)  # the carried values admit no legal completion
    if params is None:
        return g
    return Genome.make(target.op, target.name, target.source_hash, params)
