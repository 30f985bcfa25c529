"""DEAP glue for the genetic search: the one module that imports deap.

The operators stay pure functions of `evo.search.operators`; here they are registered in a
`deap.base.Toolbox` with the run's arch, dtype sets and cells bound. DEAP's own random selection
draws from the global `random` module, so the cell tournament draws its aspirants from the
caller's `random.Random` and lets `deap.tools.selBest` (deterministic, stable) pick the winner.
No `deap.creator` classes: individuals are a small local wrapper with a local Fitness subclass.
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping, Sequence

from deap import base, tools

from evo.search import operators
from evo.core.genome import Genome
from evo.templates.template import TemplateDef


class TimeFitness(base.Fitness):
    """One objective, a time in microseconds: lower is better, inf is the worst."""

    weights = (-1.0,)


class Individual:
    """A genome with its fitness on one cell, for DEAP's selection helpers."""

    __slots__ = ("genome", "fitness")

    def __init__(self, genome: Genome, time: float):
        self.genome = genome
        self.fitness = TimeFitness((time,))


def _time(times: Mapping[str, Mapping[str, float]], g: Genome, label: str) -> float:
    t = times.get(g.key(), {}).get(label, math.inf)
    return math.inf if math.isnan(t) else t


def cell_tournament(
    pool: Sequence[Genome],
    times: Mapping[str, Mapping[str, float]],
    labels: Sequence[str],
    k: int,
    tournsize: int,
    rng: random.Random,
    p_niche: float = 0.0,
) -> list[Genome]:
    """k winners; each tournament draws a random cell and `tournsize` aspirants (with replacement).

    Judging each tournament on a single cell keeps specialists: a genome that is best on a few
    shapes and illegal (inf) on the rest still wins the tournaments held on its shapes. With
    probability p_niche the aspirants all come from one template (drawn among those with a finite
    time on the cell), so a template that trails on a cell keeps improving there.
    """
    chosen = []
    for _ in range(k):
        label = rng.choice(labels)
        field = pool
        if p_niche > 0 and rng.random() < p_niche:
            templates = sorted({g.template for g in pool if math.isfinite(_time(times, g, label))})
            if templates:
                niche = rng.choice(templates)
                field = [g for g in pool if g.template == niche]
        aspirants = [rng.choice(field) for _ in range(tournsize)]
        best = tools.selBest([Individual(g, _time(times, g, label)) for g in aspirants], 1)
        chosen.append(best[0].genome)
    return chosen


def make_toolbox(
    tdefs: Mapping[str, TemplateDef],
    arch: int,
    dtype_sets: Sequence[Mapping[str, str]],
    cells: Sequence[Mapping[str, int]] | None,
    n_params: int = 2,
    tournsize: int = 3,
    p_niche: float = 0.0,
    priors: Mapping[str, Mapping[str, Mapping[Any, float]]] | None = None,
) -> base.Toolbox:
    """A toolbox with mutate(g, rng), mate(a, b, rng), switch(g, rng), select(pool, times, labels, k, rng)."""

    def mutate(g: Genome, rng: random.Random) -> Genome:
        return operators.mutate_tile(g, tdefs[g.template], rng, arch, dtype_sets, cells, n_params=n_params,
                                     priors=(priors or {}).get(g.template))

    def mate(a: Genome, b: Genome, rng: random.Random) -> Genome:
        return operators.crossover(a, b, tdefs[a.template], rng, arch, dtype_sets, cells)

    def switch(g: Genome, rng: random.Random) -> Genome:
        return operators.switch_template(g, tdefs, rng, arch, dtype_sets, cells)

    def select(
        pool: Sequence[Genome],
        times: Mapping[str, Mapping[str, float]],
        labels: Sequence[str],
        k: int,
        rng: random.Random,
    ) -> list[Genome]:
        return cell_tournament(pool, times, labels, k, tournsize, rng, p_niche)

    tb = base.Toolbox()
    tb.register("mutate", mutate)
    tb.register("mate", mate)
    tb.register("switch", switch)
    tb.register("select", select)
    return tb
