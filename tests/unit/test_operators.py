"""Tiling operators: pure, legal, and they move where they say they move."""

from __future__ import annotations

import random

import pytest

from evo.core.genome import Genome
from evo.search.operators import crossover, mutate_tile, step, switch_template
from evo.search.space import Space, neighbours, sample
from evo.templates.template import TemplateDef, parse_template

from tests.unit.search_fixtures import (  # noqa: E402
    ARCH, BF16, CASE_IDS, CASES, DIMS, DTYPE_SETS, TEMPLATES,
)

TOY = """{#- kfactory
[template]
op = "toy"
name = "toy"
[space]
a = [1, 2, 3, 4]
b = [1, 2, 3, 4]
c = ["p", "q"]
[defaults]
a = 1
b = 1
c = "p"
[constraints]
only = "a == ONLY_A and b == 1 and c == 'p'"
[[launch]]
kernel = "k"
grid = ["1"]
block = ["a"]
args = ["x"]
-#}
"""


def genome(t: TemplateDef, params: dict) -> Genome:
    return Genome.make(t.op, t.name, t.source_hash, params)


def random_genome(tname: str, rng: random.Random, dsets: list[dict]) -> Genome:
    t = TEMPLATES[tname]
    return genome(t, sample(t, rng, ARCH, dsets, DIMS))


def changed(a: Genome, b: Genome) -> list[str]:
    return [p for p in a.params_dict() if a.param(p) != b.param(p)]


@pytest.mark.parametrize("n_params", [1, 2, 3], ids=lambda n: f"n{n}")
@pytest.mark.parametrize("tname", list(TEMPLATES))
def test_step_moves_1_to_n_params_to_neighbours(tname: str, n_params: int) -> None:
    t = TEMPLATES[tname]
    sizes = set()
    for seed in range(40):
        rng = random.Random(seed)
        before = random_genome(tname, rng, DTYPE_SETS["all"]).params_dict()
        after, moved = step(before, t, rng, n_params)
        assert 1 <= len(moved) <= n_params
        assert [p for p in t.param_names if after[p] != before[p]] == list(moved)
        assert all(after[p] in neighbours(t, p, before[p]) for p in moved)
        sizes.add(len(moved))
    assert sizes == set(range(1, n_params + 1))


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_mutate_tile_changes_a_param_to_a_neighbour_and_stays_legal(tname: str, dset: str) -> None:
    t, dsets = TEMPLATES[tname], DTYPE_SETS[dset]
    space = Space(t, ARCH, dsets, DIMS)
    for seed in range(40):
        rng = random.Random(seed)
        parent = random_genome(tname, rng, dsets)
        snapshot = parent.params_dict()
        child = mutate_tile(parent, t, rng, ARCH, dsets, DIMS, n_params=2)
        assert parent.params_dict() == snapshot  # inputs are never touched
        assert child.key() != parent.key() and child.template == parent.template
        assert space.is_legal(child.params_dict())
        moved = changed(parent, child)
        assert any(child.param(p) in neighbours(t, p, parent.param(p)) for p in moved), moved


def test_mutate_tile_is_deterministic_given_the_rng() -> None:
    t = TEMPLATES["warp_row"]
    parent = random_genome("warp_row", random.Random(1), [BF16])
    runs = [mutate_tile(parent, t, random.Random(5), ARCH, [BF16], DIMS, n_params=2) for _ in range(2)]
    assert runs[0] == runs[1]


def test_mutate_tile_with_no_legal_move_returns_the_parent() -> None:
    toy = parse_template(TOY)
    parent = genome(toy, {"a": 2, "b": 1, "c": "p"})
    dims = [{"ONLY_A": 2}]  # the parent is the one legal point
    assert mutate_tile(parent, toy, random.Random(0), ARCH, [{"x": "float32"}], dims, n_params=3) is parent


