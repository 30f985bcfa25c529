"""The legal space of a template: sampling, repair, neighbours, enumeration, legal cells."""

from __future__ import annotations

import itertools
import random

import pytest

from evo.search.space import Space, enumerate_space, legal_cells, neighbours, repair, sample
from evo.templates.template import parse_template
from evo.core.spec import DType

from tests.unit.search_fixtures import (  # noqa: E402
    ARCH, BF16, CASE_IDS, CASES, CELLS, DIMS, DTYPE_SETS, FP32, TEMPLATES,
)

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
small = "a * b <= LIMIT"
[[launch]]
kernel = "k"
grid = ["1"]
block = ["a"]
args = ["x"]
-#}
"""


def statically_legal(tname: str, params: dict, dsets: list[dict]) -> bool:
    """Legal for at least one dtype set (a 16-bit-only point is legal in a run with bf16 cells)."""
    return any(TEMPLATES[tname].is_valid(params, ARCH, d) for d in dsets)


def legal_on_some_cell(tname: str, params: dict, dsets: list[dict], dims: list[dict]) -> bool:
    return any(TEMPLATES[tname].is_valid(params, ARCH, d, dm) for d in dsets for dm in dims)


def any_point(tname: str, rng: random.Random) -> dict:
    """A point of the declared space, legal or not."""
    t = TEMPLATES[tname]
    return {p: rng.choice(t.values(p)) for p in t.param_names}


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_sample_is_legal_for_some_dtype_set(tname: str, dset: str) -> None:
    dsets = DTYPE_SETS[dset]
    for seed in range(40):
        p = sample(TEMPLATES[tname], random.Random(seed), ARCH, dsets)
        assert p is not None and statically_legal(tname, p, dsets), (seed, p)


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_sample_with_cells_is_legal_on_some_cell(tname: str, dset: str) -> None:
    dsets = DTYPE_SETS[dset]
    for seed in range(40):
        p = sample(TEMPLATES[tname], random.Random(seed), ARCH, dsets, DIMS)
        assert p is not None and legal_on_some_cell(tname, p, dsets, DIMS), (seed, p)


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_repair_returns_a_legal_point(tname: str, dset: str) -> None:
    dsets = DTYPE_SETS[dset]
    space = Space(TEMPLATES[tname], ARCH, dsets, DIMS)
    for seed in range(60):
        rng = random.Random(seed)
        p = space.repair(any_point(tname, rng), rng)
        assert p is not None and legal_on_some_cell(tname, p, dsets, DIMS), (seed, p)


@pytest.mark.parametrize("tname,dset", CASES, ids=CASE_IDS)
def test_repair_is_idempotent(tname: str, dset: str) -> None:
    dsets = DTYPE_SETS[dset]
    t = TEMPLATES[tname]
    for seed in range(30):
        rng = random.Random(seed)
        legal = sample(t, rng, ARCH, dsets, DIMS)
        assert repair(t, legal, rng, ARCH, dsets, DIMS) == legal
        once = repair(t, any_point(tname, rng), rng, ARCH, dsets, DIMS)
        assert repair(t, once, rng, ARCH, dsets, DIMS) == once


@pytest.mark.parametrize("tname", list(TEMPLATES))
def test_repair_is_deterministic_given_the_rng(tname: str) -> None:
    dsets = DTYPE_SETS["all"]
    for seed in range(20):
        p = any_point(tname, random.Random(seed))
        a = repair(TEMPLATES[tname], p, random.Random(seed), ARCH, dsets, DIMS)
        b = repair(TEMPLATES[tname], p, random.Random(seed), ARCH, dsets, DIMS)
        assert a == b


def test_repair_takes_the_neighbouring_value_of_the_one_bad_param() -> None:
    # vec=8 of fp32 is 32 bytes, over the 16-byte limit: only vec has to move, to its neighbour 4
    t = TEMPLATES["cta_row"]
    p = t.default_params() | {"vec": 8}
    assert repair(t, p, random.Random(0), ARCH, [FP32]) == p | {"vec": 4}


def test_repair_keeps_fixed_params() -> None:
    t = TEMPLATES["cta_row"]
    p = t.default_params() | {"vec": 8, "threads": 512}
    got = repair(t, p, random.Random(0), ARCH, [BF16], [{"M": 4096, "N": 1024}], fixed=("vec",))
    # N=1024 with vec=8 leaves no idle warps only at threads=128 (or the exempt 64): threads moves, vec stays
    assert got is not None and got["vec"] == 8 and got["threads"] == 128


def test_repair_normalizes_unknown_missing_and_off_space_values() -> None:
    t = TEMPLATES["warp_row"]
    p = t.default_params()
    del p["unroll"]
    p["bogus"] = 3
    p["threads"] = 200  # not declared: snaps to the nearest declared number (256, not 128)
    got = repair(t, p, random.Random(0), ARCH, [BF16])
    assert got == t.default_params() | {"threads": 256}


def test_neighbours_are_adjacent_in_declared_order() -> None:
    t = TEMPLATES["cta_row"]
    assert neighbours(t, "threads", 256) == [128, 512]
    assert neighbours(t, "threads", 64) == [128]
    assert neighbours(t, "threads", 1024) == [512]
    assert neighbours(t, "weight_early", True) == [False]
    assert neighbours(t, "load_hint", "cs") == ["cg", "lu"]
    with pytest.raises(ValueError, match="threads=100"):
        neighbours(t, "threads", 100)


@pytest.mark.parametrize("with_cells", [False, True], ids=["static", "cells"])
@pytest.mark.parametrize("tname", list(TEMPLATES))
def test_space_agrees_with_template_is_valid(tname: str, with_cells: bool) -> None:
    dsets = DTYPE_SETS["all"]
    space = Space(TEMPLATES[tname], ARCH, dsets, DIMS if with_cells else None)
    rng = random.Random(7)
    verdicts = set()
    for _ in range(200):
        p = any_point(tname, rng)
        want = legal_on_some_cell(tname, p, dsets, DIMS) if with_cells else statically_legal(tname, p, dsets)
        assert space.is_legal(p) == want, p
        verdicts.add(want)
    assert verdicts == {True, False}  # the sample exercised both answers


def test_enumerate_space_lists_exactly_the_legal_points() -> None:
    t = TEMPLATES["cta_row"]
    dsets = DTYPE_SETS["all"]
    brute = [
        dict(zip(t.param_names, combo))
        for combo in itertools.product(*(t.values(p) for p in t.param_names))
        if statically_legal("cta_row", dict(zip(t.param_names, combo)), dsets)
    ]
    assert list(enumerate_space(t, ARCH, dsets)) == brute
    assert 0 < len(brute) < 5 * 4 * 3 * 2 * 6 * 3  # fp32 rules out vec=8


def test_enumerate_space_of_warp_row_is_legal_and_distinct() -> None:
    t = TEMPLATES["warp_row"]
    points = list(enumerate_space(t, ARCH, DTYPE_SETS["all"]))
    keys = {tuple(p.items()) for p in points}
    assert len(keys) == len(points) > 1000
    rng = random.Random(3)
    for p in rng.sample(points, 50):
        assert statically_legal("warp_row", p, DTYPE_SETS["all"])


def test_legal_cells_uses_each_cells_dtypes_and_dims() -> None:
    # threads=256, vec=8: fp32 is too wide for 8-vectors, N < 2048 idles warps, N > 16384 needs
    # more than 64 registers per thread
    t = TEMPLATES["cta_row"]
    p = t.default_params() | {"threads": 256, "vec": 8}
    want = [c for c in CELLS if c.dtype("x") is not DType.FP32 and 2048 <= c.dim("N") <= 16384]
    assert legal_cells(t, p, ARCH, CELLS) == want
    assert len(want) == 16


def test_nothing_legal_gives_none() -> None:
    toy = parse_template(TOY)
    dsets = [{"x": "float32"}]
    assert sample(toy, random.Random(0), ARCH, dsets, [{"LIMIT": 0}], tries=50) is None
    assert repair(toy, {"a": 3, "b": 2}, random.Random(0), ARCH, dsets, [{"LIMIT": 0}]) is None
    assert list(enumerate_space(toy, ARCH, dsets)) == [{"a": a, "b": b} for a in (1, 2, 3) for b in (1, 2)]


def test_a_genome_needs_only_one_legal_cell() -> None:
    toy = parse_template(TOY)
    space = Space(toy, ARCH, [{"x": "float32"}], [{"LIMIT": 2}, {"LIMIT": 4}])
    legal = [(1, 1), (1, 2), (2, 1), (2, 2), (3, 1)]  # a * b <= 4
    assert list(space.enumerate()) == [{"a": a, "b": b} for a, b in legal]
    assert not space.is_legal({"a": 3, "b": 2})
