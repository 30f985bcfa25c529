"""Search strategies that speak ask/tell: `propose(n)` genomes, `observe(observations)` of their times.

Fitness is per cell (dtype x shape): an observation maps cell labels to median microseconds, inf
for a failed or illegal cell. A strategy never proposes a genome key twice in a run (seeds and
observed genomes included) and returns fewer than asked only when the legal space is exhausted.

Determinism and resumption: the constructor's rng gives a run seed, and each `propose` call draws
from a generator derived from (run seed, number of genomes proposed or observed so far). The next
proposals are therefore a function of the run seed and the observations, in the order they were
observed: `replay(observations)` on a fresh strategy with the same seed rebuilds a run from its
stored observations without re-running the breeding. (A proposal that was never observed is
forgotten by a replay, so the resumed run may propose it again: it was never measured.)
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol, Sequence

from evo.search.deap_adapter import make_toolbox
from evo.core.genome import Genome
from evo.search.space import Space, neighbours, weighted_choice
from evo.templates.template import TemplateDef
from memory.queries import ANY_TEMPLATE
from evo.core.spec import Cell

SAMPLE_TRIES = 64  # rejected (already proposed) random draws before listing what is left of a template
BREED_TRIES = 20  # breeding attempts per wanted child before topping up with random genomes
MISS = 0.02  # a warm start's prediction for a cell misses when it is this much slower than the best found there
EXPLORE_SHARE = 0.25  # of a warm generation, for templates the seeds do not cover (a new template gets tried)


@dataclass(frozen=True)
class Observation:
    """Median microseconds per cell label for one genome; math.inf for a failed or illegal cell."""

    genome: Genome
    times: Mapping[str, float]


class Strategy(Protocol):
    def propose(self, n: int) -> list[Genome]: ...

    def observe(self, obs: Sequence[Observation]) -> None: ...

    def cells_for(self, g: Genome) -> frozenset[str] | None: ...


class _Search:
    """What both strategies keep: the run seed, proposed keys, observed times, fresh random genomes."""

    def __init__(
        self,
        tdefs: Mapping[str, TemplateDef],
        rng: random.Random,
        arch: int,
        dtype_sets: Sequence[Mapping[str, str]],
        cells: Sequence[Cell],
        priors: Mapping[str, Mapping[str, Mapping[Any, float]]] | None = None,
    ):
        if not tdefs:
            raise ValueError("need at least one template")
        if not cells:
            raise ValueError("need at least one cell")
        self.tdefs = dict(sorted(tdefs.items()))
        self.arch = arch
        self.dtype_sets = [dict(d) for d in dtype_sets]
        self.cells = list(cells)
        self.labels = [c.label() for c in self.cells]
        self._dims = [c.dims_dict() for c in self.cells]
        self._spaces = {name: Space(t, arch, self.dtype_sets, self._dims) for name, t in self.tdefs.items()}
        self._priors = priors or {}
        self._seed = rng.getrandbits(64)
        self._proposed: set[str] = set()
        self._tried: Counter[str] = Counter()  # genomes proposed per template
        self._genomes: dict[str, Genome] = {}  # observed, in order of first observation
        self._times: dict[str, dict[str, float]] = {}
        self._cells_for: dict[str, frozenset[str]] = {}  # genomes to evaluate on some cells only

    def add_template(self, tdef: TemplateDef) -> None:
        """Make a new template (e.g. written by the LLM operator) available to sampling and breeding."""
        self.tdefs[tdef.name] = tdef
        self._spaces[tdef.name] = Space(tdef, self.arch, self.dtype_sets, self._dims)

    def genome(self, key: str) -> Genome | None:
        """An observed genome by key."""
        return self._genomes.get(key)

    def was_proposed(self, g: Genome) -> bool:
        return g.key() in self._proposed

    def cells_for(self, g: Genome) -> frozenset[str] | None:
        """The cell labels to evaluate g on; None for every cell where it is legal."""
        return self._cells_for.get(g.key())

    def propose(self, n: int) -> list[Genome]:
        """n new genomes (fewer only when the legal space is exhausted)."""
        if n <= 0:
            return []
        out = self._propose(n, random.Random(f"{self._seed}:{len(self._proposed)}"))
        self._proposed.update(g.key() for g in out)
        self._tried.update(g.template for g in out)
        return out

    def _propose(self, n: int, rng: random.Random) -> list[Genome]:
        raise NotImplementedError

    def observe(self, obs: Sequence[Observation]) -> None:
        """Record times; a genome observed again keeps the latest time per cell."""
        for o in obs:
            key = o.genome.key()
            self._proposed.add(key)
            self._genomes.setdefault(key, o.genome)
            times = self._times.setdefault(key, {})
            for label, t in o.times.items():
                t = float(t)
                times[label] = math.inf if math.isnan(t) else t

    def replay(self, observations: Iterable[Observation]) -> None:
        """Rebuild a run from its stored observations, in the order they were observed."""
        self.observe(list(observations))

    def time(self, g: Genome, label: str) -> float:
        return self._times.get(g.key(), {}).get(label, math.inf)

    def best_per_cell(self) -> dict[str, tuple[Genome, float]]:
        """The fastest observed genome and its time, for every cell with a finite time."""
        best: dict[str, tuple[Genome, float]] = {}
        for key, g in self._genomes.items():
            for label in self.labels:
                t = self._times[key].get(label, math.inf)
                if math.isfinite(t) and (label not in best or t < best[label][1]):
                    best[label] = (g, t)
        return {label: best[label] for label in self.labels if label in best}

    def _genome(self, name: str, params: Mapping[str, Any]) -> Genome:
        t = self.tdefs[name]
        return Genome.make(t.op, t.name, t.source_hash, params)

    def _pick_template(self, live: list[str], rng: random.Random) -> str:
        """A template uniformly, or weighted by the learned template prior (unknown templates weigh 1)."""
        return weighted_choice(rng, live, self._priors.get(ANY_TEMPLATE, {}).get("template"))

    def _fresh(self, n: int, rng: random.Random, taken: set[str], names: Sequence[str] | None = None) -> list[Genome]:
        """Up to n random legal genomes never proposed: a template (of `names`, default all), then a point of it.

        Uniform draws, or draws weighted by the priors (template prior, then per-param priors), which
        keep a floor of odds for every value, so a warm run still explores.
        """
        out: list[Genome] = []
        live = list(names if names is not None else self.tdefs)
        rest: dict[str, list[Genome]] = {}  # what is left of a template, listed once rejection stalls
        while len(out) < n and live:
            name = self._pick_template(live, rng)
            g = None
            if name not in rest:
                for _ in range(SAMPLE_TRIES):
                    params = self._spaces[name].sample(rng, weights=self._priors.get(name))
                    if params is None:
                        break
                    cand = self._genome(name, params)
                    if cand.key() not in self._proposed and cand.key() not in taken:
                        g = cand
                        break
            if g is None:
                if name not in rest:
                    rest[name] = [self._genome(name, p) for p in self._spaces[name].enumerate()]
                rest[name] = [c for c in rest[name] if c.key() not in self._proposed and c.key() not in taken]
                if not rest[name]:
                    live.remove(name)
                    continue
                g = rest[name].pop(rng.randrange(len(rest[name])))
            out.append(g)
            taken.add(g.key())
        return out


class RandomSearch(_Search):
    """Fresh legal genomes drawn at random, never one proposed before."""

    def _propose(self, n: int, rng: random.Random) -> list[Genome]:
        return self._fresh(n, rng, set())


class GeneticSearch(_Search):
    """A (mu + lambda) genetic search with per-cell fitness.

    The breeding population holds the `elite` fastest genomes of every cell and of every template
    on every cell (so a template that trails on a shape keeps its best there), then is filled to
    `population` from everything observed, ranked by best rank on any cell (specialists stay) and
    then by summed rank over all cells. No template fills more than `max_template_share` of it
    while other templates have genomes to offer. Parents come from cell tournaments (a fraction
    p_niche of them within one template); a child is a template switch (p_switch), a crossover
    with a mate of the same template (p_crossover) or a tiling mutation of up to
    `mutation_params` params. A child already proposed is mutated once more; what breeding cannot
    supply is filled with fresh legal genomes, drawn by the priors where there are any (a template
    by the template prior, then each param by its prior; uniformly otherwise). Seeds are proposed
    first, before any breeding or drawing.

    `targets` (a warm start's predictions: cell label -> keys of the seeds expected to be fastest
    there) turns on targeted refinement: the seeds form the first generation alone, and each later
    generation starts with the one-step neighbours of the best genome on every cell where the
    prediction missed (the predicted seeds more than MISS slower than the best found there; worst miss
    first), each evaluated only on the missed cells that best leads (`cells_for`).
    """

    def __init__(
        self,
        tdefs: Mapping[str, TemplateDef],
        rng: random.Random,
        arch: int,
        dtype_sets: Sequence[Mapping[str, str]],
        cells: Sequence[Cell],
        population: int = 32,
        elite: int = 1,
        tournament: int = 3,
        p_crossover: float = 0.3,
        p_switch: float = 0.1,
        max_template_share: float = 0.6,
        mutation_params: int = 2,
        p_niche: float = 0.3,
        seeds: Sequence[Genome] = (),
        priors: Mapping[str, Mapping[str, Mapping[Any, float]]] | None = None,
        targets: Mapping[str, Sequence[str]] | None = None,
    ):
        if population < 1 or elite < 0 or tournament < 1 or mutation_params < 1:
            raise ValueError("population, tournament and mutation_params must be >= 1, elite >= 0")
        if not (0 <= p_crossover <= 1 and 0 <= p_switch <= 1 and p_crossover + p_switch <= 1):
            raise ValueError(f"need 0 <= p_crossover, p_switch and their sum <= 1, got {p_crossover}, {p_switch}")
        if not 0 <= p_niche <= 1:
            raise ValueError(f"p_niche must be in [0, 1], got {p_niche}")
        if not 0 < max_template_share <= 1:
            raise ValueError(f"max_template_share must be in (0, 1], got {max_template_share}")
        super().__init__(tdefs, rng, arch, dtype_sets, cells, priors)
        self.population_size = population
        self.elite = elite
        self.p_crossover = p_crossover
        self.p_switch = p_switch
        self.max_template_share = max_template_share
        self._seeds = list(seeds)
        self._targets = {lb: list(keys) for lb, keys in (targets or {}).items() if lb in self.labels and keys}
        self._toolbox = make_toolbox(
            self.tdefs, arch, self.dtype_sets, self._dims, mutation_params, tournament, p_niche, priors
        )

    def _breedable(self, g: Genome) -> bool:
        t = self.tdefs.get(g.template)
        return t is not None and t.source_hash == g.source_hash

    def population(self) -> list[Genome]:
        """The current breeding population (empty before any finite observation)."""
        times = self._times
        cands = {
            k: g
            for k, g in self._genomes.items()
            if self._breedable(g) and any(math.isfinite(times[k].get(lb, math.inf)) for lb in self.labels)
        }
        if not cands:
            return []
        order = {k: i for i, k in enumerate(cands)}
        best_rank = dict.fromkeys(cands, len(cands))
        rank_sum = dict.fromkeys(cands, 0)
        elites: list[str] = []
        for label in self.labels:
            finite = [k for k in cands if math.isfinite(times[k].get(label, math.inf))]
            finite.sort(key=lambda k: (times[k][label], order[k]))
            ranks = {k: r for r, k in enumerate(finite)}
            for k in cands:
                r = ranks.get(k, len(cands))  # inf on this cell ranks last
                best_rank[k] = min(best_rank[k], r)
                rank_sum[k] += r
            elites += finite[: self.elite]
            for name in self.tdefs:  # and of every template on the cell: a trailing template keeps its best
                elites += [k for k in finite if cands[k].template == name][: self.elite]
        pool = {k: cands[k] for k in elites}
        ranked = sorted(cands, key=lambda k: (best_rank[k], rank_sum[k], order[k]))
        cap = max(1, int(self.max_template_share * self.population_size))
        share = Counter(g.template for g in pool.values())
        held_back = []
        for k in ranked:
            if len(pool) >= self.population_size:
                break
            if k in pool:
                continue
            if share[cands[k].template] >= cap:
                held_back.append(k)
                continue
            pool[k] = cands[k]
            share[cands[k].template] += 1
        for k in held_back:  # other templates had too few genomes: the cap gives way to a full pool
            if len(pool) >= self.population_size:
                break
            pool[k] = cands[k]
        return list(pool.values())

    def _propose(self, n: int, rng: random.Random) -> list[Genome]:
        taken: set[str] = set()
        out: list[Genome] = []
        for s in self._seeds:
            if len(out) < n and s.key() not in self._proposed and s.key() not in taken:
                out.append(s)
                taken.add(s.key())
        if self._targets:
            if out and not self._genomes:  # the seeds alone (and the unseeded templates' share):
                return out + self._explore(n, n - len(out), rng, taken)  # refinement starts from what they measure
            out += self._refine(n - len(out), rng, taken)
        out += self._explore(n, n - len(out), rng, taken)
        pool = self.population()
        if pool and len(out) < n:
            out += self._breed(pool, n - len(out), rng, taken)
        return out + self._fresh(n - len(out), rng, taken)

    def _explore(self, n: int, room: int, rng: random.Random, taken: set[str]) -> list[Genome]:
        """A warm run's share for the templates its seeds do not cover (a template new since the stored
        runs has no champion to seed it, and breeding and refinement start from the seeds), until each
        has had half a population of genomes: its default point first, then random legal points. A cold
        run (no seeds) is unchanged."""
        if not self._seeds or room <= 0:
            return []
        seeded = {g.template for g in self._seeds}
        unseen = [t for t in self.tdefs if t not in seeded and self._tried[t] < max(1, self.population_size // 2)]
        if not unseen:
            return []
        want = min(room, max(len(unseen), int(EXPLORE_SHARE * n)))
        out: list[Genome] = []
        for name in unseen:
            g = self._genome(name, self.tdefs[name].default_params())
            if len(out) < want and g.key() not in self._proposed and g.key() not in taken \
                    and self._spaces[name].is_legal(g.params_dict()):
                out.append(g)
                taken.add(g.key())
        return out + self._fresh(want - len(out), rng, taken, names=unseen)

    def missed(self, best: Mapping[str, tuple[Genome, float]] | None = None) -> dict[str, float]:
        """Cells where the prediction missed: label -> (time of the fastest predicted seed) / (best time)."""
        best = self.best_per_cell() if best is None else best
        out = {}
        for label, keys in self._targets.items():
            if label in best:
                predicted = min(self._times.get(k, {}).get(label, math.inf) for k in keys)
                if predicted > (1 + MISS) * best[label][1]:
                    out[label] = predicted / best[label][1]
        return out

    def _refine(self, want: int, rng: random.Random, taken: set[str]) -> list[Genome]:
        """Up to `want` neighbours of the bests on missed cells, worst miss first, each for its cells only."""
        best = self.best_per_cell()
        missed = self.missed(best)
        lead: dict[str, list[str]] = {}  # best genome key -> the missed cells it leads
        parents: dict[str, Genome] = {}
        for label in sorted(missed, key=lambda lb: (-missed[lb], lb)):
            g = best[label][0]
            if self._breedable(g):
                lead.setdefault(g.key(), []).append(label)
                parents[g.key()] = g
        out: list[Genome] = []
        for key, labels in lead.items():
            for child in self._neighbours(parents[key], labels, rng, taken):
                if len(out) >= want:
                    return out
                out.append(child)
                taken.add(child.key())
                self._cells_for[child.key()] = frozenset(labels)
        return out

    def _neighbours(self, g: Genome, labels: Sequence[str], rng: random.Random, taken: set[str]) -> list[Genome]:
        """g's one-step neighbours legal on one of `labels` and never proposed, in a random order
        weighted toward the values the priors favour."""
        space, tdef = self._spaces[g.template], self.tdefs[g.template]
        cells = [c for c in self.cells if c.label() in labels]
        priors = self._priors.get(g.template, {})
        params = space.normalize(g.params_dict())
        keyed: list[tuple[float, Genome]] = []
        for p in space.names:
            for v in neighbours(tdef, p, params[p]):
                cand = {**params, p: v}
                if not any(tdef.is_valid(cand, self.arch, c.dtypes_dict(), c.dims_dict()) for c in cells):
                    continue
                child = self._genome(g.template, cand)
                if child.key() in self._proposed or child.key() in taken:
                    continue
                w = max(1e-3, float(priors.get(p, {}).get(v, 1.0)))
                keyed.append((rng.random() ** (1.0 / w), child))  # largest first: a weighted random order
        keyed.sort(key=lambda kc: -kc[0])
        return [c for _, c in keyed]

    def _breed(self, pool: list[Genome], want: int, rng: random.Random, taken: set[str]) -> list[Genome]:
        tb = self._toolbox
        labels = [lb for lb in self.labels if any(math.isfinite(self.time(g, lb)) for g in pool)]
        children: list[Genome] = []

        def fresh(g: Genome) -> bool:
            return g.key() not in self._proposed and g.key() not in taken

        for _ in range(BREED_TRIES * want):
            if len(children) >= want:
                break
            (parent,) = tb.select(pool, self._times, labels, 1, rng)
            r = rng.random()
            if r < self.p_switch and len(self.tdefs) > 1:
                child = tb.switch(parent, rng)
            elif r < self.p_switch + self.p_crossover:
                mates = [g for g in pool if g.template == parent.template and g.key() != parent.key()]
                if mates:
                    (mate,) = tb.select(mates, self._times, labels, 1, rng)
                    child = tb.mate(parent, mate, rng)
                else:
                    child = tb.mutate(parent, rng)
            else:
                child = tb.mutate(parent, rng)
            if not fresh(child):
                child = tb.mutate(child, rng)
            if fresh(child):
                children.append(child)
                taken.add(child.key())
        return children