def test_mutate_tile_rejects_a_genome_of_another_template() -> None:
    g = random_genome("warp_row", random.Random(0), [BF16])
    with pytest.raises(ValueError, match="not of template cta_row"):
        mutate_tile(g, TEMPLATES["cta_row"], random.Random(0), ARCH, [BF16])


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_crossover_is_legal_and_of_the_same_template(tname: str, dset: str) -> None:
    t, dsets = TEMPLATES[tname], DTYPE_SETS[dset]
    space = Space(t, ARCH, dsets, DIMS)
    for seed in range(30):
        rng = random.Random(seed)
        a, b = random_genome(tname, rng, dsets), random_genome(tname, rng, dsets)
        child = crossover(a, b, t, rng, ARCH, dsets, DIMS)
        assert child.template == tname and space.is_legal(child.params_dict())


def test_crossover_mixes_both_parents() -> None:
    toy = parse_template(TOY)
    a, b = genome(toy, {"a": 1, "b": 1, "c": "p"}), genome(toy, {"a": 4, "b": 4, "c": "q"})
    for seed in range(30):
        child = crossover(a, b, toy, random.Random(seed), ARCH, [{"x": "float32"}])  # no cells: no constraint
        assert all(child.param(p) in (a.param(p), b.param(p)) for p in ("a", "b", "c"))
        assert child not in (a, b)


def test_crossover_of_different_templates_raises() -> None:
    a = random_genome("warp_row", random.Random(0), [BF16])
    b = random_genome("cta_row", random.Random(0), [BF16])
    with pytest.raises(ValueError, match="one template"):
        crossover(a, b, TEMPLATES["warp_row"], random.Random(0), ARCH, [BF16])


@pytest.mark.parametrize("dset", list(DTYPE_SETS))
@pytest.mark.parametrize("tname", list(TEMPLATES))
def test_switch_template_moves_to_a_legal_point_of_another_template(tname: str, dset: str) -> None:
    dsets = DTYPE_SETS[dset]
    for seed in range(20):
        rng = random.Random(seed)
        g = random_genome(tname, rng, dsets)
        child = switch_template(g, TEMPLATES, rng, ARCH, dsets, DIMS)
        target = TEMPLATES[child.template]
        assert child.template != tname and child.source_hash == target.source_hash
        assert Space(target, ARCH, dsets, DIMS).is_legal(child.params_dict())


def test_switch_template_carries_params_of_the_same_name() -> None:
    w = TEMPLATES["warp_row"]
    g = genome(w, w.default_params() | {"threads": 256, "vec": 4, "load_hint": "cg", "store_hint": "cs"})
    two = {k: TEMPLATES[k] for k in ("warp_row", "cta_row")}  # the only other template is cta_row
    for seed in range(10):
        child = switch_template(g, two, random.Random(seed), ARCH, [BF16])
        assert child.template == "cta_row"
        assert {p: child.param(p) for p in ("threads", "vec", "load_hint", "store_hint")} == {
            "threads": 256,
            "vec": 4,
            "load_hint": "cg",
            "store_hint": "cs",
        }


def test_switch_template_with_one_template_returns_the_genome() -> None:
    g = random_genome("warp_row", random.Random(0), [BF16])
    assert switch_template(g, {"warp_row": TEMPLATES["warp_row"]}, random.Random(0), ARCH, [BF16]) is g


def test_priors_bias_the_step_but_keep_exploring():
    import random as _r

    from evo.search.operators import step
    from evo.templates.template import load_templates as _lt

    t = _lt("rmsnorm")["warp_row"]
    base = t.default_params() | {"threads": 256}
    counts = {128: 0, 512: 0}
    rng = _r.Random(0)
    for _ in range(2000):
        out, moved = step(base, t, rng, 1, priors={"threads": {512: 9.0, 128: 1.0}})
        if moved == ("threads",):
            counts[out["threads"]] += 1
    assert counts[512] > 5 * counts[128] > 0
