"""Ask/tell strategies on synthetic objectives: no repeats, determinism, per-cell optima, niching, replay."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from evo.core.genome import Genome
from evo.search.space import Space
from evo.search.strategy import GeneticSearch, Observation, RandomSearch, Strategy
from evo.templates.template import TemplateDef, load_templates, parse_template
from ops.rmsnorm.spec import matrix
from evo.core.spec import Cell, DType

TEMPLATES = {k: t for k, t in load_templates("rmsnorm").items() if k in ("warp_row", "cta_row")}  # WINS' two
ARCH = 90
CELLS = [c for c in matrix() if c.dim("M") == 4096 and c.dtype("x") is DType.BF16]  # N = 1024 .. 32768
LABELS = [c.label() for c in CELLS]
BF16 = [CELLS[0].dtypes_dict()]
PER_CELL = ("threads", "vec")  # the params whose best value depends on the shape; the others do not
WINS = {"warp_row": lambda n: n <= 4096, "cta_row": lambda n: n > 4096}

TOY = """{#- kfactory
[template]
op = "toy"
name = "toy"
[space]
a = [1, 2, 3]
b = [1, 2]
[defaults]
a = 1
b = 1
[constraints]
small = "a * b <= 4"
[[launch]]
kernel = "k"
grid = ["1"]
block = ["a"]
args = ["x"]
-#}
"""


class Synthetic:
    """time = 10 us (12 on the template that loses the cell) + L1 distance, in list positions, to a target.

    Every template has one target per cell: the params outside PER_CELL share their target across
    cells, threads and vec get their own. The winning template's target is legal on its cell, so
    every cell's optimum is exactly 10 us, at a different point per cell.
    """

    def __init__(self, seed: int):
        rng = random.Random(seed)
        self.spaces = {
            (c.label(), n): Space(t, ARCH, BF16, [c.dims_dict()]) for c in CELLS for n, t in TEMPLATES.items()
        }
        self.target: dict[tuple[str, str], dict[str, int]] = {}
        for name, t in TEMPLATES.items():
            shared = Space(t, ARCH, BF16, [c.dims_dict() for c in CELLS]).sample(rng)
            for c in CELLS:
                space = self.spaces[(c.label(), name)]
                options = [
                    shared | {"threads": th, "vec": v}
                    for th in t.values("threads")
                    for v in t.values("vec")
                    if space.is_legal(shared | {"threads": th, "vec": v})
                ]
                assert options or not WINS[name](c.dim("N")), f"no legal target for {name} on {c.label()}"
                point = rng.choice(options) if options else shared
                self.target[(c.label(), name)] = {p: t.values(p).index(point[p]) for p in t.param_names}
        self.base = {(c.label(), n): 10.0 if WINS[n](c.dim("N")) else 12.0 for c in CELLS for n in TEMPLATES}

    def time(self, g: Genome, label: str) -> float:
        p = g.params_dict()
        if not self.spaces[(label, g.template)].is_legal(p):
            return math.inf
        t = TEMPLATES[g.template]
        target = self.target[(label, g.template)]
        return self.base[(label, g.template)] + sum(abs(t.values(q).index(p[q]) - target[q]) for q in t.param_names)

    def observe(self, genomes: list[Genome]) -> list[Observation]:
        return [Observation(g, {label: self.time(g, label) for label in LABELS}) for g in genomes]


@pytest.fixture(scope="module")
def objective() -> Synthetic:
    return Synthetic(seed=1)


def run(strategy: Strategy, objective: Synthetic, generations: int, n: int) -> list[list[Genome]]:
    batches = []
    for _ in range(generations):
        batch = strategy.propose(n)
        strategy.observe(objective.observe(batch))
        batches.append(batch)
    return batches


def solved(strategy: GeneticSearch | RandomSearch) -> int:
    """How many cells reached their optimum (10 us)."""
    return sum(t == 10.0 for _, t in strategy.best_per_cell().values())


def ga(seed: int, **kw) -> GeneticSearch:
    kw.setdefault("population", 16)
    return GeneticSearch(TEMPLATES, random.Random(seed), ARCH, BF16, CELLS, **kw)


def toy_search(kind: type, tdef: TemplateDef, seed: int = 0) -> GeneticSearch | RandomSearch:
    return kind({"toy": tdef}, random.Random(seed), ARCH, [{"x": "float32"}], [Cell.make({"x": "float32"}, {"M": 1})])


def test_random_search_proposes_fresh_legal_genomes() -> None:
    rs = RandomSearch(TEMPLATES, random.Random(0), ARCH, BF16, CELLS)
    spaces = {n: Space(t, ARCH, BF16, [c.dims_dict() for c in CELLS]) for n, t in TEMPLATES.items()}
    keys = []
    for _ in range(8):
        batch = rs.propose(40)
        assert len(batch) == 40
        assert all(spaces[g.template].is_legal(g.params_dict()) for g in batch)
        keys += [g.key() for g in batch]
    assert len(set(keys)) == len(keys)
    assert set(Counter(g.template for g in batch)) == set(TEMPLATES)


@pytest.mark.parametrize("kind", [RandomSearch, GeneticSearch], ids=["random", "ga"])
def test_an_exhausted_space_gives_fewer_then_none(kind: type) -> None:
    toy = parse_template(TOY)
    s = toy_search(kind, toy)
    first = s.propose(3)
    s.observe([Observation(g, {"x=fp32 M1": 1.0 + g.param("a")}) for g in first])
    rest = s.propose(10)
    s.observe([Observation(g, {"x=fp32 M1": 1.0}) for g in rest])
    legal = {(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)}  # a * b <= 4
    assert len(first) == 3 and len(rest) == 2
    assert {(g.param("a"), g.param("b")) for g in first + rest} == legal
    assert s.propose(4) == []


def test_ga_first_proposal_is_the_seeds_then_random_and_nothing_repeats(objective: Synthetic) -> None:
    w, c = TEMPLATES["warp_row"], TEMPLATES["cta_row"]
    seeds = [
        Genome.make("rmsnorm", "warp_row", w.source_hash, w.default_params()),
        Genome.make("rmsnorm", "cta_row", c.source_hash, c.default_params()),
        Genome.make("rmsnorm", "warp_row", w.source_hash, w.default_params()),  # a duplicate seed
    ]
    s = ga(0, seeds=seeds)
    warm = Genome.make("rmsnorm", "warp_row", w.source_hash, w.default_params() | {"threads": 256})
    s.observe(objective.observe([warm]))  # measured before the run (a warm start): never proposed
    batches = run(s, objective, generations=15, n=16)
    assert batches[0][:2] == seeds[:2]
    keys = [g.key() for b in batches for g in b]
    assert all(len(b) == 16 for b in batches)
    assert len(set(keys)) == len(keys)
    assert warm.key() not in keys


def test_ga_is_deterministic_given_the_seed(objective: Synthetic) -> None:
    a = run(ga(3), objective, generations=8, n=12)
    b = run(ga(3), objective, generations=8, n=12)
    c = run(ga(4), objective, generations=8, n=12)
    assert a == b
    assert a != c


@pytest.mark.parametrize("seed", range(5), ids=lambda s: f"seed{s}")
def test_ga_finds_every_cells_optimum_where_random_search_does_not(objective: Synthetic, seed: int) -> None:
    generations, n = 60, 16  # 960 evaluations of ~11,700 legal points
    s = ga(seed)
    for done in range(1, generations + 1):
        run(s, objective, 1, n)
        if solved(s) == len(CELLS):
            break
    assert solved(s) == len(CELLS), f"GA solved {solved(s)} of {len(CELLS)} cells in {done} generations"
    best = s.best_per_cell()
    assert len({g.key() for g, _ in best.values()}) == len(CELLS)  # a different genome per cell
    assert {best[c.label()][0].template for c in CELLS if c.dim("N") <= 4096} == {"warp_row"}
    assert {best[c.label()][0].template for c in CELLS if c.dim("N") > 4096} == {"cta_row"}
    rs = RandomSearch(TEMPLATES, random.Random(seed), ARCH, BF16, CELLS)
    run(rs, objective, generations, n)
    assert solved(rs) < len(CELLS)


def test_elitism_keeps_the_best_genome_of_every_cell(objective: Synthetic) -> None:
    s = ga(0, population=4)
    run(s, objective, generations=6, n=16)
    pool = {g.key() for g in s.population()}
    assert all(g.key() in pool for g, _ in s.best_per_cell().values())


def test_niching_caps_a_dominant_templates_share(objective: Synthetic) -> None:
    # cta_row is 5x faster wherever it is legal: without the cap warp_row keeps little more than its elites
    scale = {"cta_row": 0.2, "warp_row": 1.0}

    def observe(s: GeneticSearch, batch: list[Genome]) -> None:
        obs = objective.observe(batch)
        s.observe([Observation(o.genome, {k: v * scale[o.genome.template] for k, v in o.times.items()}) for o in obs])

    shares = {}
    for cap in (0.6, 1.0):
        s = ga(0, population=20, max_template_share=cap, p_switch=0.0)
        for _ in range(6):
            observe(s, s.propose(30))
        shares[cap] = Counter(g.template for g in s.population())
        last = s.propose(30)
        assert {g.template for g in last} == set(TEMPLATES)
    assert shares[0.6]["cta_row"] == 12 and shares[0.6]["warp_row"] == 8
    assert shares[1.0]["warp_row"] < shares[0.6]["warp_row"]


def test_genomes_that_failed_everywhere_do_not_breed(objective: Synthetic) -> None:
    s = ga(0)
    batch = s.propose(16)
    s.observe([Observation(g, {label: math.inf for label in LABELS}) for g in batch[:8]])
    s.observe(objective.observe(batch[8:]))
    assert {g.key() for g in s.population()} <= {g.key() for g in batch[8:]}


@pytest.mark.parametrize("kind", ["ga", "random"])
def test_replaying_the_observations_gives_the_same_next_proposals(objective: Synthetic, kind: str) -> None:
    def make(seed: int) -> GeneticSearch | RandomSearch:
        return ga(seed) if kind == "ga" else RandomSearch(TEMPLATES, random.Random(seed), ARCH, BF16, CELLS)

    original = make(11)
    history: list[Observation] = []
    for _ in range(7):
        obs = objective.observe(original.propose(16))
        original.observe(obs)
        history += obs
    resumed, other_seed = make(11), make(12)
    resumed.replay(history)
    other_seed.replay(history)
    assert resumed.best_per_cell() == original.best_per_cell()
    upcoming = original.propose(16)
    assert resumed.propose(16) == upcoming
    assert other_seed.propose(16) != upcoming  # the seed matters: the equality above is not vacuous


def test_best_per_cell_keeps_the_fastest_finite_time() -> None:
    s = ga(0)
    w = TEMPLATES["warp_row"]
    g1 = Genome.make("rmsnorm", "warp_row", w.source_hash, w.default_params())
    g2 = g1.with_params(threads=256)
    s.observe([Observation(g1, {LABELS[0]: 5.0, LABELS[1]: math.inf}), Observation(g2, {LABELS[0]: 6.0})])
    s.observe([Observation(g2, {LABELS[0]: 4.0})])  # a re-measurement replaces the earlier time
    assert s.best_per_cell() == {LABELS[0]: (g2, 4.0)}


def test_priors_weigh_fresh_draws_and_neutral_priors_change_nothing() -> None:
    from memory.queries import ANY_TEMPLATE

    def first(priors, n=60):
        return GeneticSearch(TEMPLATES, random.Random(5), ARCH, BF16, CELLS, population=n, priors=priors).propose(n)

    plain = first(None)
    neutral = {ANY_TEMPLATE: {"template": dict.fromkeys(TEMPLATES, 1.0)},
               "cta_row": {"vec": {4: 1.0, 8: 1.0}}}
    assert [g.key() for g in first(neutral)] == [g.key() for g in plain]  # no evidence: the cold draw exactly
    strong = {ANY_TEMPLATE: {"template": {"cta_row": 1.9, "warp_row": 0.1}}, "cta_row": {"vec": {4: 0.1, 8: 1.9}}}
    biased = first(strong)
    share = Counter(g.template for g in biased)
    assert share["cta_row"] >= 45 and share["warp_row"] >= 1  # favoured, and the floor still explores
    vecs = Counter(g.params_dict()["vec"] for g in biased if g.template == "cta_row")
    assert vecs[8] > 2 * vecs[4] and Counter(g.template for g in plain)["cta_row"] < 45
    assert len({g.key() for g in biased}) == 60  # still never a repeat


def _one_step(a: Genome, b: Genome) -> bool:
    pa, pb = a.params_dict(), b.params_dict()
    return a.template == b.template and sum(pa[k] != pb[k] for k in pa) == 1


def test_targeted_refinement_polls_the_neighbours_of_the_best_where_the_prediction_missed() -> None:
    cta = TEMPLATES["cta_row"]
    hit = Genome.make("rmsnorm", "cta_row", cta.source_hash, {**cta.default_params(), "threads": 512})
    miss = hit.with_params(threads=1024, vec=4)  # predicted fastest on the largest cell, but slow there
    big, small = LABELS[-1], LABELS[-2]
    targets = {big: [miss.key()], small: [hit.key()]}
    s = ga(0, seeds=[hit, miss], targets=targets)
    first = s.propose(16)
    assert [g.key() for g in first[:2]] == [hit.key(), miss.key()]  # the seeds first, then only
    assert all(g.template == "warp_row" for g in first[2:]) and first[2:]  # the unseeded template's share
    s.observe([Observation(hit, {big: 10.0, small: 5.0}), Observation(miss, {big: 30.0, small: 6.0})])
    assert s.missed() == {big: pytest.approx(3.0)}  # small: the prediction was the best there
    out = s.propose(16)
    refined = [g for g in out if s.cells_for(g) is not None]
    assert refined and out[: len(refined)] == refined  # refinement comes first in the generation
    assert all(_one_step(g, hit) and s.cells_for(g) == frozenset({big}) for g in refined)
    from evo.search.space import neighbours

    cell = CELLS[-1]
    legal = {hit.with_params(**{p: v}).key() for p in cta.param_names for v in neighbours(cta, p, hit.params_dict()[p])
             if cta.is_valid({**hit.params_dict(), p: v}, ARCH, cell.dtypes_dict(), cell.dims_dict())}
    legal -= {miss.key()}
    assert {g.key() for g in refined} == legal and len(legal) >= 5  # the whole legal neighbourhood on that cell
    assert all(s.cells_for(g) is None for g in out[len(refined):])  # bred and drawn genomes: every cell
    assert len({g.key() for g in out}) == len(out) == 16


def test_no_targets_no_refinement_and_the_cold_stream_is_unchanged() -> None:
    cta = TEMPLATES["cta_row"]
    seed = Genome.make("rmsnorm", "cta_row", cta.source_hash, cta.default_params())
    plain, with_empty = ga(3, seeds=[seed]), ga(3, seeds=[seed], targets={})
    a, b = plain.propose(16), with_empty.propose(16)
    assert [g.key() for g in a] == [g.key() for g in b] and len(a) == 16 and a[0] == seed
    assert all(plain.cells_for(g) is None for g in a)
    times = {lb: 10.0 for lb in LABELS}
    plain.observe([Observation(g, times) for g in a])
    assert plain.missed() == {} and all(plain.cells_for(g) is None for g in plain.propose(16))


def test_a_prediction_within_the_miss_margin_is_not_refined() -> None:
    cta = TEMPLATES["cta_row"]
    hit = Genome.make("rmsnorm", "cta_row", cta.source_hash, cta.default_params())
    close = hit.with_params(threads=512)
    s = ga(1, seeds=[hit, close], targets={LABELS[0]: [close.key()]})
    s.propose(16)
    s.observe([Observation(hit, {LABELS[0]: 10.0}), Observation(close, {LABELS[0]: 10.1})])  # 1% off: a hit
    assert s.missed() == {}
    assert all(s.cells_for(g) is None for g in s.propose(16))


def test_a_warm_run_tries_the_templates_its_seeds_do_not_cover() -> None:
    """A template new since the stored runs has no champion to seed it: a warm generation still gives
    it a share (its default point first) until it has had half a population, with or without targets."""
    cta, warp = TEMPLATES["cta_row"], TEMPLATES["warp_row"]
    seed = Genome.make("rmsnorm", "cta_row", cta.source_hash, cta.default_params())
    for targets in (None, {LABELS[-1]: [seed.key()]}):
        s = ga(0, seeds=[seed], targets=targets)
        first = s.propose(16)
        new = [g for g in first if g.template == "warp_row"]
        assert first[0] == seed and len(new) >= 4 and new[0].params_dict() == warp.default_params()
        tried = len(new)
        while tried < 8:  # until half a population of warp_row genomes has been proposed
            s.observe([Observation(g, {lb: 10.0 for lb in LABELS}) for g in first])
            first = s.propose(16)
            tried += sum(g.template == "warp_row" for g in first)
    cold = ga(0)  # no seeds: no exploration share, the stream is the plain GA's
    assert [g.key() for g in cold.propose(16)] == [g.key() for g in ga(0).propose(16)]


def test_seeds_of_every_template_leave_the_stream_unchanged_by_the_exploration_share() -> None:
    w, c = TEMPLATES["warp_row"], TEMPLATES["cta_row"]
    seeds = [Genome.make("rmsnorm", "warp_row", w.source_hash, w.default_params()),
             Genome.make("rmsnorm", "cta_row", c.source_hash, c.default_params())]
    s = ga(0, seeds=seeds)
    assert s._explore(16, 14, random.Random(0), set()) == []
